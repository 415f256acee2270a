"""The batched loop's two target calls: a joining request's prefill, and a step of every running row at once.

A step is the speculative loop of runtime/speculative.py with rows: each row's last final token and its
drafts (whatever drafted them: runtime/batching/drafting.py) are padded to one length (trailing slots that
causality hides from the row's real tokens), one `shallow` and one `deep` call run them all, and each row's
drafts are judged against its own logits by the same rule as one request alone, so a row keeps exactly the
tokens it would keep alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..sampling import pick
from ..speculative import verify
from .drafting import DraftHead
from .request import Row
from .rows import BatchedPiece


@dataclass
class BatchPieces:
    shallow: BatchedPiece
    deep: BatchedPiece
    adapter: DraftHead | None = None  # the bundle's drafting pieces, when it has them
    drafter: DraftHead | None = None


def prefill(pieces: BatchPieces, row: Row) -> tuple[list[int], np.ndarray]:
    """Reads a joining row's prompt into its caches (a one-row call, as Session's prefill); returns the first
    token and the prompt's shallow states [1, n, hidden] (the adapter reads them before it first drafts)."""
    ids = np.asarray(row.history, dtype=np.int64)[None, :]
    hidden = pieces.shallow.run(ids, [row.slot], [0])["hidden"]
    logits = pieces.deep.run(hidden, [row.slot], [0], keep=1)["logits"]
    return [pick(logits[0, -1], row.params, row.rng)], hidden


def step(pieces: BatchPieces, rows: list[Row]) -> tuple[list[list[int]], np.ndarray]:
    """One verification step for every row: returns each row's new final tokens (its accepted drafts and
    the target's own next token) and the step's shallow states [rows, n, hidden] (for the adapter)."""
    n = 1 + max(len(r.draft.tokens) for r in rows)
    ids = np.array([padded([r.history[-1], *r.draft.tokens], n) for r in rows], dtype=np.int64)
    slots, starts = [r.slot for r in rows], [len(r.history) - 1 for r in rows]
    hidden = pieces.shallow.run(ids, slots, starts)["hidden"]
    logits = pieces.deep.run(hidden, slots, starts, keep=n)["logits"]
    return [verify(r.draft.tokens, r.draft.qs, logits[i], r.params, r.rng) for i, r in enumerate(rows)], hidden


def padded(tokens: list[int], n: int) -> list[int]:
    # the pad repeats the last token: any id would do, as nothing real attends to it and its logits are unread
    return tokens + tokens[-1:] * (n - len(tokens))
