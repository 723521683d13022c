"""Exact verification of a token tree (multi-candidate speculative decoding).

Letters: B batch, N drafted nodes, D max depth, K most children of any position,
V vocabulary. Node / position numbering as in `tree_shapes` (position 0 = the root,
the pending token; position i + 1 = node i).

Inputs per row:
  tokens [B,N]      the drafted token of every node;
  q_at [B,N+1,V]    the draft's law at every position (the distribution the children of
                    that position were drawn from); node i was drawn from q_at[parents[i]+1];
  p_at [B,N+1,V]    the target's law at every position, after the same warp as q.
One target call over the N nodes (tree attention) gives p_at; position j's row is the
target's next-token law after the prefix, the root and the path down to position j.

The walk starts at the root and, at the current position with target law p, applies one
of two rules (`TREE_VERIFIERS`):
  "sampled" (SpecInfer multi-step speculative sampling; Miao et al., "SpecInfer", ASPLOS
      2024): the children x_1..x_k were drawn i.i.d. from q. For i = 1..k: accept x_i iff
      u_i q(x_i) < p(x_i) (probability min(1, p(x_i)/q(x_i))); on rejection
      p <- norm(max(p - q, 0)) (p itself if that mass underflows) and q stays. If all are
      rejected, emit y ~ p (the last residual) and stop.
  "topk" (a deterministic candidate set, e.g. the draft's top-k as in EAGLE-2; Li et al.
      2024): draw y ~ p; if y is a child's token, descend into the first such child,
      else emit y and stop. Exact for any candidate set chosen without the verifier's
      randomness, so it never reads q.
On descending, the walk moves to the child's position (its own p and q). A position with
no children (a leaf, every node at depth D) emits a bonus token y ~ p there. The row
emits its accepted path x_1..x_n then y: n + 1 tokens, 1 to D + 1. Every emitted token is
distributed as the target's p given the emitted prefix (the law tests enumerate it).

Broken drafts (as `verify.valid_proposals`; docs/exactness.md#broken-drafts). A node is
*proposed* iff
  sampled: its q row q_at[parent] is a distribution (finite, >= 0, |Σ - 1| <=
           Q_SUM_TOLERANCE) and 0 <= x < V with q(x) > 0 (`valid_proposals` on the node);
  topk:    0 <= x < V (q is not read);
and node_mask (optional bool [B,N]) holds, and its parent is proposed (or the root). A
node that is not proposed is never accepted and, for "sampled", is skipped without a
residual update (siblings are i.i.d., so the others keep their law); a walk that reaches
a position with a broken q row therefore emits y ~ p there. No non-finite q reaches the
arithmetic. Greedy (one-hot p): "sampled" accepts the first child equal to the argmax; its
residual stays that one-hot; "topk" draws the argmax: both follow the target's argmax.

Keys: `key` is one PRNG key or B keys. One key gives row b the key fold_in(key, b), so a
row's output depends only on (key, b, its inputs), never on the batch size or the other
rows. At depth d = 0..D a row key r gives k_accept, k_sample = split(fold_in(r, d)):
u_1..u_K = uniform(k_accept, (K,)) (u_i for the child of rank i-1) and
y = sample(k_sample, law at the stop) ("topk" draws its y from k_sample at every depth).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec_jax.models.sampling import sample
from specdec_jax.verification.tree_shapes import TreeShape
from specdec_jax.verification.verify import residual_distribution, valid_proposals

Array = jax.Array


def _row_keys(key: Array, batch: int) -> Array:
  """[B] keys: fold_in(key, b) for one key, or `key` itself if it holds B keys."""
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  single_ndim = 0 if typed else 1
  if key.ndim == single_ndim:
    return jax.vmap(lambda b: jax.random.fold_in(key, b))(jnp.arange(batch, dtype=jnp.uint32))
  if key.ndim == single_ndim + 1 and key.shape[0] == batch:
    return key
  raise ValueError(f"key must be one PRNG key or a batch of {batch} keys, got shape {key.shape}")


def _check_args(shape, tokens, q_at, p_at, node_mask):
  """Shape checks naming the bad value; returns (tokens int32, q f32, p f32, mask bool)."""
  if not isinstance(shape, TreeShape):
    raise ValueError(f"shape must be a TreeShape, got {type(shape).__name__}")
  n = shape.num_nodes
  tokens = jnp.asarray(tokens)
  if tokens.ndim != 2 or tokens.shape[1] != n or not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"tokens must be an int array [B,N] = [B,{n}], got {tokens.dtype} "
                     f"{tokens.shape}")
  b = tokens.shape[0]
  p_at = jnp.asarray(p_at, jnp.float32)
  if p_at.ndim != 3 or p_at.shape[:2] != (b, n + 1):
    raise ValueError(f"p_at must be [B,N+1,V] = [{b},{n + 1},V], got {p_at.shape}")
  v = p_at.shape[2]
  if q_at is None:
    q_at = jnp.zeros((b, n + 1, v), jnp.float32)
  q_at = jnp.asarray(q_at, jnp.float32)
  if q_at.shape != (b, n + 1, v):
    raise ValueError(f"q_at must be [B,N+1,V] = {(b, n + 1, v)}, got {q_at.shape} "
                     f"(draft and target vocabularies must match)")
  if node_mask is None:
    node_mask = jnp.ones((b, n), bool)
  node_mask = jnp.asarray(node_mask)
  if node_mask.shape != (b, n):
    raise ValueError(f"node_mask must be bool [B,N] = {(b, n)}, got {node_mask.shape}")
  return tokens.astype(jnp.int32), q_at, p_at, node_mask.astype(bool)


def proposed_nodes(shape: TreeShape, tokens: Array, q_at: Array | None, *, rule: str,
                   node_mask: Array | None = None) -> Array:
  """bool [B,N]: which nodes can be accepted (module docstring, "Broken drafts")."""
  b, n = tokens.shape
  vocab = q_at.shape[-1]
  ok = (tokens >= 0) & (tokens < vocab)
  if rule == "sampled":
    q_parent = q_at[:, shape.parent_positions()]  # [B,N,V]
    ok = valid_proposals(tokens.reshape(b * n, 1), q_parent.reshape(b * n, 1, vocab))
    ok = ok.reshape(b, n) == 1
  if node_mask is not None:
    ok = ok & node_mask
  # A node counts only if it and all its ancestors are proposed.
  ancestors = jnp.asarray(shape.ancestor_mask())
  return jnp.all(jnp.where(ancestors[None], ok[:, None, :], True), axis=-1)


def _sampled_node(p, q, child_tokens, child_ok, residual_fn):
  """SpecInfer at one position: p, q [V], children [K] -> (p(x_i) under the running
  residual [K], q(x_i) [K] (1 where not proposed), the law after all rejections [V])."""
  vocab = p.shape[-1]
  q = jnp.where(jnp.any(child_ok), q, 0.0)  # a broken q row has no proposed child

  def step(p_run, child):
    token, ok = child
    p_x = jnp.where(ok, p_run[token], 1.0)
    q_x = jnp.where(ok, q[token], 1.0)
    return jnp.where(ok, residual_fn(p_run, q), p_run), (p_x, q_x)

  tokens = jnp.clip(child_tokens, 0, vocab - 1)
  p_final, (p_x, q_x) = jax.lax.scan(step, p, (tokens, child_ok))
  return p_x, q_x, p_final


def _first(flags):
  """(any, index of the first True) of a bool [K]."""
  return jnp.any(flags), jnp.argmax(flags)


def _walk_row(tokens, q_at, p_at, key, proposed, *, shape, rule, residual_fn):
  """One row: tokens [N], q_at/p_at [N+1,V], key, proposed [N] -> (path [D], out [D+1], n)."""
  table = jnp.asarray(shape.children_table())  # [N+1,K]
  width, depth = table.shape[1], shape.max_depth
  pos, done, n = jnp.int32(0), jnp.bool_(False), jnp.int32(0)
  path = jnp.full((depth,), -1, jnp.int32)
  out = jnp.full((depth + 1,), -1, jnp.int32)
  for d in range(depth + 1):
    kids = table[pos]
    kid_ok = (kids >= 0) & proposed[jnp.maximum(kids, 0)]
    kid_tokens = tokens[jnp.maximum(kids, 0)]
    k_accept, k_sample = jax.random.split(jax.random.fold_in(key, d))
    p = p_at[pos]
    if rule == "sampled":
      u = jax.random.uniform(k_accept, (width,), jnp.float32)
      p_x, q_x, p_final = _sampled_node(p, q_at[pos], kid_tokens, kid_ok, residual_fn)
      accepted, first = _first((u * q_x < p_x) & kid_ok)
      y = sample(k_sample, p_final)
    else:
      y = sample(k_sample, p)
      accepted, first = _first(kid_ok & (kid_tokens == y))
    live = ~done
    descend = live & accepted
    emit = jnp.where(descend, kid_tokens[first], y)
    out = out.at[d].set(jnp.where(live, emit, out[d]))
    if d < depth:
      path = path.at[d].set(jnp.where(descend, kids[first], path[d]))
    pos = jnp.where(descend, kids[first] + 1, pos)
    n = n + descend.astype(jnp.int32)
    done = done | ~accepted
  return path, out, n


def tree_verify(shape: TreeShape, tokens: Array, q_at: Array | None, p_at: Array, key: Array,
                *, rule: str = "sampled", node_mask: Array | None = None,
                residual_fn=residual_distribution):
  """Verify a tree of drafts against the target; vectorized over rows.

  Jittable with `shape` and `rule` static (jax.jit(tree_verify, static_argnums=0,
  static_argnames="rule")).

  Args:
    shape: the static TreeShape (N nodes, depth D).
    tokens: int [B,N], the drafted token of every node.
    q_at: float [B,N+1,V], the draft's law at every position (module docstring); may be
      None for rule "topk", which never reads it.
    p_at: float [B,N+1,V], the target's law at every position, same warp as q.
    key: one PRNG key (row b uses fold_in(key, b)) or B keys.
    rule: "sampled" (SpecInfer, i.i.d. children) or "topk" (deterministic candidates).
    node_mask: bool [B,N] or None: nodes a row did not propose (dynamic trees).
    residual_fn: (p[V], q[V]) -> the law after a rejection. Only tests change it (the
      negative control keeps p).

  Returns:
    path: int32 [B,D], the accepted node indices, -1 past n.
    tokens: int32 [B,D+1], the emitted tokens: the path's tokens, then the correction
      or bonus token at index n; -1 past n.
    num_accepted: int32 [B], n (0..D).
  """
  if rule not in TREE_VERIFIERS:
    raise ValueError(f"rule must be one of {sorted(TREE_VERIFIERS)}, got {rule!r}")
  if rule == "sampled" and q_at is None:
    raise ValueError("rule 'sampled' needs q_at (the draft's laws), got None")
  tokens, q_at, p_at, node_mask = _check_args(shape, tokens, q_at, p_at, node_mask)
  proposed = proposed_nodes(shape, tokens, q_at, rule=rule, node_mask=node_mask)
  keys = _row_keys(key, tokens.shape[0])
  row = functools.partial(_walk_row, shape=shape, rule=rule, residual_fn=residual_fn)
  return jax.vmap(row)(tokens, q_at, p_at, keys, proposed)


def sampled_tree_verify(shape, tokens, q_at, p_at, key, **kw):
  """`tree_verify` with rule "sampled" (SpecInfer multi-step speculative sampling)."""
  return tree_verify(shape, tokens, q_at, p_at, key, rule="sampled", **kw)


def topk_tree_verify(shape, tokens, q_at, p_at, key, **kw):
  """`tree_verify` with rule "topk" (deterministic candidate sets, EAGLE-2 style)."""
  return tree_verify(shape, tokens, q_at, p_at, key, rule="topk", **kw)


TREE_VERIFIERS = {"sampled": sampled_tree_verify, "topk": topk_tree_verify}


# ------------------------------------------------------------ exact analysis (tests)

def _terms_row(tokens, q_at, p_at, proposed, *, shape, rule, residual_fn):
  """One row: the per-position accept probabilities and stop laws of the walk."""
  table = jnp.asarray(shape.children_table())
  kids_ok = (table >= 0) & proposed[jnp.maximum(table, 0)]  # [N+1,K]
  kid_tokens = tokens[jnp.maximum(table, 0)]

  def position(p, q, child_tokens, child_ok):
    if rule == "sampled":
      p_x, q_x, p_final = _sampled_node(p, q, child_tokens, child_ok, residual_fn)
      a = jnp.where(child_ok, jnp.minimum(1.0, p_x / q_x), 0.0)
      reach = jnp.cumprod(jnp.concatenate([jnp.ones((1,)), 1.0 - a[:-1]]))
      return a * reach, p_final
    vocab = p.shape[-1]
    hit = jax.nn.one_hot(jnp.clip(child_tokens, 0, vocab - 1), vocab) * child_ok[:, None]
    earlier = jnp.cumsum(hit, axis=0) - hit  # [K,V]: token already a proposed earlier child
    first = child_ok & (jnp.sum(hit * (earlier == 0), axis=-1) > 0)
    take = jnp.where(first, p[jnp.clip(child_tokens, 0, vocab - 1)], 0.0)
    rest = p * (1.0 - jnp.minimum(jnp.sum(hit, axis=0), 1.0))
    mass = jnp.sum(rest)
    return take, jnp.where(mass > 0, rest / jnp.where(mass > 0, mass, 1.0), p)

  descend, stop_law = jax.vmap(position)(p_at, q_at, kid_tokens, kids_ok)
  accept = jnp.zeros(shape.num_nodes + 1).at[jnp.where(table >= 0, table + 1, 0)].add(
      jnp.where(table >= 0, descend, 0.0))[1:]
  stop = 1.0 - jnp.sum(descend, axis=-1)
  return accept, stop, stop_law


def tree_verification_terms(shape: TreeShape, tokens: Array, q_at: Array | None, p_at: Array,
                            *, rule: str = "sampled", node_mask: Array | None = None,
                            residual_fn=residual_distribution):
  """The deterministic part of `tree_verify`, for exact (enumerated) analysis.

  Returns accept [B,N] (P(the walk descends into node i | it stands at i's parent)),
  stop [B,N+1] (P(the walk stops at position j | it stands there)) and stop_law
  [B,N+1,V] (the law y is drawn from when it stops at j). P(path x_1..x_n, then y) =
  Π accept along the path * stop[end] * stop_law[end, y].
  """
  if rule not in TREE_VERIFIERS:
    raise ValueError(f"rule must be one of {sorted(TREE_VERIFIERS)}, got {rule!r}")
  tokens, q_at, p_at, node_mask = _check_args(shape, tokens, q_at, p_at, node_mask)
  proposed = proposed_nodes(shape, tokens, q_at, rule=rule, node_mask=node_mask)
  row = functools.partial(_terms_row, shape=shape, rule=rule, residual_fn=residual_fn)
  return jax.vmap(row)(tokens, q_at, p_at, proposed)

