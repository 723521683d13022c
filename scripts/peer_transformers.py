r"""The peer: Hugging Face transformers' plain and assisted generation, timed like ours.

Runs in the reference venv (requirements-reference.txt: torch, transformers, gguf), never
the project's; `scripts/benchmark.py --peer=transformers` starts it after it has freed its
own copy of the models, so one framework holds the pair at a time:

  .venv-ref/bin/python scripts/peer_transformers.py --request=REQUEST.json --out=OUT.json

REQUEST.json: dict(target=<.gguf path>, draft=<.gguf path>, prompts=[[token ids], ...],
max_new_tokens=, temperature=, seed=, repeats=, threads=). Every prompt runs alone
(batch 1): a warm-up call of each mode, then `repeats` timed calls alternating plain and
assisted (transformers' default assistant settings), the median of each. Generation runs
to max_new_tokens exactly (min_new_tokens = max_new_tokens), as ours does when
benchmarking. OUT.json: dict(versions=, prompts=[dict(plain_tokens_per_s=,
assisted_tokens_per_s=, plain_tokens=, assisted_tokens=) per prompt]).
"""

import argparse
import json
import os
import statistics
import sys
import time


def load(path: str, dtype):
  from transformers import AutoModelForCausalLM
  folder, name = os.path.split(os.path.abspath(path))
  model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=dtype)
  model.eval()
  return model


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--request", required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  with open(args.request) as f:
    req = json.load(f)
  import torch
  import transformers
  torch.set_num_threads(int(req.get("threads") or os.cpu_count() or 1))
  target = load(req["target"], torch.float32)
  draft = load(req["draft"], torch.float32)
  new = int(req["max_new_tokens"])
  temperature = float(req["temperature"])
  sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) \
      if temperature > 0 else dict(do_sample=False)
  rows = []
  for ids in req["prompts"]:
    x = torch.tensor([ids], dtype=torch.long)
    mask = torch.ones_like(x)

    def run(assistant):
      torch.manual_seed(int(req["seed"]))
      kw = dict(assistant_model=draft) if assistant else {}
      t0 = time.perf_counter()
      with torch.no_grad():
        out = target.generate(x, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                              pad_token_id=0, **sampling, **kw)
      return time.perf_counter() - t0, out[0, x.shape[1]:].tolist()

    run(False), run(True)  # warm-up
    plain, assisted = [], []
    for _ in range(int(req["repeats"])):
      plain.append(run(False))
      assisted.append(run(True))
    rows.append(dict(
        plain_tokens_per_s=new / statistics.median(s for s, _ in plain),
        assisted_tokens_per_s=new / statistics.median(s for s, _ in assisted),
        plain_tokens=plain[-1][1], assisted_tokens=assisted[-1][1]))
    print(f"peer prompt {len(rows)}/{len(req['prompts'])}: plain "
          f"{rows[-1]['plain_tokens_per_s']:.2f} tok/s, assisted "
          f"{rows[-1]['assisted_tokens_per_s']:.2f} tok/s", file=sys.stderr, flush=True)
  with open(args.out + ".tmp", "w") as f:
    json.dump(dict(versions=dict(torch=torch.__version__,
                                 transformers=transformers.__version__,
                                 threads=torch.get_num_threads()), prompts=rows), f)
  os.replace(args.out + ".tmp", args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
