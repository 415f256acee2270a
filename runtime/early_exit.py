"""`shallow` beside `full`: the early exit for drafting, with caches of its own.

When a bundle has `full` (shallow and deep joined, exporter/joined.py), every target call goes through it,
and `shallow` runs only where a drafter needs the early-exit states of tokens it proposes (Kangaroo's
self-draft, the hierarchy's screen, PEARL's self-draft). Its caches are then its own, not full's: full
writes its caches on every verification, PEARL's drafting thread writes shallow's at the same time, and one
store grown (laid out again) from two threads would be a race. So shallow's cache misses what only full ran:
the prompt, and positions verified from another drafter's tokens. `EarlyExit` logs which token each of its
cache slots holds, and `catch_up` runs the final tokens it lacks before a drafter reads it (a prompt's
worth of two layers once a request, then nothing while one drafter drafts every position).

The states it gives are drafts' only: verification never reads them, so their rounding cannot move the
output away from AR.
"""

from __future__ import annotations

import numpy as np

from .backends.common import WrappedPiece

UNKNOWN = -1


class EarlyExit(WrappedPiece):
    """A shallow piece that remembers the token in each cache slot: a slot holds its token's keys and values
    for the prefix the log shows before it, so a call at `start` leaves everything after its rows unknown."""

    def __init__(self, piece, max_context: int) -> None:
        super().__init__(piece)
        self.tokens = np.full(max_context + 1, UNKNOWN, dtype=np.int64)

    def run(self, x, start: int, keep: int = 1, tree=None) -> dict:
        n = x.shape[1]
        self.tokens[start:] = UNKNOWN
        if tree is None:  # a tree's rows are not one prefix: leave them unknown
            self.tokens[start:start + n] = x[0]
        return self.piece.run(x, start, keep, tree)

    def catch_up(self, history: list[int], pos: int) -> None:
        """Makes the cache hold history[:pos], running the tokens from the first slot that does not."""
        if pos <= 0:
            return
        differ = np.flatnonzero(self.tokens[:pos] != np.asarray(history[:pos], dtype=np.int64))
        if differ.size:
            first = int(differ[0])
            self.run(np.asarray(history[first:pos], dtype=np.int64)[None, :], first)


def catch_up(pieces, history: list[int], pos: int) -> None:
    """Before a drafter calls shallow at `pos`: its cache holds the final tokens before it (a no-op when
    shallow and deep are the target, and every target call ran shallow)."""
    if isinstance(pieces.shallow, EarlyExit):
        pieces.shallow.catch_up(history, pos)
