"""Token trees in the jitted decode loop: one tree step per loop iteration.

Letters: B batch, N drafted nodes, D max depth, V vocabulary, S cache slots,
F target feature width (a feature draft's fused layers), K most children of a position.
Node / position numbering as in `tree_shapes` (position 0 = the root = the pending
token, position i + 1 = node i).

A tree step for row b (length ℓ = num_tokens[b]-1, pending token t at position ℓ) keeps
the loop's decode-state invariant (`speculative`'s module docstring) and its caches:
  1. draft the tree level by level (nodes numbered level by level, depths non-decreasing):
     one draft call per depth over all nodes of that depth. Node i is written at draft
     slot ℓ+1+i, at position ℓ+depth(i), and attends the prefix slots <= ℓ and its own
     ancestors' slots (`tree_mask`). The children of a position are drawn per rule:
       'sampled': k children i.i.d. from q at that position (node i uses draft_keys[i]);
       'topk':    the k most likely tokens of the draft's logits there (deterministic;
                  at T=0 a greedy draft's top-k, not k copies of its argmax).
     A lookup draft (kind 'ngram', rule 'topk' only) needs no draft call: the root's K
     children are the first followers of up to K earlier matches with distinct first
     tokens, each heading a chain of its match's continuation (`ngram.lookup_candidates`;
     the shape must be such chains below the root, `lookup_tree_ranks`); it is a
     deterministic candidate set, so rule 'topk' is exact for it. A hybrid draft
     (kind 'hybrid', same rule and shapes) runs its feature draft's tree on every row and
     takes the lookup's tree on rows with a match of min_n..max_n tokens; the choice
     depends on known tokens only, so the candidate set is still deterministic.
     An independent draft (kind 'model') gets the root's q by feeding t at ℓ; a feature
     draft (kind 'feature') by the re-read of `drafting.draft_feature` (positions ℓ_d..ℓ,
     true target features), and each node's call takes as context the draft's hidden
     state at its parent's position (the chain's scan, gathered per node).
  2. one target call over [t, nodes 0..N-1] at slots ℓ..ℓ+N, positions ℓ + [0, depths],
     tree attention -> p_at [B,N+1,V] after the chain's warp (and the target's features).
     A dynamic tree (`TreeShape.budget` N') sends only the N' nodes of the largest draft
     log path probability Σ log q(x | parent) (draft logits / SELECTION_TEMPERATURE, not
     the sampling warp; `select_nodes`), in node order, at slots ℓ+1..ℓ+N'; their rows
     of p go back to their node positions and `node_mask` marks them (rule 'topk' only:
     which candidates a row sends depends on the draft alone, so each position's
     children are still a set chosen without the verifier's randomness, and the walk is
     exact);
  3. `tree_verify.tree_verify(shape, nodes, q_at, p_at, verify_keys, rule=...)` -> the
     accepted path (n nodes) and y; the row emits the path's tokens then y (`_emit`);
  4. the accepted path's K/V move to contiguous slots (node at depth d: from its call
     slot, ℓ+1+i for a static tree, to slot ℓ+d) in the target cache and an independent
     draft's cache; lengths become the new num_tokens-1. A feature draft instead takes the
     target's features at the root and the path as `features` and ℓ_d = ℓ+1, so the next
     re-read covers the accepted tokens exactly as after a chain step.
Records: accepted[b, s] = n, gammas[b, s] = D for live rows (-1 idle); accept_prob stays
zeros (β of a tree position is not defined by one q and one p).

State widths. The state is `speculative.init_state`'s with gamma = N (`prepare_generate`
does this for a tree): features then hold N+1 >= D+1 positions and the caches N slots
beyond the emitted tokens, room for the N+1 tokens of the target call at ℓ <= P+M-1.

Keys: the chain's roots (`speculative._step_keys`): draft_key, verify_key = split(step
key); node i is drawn with split(draft_key, N)[i] (the chain's draft_keys for a chain
shape); verify_key is `tree_verify`'s row key. At T=0 a chain shape with rule 'sampled'
gives exactly the chain's tokens (verifier='token', same γ); at T>0 the verifier's key
use differs from `verify`'s, so the two agree in law, not token for token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.drafts import ngram
from specdec_jax.drafts.drafting import feature_part, pending_tokens, with_length
from specdec_jax.models.model import ModelConfig, forward
from specdec_jax.models.sampling import SamplingConfig, sample
from specdec_jax.verification.tree_shapes import TreeShape
from specdec_jax.verification.tree_verify import TREE_VERIFIERS, tree_verify

Array = jax.Array
TREE_DRAFT_KINDS = ("model", "feature", "ngram", "hybrid")
# A dynamic tree ranks its candidates by log path probability under the draft's logits
# divided by this. Below 1 the ranking trusts the draft's first choices more than its
# raw probabilities say: under rule 'topk' a node is accepted when its token is the one
# the target draws (at T = 0 its argmax), which the draft's sharpened law tracks better.
# Chosen on the held-out prompt set at T = 0 (scripts/tree_study.py, this constant
# edited): 'dynamic:16:best:64' gave 2.17 / 2.32 / 2.31 tokens per target call at 0.25 /
# 0.5 / 0.7, and 'dynamic:15:best:64' 2.24 at 1 against 2.29 at 0.5. More candidates do
# not help: 'dynamic:16:best:128' gave 2.30 at 0.5.
SELECTION_TEMPERATURE = 0.5
LOOKUP_KINDS = ("ngram", "hybrid")  # rule 'topk', chains below the root


def lookup_tree_ranks(shape: TreeShape) -> np.ndarray | None:
  """int32 [N]: per node the rank of its depth-1 ancestor (the lookup candidate it reads),
  or None if the shape is not chains below the root (a node at depth >= 2 of rank > 0)."""
  if any(d > 1 and r > 0 for d, r in zip(shape.depths, shape.child_rank)):
    return None
  return np.asarray([path[0] for path in shape.rank_paths()], np.int32)


def check_tree(shape, rule: str, draft_config, vocab_size: int) -> None:
  """Raises ValueError naming the value if the loop cannot run this tree."""
  if not isinstance(shape, TreeShape):
    raise ValueError(f"tree must be a TreeShape (tree_shapes), got {type(shape).__name__}")
  if any(b < a for a, b in zip(shape.depths, shape.depths[1:])):
    raise ValueError(f"tree nodes must be numbered level by level (depths non-decreasing), "
                     f"got depths {shape.depths} for parents {shape.parents}")
  if rule not in TREE_VERIFIERS:
    raise ValueError(f"tree_rule must be one of {sorted(TREE_VERIFIERS)}, got {rule!r}")
  kind = getattr(draft_config, "kind", None)
  if kind not in TREE_DRAFT_KINDS:
    raise ValueError(f"a token tree needs a draft of kind in {TREE_DRAFT_KINDS}, got a "
                     f"draft of kind {kind!r}")
  if kind in LOOKUP_KINDS and rule != "topk":
    raise ValueError(f"a lookup draft's tree needs tree_rule 'topk' (its candidates are a "
                     f"deterministic set, not draws from q), got {rule!r}")
  if kind in LOOKUP_KINDS and lookup_tree_ranks(shape) is None:
    raise ValueError(f"a lookup draft's tree must be chains below the root (every node at "
                     f"depth >= 2 an only child, e.g. branching (3, 1, 1)), got rank paths "
                     f"{shape.rank_paths()}")
  if shape.budget is not None and (rule != "topk" or kind not in ("model", "feature")):
    raise ValueError(f"a dynamic tree (budget {shape.budget}) needs tree_rule 'topk' and a "
                     f"draft of kind 'model' or 'feature' (choosing among i.i.d. draws by "
                     f"their probability would bias them), got rule {rule!r}, kind {kind!r}")
  widest = shape.children_table().shape[1]
  if rule == "topk" and widest > vocab_size:
    raise ValueError(f"rule 'topk' needs at most vocab_size={vocab_size} children per "
                     f"position, the tree has {widest}")


def levels(shape: TreeShape) -> tuple:
  """Per depth 1..D: (first node, end) of that depth's contiguous node range."""
  depths = np.asarray(shape.depths)
  return tuple((int(np.searchsorted(depths, d)), int(np.searchsorted(depths, d, "right")))
               for d in range(1, shape.max_depth + 1))


def tree_mask(shape: TreeShape, length: Array, slots: int, rows) -> Array:
  """bool [B,R,S]: query positions `rows` (0 = root) attend the slots < ℓ, the root's
  slot ℓ and their own ancestors' (and own) slots ℓ+1+j. length: ℓ int32 [B]."""
  full = position_mask(shape)
  return _slot_mask(jnp.broadcast_to(jnp.asarray(full[np.asarray(rows)]),
                                     (length.shape[0], len(rows), full.shape[1])),
                    length, slots)


def position_mask(shape: TreeShape) -> np.ndarray:
  """bool [N+1,N+1]: position r attends position c (0 = the root, seen by all)."""
  full = np.zeros((shape.num_nodes + 1, shape.num_nodes + 1), bool)
  full[:, 0] = True
  full[1:, 1:] = shape.ancestor_mask()
  return full


def _slot_mask(visible: Array, length: Array, slots: int) -> Array:
  """visible bool [B,R,M+1] over the call's positions (the root at slot ℓ, position j at
  slot ℓ+j) -> bool [B,R,S]: those slots plus every slot < ℓ."""
  last = visible.shape[2] - 1
  rel = jnp.arange(slots)[None, :] - length[:, None]  # [B,S]
  at = jnp.broadcast_to(jnp.clip(rel, 0, last)[:, None, :], visible.shape[:2] + (slots,))
  tree = jnp.take_along_axis(visible, at, axis=2)  # [B,R,S]
  return (rel[:, None] < 0) | ((rel[:, None] <= last) & tree)


def select_nodes(shape: TreeShape, scores: Array) -> Array:
  """A dynamic tree's call nodes: int32 [B,N'] ascending, the N' = budget nodes of the
  largest draft log path probability scores [B,N] (ties: the lower index, so a parent,
  never less likely than its child, is chosen before it)."""
  return jnp.sort(jax.lax.top_k(scores, shape.budget)[1], axis=1).astype(jnp.int32)


def compact_path(cache: dict, length: Array, path: Array) -> dict:
  """Moves the path's K/V (node path[b, d-1] at slot ℓ+1+path) to slots ℓ+d, d = 1..D,
  every layer; slots past the path keep their entries. path int32 [B,D], -1 past n."""
  depth = path.shape[1]
  dest = length[:, None] + 1 + jnp.arange(depth)[None, :]  # [B,D]
  src = jnp.where(path >= 0, length[:, None] + 1 + path, dest)
  rows = jnp.arange(path.shape[0])[:, None]

  def move(x):  # [L,B,S,K,H]
    return x.at[:, rows, dest].set(x[:, rows, src])
  return {**cache, "k": move(cache["k"]), "v": move(cache["v"])}


def _children(shape: TreeShape, rule: str, start: int, end: int, q_at: Array, rank: Array,
              keys: Array, greedy: bool) -> Array:
  """The tokens of nodes start..end-1 -> int32 [B,end-start], from their parents' q_at
  [B,P,V] ('sampled', keys [B,N,2]) or draft logits rank [B,P,V] ('topk')."""
  parents = shape.parent_positions()[start:end]
  if rule == "topk":
    widest = shape.children_table().shape[1]
    top = jax.lax.top_k(rank[:, parents], widest)[1]  # [B,n,K]
    ranks = jnp.asarray(shape.child_rank[start:end])
    return jnp.take_along_axis(top, ranks[None, :, None], axis=2)[..., 0].astype(jnp.int32)
  draw = jax.vmap(jax.vmap(functools.partial(sample, greedy=greedy)))
  return draw(keys[:, start:end], q_at[:, parents])


def lookup_tree(state, *, shape: TreeShape, min_n: int, max_n: int) -> tuple[Array, Array]:
  """Step 1 for a lookup draft -> (nodes int32 [B,N], found bool [B]): node i is depth(i)'s
  token of the candidate its depth-1 ancestor's rank names (`ngram.lookup_candidates`);
  found: the row has a match of min_n..max_n tokens."""
  ranks = lookup_tree_ranks(shape)
  cands, found = ngram.lookup_candidates(state.tokens, state.num_tokens, min_n=min_n,
                                         max_n=max_n, count=int(ranks.max()) + 1,
                                         depth=shape.max_depth)  # [B,K,D]
  return cands[:, ranks, np.asarray(shape.depths) - 1], found[:, 0]


def draft_tree(target_params, draft_params, state, draft_keys: Array, *, shape: TreeShape,
               rule: str, draft_config: ModelConfig, warp_fn, vocab_size: int, greedy: bool):
  """Step 1 (module docstring) -> (nodes int32 [B,N], q_at float32 [B,N+1,V] (zeros at
  depth-D positions), draft cache, scores): scores float32 [B,N], each node's log path
  probability under the draft's logits / SELECTION_TEMPERATURE (NaN as -inf), for a
  dynamic tree; else None."""
  feature = draft_config.kind == "feature"
  length = state.num_tokens - 1
  own = (draft_config.num_layers,)
  embed = target_params["embed"] if feature else None
  if feature:  # the re-read of `drafting.draft_feature` (positions ℓ_d..ℓ_d+G)
    base = state.draft_cache["length"]
    offsets = jnp.arange(state.features.shape[1])[None, :]
    reread = jnp.take_along_axis(state.tokens, base[:, None] + offsets, axis=1)
    at = (length - base)[:, None]
    logits, cache, hidden = forward(draft_params, reread, base[:, None] + offsets,
                                    state.draft_cache, config=draft_config, input_embed=embed,
                                    target_features=state.features, hidden_layers=own,
                                    logits_at=at)
    hiddens = jnp.take_along_axis(hidden, at[:, :, None], axis=1)  # [B,1,Dm]: positions 0..
  else:
    logits, cache = forward(draft_params, pending_tokens(state)[:, None], length[:, None],
                            with_length(state.draft_cache, length), config=draft_config)
    hiddens = None
  rank = logits[:, :, :vocab_size]  # [B,P,V]: positions drafted so far
  q_at = warp_fn(logits)
  nodes, logq = [], []
  spans = levels(shape)
  slots = cache["k"].shape[2]
  for depth, (start, end) in enumerate(spans, 1):
    x = _children(shape, rule, start, end, q_at, rank, draft_keys, greedy)
    nodes.append(x)
    if shape.budget is not None:  # log q(x | parent) of the unwarped draft, for the ranking
      parent_logits = rank[:, shape.parent_positions()[start:end]] / SELECTION_TEMPERATURE
      logq.append(jnp.take_along_axis(jax.nn.log_softmax(parent_logits, axis=-1),
                                      x[:, :, None], axis=2)[..., 0])
    last = depth == len(spans)
    kw = dict(config=draft_config, return_logits=not last,
              attn_mask=tree_mask(shape, length, slots, np.arange(start, end) + 1))
    positions = jnp.broadcast_to((length + depth)[:, None], x.shape)
    cache = with_length(cache, length + 1 + start)
    if feature:
      context = jnp.take(hiddens, jnp.asarray(shape.parent_positions()[start:end]), axis=1)
      out = forward(draft_params, x, positions, cache, input_embed=embed, context=context,
                    hidden_layers=() if last else own, **kw)
      if not last:
        hiddens = jnp.concatenate([hiddens, out[2]], axis=1)
    else:
      out = forward(draft_params, x, positions, cache, **kw)
    cache = out[1]
    if not last:
      rank = jnp.concatenate([rank, out[0][..., :vocab_size]], axis=1)
      q_at = jnp.concatenate([q_at, warp_fn(out[0])], axis=1)
  leaves = shape.num_nodes + 1 - q_at.shape[1]
  q_at = jnp.pad(q_at, ((0, 0), (0, leaves), (0, 0)))
  scores = None
  if shape.budget is not None:  # log path probabilities, parents before children
    logq = jnp.concatenate(logq, axis=1)  # [B,N]
    logq = jnp.where(jnp.isnan(logq), -jnp.inf, logq)
    scores = jnp.zeros((logq.shape[0], 1), logq.dtype)  # the root's, position 0
    for start, end in spans:
      scores = jnp.concatenate(
          [scores, scores[:, shape.parent_positions()[start:end]] + logq[:, start:end]], 1)
    scores = scores[:, 1:]
  return jnp.concatenate(nodes, axis=1), q_at, cache, scores


def tree_step_fn(target_params, draft_params, state, *, target_config: ModelConfig,
                 draft_config: ModelConfig, shape: TreeShape, rule: str,
                 sampling: SamplingConfig, vocab_size: int, eos_id: int | None,
                 max_new_tokens: int):
  """One tree step for every row (module docstring) -> the new `speculative.DecodeState`.

  Not jitted; `speculative.decode_loop` runs it as its loop body when given a tree. The
  state must come from `init_state` with gamma >= N (module docstring, "State widths").
  """
  from specdec_jax.decoding import speculative as spec  # the loop imports this module lazily
  check_tree(shape, rule, draft_config, vocab_size)
  warp_fn = functools.partial(spec._warp_vocab, vocab=vocab_size,
                              temperature=sampling.temperature, top_k=sampling.top_k,
                              top_p=sampling.top_p)
  n_nodes, depth = shape.num_nodes, shape.max_depth
  feature = feature_part(draft_config) is not None
  length = state.num_tokens - 1
  split = jax.vmap(jax.random.split)(spec._step_keys(state))  # [B,2,2]
  draft_keys = jax.vmap(lambda k: jax.random.split(k, n_nodes))(split[:, 0])  # [B,N,2]
  if draft_config.kind == "ngram":  # rule 'topk' (check_tree): q is never read
    nodes, _ = lookup_tree(state, shape=shape, min_n=1, max_n=draft_config.max_n)
    q_at, draft_cache = None, None
  else:  # a hybrid's feature draft runs on every row: its cache stays the emitted tokens'
    nodes, q_at, draft_cache, scores = draft_tree(
        target_params, draft_params, state, draft_keys, shape=shape, rule=rule,
        draft_config=feature_part(draft_config) or draft_config, warp_fn=warp_fn,
        vocab_size=vocab_size, greedy=sampling.temperature == 0)
    if draft_config.kind == "hybrid":  # rule 'topk': rows with a match propose the lookup's
      looked, found = lookup_tree(state, shape=shape, min_n=draft_config.min_n,
                                  max_n=draft_config.max_n)
      nodes = jnp.where(found[:, None], looked, nodes)

  # the call's positions: 0 = the root, then every node or, for a dynamic tree, the
  # selected ones (call[b, j] = the node at position j+1 of row b's call)
  rows = jnp.arange(nodes.shape[0])[:, None]
  node_mask = None
  if shape.budget is None:
    call = jnp.broadcast_to(jnp.arange(n_nodes, dtype=jnp.int32), nodes.shape)
  else:
    call = select_nodes(shape, scores)  # [B,N']
    node_mask = jnp.zeros(nodes.shape, bool).at[rows, call].set(True)
  at = jnp.concatenate([jnp.zeros_like(call[:, :1]), call + 1], axis=1)  # [B,N'+1]
  target_in = jnp.concatenate([pending_tokens(state)[:, None],
                               jnp.take_along_axis(nodes, call, axis=1)], axis=1)
  positions = length[:, None] + jnp.asarray((0,) + shape.depths)[at]
  visible = jnp.asarray(position_mask(shape))[at[:, :, None], at[:, None, :]]  # [B,N'+1,N'+1]
  slots = state.target_cache["k"].shape[2]
  out = forward(target_params, target_in, positions, with_length(state.target_cache, length),
                config=target_config, attn_mask=_slot_mask(visible, length, slots),
                hidden_layers=feature_part(draft_config).feature_layers if feature else ())
  p_at = warp_fn(out[0])  # [B,N'+1,V]
  if shape.budget is not None:  # back to positions of the candidate tree (unsent: never read)
    p_at = jnp.zeros(p_at.shape[:1] + (n_nodes + 1,) + p_at.shape[2:],
                     p_at.dtype).at[rows, at].set(p_at)
  path, block, num_accepted = tree_verify(shape, nodes, q_at, p_at, split[:, 1], rule=rule,
                                          node_mask=node_mask)
  # the path's nodes as positions of the call (the target cache's slots ℓ+1+j)
  slot_of = jnp.full(nodes.shape, -1, jnp.int32).at[rows, call].set(
      jnp.arange(call.shape[1], dtype=jnp.int32))
  call_path = jnp.where(path >= 0, jnp.take_along_axis(slot_of, jnp.maximum(path, 0), 1), -1)

  live = ~state.done
  state = state.replace(
      accepted=state.accepted.at[:, state.step].set(jnp.where(live, num_accepted, -1)),
      gammas=state.gammas.at[:, state.step].set(jnp.where(live, depth, -1)))
  state, _ = spec._emit(state, jnp.maximum(block, 0), num_accepted + 1, eos_id=eos_id,
                        max_new_tokens=max_new_tokens)
  new_length = state.num_tokens - 1
  target_cache = with_length(compact_path(out[1], length, call_path), new_length)
  if feature:  # the target's features at ℓ (root) and the path, then ℓ_d = ℓ+1
    at = jnp.concatenate([jnp.zeros_like(path[:, :1]), call_path + 1], axis=1)  # [B,D+1]
    feats = jnp.take_along_axis(out[2], jnp.maximum(at, 0)[:, :, None], axis=1)  # [B,D+1,F]
    valid = jnp.concatenate([jnp.ones_like(path[:, :1], bool), path >= 0], axis=1)
    feats = jnp.where(valid[:, :, None], feats, 0)  # zeros past the path, as the chain pads
    width = state.features.shape[1]
    feats = jnp.pad(feats.astype(state.features.dtype),
                    ((0, 0), (0, width - depth - 1), (0, 0)))
    state = state.replace(features=feats)
    draft_cache = with_length(draft_cache, length + 1)
  elif draft_cache is not None:
    draft_cache = with_length(compact_path(draft_cache, length, path), new_length)
  return state.replace(target_cache=target_cache, draft_cache=draft_cache,
                       step=state.step + 1)
