"""The decode loops and their entry points: a prefill and one jitted `lax.while_loop`.

Letters: B batch, G drafted positions a step holds, P longest prompt, M max_new_tokens.

`speculative_generate(target, draft, prompts, spec=...)` and `autoregressive_generate`
check every argument on the host (`spec.prepare`), prefill (`state.init_state`, one
compiled program) and run `run_steps` (another), then return a `GenerationResult`.

`run_steps` is one `lax.while_loop` of steps until every row is done or M steps ran. A
chain step with several kinds (`step.step_kinds`: the proposer's call widths, e.g. every
width under gamma 'auto' or a lookup that may propose nothing; under gamma 'auto' a draft
with a skip lag has SKIP, the plain step that skips the draft, and CATCH_UP, the draft's
catch-up call that takes no step, in place of width 1) runs one inner `while_loop` per
kind inside the loop of steps, each taking the steps of its kind: one compiled loop, no
step under a conditional (whose branches XLA:CPU would hand copies of both caches). The plan of the
next step (`step.step_plan`) is computed once, after each step, and carried: it decides
the next kind (`step.kind_index`) and is the step's plan. The single jitted
`step.speculative_step` picks the width with a `lax.switch` instead and never skips the
draft; both give the same tokens at T = 0 and the same law at any temperature.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec_jax.decoding.results import GenerationResult, finish
from specdec_jax.decoding.spec import DecodeSpec, Prepared, prepare
from specdec_jax.decoding.state import DecodeState, init_state
from specdec_jax.decoding.step import (CATCH_UP, autoregressive_step_fn, kind_index,
                                       speculative_step_fn, step_kinds, step_plan)
from specdec_jax.decoding.tree_step import tree_step_fn
from specdec_jax.drafts.base import Draft
from specdec_jax.models.model import Model, ModelConfig

Array = jax.Array


def _any_live(state: DecodeState, axis_name: str | None) -> Array:
  live = jnp.any(~state.done).astype(jnp.int32)
  if axis_name is not None:  # every device loops until the last row anywhere is done
    live = jax.lax.pmax(live, axis_name)
  return live > 0


def run_steps(target_params, draft_params, state: DecodeState, costs: Array | None = None, *,
              target_config: ModelConfig, draft: Draft | None, spec: DecodeSpec,
              axis_name: str | None = None) -> DecodeState:
  """Steps from `state` until every row is done or state.step reaches max_new_tokens.

  draft None: autoregressive. costs: float32 [2,G+1] (`CostTable.loop_costs`, a traced
  input: any table, one compiled loop) for gamma 'auto'; None otherwise. axis_name: the
  pmap axis (`parallel.pmap_generate`); it changes no token. The cost table times its
  steps in this same compiled loop, from states it builds (`gamma.machine_costs`).
  """
  max_new = spec.max_new_tokens

  def cond(s):
    return _any_live(s, axis_name) & (s.step < max_new)

  if draft is None:
    body = functools.partial(autoregressive_step_fn, target_params, target_config=target_config,
                             spec=spec)
    return jax.lax.while_loop(cond, body, state)
  if spec.tree is not None:
    body = functools.partial(tree_step_fn, target_params, draft_params,
                             target_config=target_config, draft=draft, spec=spec)
    return jax.lax.while_loop(cond, body, state)
  step = functools.partial(speculative_step_fn, target_params, draft_params,
                           target_config=target_config, draft=draft, spec=spec)

  def planned(s):
    plan = step_plan(s, draft, spec, costs)
    return s, plan, kind_index(s, plan, draft, spec)

  kinds = step_kinds(draft, spec)
  if len(kinds) == 1:  # one width: plan and step
    return jax.lax.while_loop(
        cond, lambda s: step(s, step_plan(s, draft, spec, costs), width=kinds[0]), state)

  # Several kinds (`step.step_kinds`: call widths, and SKIP and CATCH_UP for a draft that
  # may be skipped): one inner while_loop per kind, each taking the steps of its kind, in
  # turn. The carried plan of the next step decides its kind (`step.kind_index`).
  def catch_up(s, plan):
    del plan  # the catch-up changes no row's plan
    return s.replace(draft_state=draft.catch_up(draft_params, target_params, s))

  runs = [catch_up if k == CATCH_UP else functools.partial(step, width=k) for k in kinds]

  def advance(carry, index):
    return planned(runs[index](carry[0], plan=carry[1]))

  def steps_at(carry, index):
    return jax.lax.while_loop(
        lambda c: jnp.any(~c[0].done) & (c[0].step < max_new) & (c[2] == index),
        functools.partial(advance, index=index), carry)

  final, _, _ = jax.lax.while_loop(
      lambda c: cond(c[0]), lambda c: functools.reduce(steps_at, range(len(runs)), c),
      planned(state))
  return final


def decode_loop(target_params, draft_params, tokens, prompt_len, row_keys,
                costs: Array | None = None, *, target_config: ModelConfig, draft: Draft | None,
                spec: DecodeSpec, axis_name: str | None = None, mesh=None) -> DecodeState:
  """Prefill (`init_state`) + `run_steps` in one function (pmap and the mesh path jit it
  whole; the generate functions compile the two parts as programs of their own). mesh:
  the device mesh of sharded inputs (`parallel.mesh_generate`), which pins the caches."""
  state = init_state(target_params, draft_params, tokens, prompt_len, row_keys,
                     target_config=target_config, draft=draft, gamma=spec.gamma,
                     max_new_tokens=spec.max_new_tokens, lag=spec.lag(draft),
                     proposer=spec.proposer, mesh=mesh)
  return run_steps(target_params, draft_params, state, costs, target_config=target_config,
                   draft=draft, spec=spec, axis_name=axis_name)


_STATICS = ("target_config", "draft", "spec", "axis_name")
decode_loop_jit = jax.jit(decode_loop, static_argnames=_STATICS + ("mesh",))
# the state is consumed: its buffers (both caches among them) are donated to the loop
run_steps_jit = jax.jit(run_steps, static_argnames=_STATICS, donate_argnums=(2,))
init_state_jit = jax.jit(init_state, static_argnames=(
    "target_config", "draft", "gamma", "max_new_tokens", "lag", "proposer", "mesh"))


def prefill(target: Model, draft_params, prepared: Prepared) -> DecodeState:
  """The starting state of a prepared call (`init_state_jit`), compiled under the same
  statics wherever it is called (the generate functions, the cost table)."""
  spec, draft = prepared.spec, prepared.draft
  return init_state_jit(target.params, draft_params, prepared.tokens, prepared.prompt_len,
                        prepared.row_keys, target_config=target.config, draft=draft,
                        gamma=spec.gamma, max_new_tokens=spec.max_new_tokens,
                        lag=spec.lag(draft), proposer=spec.proposer)


def run_prepared(target: Model, draft_params, state: DecodeState, prepared: Prepared,
                 costs=None) -> DecodeState:
  """`run_steps_jit` from `state` (consumed) under a prepared call's statics; costs: float32
  [2,G+1] in place of the prepared table (the cost table forces one width with it)."""
  return run_steps_jit(target.params, draft_params, state,
                       prepared.costs if costs is None else costs, target_config=target.config,
                       draft=prepared.draft, spec=prepared.spec)


def speculative_generate(target: Model, draft: Model, prompts, *, spec: DecodeSpec, seed=0,
                         row_ids=None, pad_id: int = 0,
                         prompt_width: int | None = None) -> GenerationResult:
  """Speculative sampling of up to spec.max_new_tokens per prompt, one jitted while_loop.

  target: `Model(config, params)`; draft: `Model(draft, params)` with a `Draft` (or a model
  draft's ModelConfig) and its params (None for a prompt lookup). spec: the run's
  `DecodeSpec`, whose proposer is FixedGamma, AutoGamma or TreeProposal.
  prompts: a list of B token-id lists (any lengths >= 1) or an int array [B,P].
  seed: an int or B ints; row b's randomness derives from (seed[b], row_ids[b]) only.
  prompt_width: pad the prompts to at least this width (`spec.prepare_prompts`).
  """
  prepared = prepare(target, draft, prompts, spec, seed=seed, row_ids=row_ids, pad_id=pad_id,
                     prompt_width=prompt_width)
  state = run_prepared(target, draft.params, prefill(target, draft.params, prepared), prepared)
  return finish(state, spec.max_new_tokens, pad_id)


def autoregressive_generate(target: Model, prompts, *, spec: DecodeSpec, seed=0, row_ids=None,
                            pad_id: int = 0, prompt_width: int | None = None) -> GenerationResult:
  """Plain sampling with the same warp, cache, loop and key roots as the speculative one
  (spec's proposer must be None; a spec made for a draft is taken without it)."""
  spec = spec if spec.proposer is None else DecodeSpec(
      max_new_tokens=spec.max_new_tokens, sampling=spec.sampling, eos_id=spec.eos_id,
      vocab_size=spec.vocab_size)
  prepared = prepare(target, None, prompts, spec, seed=seed, row_ids=row_ids, pad_id=pad_id,
                     prompt_width=prompt_width)
  state = run_prepared(target, None, prefill(target, None, prepared), prepared)
  return finish(state, spec.max_new_tokens, pad_id)
