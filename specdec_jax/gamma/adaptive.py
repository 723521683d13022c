"""γ chosen per step and per row from this machine's costs (`gamma='auto'`).

Letters: B batch, G = γ_max (static), K = G + 1 target-call widths.

A cost table (`CostTable`; measured and cached per machine by `machine_costs`) gives
the cost s(γ) of one speculative step in which a row proposes γ drafts, in plain
(autoregressive) steps of the same batch, context and sampling:
  measured  s(γ) = t(a whole compiled step of call width γ+1) / t(a plain step), timed in
            the compiled decode loop itself (`machine_costs.measure_steps`): the draft,
            its sampling, the verifier, the lookup and the bookkeeping included;
  modelled  s(γ) = γ c + v(γ+1) (`step_cost` of `draft_calls(γ)`) from c = draft
            call / target call (one token) and v(k) = target call over k tokens / over 1
            (`studies`).
The model leaves out everything but the two models' forward calls (the draft's sampling,
the verifier and the bookkeeping: a sizeable part of a step on a small CPU target, more at
temperature > 0, where every drafted token is sampled over the whole vocabulary), so the
measured form is the one the scripts use.
Each row b keeps a belief about its acceptance per proposal source src (DRAFT = 0: the
draft model; LOOKUP = 1: a hybrid draft's prompt lookup, which is right far more often
where it matches): discounted sums of the exact β_i = Σ min(p_i, q_i) at the drafted
positions it observed from that source, of their squares, and of their count, twice
(`Belief`),
  S ← k·S + β_i,  Q ← k·Q + β_i²,  n ← k·n + 1,  f ← k·f,
  m ← EVIDENCE_KEEP·m + 1                             per observed position, in order,
  S, Q, n, f, m ← FORGET·(S, Q, n, f, m)              per step the column observes nothing,
with the mean α̂ = (S + f·n₀·α₀) / (n + f·n₀) (α₀ = ALPHA_PRIOR[src], n₀ = PRIOR_WEIGHT
pseudo-positions, f = 1 at the start: the prior fades like any evidence), the spread of
β about it σ̂² = α̂(1-α̂) - (S - Q) / n (the Bernoulli spread of the mean less the spread
within each observed β, β(1-β), on average over the observed positions alone: the prior's
pseudo-positions carry a mean, not a spread; α̂(1-α̂) before any evidence), and the
optimistic bound
α⁺ = min(1, α̂ + OPTIMISM·sqrt(σ̂² / (m + f·n₀))).
At T = 0 every β_i is 0 or 1, so Q = S and σ̂² = α̂(1-α̂), the Bernoulli variance. At
T > 0 β_i is a probability, whose spread over positions lies far below α̂(1-α̂)
(measured: docs/results.md#gamma-rules-t1), so a bound sized for Bernoulli draws would
keep a row just below the threshold probing far longer than its evidence warrants.
The mean's discount k = 1 - g is set by how noisy each β is, as in the steady state of a
Kalman filter that tracks a drifting level (gain g ≈ sqrt(drift / noise) for small
gains): g = MEMORY_GAIN / sqrt(ρ), ρ = σ̂² / (α̂(1-α̂)) the row's observed spread of β
against Bernoulli draws of its mean, held to MIN_SPREAD..1 (taken from the belief before
the step). At T = 0, ρ = 1 and the mean weighs about the last 1 / MEMORY_GAIN = 20
positions: each β is a 0/1 draw, and a shorter mean would swing between γ choices on
the noise of a few draws. At T > 0 the β vary less, the mean can follow the text more
closely, and it weighs down to the last sqrt(MIN_SPREAD) / MEMORY_GAIN = 10 at
ρ = MIN_SPREAD (where not noise_memory: k = KEEP always). The bound's width stands on
about the last 1 / (1 - EVIDENCE_KEEP) = 50, so it keeps narrowing as the row observes
more (with the mean's own count, the width could never fall below sqrt(σ̂²/20), about
0.11 at a Bernoulli α̂ = 0.6, and a row that close below the table's threshold would probe
on every step). FORGET leaves the mean of a row that stopped drafting where it was and
shrinks the evidence it stands on, so its bound widens with time.
A step's source is LOOKUP where a hybrid's lookup matches the row's known tokens, else
DRAFT (always DRAFT for the other kinds). Each source has its own step costs: in a step
where every proposing row takes the lookup, the hybrid's feature draft runs its re-read
only (q_1 and its cache), not its deeper drafts, so s_lookup(γ) < s(γ) for γ >= 2.
A position is observed when the row proposed it and reached it (every earlier draft
accepted). Each step row b takes, with src its source this step and
  best(α) = argmax_{γ in 0..G} E(α, γ) / s_src(γ),   E(α, γ) = Σ_{j=0..γ} α^j
(Leviathan et al. §3 with this machine's measured costs; ties go to the smaller γ):
  γ_b = best(α̂)   where that drafts (exploit),   else best(α⁺)   (a probe, or 0),
and a probe only where it can pay: where the belief after its best outcome (every probed
draft accepted, β = 1) would make the row draft on its mean (`BeliefRule.probe_can_pay`;
else γ_b = 0). A probe whose best outcome leaves the choice at 0 buys information no
later step acts on; under a table where drafting pays only at α near 1, such probes
are all a row would draft.
This is optimism under uncertainty with discounted evidence (the discounted UCB of
Garivier and Moulines 2011): a fresh row's bound drafts from its first step whatever the
prior's mean wherever the table's threshold lies below that bound, a row whose drafts
were rejected stops drafting once α⁺ falls below the table's threshold (never, for a row
within sqrt(σ̂²(1-EVIDENCE_KEEP)) below it: EVIDENCE_KEEP caps m at
1 / (1 - EVIDENCE_KEEP)), and probes again
once enough of its evidence has faded; a probe is worth more the closer α̂ sits to the
threshold and the longer the row went unobserved, the value of the information it buys
(docs/background.md#gamma).
A γ_b = 0 step observes nothing and, for a draft that can fall behind (`Draft.skip_lag`
> 0: every model draft), does not run the draft when no live row drafts: it costs a plain
step, s(0) ≈ 1, and the draft catches up on the skipped tokens when it next runs
(`Draft.catch_up`, `decoding.loop`). The choice depends only on the row's own past, so
the verifiers' `num_proposed` rule keeps every emitted token distributed as p.
Everything above from "Each row b keeps a belief" on is `BeliefRule`, the default γ rule;
`GammaRule` is the protocol any other rule meets (its state, choice, observation and call
widths), and the decode loop and the replay run any such rule unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# A γ_max for gamma='auto' when none is given: each further draft adds only α^(γ+1)
# expected tokens while widening the target call, whose cost v(k) grows with k
# (docs/background.md#formulas; measured v(k): docs/results.md#heldout).
DEFAULT_GAMMA_MAX = 4
DRAFT, LOOKUP = 0, 1  # proposal sources: the draft model; a hybrid's prompt lookup
# The belief's prior mean α₀ per source and its weight n₀ in pseudo-positions; KEEP =
# 1 - MEMORY_GAIN, the mean's discount per observed position where β are 0/1 draws (T = 0:
# about the last 20 count), MIN_SPREAD the least observed spread ratio ρ its gain scales
# with (module docstring: at most MEMORY_GAIN / sqrt(MIN_SPREAD), about the last 10);
# EVIDENCE_KEEP, the same for the count the bound's width stands on (about the last 50);
# FORGET, the discount per step a column observes nothing; OPTIMISM, the bound's width in
# standard deviations. Chosen by replaying the held-out set's greedy decodes offline under
# each rule (scripts/gamma_policy_study.py; docs/results.md#gamma-rules).
ALPHA_PRIOR = (0.5, 0.8)
PRIOR_WEIGHT = 2.0
MEMORY_GAIN = 0.05
KEEP = 1.0 - MEMORY_GAIN
MIN_SPREAD = 0.25
EVIDENCE_KEEP = 0.98
FORGET = 0.99
OPTIMISM = 1.0
# Drafting "does not pay on this machine" when no γ >= 1 beats a plain step at this α.
PAYS_AT_ALPHA = 0.9


@dataclasses.dataclass(frozen=True)
class CostTable:
  """The costs of one (machine, target, draft): step_costs, when measured, s(0..G) of
  whole steps in plain steps (module docstring), which then decide; otherwise the model's
  c and v(1..G+1), v[0] = v(1) = 1 (a table may hold both; `machine_costs` measures the
  step costs alone). lookup_step_costs (a hybrid draft): s_lookup(0..G) of steps in
  which every proposing row takes the lookup's proposals; None: the same as step_costs."""

  c: float | None
  verify_costs: tuple[float, ...] | None
  step_costs: tuple[float, ...] | None = None
  lookup_step_costs: tuple[float, ...] | None = None

  def __post_init__(self):
    if (self.c is None) != (self.verify_costs is None):
      raise ValueError(f"cost table c and verify_costs go together (the modelled step "
                       f"costs), got c={self.c!r}, verify_costs={self.verify_costs!r}")
    if self.verify_costs is None and self.step_costs is None:
      raise ValueError("cost table needs step_costs or c and verify_costs, got none")
    widths = None
    if self.verify_costs is not None:
      if not (isinstance(self.c, (int, float)) and math.isfinite(self.c) and self.c >= 0):
        raise ValueError(f"cost table c must be a finite number >= 0, got {self.c!r}")
      v = tuple(self.verify_costs)
      if not v or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0
                          for x in v):
        raise ValueError(f"cost table verify_costs must be finite numbers > 0, got {v!r}")
      if abs(v[0] - 1.0) > 1e-6:
        raise ValueError(f"cost table verify_costs[0] is v(1) and must be 1, got {v[0]!r}")
      widths = ("verify_costs", len(v))
    if self.lookup_step_costs is not None and self.step_costs is None:
      raise ValueError("cost table lookup_step_costs needs step_costs (both are measured)")
    for name in ("step_costs", "lookup_step_costs"):
      s = getattr(self, name)
      if s is None:
        continue
      s = tuple(s)
      if not s or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0
                          for x in s):
        raise ValueError(f"cost table {name} must be finite numbers > 0, got {s!r}")
      if widths is None:
        widths = (name, len(s))
      elif len(s) != widths[1]:
        raise ValueError(f"cost table {name} has {len(s)} entries (s(0..)); it needs one "
                         f"per call width, {widths[1]} like {widths[0]}")

  def to_dict(self) -> dict:
    """The table as JSON-ready lists (`from_dict` reads it back exactly)."""
    def floats(values):
      return None if values is None else [float(x) for x in values]
    return dict(c=None if self.c is None else float(self.c),
                verify_costs=floats(self.verify_costs), step_costs=floats(self.step_costs),
                lookup_step_costs=floats(self.lookup_step_costs))

  @classmethod
  def from_dict(cls, stored: dict) -> "CostTable":
    """A table from `to_dict`'s form (a mapping with the four keys, missing = None);
    ValueError for a malformed one."""
    try:
      def floats(name):
        values = stored.get(name)
        return None if values is None else tuple(float(x) for x in values)
      return cls(c=None if stored.get("c") is None else float(stored["c"]),
                 verify_costs=floats("verify_costs"), step_costs=floats("step_costs"),
                 lookup_step_costs=floats("lookup_step_costs"))
    except (TypeError, AttributeError):
      raise ValueError(f"not a cost table: {str(stored)[:80]!r}") from None

  @property
  def max_gamma(self) -> int:
    """The largest γ the table covers (s(γ), or v(γ+1), known)."""
    return len(self.verify_costs if self.step_costs is None else self.step_costs) - 1

  def as_array(self, gamma_max: int) -> np.ndarray:
    """float32 [G+1]: s(0..G), the step costs the decode loop takes (measured, or
    modelled from c and v)."""
    if gamma_max > self.max_gamma:
      raise ValueError(f"gamma_max={gamma_max} needs v(k) up to k={gamma_max + 1}; the cost "
                       f"table covers k <= {self.max_gamma + 1}")
    if self.step_costs is not None:
      return np.asarray(self.step_costs[: gamma_max + 1], np.float32)
    return np.asarray([step_cost(draft_calls(g), self.c, self.verify_costs[g])
                       for g in range(gamma_max + 1)], np.float32)

  def loop_costs(self, gamma_max: int) -> np.ndarray:
    """float32 [2,G+1]: s_src(0..G) per proposal source (DRAFT, LOOKUP), the decode
    loop's cost input."""
    draft = self.as_array(gamma_max)
    if self.lookup_step_costs is None:
      return np.stack([draft, draft])
    return np.stack([draft, np.asarray(self.lookup_step_costs[: gamma_max + 1], np.float32)])

  def best_gamma(self, alpha: float, gamma_max: int | None = None) -> int:
    """Host-side twin of `choose_gamma` for one α."""
    g = self.max_gamma if gamma_max is None else gamma_max
    return int(np.asarray(choose_gamma(jnp.asarray([alpha], jnp.float32),
                                       jnp.asarray(self.as_array(g))))[0])

  def predicted_speedup(self, alpha: float, gamma: int) -> float:
    """E(α, γ) / s(γ): tokens per plain step's time when every step proposes γ."""
    return float(expected_tokens(alpha, gamma)[gamma] / self.as_array(gamma)[gamma])

  def drafting_pays(self, gamma_max: int | None = None, alpha: float = PAYS_AT_ALPHA) -> bool:
    """True when some γ >= 1 beats a plain step (cost 1, one token) at acceptance `alpha`."""
    g = self.max_gamma if gamma_max is None else gamma_max
    return any(self.predicted_speedup(alpha, k) > 1.0 for k in range(1, g + 1))


def draft_calls(gamma: int) -> int:
  """Draft calls of a chain step in which a row proposes γ drafts: γ (a γ = 0 step skips
  the draft; `decoding.step`). The one count of the modelled step costs (`step_cost`):
  the loop's choice, the studies' and the benchmark's predictions and the roofline all
  take it from here."""
  return int(gamma)


def step_cost(calls: int, c: float, verify_cost: float, verifier_cost: float = 0.0) -> float:
  """The modelled cost of one step in plain steps, calls·c + v(k) + verifier_cost: `calls`
  draft calls (`draft_calls(γ)` for a chain, the depth D for a tree) at c each, one target
  call over k tokens at v(k) = verify_cost (k = γ+1, or a tree's N+1), and the verifier's
  own time where it is modelled (the roofline), in target-call times."""
  return calls * c + verify_cost + verifier_cost


def expected_tokens(alpha, gamma_max: int):
  """E(α, γ) = Σ_{j=0..γ} α^j, the expected tokens of a step proposing γ drafts at
  acceptance α (Leviathan et al. 2023, §3), for γ = 0..G: [..., G+1] over alpha [...]
  (jnp for a jax array, else numpy float64)."""
  xp = jnp if isinstance(alpha, jax.Array) else np
  alpha = xp.asarray(alpha)
  return xp.cumsum(alpha[..., None] ** xp.arange(gamma_max + 1), axis=-1)


def choose_gamma(alpha: Array, costs: Array) -> Array:
  """int32 [B]: γ_b maximising E(α̂_b, γ) / s(γ) over 0..G.

  alpha float [B] (α̂); costs float32 [G+1] = s(0..G) (`CostTable.as_array`), or [B,G+1]
  (each row's own).
  """
  expected = expected_tokens(jnp.asarray(alpha), costs.shape[-1] - 1)  # [B,G+1]
  return jnp.argmax(expected / jnp.atleast_2d(costs), axis=1).astype(jnp.int32)


@flax.struct.dataclass
class Belief:
  """Each row's evidence about its acceptance per source (module docstring), float32
  [B,2] each: beta_sum (S, discounted Σ β), square_sum (Q, discounted Σ β²), count (n,
  positions discounted as S is: the mean's weight), prior (f, what is left of the prior's
  weight, 1 at the start) and evidence (m, positions discounted by EVIDENCE_KEEP: the
  bound's weight)."""

  beta_sum: Array
  square_sum: Array
  count: Array
  prior: Array
  evidence: Array


def initial_belief(batch: int) -> Belief:
  """Every row's belief before it observes anything: the prior alone (n = 0, f = 1)."""
  zeros = jnp.zeros((batch, len(ALPHA_PRIOR)), jnp.float32)
  return Belief(beta_sum=zeros, square_sum=zeros, count=zeros, prior=jnp.ones_like(zeros),
                evidence=zeros)


class GammaRule(Protocol):
  """What gamma 'auto' asks of a rule (`AutoGamma.rule`; docs/design.md#adding-a-gamma-rule).

  A rule is a frozen dataclass (hashable: a static of the compiled loop) with four methods.
  The decode loop traces them inside its step; the replay (`gamma_replay`) calls the same
  methods eagerly, one row at a time. B batch, G = γ_max.
    init(batch)          the rule's per-row state before any step: a pytree of arrays with
                         leading axis B (`DecodeState.rule_state`);
    choose(state, costs, source) -> int32 [B], γ_b in 0..G for this step; costs float32
                         [2,G+1] (`CostTable.loop_costs`), source int [B] (DRAFT or LOOKUP);
    observe(state, *, chosen, proposes, num_accepted, beta, source) -> the state after the
                         step: chosen int [B] (γ_b), proposes bool [B] (live rows that had
                         something to propose), num_accepted int [B], beta float32 [B,G] (the
                         exact β_i of each drafted position), source int [B];
    call_widths(gamma_max) -> the static target-call widths k = γ + 1 its choices need,
                         ascending, ending at G + 1 (the loop compiles one kind per width).
  Exactness asks one thing of a rule: row b's γ_b may depend on row b's own past (its
  state, which only `observe` of its own steps changes) and the costs, nothing else
  (docs/exactness.md). `BeliefRule` is the default; tests/test_custom_gamma_rule.py defines
  one outside the package.
  """

  def init(self, batch: int) -> Any: ...

  def choose(self, state: Any, costs: Array, source: Array) -> Array: ...

  def observe(self, state: Any, *, chosen: Array, proposes: Array, num_accepted: Array,
              beta: Array, source: Array) -> Any: ...

  def call_widths(self, gamma_max: int) -> tuple[int, ...]: ...


def check_rule(rule, gamma_max: int) -> None:
  """ValueError unless `rule` meets `GammaRule` (methods, hashable, its call widths)."""
  missing = [m for m in ("init", "choose", "observe", "call_widths")
             if not callable(getattr(rule, m, None))]
  if missing:
    raise ValueError(f"gamma='auto' rule {type(rule).__name__} lacks {', '.join(missing)} "
                     f"(gamma.adaptive.GammaRule)")
  try:
    hash(rule)
  except TypeError:
    raise ValueError(f"gamma='auto' rule {type(rule).__name__} must be hashable (a frozen "
                     f"dataclass): it is a static of the compiled loop") from None
  widths = tuple(rule.call_widths(gamma_max))
  if (not widths or list(widths) != sorted(set(widths)) or widths[0] < 1
      or widths[-1] != gamma_max + 1
      or not all(isinstance(k, (int, np.integer)) for k in widths)):
    raise ValueError(f"gamma='auto' rule {type(rule).__name__}.call_widths({gamma_max}) must "
                     f"be ascending ints in 1..{gamma_max + 1} ending at {gamma_max + 1}, got "
                     f"{widths!r}")


@dataclasses.dataclass(frozen=True)
class BeliefRule:
  """The default `GammaRule`: the belief and its choice (module docstring) under these
  constants. The decode loop runs `DEFAULT_RULE` unless a spec names another rule
  (`AutoGamma.rule`); the replay (`gamma_replay`) compares rules offline."""

  prior: tuple[float, float] = ALPHA_PRIOR
  prior_weight: float = PRIOR_WEIGHT
  keep: float = KEEP
  forget: float = FORGET
  evidence_keep: float = EVIDENCE_KEEP
  optimism: float = OPTIMISM
  lookahead: bool = True  # probe only where a probe's best outcome would make the row draft
  observed_spread: bool = True  # the bound's width from σ̂² (False: from α̂(1 - α̂))
  noise_memory: bool = True  # the mean's discount from the observed spread (False: keep)
  min_spread: float = MIN_SPREAD
  evidence_spread: bool = True  # σ̂²'s within-β part from observed positions alone

  def init(self, batch: int) -> Belief:
    """`initial_belief`: the rule's state (`GammaRule.init`)."""
    return initial_belief(batch)

  def call_widths(self, gamma_max: int) -> tuple[int, ...]:
    """Every width 1..G+1: the choice may take any γ in 0..G."""
    return tuple(range(1, gamma_max + 2))

  def weight(self, belief: Belief) -> Array:
    """float32 [B,2]: n + f n₀, the evidence the mean stands on."""
    return belief.count + belief.prior * self.prior_weight

  def bound_weight(self, belief: Belief) -> Array:
    """float32 [B,2]: m + f n₀, the evidence the bound's width stands on."""
    return belief.evidence + belief.prior * self.prior_weight

  def with_prior(self, belief: Belief, sums: Array) -> Array:
    """float32 [B,2]: (sums + f n₀ α₀) / (n + f n₀), a discounted mean of the observed
    values whose sums are given (S or Q) beside the prior's n₀ positions at α₀ (α₀ once
    nothing is left of either)."""
    prior = jnp.asarray(self.prior, jnp.float32)
    weight = self.weight(belief)
    total = sums + belief.prior * self.prior_weight * prior
    return jnp.where(weight > 1e-12, total / jnp.maximum(weight, 1e-12), prior)

  def mean(self, belief: Belief) -> Array:
    """float32 [B,2]: α̂ = (S + f n₀ α₀) / (n + f n₀) (α₀ once nothing is left of either)."""
    return self.with_prior(belief, belief.beta_sum)

  def observed_variance(self, belief: Belief) -> Array:
    """float32 [B,2]: σ̂², the spread of β about the mean: α̂(1 - α̂) - (S - Q) / w, the
    Bernoulli spread of the mean less the spread within each β (β(1 - β), 0 for a 0/1
    draw) on average. w = n where evidence_spread (the observed positions alone: the
    prior's pseudo-positions carry a mean, not a spread), else n + f n₀ (the prior's
    counted as 0/1 draws, σ̂² = (Q + f n₀ α₀) / (n + f n₀) - α̂²). α̂(1 - α̂) at T = 0,
    where Q = S, and before any evidence."""
    mean = self.mean(belief)
    within = belief.beta_sum - belief.square_sum
    weight = belief.count if self.evidence_spread else self.weight(belief)
    within = jnp.where(weight > 1e-6, within / jnp.maximum(weight, 1e-6), 0.0)
    return jnp.clip(mean * (1.0 - mean) - within, 0.0)

  def variance(self, belief: Belief) -> Array:
    """float32 [B,2]: the spread the bound's width takes: `observed_variance`, or
    α̂(1 - α̂) where not observed_spread."""
    if self.observed_spread:
      return self.observed_variance(belief)
    mean = self.mean(belief)
    return jnp.clip(mean - mean ** 2, 0.0)

  def mean_keep(self, belief: Belief) -> Array:
    """float32 [B,2]: k, the mean's discount per observed position: 1 - (1 - keep) /
    sqrt(ρ), ρ = σ̂² / (α̂(1 - α̂)) held to min_spread..1 (module docstring); keep
    itself where not noise_memory."""
    if not self.noise_memory:
      return jnp.full_like(belief.count, self.keep)
    mean = self.mean(belief)
    ratio = self.observed_variance(belief) / jnp.maximum(mean * (1.0 - mean), 1e-6)
    ratio = jnp.where(mean * (1.0 - mean) > 1e-6, ratio, 1.0)  # α̂ at 0 or 1: no spread to see
    return 1.0 - (1.0 - self.keep) / jnp.sqrt(jnp.clip(ratio, self.min_spread, 1.0))

  def bound(self, belief: Belief) -> Array:
    """float32 [B,2]: α⁺ = min(1, α̂ + OPTIMISM sqrt(σ̂² / (m + f n₀)))."""
    mean = self.mean(belief)
    spread = jnp.sqrt(self.variance(belief) / jnp.maximum(self.bound_weight(belief), 1e-12))
    return jnp.minimum(mean + self.optimism * spread, 1.0)

  def choose(self, belief: Belief, costs: Array, source: Array) -> Array:
    """int32 [B]: γ_b of the module docstring, best(α̂) where it drafts, else best(α⁺),
    on the step costs of each row's source this step.

    costs float32 [2,G+1] (`CostTable.loop_costs`); source int [B] (DRAFT or LOOKUP).
    """
    def own(alpha):
      return jnp.take_along_axis(alpha, source[:, None], axis=1)[:, 0]
    row_costs = jnp.asarray(costs)[source]
    exploit = choose_gamma(own(self.mean(belief)), row_costs)
    probe = choose_gamma(own(self.bound(belief)), row_costs)
    if self.lookahead:  # a probe that could not change the choice buys nothing: skip it
      probe = jnp.where(self.probe_can_pay(belief, probe, row_costs, source), probe, 0)
    return jnp.where(exploit > 0, exploit, probe)

  def probe_can_pay(self, belief: Belief, probe: Array, row_costs: Array,
                    source: Array) -> Array:
    """bool [B]: whether a probe of γ_b = probe_b drafts would leave row b drafting on
    its mean if every probed draft were accepted with β = 1, its best outcome. Where even
    that leaves best(α̂) = 0, the probe's information cannot change a later choice, so it
    is worth nothing and its cost s(γ) - E(α̂, γ) is lost. probe int [B]; row_costs float32
    [B,G+1]; source int [B]."""
    gamma_max = row_costs.shape[-1] - 1
    best_case = self.observe(
        belief, chosen=probe, proposes=probe > 0, num_accepted=probe,
        beta=jnp.ones((probe.shape[0], gamma_max), jnp.float32), source=source)
    after = jnp.take_along_axis(self.mean(best_case), source[:, None], axis=1)[:, 0]
    return choose_gamma(after, row_costs) > 0

  def observe(self, belief: Belief, *, chosen: Array, proposes: Array, num_accepted: Array,
              beta: Array, source: Array) -> Belief:
    """One step's bookkeeping, the same in the decode loop and the replay: the belief
    after the positions the step observed, in order.

    A position i is observed when the row proposed it (i <= γ_b) and reached it (every
    earlier draft accepted); the column of the row's source takes them (k = `mean_keep`
    of the belief before the step; S ← k S + β_i,
    Q ← k Q + β_i², n ← k n + 1, f ← k f, m ← EVIDENCE_KEEP m + 1 each), every
    column that observed nothing fades by FORGET.
    chosen int [B] (γ_b); proposes bool [B]; num_accepted int [B]; beta float [B,G]
    (β_i); source int [B] (the column this step updates).
    """
    j = jnp.arange(beta.shape[1])[None, :]
    observed = proposes[:, None] & (j <= num_accepted[:, None]) & (j < chosen[:, None])
    keep = self.mean_keep(belief)  # [B,2]
    total, square, count = belief.beta_sum, belief.square_sum, belief.count
    prior, evidence = belief.prior, belief.evidence
    column = jnp.arange(total.shape[1])[None, :] == source[:, None]  # [B,2]
    for i in range(beta.shape[1]):  # G is small and static
      hit = column & observed[:, i:i + 1]
      total = jnp.where(hit, keep * total + beta[:, i:i + 1], total)
      square = jnp.where(hit, keep * square + beta[:, i:i + 1] ** 2, square)
      count = jnp.where(hit, keep * count + 1.0, count)
      prior = jnp.where(hit, keep * prior, prior)
      evidence = jnp.where(hit, self.evidence_keep * evidence + 1.0, evidence)
    quiet = ~(column & observed.any(axis=1, keepdims=True))
    fade = jnp.where(quiet, self.forget, 1.0)
    return Belief(beta_sum=fade * total, square_sum=fade * square, count=fade * count,
                  prior=fade * prior, evidence=fade * evidence)


DEFAULT_RULE = BeliefRule()


def width_index(widths: tuple[int, ...], chosen: Array) -> Array:
  """int32 []: the branch of the narrowest of the static call widths (ascending) >= max_b
  γ_b + 1, the one place a step's width is chosen (`decoding.step.kind_index`). chosen int
  [B], each <= widths[-1] - 1."""
  need = jnp.max(chosen) + 1
  return jnp.sum(jnp.asarray(widths) < need).astype(jnp.int32)


def gamma_histogram(gammas: np.ndarray) -> dict[int, int]:
  """{γ: row-steps that used it} over the live entries of gammas int [B,steps] (-1 idle)."""
  values, counts = np.unique(np.asarray(gammas)[np.asarray(gammas) >= 0], return_counts=True)
  return {int(v): int(n) for v, n in zip(values, counts)}
