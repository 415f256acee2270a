"""The draft-then-verify loop, for every drafter (runtime/drafters.py) and draft-length policy
(runtime/policies.py).

State between steps: `history` holds the final tokens; all but the last are in every target cache.
A step drafts from the last one (at most the policy's budget), verifies all drafts with one `deep`
call over their shallow states (the self-drafter made them while drafting, so the shallow layers
never run twice on a token; for other drafters one shallow call makes them), and keeps the accepted
prefix plus the target's own next token. Caches are rolled back by moving the position: nothing is
copied or cleared. A draft may be a token tree (runtime/tree.py, greedy): the same calls then take a
tree mask; the target's branch through the tree is final as far as rows computed exactly like AR's
decide it, and the tree drafter verifies the rest again in the next step (`settle_branch`). With `full_trees`
every row is, so the whole branch is final, and its cache entries are the one thing ever copied: they
move from the tree's slots to consecutive ones (`tree.lay_out_branch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from .backends.common import TreeMask
from .decode import Pieces, ids_array, prefill
from .drafters import Draft, Drafter
from .policies import DraftPolicy
from .sampling import SamplingParams, pick, probabilities, sample
from .stats import Stats
from .tree import lay_out_branch, settle_branch, tree_depth


def judge(draft: int, q: np.ndarray | None, logits: np.ndarray, params: SamplingParams,
          rng: np.random.Generator | None) -> int | None:
    """None when the target accepts `draft` at a position whose logits are `logits`; otherwise the token it
    emits there instead. Greedy: accept the argmax. Sampling (Leviathan et al.): accept x ~ q with
    probability min(1, p(x)/q(x)), else draw from norm(max(0, p - q)); this gives exactly p."""
    if params.greedy:
        target = int(np.argmax(logits))
        return None if draft == target else target
    p = probabilities(logits, params)
    if rng.random() * q[draft] < p[draft]:
        return None
    residual = np.maximum(p - q, 0.0)
    return sample(residual / residual.sum(), rng)


def verify(drafts: list[int], qs: list[np.ndarray] | None, logits: np.ndarray, params: SamplingParams,
           rng: np.random.Generator, rule: Callable = judge) -> list[int]:
    """Accepted drafts + the target's next token. logits[i] is the target's view after drafts[:i]: the
    drafts are judged in order up to the first rejection, whose replacement ends the step; after a full
    acceptance the bonus token is drawn from the target's last row. Lossless for greedy and sampling with
    the default `rule`, `judge` (runtime/verification.py passes a relaxed one)."""
    for i, d in enumerate(drafts):
        instead = rule(d, qs[i] if qs else None, logits[i], params, rng)
        if instead is not None:
            return [*drafts[:i], instead]
    return [*drafts, pick(logits[len(drafts)], params, rng)]


def speculative(pieces: Pieces, drafter: Drafter, policy: DraftPolicy, prompt: list[int], params: SamplingParams,
                rng: np.random.Generator, stats: Stats, max_context: int,
                accept: Callable = verify, full_trees: bool = False) -> Iterator[list[int]]:
    """Draft, verify with one deep call, keep what the target accepts; yields the new final tokens.
    `full_trees`: a tree's whole accepted branch is final (`tree.trees_in_full` says when it may be)."""
    hidden, logits = prefill(pieces, prompt, stats)
    drafter.start(prompt, hidden)
    history = [*prompt, pick(logits[0, -1], params, rng)]
    yield history[-1:]
    while True:
        pos = len(history) - 1  # history[-1] is final but in no cache yet
        t0 = time.perf_counter()
        budget = min(policy.budget(), max_context - pos - 1)  # every draft needs a cache slot
        draft = drafter.propose(history, budget, policy, params, rng) if budget > 0 else Draft([])
        t1 = time.perf_counter()
        hidden = draft.hidden
        tree = None if draft.parents is None else TreeMask.from_parents(draft.parents, pos)
        if hidden is None:
            hidden = pieces.shallow.run(ids_array([history[-1], *draft.tokens]), pos, tree=tree)["hidden"]
        logits = pieces.deep.run(hidden, pos, keep=hidden.shape[1], tree=tree)["logits"][0]
        if tree is None:
            new = accept(draft.tokens, draft.qs, logits, params, rng)
        else:  # greedy: the target's branch through the tree, as far as rows computed as AR's decide it
            new, rows = settle_branch(draft, logits, full_trees)
            if rows[-1] != len(rows) - 1:  # the branch leaves the leading chain: laid out as its chain
                lay_out_branch(pieces, pos, rows)
                hidden = hidden[:, rows]  # the drafters read the final positions' rows
        t2 = time.perf_counter()
        drafter.advance(hidden, pos, len(new))
        policy.observe(len(draft.tokens), len(new) - 1, t1 - t0, t2 - t1)
        stats.record_step(len(draft.tokens), len(new) - 1, t1 - t0, t2 - t1,
                          None if draft.parents is None else tree_depth(draft.parents))
        history.extend(new)
        yield new
