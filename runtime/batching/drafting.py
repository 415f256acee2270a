"""Drafting for many rows at once: per draft position, one call of the drafter piece for every `model` row
still drafting at it, and one `shallow` + one `adapter` call for every `self` row, each row drafting as one
request alone does (runtime/drafters.py: ModelDrafter, SelfDrafter) in a cache row of its own.

A row's drafting cache lags its history when the row did not draft with that model lately (another source
drafted, or none, or it has just joined): the drafter has not read the final tokens since, the adapter not
their shallow states. Up to CATCH_UP of them ride along in the row's first drafting call, the rows padded to
the longest with trailing slots that no real token reads before the row rewrites them; a longer backlog is
read first in a call of the row's own, so that one row's backlog does not pad every other row's call.
"""

from __future__ import annotations

import numpy as np

from ..drafters import Draft, choose
from .request import Row
from .rows import BatchedPiece

CATCH_UP = 2  # entries a row brings to its first drafting call: after a fully accepted step, its last draft too


class DraftHead:
    """A drafting piece and its head's vocabulary (FR-Spec's pruned ids, or None for the full one)."""

    def __init__(self, piece: BatchedPiece, vocab_map: np.ndarray | None, vocab_size: int) -> None:
        self.piece, self.vocab_map, self.vocab_size = piece, vocab_map, vocab_size

    def call(self, seqs: list[np.ndarray], rows: list[Row], starts: list[int]) -> tuple[dict, list[int]]:
        """Rows of unequal lengths in one call, each padded to the longest by repeating its last entry; returns
        the outputs and, per row, where its last real entry's outputs are among the kept positions."""
        lengths = [len(s) for s in seqs]
        n = max(lengths)
        keep = n - min(lengths) + 1
        x = np.stack([np.concatenate([s, np.repeat(s[-1:], n - len(s), axis=0)]) for s in seqs])
        out = self.piece.run(x, [r.slot for r in rows], starts, keep=keep)
        return out, [length - 1 - (n - keep) for length in lengths]

    def take(self, row: Row, out: dict[str, np.ndarray], i: int, index: int) -> bool:
        """Adds row i's next draft, drawn from the call's outputs at `index`; True while the row drafts on."""
        view = {name: value[i:i + 1, index:index + 1] for name, value in out.items()}
        token, q, signal = choose(view, row.params, row.rng, self.vocab_map, self.vocab_size)
        row.draft.tokens.append(token)
        if q is not None:
            row.draft.qs.append(q)
        return len(row.draft.tokens) < row.limit and row.policy.keep_going(len(row.draft.tokens), signal)


def start(rows: list[Row]) -> None:
    for row in rows:
        row.draft = Draft([], None if row.params.greedy else [])


def draft_with_drafter(head: DraftHead, rows: list[Row]) -> None:
    """Drafts up to each row's limit with the drafter piece: one call per draft position for every row still
    drafting."""
    start(rows)
    active: list[tuple[Row, int, list[int]]] = []  # a row, where its feed goes, its feed
    for row in rows:
        cache = row.drafter
        at = cache.cached(row.history)
        feed = row.history[at:]
        if len(feed) > CATCH_UP:
            head.piece.run(np.asarray([feed[:-1]], dtype=np.int64), [row.slot], [at])
            cache.wrote(at, feed[:-1])
            at, feed = len(row.history) - 1, feed[-1:]
        cache.final = len(row.history)
        active.append((row, at, feed))
    while active:
        rows_now = [row for row, _, _ in active]
        out, index = head.call([np.asarray(feed, dtype=np.int64) for _, _, feed in active], rows_now,
                               [at for _, at, _ in active])
        going = []
        for i, (row, at, feed) in enumerate(active):
            row.drafter.wrote(at, feed)
            if head.take(row, out, i, index[i]):
                going.append((row, at + len(feed), [row.draft.tokens[-1]]))
        active = going


def draft_with_adapter(shallow: BatchedPiece, head: DraftHead, rows: list[Row]) -> None:
    """Drafts up to each row's limit with Kangaroo's early exit: per draft position one `shallow` call on the
    rows' last tokens, then one adapter call on those states (after any the adapter has not read yet).

    The shallow states made here feed only the adapter: the step's own shallow call makes them again for
    verification, which costs nothing more when other rows pad that call anyway and keeps one verification
    path for every source."""
    start(rows)
    for row in rows:
        state = row.adapter
        if state.pending.shape[1] >= CATCH_UP:
            head.piece.run(state.pending, [row.slot], [state.seen])
            state.seen, state.pending = state.seen + state.pending.shape[1], state.pending[:, :0]
    active = list(rows)
    while active:
        positions = [len(row.history) - 1 + len(row.draft.tokens) for row in active]
        tokens = [[row.draft.tokens[-1] if row.draft.tokens else row.history[-1]] for row in active]
        hidden = shallow.run(np.asarray(tokens, dtype=np.int64), [row.slot for row in active], positions)["hidden"]
        seqs = [np.concatenate([row.adapter.pending[0], hidden[i]]) for i, row in enumerate(active)]
        out, index = head.call(seqs, active, [row.adapter.seen for row in active])
        going = []
        for i, row in enumerate(active):
            state = row.adapter
            state.seen, state.pending = positions[i] + 1, state.pending[:, :0]
            if head.take(row, out, i, index[i]):
                going.append(row)
        active = going
