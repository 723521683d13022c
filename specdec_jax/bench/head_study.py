"""How a vocabulary-subset draft head trades acceptance for draft cost, on a prompt set.

Letters: R prompts (rows), T tokens of a row (prompt + answer, padded), A answer tokens,
V vocabulary, K head sizes studied, C one head size.

The target answers every prompt greedily (`max_new_tokens` tokens, batched). One forward
of the target and one of the full-head draft over each prompt + answer then give, at
every answer position, the target's law p and the draft's logits. A subset head on the
ids S gives the full head's logits on S and -inf elsewhere (`io.head_tokens.cut_head`,
tested), so its law at temperature τ is the draft's warped law restricted to S, and

  α_τ(C) = mean over answer positions of Σ_x min(p_τ(x), q_τ,C(x))

(τ = 0: argmax agreement) is read for every C from the same two forwards: the acceptance
rate of a first drafted token along the target's own greedy path (Leviathan et al. 2023's
α; along a sampled path at τ = 1 it differs a little). `coverage` is the fraction of
answer tokens inside S: outside it q = 0, and the token comes from the residual.

c(C) = the cut draft's one-token call / the target's one-token call, all timed in turn in
each round (`timing.interleaved_seconds`) at the prompts' median length, and
v(γ+1) = the target's γ+1-token call / its one-token call; `studies.predicted_speedup`
turns (α, γ, c, v) into E(α, γ) / s(γ).
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.bench import studies, timing
from specdec_jax.decoding.loop import autoregressive_generate
from specdec_jax.decoding.spec import DecodeSpec
from specdec_jax.io.head_tokens import cut_head
from specdec_jax.models.model import Model, ModelConfig, forward, init_cache
from specdec_jax.models.sampling import SamplingConfig, warp

FULL = 0  # the head size that stands for the draft's own full head


def greedy_answers(target: Model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                   eos_id: int | None, vocab_size: int) -> list[list[int]]:
  """Each prompt's greedy answer by the target (up to EOS, if any, or max_new_tokens)."""
  spec = DecodeSpec(max_new_tokens, sampling=SamplingConfig(temperature=0.0), eos_id=eos_id,
                    vocab_size=vocab_size)
  result = autoregressive_generate(target, [list(p) for p in prompts], spec=spec)
  return [list(result.row(b)) for b in range(len(prompts))]


@functools.partial(jax.jit, static_argnames=("config",))
def _logits(params, tokens, *, config: ModelConfig):
  """float32 [1,T,V] logits of one padded row (positions 0..T-1, a fresh cache)."""
  t = tokens.shape[1]
  positions = jnp.arange(t, dtype=jnp.int32)[None]
  logits, _ = forward(params, tokens, positions, init_cache(config, 1, t), config=config)
  return logits.astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("temperatures", "vocab_size"))
def _row_sums(target_logits, draft_logits, masks, answer, weights, *, temperatures,
              vocab_size):
  """Sums over one row's answer positions: {'coverage': [K], 'alpha_t<τ>': [K]}.
  target/draft logits [A,V'] (the positions predicting the answer), masks bool [K,V],
  answer int [A] (the tokens), weights [A] (1 on real positions, 0 on padding)."""
  p_logits, d_logits = target_logits[:, :vocab_size], draft_logits[:, :vocab_size]
  sums = {"coverage": jnp.sum(masks[:, answer] * weights[None], -1)}
  for tau in temperatures:
    p = warp(p_logits, tau, 0, 1.0)

    def alpha(mask, p=p, tau=tau):
      q = warp(jnp.where(mask[None], d_logits, -jnp.inf), tau, 0, 1.0)
      return jnp.sum(jnp.sum(jnp.minimum(p, q), -1) * weights)

    sums[f"alpha_t{tau:g}"] = jax.vmap(alpha)(masks)
  return sums


def head_alphas(target: Model, draft: Model, prompts, answers, subsets: Sequence[Sequence[int]],
                *, temperatures=(0.0, 1.0), vocab_size: int) -> list[dict]:
  """[{'alpha_t<τ>', 'coverage'} per subset] over every answer position (module docstring);
  draft: the full-head draft; subsets: sorted id lists (an empty one = the full head)."""
  masks = np.zeros((len(subsets), vocab_size), bool)
  for k, ids in enumerate(subsets):
    masks[k, list(ids) if len(ids) else slice(None)] = True
  width = max(len(p) + len(a) for p, a in zip(prompts, answers))
  length = max(len(a) for a in answers)
  totals, positions = {}, 0
  for prompt, answer in zip(prompts, answers):
    if not answer:
      continue
    row = np.zeros((1, width), np.int32)
    row[0, :len(prompt) + len(answer)] = list(prompt) + list(answer)
    at = np.minimum(len(prompt) - 1 + np.arange(length), width - 1)  # predicts answer[i]
    weights = (np.arange(length) < len(answer)).astype(np.float32)
    tokens = np.zeros(length, np.int32)
    tokens[:len(answer)] = answer
    p = _logits(target.params, row, config=target.config)[0, at]
    q = _logits(draft.params, row, config=draft.config)[0, at]
    sums = jax.device_get(_row_sums(p, q, masks, tokens, weights,
                                    temperatures=tuple(float(t) for t in temperatures),
                                    vocab_size=vocab_size))
    for key, value in sums.items():
      totals[key] = totals.get(key, 0.0) + np.asarray(value, np.float64)
    positions += len(answer)
  return [{key: float(value[k] / positions) for key, value in totals.items()} | {
      "positions": positions} for k in range(len(subsets))]


def head_costs(target: Model, draft: Model, subsets: Sequence[Sequence[int]], *, context: int,
               max_verify: int, repeats: int) -> tuple[list[float], dict[int, float], float]:
  """([c(C) per subset], {k: v(k)} for k = 1..max_verify, seconds of the target's one-token
  call): every call timed in turn in each round (module docstring)."""
  fns = {("target", k): studies.forward_call(target.params, target.config, batch=1, tokens=k,
                                             context=context)
         for k in range(1, max_verify + 1)}
  for i, ids in enumerate(subsets):
    config, params = ((draft.config, draft.params) if not len(ids) else
                      cut_head(draft.config, draft.params, ids))
    fns[("draft", i)] = studies.forward_call(jax.device_put(params), config, batch=1, tokens=1,
                                             context=context)
  seconds, _ = timing.interleaved_seconds(fns, repeats, warmup=True)
  unit = seconds[("target", 1)]
  return ([seconds[("draft", i)] / unit for i in range(len(subsets))],
          {k: seconds[("target", k)] / unit for k in range(1, max_verify + 1)}, unit)
