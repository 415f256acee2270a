"""One-row calls that round as rows of a verification call, checked on the machine that runs them.

A bundle's output-path pieces (`shallow`, `deep`) must compute a token of a one-row AR call bit for bit as
that token's row of a many-row verification call, or speculative output leaves AR's. Which kernels round a
one-row call differently depends on the machine as much as on the bundle: the exporter pads every op of a
piece where it knows they do (int4 MatMulNBits, the standard graphs: manifest `min_rows` 2), and only
GroupQueryAttention where it measured that the weight MatMuls do not (fp32 MatMul and int8 MatMulNBits on
x86 MLAS: `min_rows` 1). Another CPU's kernels (ARM's KleidiAI, an AVX-512 VNNI path) or a GPU provider may
round otherwise, and so may an LM head whose blocks are wider than the layers'. So a session with `min_rows` 1
pieces compares one-row calls with rows of a six-row call that keeps every row's logits, as verification does,
once at load (`one_row_calls_match`), and where they differ runs every one-row call as two rows itself
(`TwoRowCalls`: the graph-side padding of exporter/multirow.py, done from outside the graph).
"""

from __future__ import annotations

import numpy as np

from .backends.common import DeviceStates, WrappedPiece
from .decode import Pieces, ids_array

PROBE_TOKENS = 6

# Session.one_row_calls, in the words a report gives it
ONE_ROW_CALLS = {
    "graph": "run as two rows by the pieces' graphs (every op)",
    "attention": "given a copied row for attention by the pieces' graphs; this CPU rounds the rest alike",
    "session": "run as two rows by the session: this CPU rounds a one-row call otherwise than a row of many",
    "none": "run as one row: this CPU rounds them as rows of a verification call",
}


def probe_ids(vocab: int) -> list[int]:
    # unremarkable ids spread over the vocabulary: the kernels' paths depend on shapes, not values
    return [(k * vocab) // (PROBE_TOKENS + 1) + k for k in range(1, PROBE_TOKENS + 1)]


def one_row_calls_match(pieces: Pieces, vocab: int) -> bool:
    """True when the last token's logits from a call of PROBE_TOKENS rows equal, bit for bit, those of a
    call of the others followed by a one-row call (through shallow and deep). The whole call keeps every
    row's logits, as a verification call does: the LM head's kernels, too, may round a one-row call (an AR
    step) otherwise than a row of many (MLAS's int4 blocks of 64 and more, int8 blocks of 128 and more)."""
    ids = probe_ids(vocab)
    last = len(ids) - 1
    whole = pieces.deep.run(pieces.shallow.run(ids_array(ids), 0)["hidden"], 0, keep=len(ids))["logits"][:, -1:].copy()
    pieces.deep.run(pieces.shallow.run(ids_array(ids[:last]), 0)["hidden"], 0, keep=1)
    single = pieces.deep.run(pieces.shallow.run(ids_array(ids[last:]), last)["hidden"], last, keep=1)["logits"]
    return bool(np.array_equal(whole, single))


class TwoRowCalls(WrappedPiece):
    """A piece whose one-row calls run as two rows: the row and a copy of it at the next position (its
    keys and values land in the next cache slot, which the next call writes before anything reads it); the
    copy's results are dropped. With the context full there is no next slot and the call stays one row,
    as the graph-side padding does. A batched call of several rows is rows of many already and runs as it
    stands. Everything else is the wrapped piece's."""

    def __init__(self, piece, max_context: int) -> None:
        super().__init__(piece)
        self.max_context = max_context

    def _pads(self, rows: int, n: int, start: int, tree) -> bool:
        return rows * n == 1 and tree is None and start + 2 <= self.max_context

    def run(self, x, start: int, keep: int = 1, tree=None, **kw) -> dict:
        if not self._pads(1, x.shape[1], start, tree):
            return self.piece.run(x, start, keep, tree, **kw)
        if isinstance(x, DeviceStates):  # the store's next row: the copy's state when shallow was padded too
            both = DeviceStates(x.store, x.first, 2)
        else:
            both = np.concatenate([x, x], axis=1)
        if kw.get("extra") is not None:
            kw = {**kw, "extra": doubled(kw["extra"])}
        results = self.piece.run(both, start, 2 if keep >= 1 else keep, **kw)
        return {name: value[:, :1] for name, value in results.items()}

    def run_rows(self, x, rows: list[int], starts: list[int], keep: int = 1, trees=None, extra=None) -> dict:
        if not self._pads(len(rows), x.shape[1], starts[0], trees[0] if trees else None):
            return self.piece.run_rows(x, rows, starts, keep, trees, extra)
        results = self.piece.run_rows(np.concatenate([x, x], axis=1), rows, starts, 2 if keep >= 1 else keep, None,
                                      doubled(extra))
        return {name: value[:, :1] for name, value in results.items()}


def doubled(extra: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    """A one-row call's further inputs for its padded call: the row and its copy."""
    return None if extra is None else {name: np.concatenate([v, v], axis=1) for name, v in extra.items()}


def one_row_calls_differ(pieces, vocab: int, min_rows: int, max_context: int) -> bool:
    """True where shallow's and deep's one-row calls leave a verification call's arithmetic on this machine and
    the caller must pad them; pieces that pad in the graph (min_rows 2), or a context too short to probe, never.
    The probe writes cache row 0, which no request has yet."""
    return min_rows < 2 and max_context >= PROBE_TOKENS + 1 and not one_row_calls_match(pieces, vocab)


def pad_if_needed(pieces: Pieces, vocab: int, min_rows: int, max_context: int, pad: bool | None = None) -> bool:
    """Wraps `pieces`' shallow and deep in TwoRowCalls when their one-row calls leave a
    verification call's arithmetic on this machine, or as `pad` says where another engine on the same weights
    has probed already; True when it did."""
    if pad is None:
        pad = one_row_calls_differ(pieces, vocab, min_rows, max_context)
    if pad:
        pieces.shallow = TwoRowCalls(pieces.shallow, max_context)
        pieces.deep = TwoRowCalls(pieces.deep, max_context)
    return pad


def one_row_calls(pieces: Pieces, min_rows: int, one_row_padding: str) -> str:
    """How an engine's one-token calls of shallow and deep keep verification's arithmetic, a key of
    ONE_ROW_CALLS: `graph` (the pieces pad every op), `attention` (they pad attention alone, and this machine's
    kernels round the rest of a one-row call as a row of many), `session` (they do not round alike here: the
    engine runs such calls as two rows), or `none` (a bundle built to pad nothing, whose calls round alike
    here). `min_rows` and `one_row_padding` are deep's manifest fields."""
    if isinstance(pieces.deep, TwoRowCalls):
        return "session"
    if min_rows >= 2:
        return "graph"
    return "none" if one_row_padding == "none" else "attention"
