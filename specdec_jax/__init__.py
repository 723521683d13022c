"""specdec_jax: exact speculative decoding in JAX/Flax.

The algorithm (Leviathan et al. 2023; Chen et al. 2023) lives in
`verification/verify.py` (accept/reject) and `decoding/` (the step and the loops); every
draft kind is one class behind `drafts.base.Draft` (docs/design.md).
"""

from specdec_jax.decoding.loop import autoregressive_generate, speculative_generate
from specdec_jax.decoding.results import GenerationResult
from specdec_jax.decoding.spec import AutoGamma, DecodeSpec, FixedGamma, TreeProposal
from specdec_jax.decoding.state import DecodeState
from specdec_jax.decoding.step import speculative_step
from specdec_jax.drafts.base import Draft
from specdec_jax.models.model import Model, ModelConfig, forward, init_cache, init_params
from specdec_jax.models.sampling import SamplingConfig, sample, warp
from specdec_jax.verification.verify import acceptance_probability, verify

__all__ = [
    "AutoGamma", "DecodeSpec", "DecodeState", "Draft", "FixedGamma", "GenerationResult", "Model",
    "ModelConfig", "SamplingConfig", "TreeProposal", "acceptance_probability",
    "autoregressive_generate", "forward", "init_cache", "init_params", "sample",
    "speculative_generate", "speculative_step", "verify", "warp",
]
