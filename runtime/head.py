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

import threading
import time

import numpy as np

from .backends.common import TreeMask, WrappedPiece
from .decode import Pieces, ids_array
from .drafters import Draft, Step, choose, draft_of, one_token_steps
from .policies import DraftPolicy
from .sampling import SamplingParams
from .tree import Node, TreeGrower, TreeShape


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
    target states; `pending` holds the target states of final positions [seen, ...), queued by `advance` (on
    PEARL's verifier thread, hence the lock; every other use is on one thread)."""

    def __init__(self, pieces: Pieces) -> None:
        self.piece, self.tap = pieces.head, pieces.deep
        self.lock = threading.Lock()

    def start(self, prompt: list[int]) -> None:
        self.seen, self.pending = 0, self.tap.features[:, :len(prompt)].copy()
        self.last = self.pending[:, :0]  # the target states slot seen - 1 read, should a rollback re-read it

    def ready(self, pos: int) -> bool:
        """Whether the target states of every position before `pos` are known."""
        with self.lock:
            return self.seen + self.pending.shape[1] >= pos

    def read(self, seq: list[int], pos: int) -> tuple[dict[str, np.ndarray], bool]:
        """Slots seen .. pos - 1 read the target's states and the tokens after them (seq[seen + 1 .. pos]);
        returns the head's output at slot pos - 1 (the distribution of the draft for pos + 1) and whether it
        read a backlog (the prompt, or steps other drafters ran), whose time is not a per-step cost."""
        with self.lock:
            feats, self.pending = self.pending[:, :pos - self.seen], self.pending[:, pos - self.seen:]
        out = self.piece.run(ids_array(seq[self.seen + 1:pos + 1]), self.seen, extra={"features": feats})
        self.seen, self.last = pos, feats[:, -1:]
        return out, feats.shape[1] > 2

    def rollback(self, end: int) -> None:
        """Drafting restarts at position `end`: if slot end - 1 read the token at `end`, a draft the verifier has
        now replaced, it is read again."""
        if self.seen >= end:
            with self.lock:
                self.seen, self.pending = end - 1, np.concatenate([self.last, self.pending], axis=1)

    def advance(self, final: int) -> None:
        rows = self.tap.features[:, :final].copy()  # the next deep call writes new ones
        with self.lock:
            self.pending = rows if self.pending.shape[1] == 0 else np.concatenate([self.pending, rows], axis=1)


def own(state: np.ndarray) -> np.ndarray:
    """Draft slots' features [1, n, 3H]: the head's own states [1, n, H] in the high layer's place."""
    return np.concatenate([np.zeros((*state.shape[:2], 2 * state.shape[-1]), dtype=state.dtype), state], axis=-1)


class HeadDrafter:
    """Chains drafted by the head, token by token; a stopping rule (the draft-length policy) as every chain's.

    A step reads the target's states wherever they are known for every position before it (the first step of
    a sequential step; under PEARL, whenever the verifier has caught up), else the head's own state of the
    step before, as training-time test trained it. `seq` holds the final tokens, then the head's drafts."""

    name = "head"
    makes_hidden = False

    def __init__(self, pieces: Pieces) -> None:
        self.head = HeadState(pieces)
        self.piece, self.vocab_map, self.vocab_size = pieces.head, pieces.head_vocab, pieces.vocab_size

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self.head.start(prompt)
        self.seq = list(prompt)

    def step(self, token: int, pos: int, params: SamplingParams, rng: np.random.Generator | None) -> Step:
        del self.seq[pos + 1:]
        if len(self.seq) == pos:
            self.seq.append(token)
        catchup = False
        if self.head.ready(pos):
            out, catchup = self.head.read(self.seq, pos)
        else:
            out = self.piece.run(ids_array([token]), pos - 1, extra={"features": own(self.state)})
        self.state = out["state"][:, -1:]
        x, q, signal = choose(out, params, rng, self.vocab_map, self.vocab_size)
        return Step(None, x, q, signal, catchup)

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        self.seq = list(history)
        return draft_of(*one_token_steps(self, history, budget, policy, params, rng))

    def rollback(self, history: list[int]) -> None:
        self.seq = list(history)
        self.head.rollback(len(history) - 1)

    def verified(self, pos: int, final: int) -> None:
        self.head.advance(final)

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        self.head.advance(final)


class HeadTreeDrafter:
    """EAGLE-2's dynamic tree from the head (greedy), grown by runtime/tree.py's `TreeGrower` as the drafter's
    tree is: each expansion is one head call over the frontier with a tree mask. A node's slot reads its
    parent's head state and its own token, at the position its token's parent holds; slots before the step's
    are the target-fed ones every node sees. Where rows off the tree's leading chain are not final
    (runtime/tree.settle_branch), the next step drafts afresh from the head rather than carrying them as a trunk."""

    name = "head-tree"

    def __init__(self, pieces: Pieces, shape: TreeShape, max_context: int) -> None:
        self.head = HeadState(pieces)
        self.piece, self.shape, self.max_context = pieces.head, shape, max_context
        self.grower = TreeGrower(shape, pieces.head_vocab, pieces.vocab_size, max_context)

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self.head.start(prompt)
        self.grower.lookup.start(prompt, hidden)

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        pos = len(history) - 1
        t0 = time.perf_counter()
        out, backlog = self.head.read(history, pos)
        catchup = time.perf_counter() - t0 if backlog else 0.0
        states = {-1: out["state"][:, -1:]}  # the head's state at each expanded node; -1: the root's

        def expand(cands: list[Node], frontier: list[int], slot: int, visible: np.ndarray, depth: int) -> np.ndarray:
            mask = TreeMask(pos, np.array([depth - 2] * len(frontier)), visible)
            feats = own(np.concatenate([states[cands[i].parent] for i in frontier], axis=1))
            res = self.piece.run(ids_array([cands[i].token for i in frontier]), slot, keep=len(frontier), tree=mask,
                                 extra={"features": feats})
            states.update((i, res["state"][:, row:row + 1]) for row, i in enumerate(frontier))
            return res["logits"][0]

        nodes = max(0, min(self.shape.nodes, self.max_context - pos - 1))
        tokens, parents = self.grower.grow(history, out["logits"][0, -1], expand, pos, self.max_context - 1, nodes)
        if len(tokens) == 1:
            return Draft([], catchup_s=catchup)
        return Draft(tokens[1:], parents=parents, catchup_s=catchup)

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        self.head.advance(final)
