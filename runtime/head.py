"""Drafting with the feature-level draft head (EAGLE-3's shape): the head reads what the target computed.

The head's cache slot t holds what it read at position t: the target's low, middle and high states of t
(`deep` emits them as `features`) and the token at t + 1; its output there predicts the token at t + 2. So
when a step starts at `pos` (history[-1] final but in no cache), the target states of every final position
before `pos` are known, and one head call over the slots not read yet ends on slot pos - 1, whose output is
the first draft (the token at pos + 1). Each further draft reads the head's own state of the slot before in
the high layer's place, [0, 0, state], as training-time test trained it (exporter/training/fit_head.py).

The target's states come from the deep calls themselves: `FeatureTap` keeps the `features` of deep's last
call, and `advance` queues the rows of the positions that became final. Whatever drafted the step (auto may
pick another drafter), every deep call is a verification or a plain step over final-or-rejected rows, so
the head never needs a call of its own to catch up beyond its first draft step.
"""

from __future__ import annotations

import time

import numpy as np

from .backends.common import TreeMask, WrappedPiece
from .decode import Pieces, ids_array
from .drafters import Draft, LookupDrafter, choose
from .policies import DraftPolicy
from .sampling import SamplingParams
from .tree import TreeShape, children, graft, next_frontier, select


class FeatureTap(WrappedPiece):
    """`deep`, keeping the `features` output of its last call (its rows are the call's positions)."""

    def __init__(self, piece) -> None:
        super().__init__(piece)
        self.features: np.ndarray | None = None
        self.start = 0  # the position of the features' first row

    def run(self, x, start: int, keep: int = 1, tree=None, **kw) -> dict:
        out = self.piece.run(x, start, keep, tree, **kw)
        self.features, self.start = out["features"], start
        return out

    def move_slots(self, src: list[int], dst: list[int]) -> None:
        """The caches' slots move, and the last call's feature rows with them, which the head reads as the
        states of the positions the rows now stand for."""
        self.piece.move_slots(src, dst)
        rows = self.features[:, [s - self.start for s in src]]
        self.features[:, [d - self.start for d in dst]] = rows


class HeadState:
    """The head's cache and the target states it has not read: its cache holds slots [0, seen) read from
    target states; `pending` holds the target states of final positions [seen, ...)."""

    def __init__(self, pieces: Pieces) -> None:
        self.piece, self.tap = pieces.head, pieces.deep

    def start(self, prompt: list[int]) -> None:
        self.seen, self.pending = 0, self.tap.features[:, :len(prompt)]

    def read(self, history: list[int]) -> tuple[dict[str, np.ndarray], float]:
        """Slots seen .. pos - 1 read the target's states and the tokens after them; returns the head's output at
        slot pos - 1 (the first draft's distribution) and the seconds spent on a backlog (the prompt, or steps
        other drafters ran), which is not a per-step cost."""
        pos = len(history) - 1
        t0 = time.perf_counter()
        backlog = self.pending.shape[1]
        out = self.piece.run(ids_array(history[self.seen + 1:pos + 1]), self.seen, extra={"features": self.pending})
        self.seen, self.pending = pos, self.pending[:, :0]
        return out, time.perf_counter() - t0 if backlog > 2 else 0.0

    def advance(self, final: int) -> None:
        rows = self.tap.features[:, :final]
        self.pending = rows if self.pending.shape[1] == 0 else np.concatenate([self.pending, rows], axis=1)


def own(state: np.ndarray) -> np.ndarray:
    """Draft slots' features [1, n, 3H]: the head's own states [1, n, H] in the high layer's place."""
    return np.concatenate([np.zeros((*state.shape[:2], 2 * state.shape[-1]), dtype=state.dtype), state], axis=-1)


class HeadDrafter:
    """Chains drafted by the head, token by token; a stopping rule (the draft-length policy) as every chain's."""

    name = "head"

    def __init__(self, pieces: Pieces) -> None:
        self.head = HeadState(pieces)
        self.piece, self.vocab_map, self.vocab_size = pieces.head, pieces.head_vocab, pieces.vocab_size

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self.head.start(prompt)

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        pos = len(history) - 1
        out, catchup = self.head.read(history)
        drafts, qs = [], []
        while True:
            x, q, signal = choose(out, params, rng, self.vocab_map, self.vocab_size)
            drafts.append(x)
            if q is not None:
                qs.append(q)
            if len(drafts) >= budget or not policy.keep_going(len(drafts), signal):
                break
            out = self.piece.run(ids_array([x]), pos + len(drafts) - 1, extra={"features": own(out["state"][:, -1:])})
        return Draft(drafts, qs or None, catchup_s=catchup)

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        self.head.advance(final)


class HeadTreeDrafter:
    """EAGLE-2's dynamic tree from the head (greedy): the tree grows as runtime/tree.py's drafter tree does,
    level by level from the likeliest leaves, each expansion one head call over the frontier with a tree mask.
    A node's slot reads its parent's head state and its own token, at the position its token's parent holds;
    slots before the step's are the target-fed ones every node sees. Prompt lookup's continuation joins as
    one more branch. Where rows off the tree's leading chain are not final (runtime/tree.settle_branch), the next step
    drafts afresh from the head rather than carrying them as a trunk."""

    name = "head-tree"

    def __init__(self, pieces: Pieces, shape: TreeShape, max_context: int) -> None:
        self.head = HeadState(pieces)
        self.piece, self.vocab_map, self.shape = pieces.head, pieces.head_vocab, shape
        self.lookup = LookupDrafter(pieces.vocab_size, max_context, shape.lookup)
        self.max_context = max_context
        self.keep, expand = (np.log(p) if p > 0 else -np.inf for p in (shape.keep, shape.expand))
        self.extend_floor = max(self.keep, expand)

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self.head.start(prompt)
        self.lookup.start(prompt, hidden)

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        pos = len(history) - 1
        out, catchup = self.head.read(history)
        room = max(0, min(self.shape.nodes, self.max_context - pos - 1))
        if room == 0:
            return Draft([], catchup_s=catchup)
        cands = children(out["logits"][0, -1], -1, 0.0, 1, self.shape.width, self.vocab_map)
        states = {-1: out["state"][:, -1:]}
        level, slot = list(range(len(cands))), pos
        for depth in range(2, self.shape.depth + 1):
            if slot + self.shape.width > self.max_context - 1:  # the head's cache ends here
                break
            frontier, visible = next_frontier(cands, level, self.shape.width, room, self.extend_floor, slot, pos)
            if not frontier:
                break
            mask = TreeMask(pos, np.array([depth - 2] * len(frontier)), visible)
            feats = own(np.concatenate([states[cands[i].parent] for i in frontier], axis=1))
            out = self.piece.run(ids_array([cands[i].token for i in frontier]), slot, keep=len(frontier), tree=mask,
                                 extra={"features": feats})
            slot += len(frontier)
            level = []
            for row, i in enumerate(frontier):
                states[i] = out["state"][:, row:row + 1]
                kids = children(out["logits"][0, row], i, cands[i].score, depth, self.shape.width, self.vocab_map)
                level.extend(range(len(cands), len(cands) + len(kids)))
                cands.extend(kids)
        tokens, parents = select(cands, min(room, sum(c.score >= self.keep for c in cands)))
        tokens[0] = history[-1]
        n, end = self.lookup.match(history) if self.shape.lookup else (0, -1)
        if n:
            graft(tokens, parents, history[end + 1:end + 1 + min(self.lookup.max_tokens,
                                                                    self.max_context - pos - len(tokens))])
        if len(tokens) == 1:
            return Draft([], catchup_s=catchup)
        return Draft(tokens[1:], parents=parents, catchup_s=catchup)

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        self.head.advance(final)
