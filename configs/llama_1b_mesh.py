r"""A Llama-3.2-1B-shaped target (random weights) on a ('data', 'model') device mesh.

  # one host with 4 chips, or 4 forced CPU devices:
  XLA_FLAGS=--xla_force_host_platform_device_count=4 python scripts/generate.py \
      --config=configs/llama_1b_mesh.py --prompt "Give thanks"
  python scripts/mesh_benchmark.py --config=configs/llama_1b_mesh.py
  # a TPU v5e-16 slice (4 hosts x 4 chips): the same command on every host
  python scripts/generate.py --config=configs/llama_1b_mesh.py --config.mesh=4,4 \
      --config.distributed=auto --prompt "Give thanks"

The target has Llama-3.2-1B's shape (16 layers, d=2048, 32 heads, 8 kv heads, MLP 8192:
1.07B params with SmolLM2's 49,152-token tied vocabulary) and random weights, so its text
means nothing: it is sized to exercise tensor parallelism, and its heads, kv heads and
MLP width divide a 'model' axis of 2, 4 or 8 (`specdec_jax.models.sharding` splits them
Megatron-style). The draft is the prompt-lookup draft, which needs no weights. For a
real pair of this size, point `target` at a Llama/Qwen2 GGUF or a `hf:<dir>` and the
draft at a `saved:<dir>` distilled for it (docs/scale_out.md). Its TPU compile plan is
docs/results.md#tpu-plan-llama-mesh; no mesh timing is recorded yet:
`scripts/mesh_benchmark.py --out=FILE.json` writes one with its machine.
"""

import ml_collections

from configs import smollm2_135m


def get_config() -> ml_collections.ConfigDict:
  c = smollm2_135m.get_config()
  c.target = "random_tiny"  # random params of any size, from target_model
  c.target_model = ml_collections.ConfigDict(dict(
      num_layers=16, embed_dim=2048, mlp_dim=8192, num_heads=32, num_kv_heads=8, head_dim=64,
      rope_theta=500_000.0, tie_embeddings=True, seed=0, logit_scale=1.0))
  c.draft = "ngram:3"  # prompt lookup: no draft weights to shard
  c.unstacked = False  # scan over the 16 stacked layers: faster to compile (docs/background.md#cpu)
  c.mesh = "1,4"  # data x model; 'data,model' must multiply to the device count
  c.gamma = "4"  # a fixed count (the base config's gamma is the string 'auto'; meshes need one)
  c.max_new_tokens = 32
  return c
