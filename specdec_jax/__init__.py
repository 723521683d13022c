"""specdec_jax: exact speculative decoding in JAX/Flax.

The algorithm (Leviathan et al. 2023; Chen et al. 2023; docs/background.md#algorithm) lives
in `verify.py` (accept/reject) and `speculative.py` (the step and the decode loops).
"""

from specdec_jax.models.model import ModelConfig, forward, init_cache, init_params
from specdec_jax.models.sampling import SamplingConfig, sample, warp
from specdec_jax.decoding.speculative import (
    DecodeState,
    GenerationResult,
    autoregressive_generate,
    speculative_generate,
    speculative_step,
)
from specdec_jax.verification.verify import acceptance_probability, verify

__all__ = [
    "DecodeState", "GenerationResult", "ModelConfig", "SamplingConfig", "acceptance_probability",
    "autoregressive_generate", "forward", "init_cache", "init_params", "sample",
    "speculative_generate", "speculative_step", "verify", "warp",
]
