"""Host-side results of the decode loops: tokens, acceptance per step and the γ each used.

Letters: B batch, M max_new_tokens, G drafted positions per step (γ, or γ_max for
gamma='auto'; 0 for autoregressive decoding).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np


@dataclasses.dataclass
class GenerationResult:
  """Host-side output of a generate call (numpy arrays)."""

  tokens: np.ndarray  # int32 [B,M], generated tokens, pad_id past each row's length
  lengths: np.ndarray  # int32 [B], generated tokens per row
  num_steps: int  # loop steps taken (the slowest row's)
  accepted: np.ndarray  # int32 [B,num_steps], -1 where a row was already done
  accept_prob: np.ndarray  # float32 [B,num_steps,G] (G = 0 for autoregressive)
  gammas: np.ndarray | None = None  # int32 [B,num_steps], drafts proposed (γ_b); -1 idle

  def row(self, b: int) -> list[int]:
    return self.tokens[b, : self.lengths[b]].tolist()

  @property
  def steps_per_row(self) -> np.ndarray:
    return (self.accepted >= 0).sum(axis=1)

  def reached(self) -> np.ndarray:
    """bool [B,steps,G]: drafted position j was proposed (j < γ_b) and reached (all
    drafts before it accepted)."""
    return reached_positions(self.accepted, self.accept_prob.shape[-1], self.gammas)

  def acceptance_rate(self) -> float:
    """Accepted drafts / reached drafted positions: Σ n / Σ min(n + 1, γ_b)."""
    reached = self.reached()
    if not reached.any():
      return float("nan")
    active = self.accepted >= 0
    return float(self.accepted[active].sum() / reached.sum())

  def alpha(self) -> float:
    """Mean exact acceptance probability Σ min(p,q) over reached drafted positions."""
    reached = self.reached()
    return float(self.accept_prob[reached].mean()) if reached.any() else float("nan")

  def tokens_per_step(self) -> float:
    steps = self.steps_per_row.sum()
    return float(self.lengths.sum() / steps) if steps else float("nan")


def finish(state, max_new_tokens: int, pad_id: int) -> GenerationResult:
  """The decode loop's final `DecodeState` -> a GenerationResult (caches dropped first)."""
  state = jax.device_get(state.replace(target_cache=None, draft_state=None))  # no KV copy
  tokens = np.asarray(state.tokens)
  prompt_len = np.asarray(state.prompt_len)
  lengths = np.asarray(state.num_tokens) - prompt_len
  out = np.full((tokens.shape[0], max_new_tokens), pad_id, np.int32)
  for b in range(tokens.shape[0]):
    out[b, : lengths[b]] = tokens[b, prompt_len[b]: prompt_len[b] + lengths[b]]
  steps = int(state.step)
  return GenerationResult(tokens=out, lengths=lengths.astype(np.int32), num_steps=steps,
                          accepted=np.asarray(state.accepted)[:, :steps],
                          accept_prob=np.asarray(state.accept_prob)[:, :steps],
                          gammas=np.asarray(state.gammas)[:, :steps])


def reached_positions(accepted: np.ndarray, gamma: int,
                      gammas: np.ndarray | None = None) -> np.ndarray:
  """accepted int [B,steps] (-1 = idle) -> bool [B,steps,gamma]: position j was reached,
  i.e. the step was live, j was proposed (j < gammas, the step's γ_b; every j when
  gammas is None) and every draft before j was accepted (n >= j)."""
  j = np.arange(gamma)
  reached = (accepted[..., None] >= 0) & (j <= accepted[..., None])
  return reached if gammas is None else reached & (j < gammas[..., None])
