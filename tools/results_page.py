"""docs/results.md, the README's "What to expect" block and their plots, from result JSON.

Every figure the README and docs/results.md quote is generated here from a stamped
result file under docs/results/ (`specdec_jax.io.machine.machine_stamp()`: CPU, ISA flags,
cores, memory, accelerator, jax/jaxlib, git commit and dirty flag, date, command line), so
a figure always names its command, machine and commit. The README quotes only figures
measured on a clean commit (`left_out`), and a table holds one machine's figures
(`results_format.machine_of`). These kinds of file:

  benchmark    scripts/benchmark.py --out: {'stamp', 'meta', 'rows': [one per γ, verifier]}
  sweep        a sweep workdir's results.json: {'meta': {'stamp', ...}, 'grid': [cells]}
  fresh_clone  scripts/measure_results.py --only=fresh_clone: {'stamp', 'runs': [make run,
               make test]}
  prompt_set   scripts/benchmark.py --out over a prompt set (tools/results_tables.py)
  distill_curve  scripts/distill.py's report.json: α per corpus at each evaluation
  tree_study   scripts/tree_study.py --out: tokens per target call of token trees and chains
  gamma_rules  scripts/gamma_policy_study.py --out: γ rules replayed on greedy decodes
  tpu_plan     scripts/tpu_plan.py --out: every decode path compiled for a TPU topology,
               memory per chip and a roofline per chip (tools/results_tpu.py)
  profile_step scripts/profile_step.py --out: a chain step beside its pieces
  head_study   scripts/head_study.py --out: vocabulary-subset draft heads, α and c per size
  soak         scripts/soak.py --out: decode loops compiled and resident memory over a long run

SECTIONS fixes which file fills which section, in page order; a file not there yet
renders as "not measured yet". Rendering is a pure function of the JSON: `make results`
(scripts/results.py) reproduces the page byte for byte, and tests/test_results_page.py
checks that the committed page matches the committed JSON. Plots are written too
(matplotlib, Agg, no timestamps), but only the Markdown is checked byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from tools import results_tables, results_tpu
from tools.results_format import (commit_short, machine_short, minutes, num, quoted_stamps,
                                  stamp_lines, stamp_of, table, unclean)

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS_DIR = "docs/results"  # the result JSON, relative to the repository root
PAGE = "docs/results.md"
FIGURES_DIR = "docs/figures"
README = "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


@dataclasses.dataclass(frozen=True)
class Section:
  """One result file and the section of docs/results.md it fills."""

  anchor: str  # the HTML anchor in docs/results.md
  path: str  # relative to RESULTS_DIR
  kind: str  # one of TABLES: 'benchmark', 'prompt_set', 'tree_study', ...
  title: str
  about: str  # one paragraph: what was measured, how to read it
  # The measuring command after `python` (scripts/measure_results.py); '{draft}' stands for
  # configs/smollm2_135m.py's draft, which sections with needs_draft measure.
  argv: tuple[str, ...] = ()
  needs_draft: bool = False
  made_by: str = ""  # the command that writes the file, when measure_results does not
  # the anchor of a later section that measures the same thing at newer code: the README
  # quotes that one only, and docs/results.md keeps this table, marked
  superseded_by: str = ""


CPU2 = ", on a second CPU kind"  # the title's tail of a section measured again elsewhere


def benchmark(anchor: str, path: str, kind: str, title: str, about: str, config: str,
              *flags: str, needs_draft: bool = True) -> Section:
  """A section measured by `scripts/benchmark.py --config=configs/<config>.py <flags>`
  into RESULTS_DIR/path."""
  argv = ("scripts/benchmark.py", f"--config=configs/{config}.py", *flags,
          f"--out={RESULTS_DIR}/{path}")
  return Section(anchor, path, kind, title, about, argv, needs_draft=needs_draft)


def variant(base: Section, suffix: str, title: str, about: str, *flags: str) -> Section:
  """`base` measured again: anchor '<anchor>-<suffix>', file '<stem>_<suffix>.json',
  `flags` added before its --out."""
  path = base.path.replace(".json", f"_{suffix}.json")
  argv = (*base.argv[:-1], *flags, f"--out={RESULTS_DIR}/{path}") if base.argv else ()
  return dataclasses.replace(base, anchor=f"{base.anchor}-{suffix}", path=path, title=title,
                             about=about, argv=argv)


_FRESH_CLONE = Section(
    "fresh-clone", "fresh_clone.json", "fresh_clone",
    "`make run` and `make test` on a fresh clone",
    "Wall time of each command on a fresh clone of the commit, installation included, and "
    "what it printed.")
_SMOLLM2 = benchmark(
    "smollm2", "benchmark_smollm2.json", "benchmark",
    "SmolLM2-135M with the config's draft at fixed γ, greedy",
    "Speculative against autoregressive decoding on the config's first prompt (batch 1), 64 "
    "new tokens, at each fixed γ; the settings line names the draft. The ratios are "
    "interleaved in one process (compile excluded, median of repeats). α is measured while "
    "decoding.", "smollm2_135m", "--gammas=1,2,3,4")
_HELDOUT = benchmark(
    "heldout", "benchmark_heldout_smollm2.json", "prompt_set",
    "SmolLM2-135M with the default draft on the held-out prompt set, greedy",
    "30 prompts the draft never saw (configs/prompts/heldout.json), 6 in each of modern "
    "prose, chat instructions, code, scripture and drama; each prompt runs alone at batch 1 "
    "with γ 'auto' chosen per step from this machine's cost table. Speedups are interleaved "
    "in one process (compile excluded, median of repeats); per domain and overall, the "
    "speedup is the geometric mean over prompts and α the mean, each with its 95% Student-t "
    "interval over prompts. Fixed γ 1 to 4 ran beside γ 'auto' on every prompt, in the same "
    "run.", "heldout_smollm2", "--gammas=auto,1,2,3,4")
_T1 = ("--config.temperature=1",)
_QWEN = Section(
    "qwen-heldout", "heldout_qwen25_coder_t0.json", "prompt_set",
    "Qwen2.5-Coder 1.5B with its 0.5B sibling on held-out prose, chat and code, greedy",
    "The 18 prose, chat and code prompts of configs/prompts/heldout.json, each alone at batch "
    "1, 48 new tokens: our speculative decoding (the independent 0.5B GGUF draft, fixed γ, "
    "block verification) against our autoregressive decoding, interleaved in one process "
    "(compile excluded, one timed call each), then transformers' plain and assisted "
    "generation on the same pair, token ids and settings in the same run, after ours freed "
    "its copy of the models. Opt-in: `make qwen peer` first (docs/qwen_pair.md).",
    made_by="python scripts/benchmark.py --config=configs/heldout_qwen25_coder.py "
            f"--peer=transformers --out={RESULTS_DIR}/heldout_qwen25_coder_t0.json")


def qwen_variant(suffix: str, title: str, about: str, flags: str,
                 superseded_by: str = "") -> Section:
  """The Qwen held-out run again with `flags` (before --out), into
  heldout_qwen25_coder_<suffix>.json, anchor qwen-heldout-<suffix>; the peer only where
  flags name it."""
  return dataclasses.replace(
      _QWEN, anchor=f"qwen-heldout-{suffix.replace('_', '-')}",
      path=f"heldout_qwen25_coder_{suffix}.json",
      title=_QWEN.title.replace("prose, chat and code, greedy", title), about=about,
      made_by=("python scripts/benchmark.py --config=configs/heldout_qwen25_coder.py "
               f"{flags} --out={RESULTS_DIR}/heldout_qwen25_coder_{suffix}.json"),
      superseded_by=superseded_by)


SECTIONS = (
    _FRESH_CLONE,
    variant(_FRESH_CLONE, "cpu2", _FRESH_CLONE.title + CPU2,
            "The same on a machine of another CPU kind (its stamp names it; every test and a "
            "wide target call cost more there). Run it on such a machine to replace it."),
    _SMOLLM2,
    variant(_SMOLLM2, "t1", _SMOLLM2.title.replace("greedy", "temperature 1"),
            "As above, sampling at temperature 1: one sample per cell, so acceptance is noisy; "
            "the sweep below averages 32 windows.", *_T1),
    _HELDOUT,
    variant(_HELDOUT, "cpu2", _HELDOUT.title + CPU2,
            "The greedy held-out run again on a machine of another CPU kind (its stamp names "
            "it; a wide target call costs more relative to one token there), with γ 'auto' "
            "choosing from that machine's own cost table. Run it on such a machine to replace "
            "it."),
    variant(_HELDOUT, "t1", _HELDOUT.title.replace("greedy", "temperature 1"),
            "As above, sampling at temperature 1: one sample per prompt, so each prompt's "
            "acceptance is noisy; the intervals over prompts say how much.", *_T1),
    _QWEN,
    qwen_variant(
        "code_t1", "code, temperature 1",
        "As above on the 6 code prompts alone, sampling at temperature 1 (ours and the "
        "peer's), one sample per prompt and sampler.",
        "--config.prompt_set=configs/prompts/heldout.json:code --config.temperature=1 "
        "--peer=transformers"),
    qwen_variant(
        "prose_chat_t1", "prose and chat, temperature 1",
        "As above on the 12 prose and chat prompts, sampling at temperature 1 (ours and the "
        "peer's), one sample per prompt and sampler; with the code run above it covers the "
        "18 prompts at T = 1.",
        "--config.prompt_set=configs/prompts/heldout.json:prose,chat --config.temperature=1 "
        "--peer=transformers"),
    qwen_variant(
        "t0_auto", "prose, chat and code, greedy, γ auto",
        "The 18 prompts at batch 1 with γ 'auto': each step each row takes the γ in "
        "0..gamma_max that its acceptance estimate and this pair's step costs s(γ) favour "
        "(γ = 0 is a plain target step), from the cost table measured on this machine at "
        "the start of the run (recorded in the file: `--config.costs=<file>` replays it).",
        "--config.gamma=auto", superseded_by="qwen-heldout-t0-gammas"),
    qwen_variant(
        "t0_gammas", "prose, chat and code, greedy, γ auto beside fixed γ",
        "The 18 prompts at batch 1 with γ 'auto' (each step each row takes the γ in "
        "0..gamma_max that its acceptance evidence and this pair's step costs s(γ) favour; "
        "γ = 0 is a plain target step that skips the draft) beside fixed γ 2 and 3, "
        "every prompt under every γ in the same run. The cost table is measured on this "
        "machine at the start of the run and recorded in the file (`--config.costs=<file>` "
        "replays it). Ours only.",
        "--gammas=auto,2,3"),
    qwen_variant(
        "t1_gammas", "prose, chat and code, temperature 1, γ auto beside fixed γ",
        "As above, beside fixed γ 2 and 3, sampling at temperature 1: one sample per prompt "
        "and γ.",
        "--gammas=auto,2,3 --config.temperature=1"),
    qwen_variant(
        "t0_batch4", "prose, chat and code, greedy, batch 4",
        "The 18 prompts, each alone as a batch of 4 copies of itself (`--config.batch_size=4`):"
        " every target call verifies 4 rows, so the verify call is 4 times as wide as at "
        "batch 1. Ours only: transformers' assisted generation decodes one row.",
        "--config.batch_size=4"),
    qwen_variant(
        "t1_batch4", "prose, chat and code, temperature 1, batch 4",
        "The 18 prompts at temperature 1, each alone as a batch of 4 copies of itself: the "
        "4 rows of a prompt sample 4 texts of their own. Ours only: transformers' assisted "
        "generation decodes one row.",
        "--config.batch_size=4 --config.temperature=1"),
    qwen_variant(
        "code_t0_tree", "code, greedy, token tree",
        "The 6 code prompts at batch 1 with token trees instead of chains: the 0.5B drafts the "
        "tree `2,1,1` (its 2 most likely first tokens, then one chain of 2 below each, 6 "
        "nodes, rule 'topk') and the target verifies all 6 nodes and the pending token in "
        "one call of 7. The predicted speedup divides the measured tokens per step by D c + "
        "v(7), with D = 3 and this target's measured v(7).",
        "--config.prompt_set=configs/prompts/heldout.json:code --config.tree=2,1,1 "
        "--config.tree_rule=topk"),
    Section("gamma-rules", "gamma_rules.json", "gamma_rules",
            "Rules for choosing γ, replayed on the held-out set (greedy)",
            "At T = 0 the text does not depend on γ, so one greedy decode per held-out prompt "
            "records which of the default draft's next G proposals the target confirms at "
            "every position (`gamma_replay`). Each rule is then replayed under this machine's "
            "measured step costs s(γ): its predicted speedup over autoregressive decoding. "
            "'auto' is the committed rule (one acceptance estimate and one cost row per "
            "proposal source); 'one-estimate', 'no-…', 'short-width', 'bernoulli-width', "
            "'prior-spread', 'fixed-memory', 'short-memory' and 'probe-k' each "
            "change one part of it (the script's docstring says which), 'fixed-γ' a fixed count, "
            "'oracle' the best count knowing each step's outcome (a bound).",
            ("scripts/gamma_policy_study.py", "--config=configs/heldout_smollm2.py",
             f"--out={RESULTS_DIR}/gamma_rules.json",
             f"--measured={RESULTS_DIR}/benchmark_heldout_smollm2.json"), needs_draft=True),
    Section("gamma-rules-t1", "gamma_rules_t1.json", "gamma_rules",
            "Rules for choosing γ on the held-out set at T = 1 (a model of sampled decoding)",
            "At T = 1 the text depends on the choices, so no replay is exact. One decode per "
            "held-out prompt at a fixed γ = G records the exact β = Σ min(p, q) of every "
            "drafted position it reached; each rule then walks that trace many times under "
            "this machine's measured step costs at T = 1, accepting each draft with "
            "probability β (`gamma_replay.replay_sampled`). The spread line sets the "
            "variance of β over a prompt's positions beside α(1 − α), the variance of "
            "Bernoulli draws of the same mean, which the bound's width would take without "
            "it: 'bernoulli-width' is the rule with that width.",
            ("scripts/gamma_policy_study.py", "--config=configs/heldout_smollm2.py",
             "--config.temperature=1", f"--out={RESULTS_DIR}/gamma_rules_t1.json",
             f"--measured={RESULTS_DIR}/benchmark_heldout_smollm2_t1.json"), needs_draft=True),
    Section("gamma-rules-qwen", "gamma_rules_qwen25_coder.json", "gamma_rules",
            "Rules for choosing γ on the Qwen pair, replayed on its held-out set (greedy)",
            "The same replay for Qwen2.5-Coder 1.5B with its 0.5B draft on its 18 held-out "
            "prompts, 48 new tokens each, under this machine's measured step costs at T = 0. "
            "'auto' is the rule under the "
            "pair's prior (`gamma_prior` 0.8 for the draft), 'default-prior' the same rule "
            "under the default prior of 0.5. The independent draft feeds the tokens it "
            "skipped when it next drafts: every replay charges those catch-up calls at their "
            "measured cost, and 'catch-up-aware' is the rule shown them as part of the "
            "step's cost.",
            ("scripts/gamma_policy_study.py", "--config=configs/heldout_qwen25_coder.py",
             f"--out={RESULTS_DIR}/gamma_rules_qwen25_coder.json",
             f"--measured={RESULTS_DIR}/heldout_qwen25_coder_t0_gammas.json"),
            needs_draft=False),
    Section("gamma-rules-qwen-t1", "gamma_rules_qwen25_coder_t1.json", "gamma_rules",
            "Rules for choosing γ on the Qwen pair at T = 1 (a model of sampled decoding)",
            "The T = 1 replay above for the Qwen pair: one decode per held-out prompt at "
            "fixed γ = G records the exact β of every drafted position it reached, and each "
            "rule walks that trace many times under this machine's measured step costs at "
            "T = 1, accepting each draft with probability β; set beside the measured "
            "held-out run at T = 1.",
            ("scripts/gamma_policy_study.py", "--config=configs/heldout_qwen25_coder.py",
             "--config.temperature=1", f"--out={RESULTS_DIR}/gamma_rules_qwen25_coder_t1.json",
             f"--measured={RESULTS_DIR}/heldout_qwen25_coder_t1_gammas.json"),
            needs_draft=False),
    benchmark("prompt-lookup", "benchmark_prompt_lookup_smollm2.json", "benchmark",
              "SmolLM2-135M with the prompt-lookup draft on Psalm 136, greedy",
              "The draft copies what followed the last match of up to 3 trailing tokens; its "
              "cost is nil (c = 0), so the speedup is tokens per target call over v(γ+1).",
              "prompt_lookup_smollm2", "--gammas=2,4,8", needs_draft=False),
    Section("sweep", "sweep_smollm2/results.json", "sweep",
            "Acceptance against γ over 32 held-out windows",
            "16 Bible and 16 Shakespeare windows of 32 tokens from held-out books and plays, "
            "48 new tokens each, all rows in one batch. α is over the drafted positions each "
            "step reached, with the half-width of its 95% interval over the windows; the "
            "prediction is (1 − α^(γ+1)) / (1 − α).",
            ("scripts/sweep.py", "--config=configs/sweep_smollm2.py",
             f"--workdir={RESULTS_DIR}/sweep_smollm2",
             "--config.drafts=(('feature','{draft}'),)"),
            needs_draft=True),
    benchmark("tiny", "benchmark_tiny.json", "benchmark",
              "The tiny random pair (`configs/tiny.py`)",
              "A 4-layer d=128 random target with its own first layer as draft, batch 4: the "
              "models are so small that the loop's fixed per-step work, not the models, sets "
              "the speed. It checks the machinery, not the speed-up.", "tiny", "--gammas=1,2,3,4",
              needs_draft=False),
    Section("distill", "distill_shipped.json", "distill_curve",
            "The shipped feature draft: held-out α against training",
            "Held-out α of the shipped draft at each evaluation of its training, per corpus "
            "(and over all of them) at T = 0 and T = 1, against the target tokens it has "
            "seen (steps x batch x sequence length). Not re-measured by `make "
            "results-measure`: the file is the report.json of `make distill` "
            "(configs/distill_feature_shipped.py), copied here by scripts/export_draft.py.",
            made_by="make distill"),
    Section("trees", "tree_tokens_per_call.json", "tree_study",
            "Token trees against chains: tokens per target call on the held-out set",
            "Every held-out prompt in one batch, decoded with the shipped feature draft by "
            "chains (block verifier) and by token trees (`decoding.tree_step`; rule 'topk' at T = 0, "
            "both rules at T = 1). Tokens per target call need no timing; the predicted "
            "speedup divides them by this machine's cost of the tree's target call and its D "
            "draft calls.",
            ("scripts/tree_study.py", f"--out={RESULTS_DIR}/tree_tokens_per_call.json")),
)
_PLAN_ABOUT = (
    "Every decode path of the config compiled for a TPU topology from shapes alone "
    "(libtpu on this CPU machine; no weights read, nothing run): compile time, HBM per chip "
    "against the chip's capacity, and whether each loop of steps keeps its caches in place "
    "(no cache-sized copy in the optimized program, temporaries below one cache). Then a "
    "roofline of one step per chip from the compiled pieces' flops and bytes, and the "
    "speedups it predicts at the α and tokens per step of the named CPU result file, beside "
    "that file's measured CPU speedups. How to read it: [tpu_plan.md](tpu_plan.md).")


def tpu_plan(anchor: str, path: str, title: str, config: str, topology: str,
             *flags: str) -> Section:
  """A compile plan section: `scripts/tpu_plan.py` in .venv-tpu (`make tpu-plan`)."""
  command = " ".join([".venv-tpu/bin/python scripts/tpu_plan.py", f"--config=configs/{config}.py",
                      f"--topology={topology}", *flags, f"--out={RESULTS_DIR}/{path}"])
  return Section(anchor, path, "tpu_plan", title, _PLAN_ABOUT, made_by=command)


_FROM_QWEN = "--from=docs/results/heldout_qwen25_coder_t0_gammas.json"
_FROM_SMOLLM2 = "--from=docs/results/benchmark_heldout_smollm2.json"
_SOAK_ABOUT = (
    "`speculative_generate` called again and again on prompts of one shape "
    "(docs/reliability.md), the count of compiled decode loops and the resident memory "
    "(VmRSS) read after every call: long generation must compile once and hold its memory "
    "flat. The count is of the process's compiled decode loops, so it includes those the "
    "cost table of gamma 'auto' timed where the run measured one.")
SECTIONS += (
    tpu_plan("tpu-plan-smollm2-v5e", "tpu_plan_smollm2_v5e.json",
             "Compile plan: SmolLM2-135M with the shipped hybrid on a TPU v5e 2x2",
             "smollm2_135m", "v5e:2x2", _FROM_SMOLLM2),
    tpu_plan("tpu-plan-smollm2-v6e", "tpu_plan_smollm2_v6e.json",
             "Compile plan: SmolLM2-135M with the shipped hybrid on a TPU v6e 2x2",
             "smollm2_135m", "v6e:2x2", _FROM_SMOLLM2),
    tpu_plan("tpu-plan-qwen-v5e", "tpu_plan_qwen25_coder_v5e.json",
             "Compile plan: the Qwen2.5-Coder 1.5B/0.5B pair on a TPU v5e 2x2",
             "qwen25_coder", "v5e:2x2", _FROM_QWEN),
    tpu_plan("tpu-plan-qwen-v6e", "tpu_plan_qwen25_coder_v6e.json",
             "Compile plan: the Qwen2.5-Coder 1.5B/0.5B pair on a TPU v6e 2x2",
             "qwen25_coder", "v6e:2x2", _FROM_QWEN),
    tpu_plan("tpu-plan-llama-mesh", "tpu_plan_llama_1b_mesh_v5e16.json",
             "Compile plan: a Llama-3.2-1B-shaped target on a v5e-16 mesh (4 hosts)",
             "llama_1b_mesh", "v5e:4x4", "--mesh=4,4"),
    Section("profile-step-qwen", "profile_step_qwen25_coder.json", "profile_step",
            "Where the Qwen pair's γ = 3 step goes",
            "The run's own compiled loops, a plain step and a chain step of γ = 3, timed beside "
            "the step's pieces compiled alone (the target call over 1 and 4 tokens, the 0.5B "
            "draft's call over one token and its two-token first call, the verifier; the "
            "four-token and two-token calls also with every matmul a dot product instead of "
            "the CPU's few-row multiply-sum; the target's prefill, alone and with the "
            "draft's, at the prompt's padded width), in turn in one process, on the config's "
            "first prompt at batch 1. In plain steps; the rest is the sampling, the caches' "
            "bookkeeping and the loop.",
            made_by="python scripts/profile_step.py --config=configs/qwen25_coder.py --gamma=3 "
                    f"--out={RESULTS_DIR}/profile_step_qwen25_coder.json"),
    Section("head-subset-qwen", "head_subset_qwen25_coder.json", "head_study",
            "Vocabulary-subset heads for the Qwen pair's 0.5B draft",
            "The 0.5B draft with its full head and with its head cut to the C ids most "
            "frequent in the 1.5B target's own answers to the distillation instructions "
            "(configs/head_tokens/qwen25_coder.json), on the 18 held-out prompts: α along the "
            "target's greedy answers, read for every C from one forward of each model, the "
            "share of answer tokens a subset can propose, and each head's one-token call "
            "timed in turn with the target's calls (c, v).",
            made_by="python scripts/head_study.py --config=configs/heldout_qwen25_coder.py "
                    "--head_tokens=configs/head_tokens/qwen25_coder.json "
                    "--sizes=4096,8192,16384,32768,65536 "
                    f"--out={RESULTS_DIR}/head_subset_qwen25_coder.json"),
    Section("soak-tiny", "soak_tiny.json", "soak", "Soak: the tiny pair, 1000 steps",
            _SOAK_ABOUT, made_by="python scripts/soak.py --config=configs/tiny.py --steps=1000 "
                                 f"--out={RESULTS_DIR}/soak_tiny.json"),
    Section("soak-smollm2", "soak_smollm2.json", "soak",
            "Soak: SmolLM2-135M with the config's draft, 2000 tokens", _SOAK_ABOUT,
            made_by="python scripts/soak.py --config=configs/smollm2_135m.py --tokens=2000 "
                    f"--out={RESULTS_DIR}/soak_smollm2.json"),
)


# --------------------------------------------------------------------------- reading

def load(results_dir: pathlib.Path) -> dict[str, dict]:
  """{section anchor: parsed JSON} for every section whose file exists."""
  out = {}
  for s in SECTIONS:
    path = results_dir / s.path
    if path.exists():
      try:
        out[s.anchor] = json.loads(path.read_text())
      except json.JSONDecodeError as e:
        raise ValueError(f"result file {path} is not valid JSON: {e}") from e
  return out


# --------------------------------------------------------------------------- tables

def benchmark_table(doc: dict) -> list[str]:
  meta, config = doc["meta"], doc["meta"]["config"]
  v = meta.get("verify_cost", {})
  lines = [f"Target `{config['target']}`, draft `{config['draft']}`, temperature "
           f"{config['temperature']:g}, top-k {config['top_k']}, top-p {config['top_p']:g}, "
           f"batch {config['batch_size']}, {config['max_new_tokens']} new tokens, seed "
           f"{config['seed']}, median of {config['repeats']}. One target call "
           f"{meta['target_call_ms']:.2f} ms; draft cost c = {meta['c']:.3f}; verify cost "
           "v(k) = " + ", ".join(f"{x:.2f}" for x in v.values()) + f" for k = 1..{len(v)}.",
           ""]
  rows = [[str(r["gamma"]), r["verifier"], f"{r['ar_tokens_per_s']:.1f}",
           f"{r['sd_tokens_per_s']:.1f}", f"**{r['speedup']:.2f}x**",
           f"{r['acceptance_rate']:.3f}", f"{r['alpha']:.3f}",
           f"{r['tokens_per_step']:.2f} ({r['predicted_tokens_per_step']:.2f})",
           f"{r['predicted_speedup']:.2f}x"] for r in doc["rows"]]
  return lines + table(["γ", "verifier", "AR tok/s", "SD tok/s", "speedup", "accept", "α",
                         "tokens/step (pred.)", "predicted speedup"], rows)


def sweep_table(doc: dict) -> list[str]:
  config = doc["meta"]["config"]
  timed = int(config.get("repeats", 0)) > 0
  header = ["draft", "T", "γ", "α ± 95%", "accept", "tokens/step (pred.)"]
  header += ["speedup (pred.)"] if timed else []
  rows = []
  for r in doc["grid"]:
    row = [r["draft_name"], f"{r['temperature']:g}", str(r["gamma"]),
           f"{r['alpha']:.3f} ± {r['alpha_ci95']:.3f}", f"{r['acceptance_rate']:.3f}",
           f"{r['tokens_per_step']:.2f} ({r['predicted_tokens_per_step']:.2f})"]
    if timed:
      row.append(f"{num(r.get('time_speedup'), '.2f')}x "
                 f"({num(r.get('time_predicted_speedup'), '.2f')}x)")
    rows.append(row)
  drafts = ", ".join(f"`{name}` = `{spec}`" for name, spec in config["drafts"])
  lines = [f"Drafts {drafts}; prompts `{config['prompt_source']}` ({config['num_prompts']} x "
           f"{config['prompt_tokens']} tokens), {config['max_new_tokens']} new tokens, verifier "
           f"`{config['verifier']}`, seed {config['seed']}"
           + ("; acceptance only (repeats = 0)." if not timed else
              f"; speed-ups are medians of {config['repeats']}."), ""]
  return lines + table(header, rows)


def printed_figures(run: dict) -> str:
  """What a command printed, joined for a table cell (its ' | ' separators as ', ')."""
  return "; ".join(f.replace(" | ", ", ") for f in run.get("figures", []))


def fresh_clone_table(doc: dict) -> list[str]:
  rows = []
  for run in doc["runs"]:
    printed = printed_figures(run) or "–"
    rows.append([f"`{run['command']}`", minutes(run["seconds"]), str(run["returncode"]),
                 printed])
  return table(["command", "wall time", "exit status", "printed"], rows)


def measure_command(section: Section) -> str:
  return section.made_by or f"python scripts/measure_results.py --only={section.anchor}"


TABLES = {"benchmark": benchmark_table, "sweep": sweep_table, "fresh_clone": fresh_clone_table,
          "prompt_set": results_tables.prompt_set_table,
          "distill_curve": results_tables.distill_table,
          "tree_study": results_tables.tree_table,
          "gamma_rules": results_tables.gamma_rules_table,
          "tpu_plan": results_tpu.tpu_plan_table,
          "profile_step": results_tables.profile_step_table,
          "head_study": results_tables.head_study_table,
          "soak": results_tables.soak_table}
HEADLINES = {"prompt_set": results_tables.prompt_set_headline,
             "distill_curve": results_tables.distill_headline,
             "tree_study": results_tables.tree_headline,
             "gamma_rules": results_tables.gamma_rules_headline,
             "tpu_plan": results_tpu.tpu_plan_headline,
             "profile_step": results_tables.profile_step_headline,
             "head_study": results_tables.head_study_headline,
             "soak": results_tables.soak_headline}
PLOTTED = ("benchmark", "sweep", "distill_curve")  # the kinds that get a PNG


# --------------------------------------------------------------------------- headlines

def headline(section: Section, doc: dict) -> list[tuple[str, str]]:
  """(figure, value) pairs the README quotes from one result file."""
  if section.kind in HEADLINES:
    return HEADLINES[section.kind](section.title, doc)
  if section.kind == "fresh_clone":  # the title's words after "fresh clone" name the machine
    where = section.title.split("fresh clone", 1)[-1]
    return [(f"`{run['command']}` on a fresh clone{where}",
             minutes(run["seconds"])
             + (f"; exit status {run['returncode']}" if run.get("returncode") else "")
             + (f"; printed {printed_figures(run)}" if run.get("figures") else ""))
            for run in doc["runs"]]
  if section.kind == "benchmark":
    config = doc["meta"]["config"]
    best = max(doc["rows"], key=lambda r: r["speedup"])
    at_default = [r for r in doc["rows"] if r["gamma"] == config["gamma"]]
    value = f"best {best['speedup']:.2f}x at γ = {best['gamma']} ({best['verifier']})"
    if at_default and at_default[0] is not best:
      value = f"{at_default[0]['speedup']:.2f}x at the config's γ = {config['gamma']}; " + value
    value += f"; {best['tokens_per_step']:.2f} tokens per target call"
    return [(section.title + ": speedup over autoregressive", value)]
  grid = doc["grid"]
  first = grid[0]["draft_name"]
  width = max(r["gamma"] for r in grid if r["draft_name"] == first)
  cells = [r for r in grid if r["draft_name"] == first and r["gamma"] == width]
  value = "; ".join(f"T = {r['temperature']:g}: α {r['alpha']:.3f} ± {r['alpha_ci95']:.3f}, "
                    f"{r['tokens_per_step']:.2f} tokens per target call" for r in cells)
  return [(f"{section.title}, draft `{first}` at γ = {width}", value)]


def title_of(anchor: str) -> str:
  """The title of the section with this anchor."""
  return next(s.title for s in SECTIONS if s.anchor == anchor)


def left_out(doc: dict) -> str | None:
  """Why the README does not quote `doc` (a stamp behind the figures it would quote is not
  of a clean commit, so no commit reproduces them), or None."""
  return "; ".join(dict.fromkeys(filter(None, map(unclean, quoted_stamps(doc))))) or None


def readme_block(docs: dict[str, dict]) -> str:
  """The Markdown between the README's results markers: the headline figures measured on
  a clean commit, then the sections left out and why."""
  rows, dropped, superseded = [], [], []
  for s in SECTIONS:
    link = f"[table](docs/results.md#{s.anchor})"
    if s.anchor not in docs:
      rows.append([s.title, f"not measured yet (`{measure_command(s)}`)", "–", "–", link])
      continue
    if why := left_out(docs[s.anchor]):
      dropped.append(f"- [{s.title}](docs/results.md#{s.anchor}): {why}")
      continue
    if s.superseded_by:
      superseded.append(f"- [{s.title}](docs/results.md#{s.anchor}): superseded by "
                        f"[{title_of(s.superseded_by)}](docs/results.md#{s.superseded_by})")
      continue
    stamp = stamp_of(docs[s.anchor])
    for figure, value in headline(s, docs[s.anchor]):
      rows.append([figure, value, machine_short(stamp), commit_short(stamp), link])
  lines = table(["figure", "value", "machine", "commit", "full table"], rows)
  if dropped:
    lines += ["", "Left out: the table quotes only figures measured on a clean commit. These "
              "were not, so no commit reproduces them; docs/results.md still shows them, "
              "marked.", "", *dropped]
  if superseded:
    lines += ["", "Superseded: a later section measures the same at newer code; "
              "docs/results.md still shows these, marked.", "", *superseded]
  return "\n".join(lines)


# --------------------------------------------------------------------------- the page

def render_page(docs: dict[str, dict], figures: dict[str, str] | None = None) -> str:
  """docs/results.md from the loaded result files; `figures`: {anchor: png path}."""
  figures = figures or {}
  lines = [
      "# Results",
      "",
      "Generated by `make results` (`python scripts/results.py`) from the stamped result "
      "files in [results/](results/); do not edit by hand. `make results-measure` "
      "(`python scripts/measure_results.py`) measures them again. Each section names the "
      "command that produced its table, the machine and the commit. Speed depends on the "
      "CPU kind as much as on the code, so compare figures only on one machine. Hand-typed "
      "tables of earlier commits, each with its machine and commit, are in "
      "[results_archive.md](results_archive.md).",
      "",
      "Ratios are measured interleaved in one process (same model, prompts, settings and "
      "seed; compile excluded; median of repeats). The predicted speedup is "
      "E[tokens/step] / (γc + v(γ+1)) with the measured c and verify-cost curve v(k) "
      "(Leviathan et al. §3 with v in place of 1).",
  ]
  for s in SECTIONS:
    lines += ["", f'<a id="{s.anchor}"></a>', "", f"## {s.title}", "", s.about, ""]
    if s.anchor not in docs:
      lines.append(f"Not measured yet: `{measure_command(s)}` writes `{RESULTS_DIR}/{s.path}`.")
      continue
    doc = docs[s.anchor]
    lines += stamp_lines(stamp_of(doc), s.path)
    if why := left_out(doc):
      lines.append(f"- Not quoted in the README: {why}.")
    if s.superseded_by:
      lines.append(f"- Superseded by [{title_of(s.superseded_by)}](#{s.superseded_by}), "
                   "which measures the same at newer code; not quoted in the README.")
    lines += [""] + TABLES[s.kind](doc)
    if s.anchor in figures:
      lines += ["", f"![{s.title}]({figures[s.anchor]})"]
  return "\n".join(lines) + "\n"


def figure_paths(docs: dict[str, dict]) -> dict[str, str]:
  """{anchor: png path relative to docs/} for the sections that get a plot."""
  return {s.anchor: f"figures/results_{s.anchor}.png" for s in SECTIONS
          if s.anchor in docs and s.kind in PLOTTED}


def plot(section: Section, doc: dict, path: pathlib.Path) -> None:
  """Speedup (benchmark) or tokens per target call (sweep) against γ, measured and
  predicted, or α against training tokens (distill_curve); a PNG without timestamps (the
  same JSON gives the same bytes on one matplotlib version)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5, 3.4), dpi=100)
  if section.kind == "distill_curve":
    results_tables.plot_distill_curve(ax, doc)
  elif section.kind == "benchmark":
    for verifier in sorted({r["verifier"] for r in doc["rows"]}):
      rows = [r for r in doc["rows"] if r["verifier"] == verifier]
      g = [r["gamma"] for r in rows]
      ax.plot(g, [r["speedup"] for r in rows], "o-", label=f"measured ({verifier})")
      ax.plot(g, [r["predicted_speedup"] for r in rows], "x--", label=f"predicted ({verifier})")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("speedup over autoregressive")
  else:
    for name in sorted({r["draft_name"] for r in doc["grid"]}):
      for t in sorted({r["temperature"] for r in doc["grid"]}):
        rows = [r for r in doc["grid"] if r["draft_name"] == name and r["temperature"] == t]
        g = [r["gamma"] for r in rows]
        ax.plot(g, [r["tokens_per_step"] for r in rows], "o-", label=f"{name} T={t:g}")
        ax.plot(g, [r["predicted_tokens_per_step"] for r in rows], "x--",
                label=f"{name} T={t:g} (pred.)")
    ax.set_ylabel("tokens per target call")
  if section.kind != "distill_curve":
    ax.set_xticks(sorted({r["gamma"] for r in doc.get("rows", doc.get("grid", []))}))
    ax.set_xlabel("γ")
  ax.set_title(section.title.replace("`", ""), fontsize=8)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, format="png", metadata={"Software": None})
  plt.close(fig)


def with_readme_block(readme: str, block: str) -> str:
  """README text with the text between BEGIN and END replaced by `block`."""
  if readme.count(BEGIN) != 1 or readme.count(END) != 1:
    raise ValueError(f"{README} must hold exactly one {BEGIN} and one {END}")
  head, rest = readme.split(BEGIN)
  _, tail = rest.split(END)
  return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def expected_files(root: pathlib.Path = ROOT) -> dict[str, str]:
  """{path relative to root: text} of every generated Markdown file."""
  docs = load(root / RESULTS_DIR)
  figures = figure_paths(docs)
  return {PAGE: render_page(docs, figures),
          README: with_readme_block((root / README).read_text(), readme_block(docs))}


def write(root: pathlib.Path = ROOT, *, plots: bool = True) -> list[str]:
  """Writes docs/results.md, the README block and (with plots) the PNGs; returns paths."""
  from specdec_jax.io.atomic import atomic_write, atomic_write_text  # (specdec_jax loads jax)

  written = []
  for rel, text in expected_files(root).items():
    atomic_write_text(root / rel, text)
    written.append(rel)
  if plots:
    docs = load(root / RESULTS_DIR)
    for s in SECTIONS:
      rel = figure_paths(docs).get(s.anchor)
      if rel is None:
        continue
      out = root / "docs" / rel
      out.parent.mkdir(parents=True, exist_ok=True)
      atomic_write(out, lambda f, s=s: plot(s, docs[s.anchor], f))
      written.append(f"docs/{rel}")
  return written


def stale(root: pathlib.Path = ROOT) -> list[str]:
  """Generated Markdown files that differ from what the result JSON gives."""
  return [rel for rel, text in expected_files(root).items()
          if not (root / rel).exists() or (root / rel).read_text() != text]
