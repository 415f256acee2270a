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

from .backends.common import WrappedPiece
from .decode import Pieces, ids_array
from .drafters import Draft, choose
from .policies import DraftPolicy
from .sampling import SamplingParams


class FeatureTap(WrappedPiece):
    """`deep`, keeping the `features` output of its last call (its rows are the call's positions)."""

    def __init__(self, piece) -> None:
        super().__init__(piece)
        self.features: np.ndarray | None = None

    def run(self, x, start: int, keep: int = 1, tree=None, **kw) -> dict:
        out = self.piece.run(x, start, keep, tree, **kw)
        self.features = out["features"]
        return out


class HeadDrafter:
    """Chains drafted by the head, token by token; a stopping rule (the draft-length policy) as every chain's.

    `seen`: the head's cache holds slots [0, seen) read from target states; `pending` holds the target states
    of final positions [seen, ...) not read yet."""

    name = "head"

    def __init__(self, pieces: Pieces) -> None:
        self.piece, self.tap = pieces.head, pieces.deep
        self.vocab_map, self.vocab_size = pieces.head_vocab, pieces.vocab_size
        self.zeros: np.ndarray | None = None

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self.seen, self.pending = 0, self.tap.features[:, :len(prompt)]

    def own(self, state: np.ndarray) -> np.ndarray:
        """A draft slot's features: the head's own state in the high layer's place."""
        if self.zeros is None or self.zeros.dtype != state.dtype:
            self.zeros = np.zeros((1, 1, 2 * state.shape[-1]), dtype=state.dtype)
        return np.concatenate([self.zeros, state[:, -1:]], axis=-1)

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        pos = len(history) - 1
        t0 = time.perf_counter()
        backlog = self.pending.shape[1]
        # slots seen .. pos - 1 read the target's states and the tokens after them
        out = self.piece.run(ids_array(history[self.seen + 1:pos + 1]), self.seen, extra={"features": self.pending})
        catchup = time.perf_counter() - t0 if backlog > 2 else 0.0  # the prompt, or other drafters' steps
        self.seen, self.pending = pos, self.pending[:, :0]
        drafts, qs = [], []
        while True:
            x, q, signal = choose(out, params, rng, self.vocab_map, self.vocab_size)
            drafts.append(x)
            if q is not None:
                qs.append(q)
            if len(drafts) >= budget or not policy.keep_going(len(drafts), signal):
                break
            out = self.piece.run(ids_array([x]), pos + len(drafts) - 1, extra={"features": self.own(out["state"])})
        return Draft(drafts, qs or None, catchup_s=catchup)

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        rows = self.tap.features[:, :final]
        self.pending = rows if self.pending.shape[1] == 0 else np.concatenate([self.pending, rows], axis=1)
