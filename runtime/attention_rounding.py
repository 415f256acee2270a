"""GroupQueryAttention rows that round by their call's total length, kept on one side of the line.

ONNX Runtime 1.32's CPU GroupQueryAttention gives a row the same bits whatever call it is in for head sizes
up to 128, but at Gemma 3's 256 a row's result moves when the call's total length (past + new tokens)
crosses 64, 192, 320, ... (the flash path walks the cache in blocks sized from the L2 cache, 128 keys here,
and sums a block in one pass up to 64 keys and in two beyond), and, with the flash path off, only when it
crosses 64 (fixed constants of the non-flash path). docs/journal/2026-11-25.md has the measurements
("Gemma 3 270M at int4"). A verification call is longer than the AR calls of its rows, so a row
near a crossing would round otherwise than AR, and int8 activations make that another token.

So for such pieces the session creates them with the flash path off (a boundary that does not depend on
the machine's caches), and `SplitAtBoundary` cuts a chain call in two where its rows' AR calls would fall
on both sides of the one boundary left; token trees stop short of it (`tree_end`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from .backends.common import WrappedPiece

EXACT_HEAD_DIM = 128  # at or below: rows do not depend on the call's length (measured at 64 and 128)
BOUNDARY = 64  # the non-flash path's one crossing: totals up to 64 round one way, beyond it another
FLASH_SWITCH = "ORT_GQA_DISABLE_FLASH_ATTENTION"  # read when a session builds its GQA kernels
_env_lock = threading.Lock()


def length_sensitive(flavour: str, head_dim: int) -> bool:
    return flavour == "ort" and head_dim > EXACT_HEAD_DIM


@contextmanager
def flash_attention_off() -> Iterator[None]:
    """While sessions are created inside, their GroupQueryAttention kernels take the non-flash path."""
    with _env_lock:
        before = os.environ.get(FLASH_SWITCH)
        os.environ[FLASH_SWITCH] = "1"
        try:
            yield
        finally:
            if before is None:
                del os.environ[FLASH_SWITCH]
            else:
                os.environ[FLASH_SWITCH] = before


def ar_total(position: int, copy: bool) -> int:
    """The total length of the attention call that computes `position` in AR: one row, plus the copy a
    one-row call gets at the next slot when the pieces or the session pad it."""
    return position + 1 + int(copy)


def split_point(start: int, n: int, copy: bool) -> int | None:
    """Where a call of n rows at `start` must be cut so each part's total is on its rows' AR side of
    BOUNDARY; None when it need not be. A row's AR total is ar_total(p); a multi-row part [a, b) has total b."""
    first_beyond = BOUNDARY - int(copy)  # the first position whose AR total, ar_total, passes BOUNDARY
    # with every row on one side, so is the call (its total is at least its last row's AR total)
    return first_beyond - start if start < first_beyond < start + n else None


def tree_end(pos: int, max_context: int, copy: bool) -> int:
    """The slot a token tree verified from `pos` must stay below: while the root's AR call is on the near
    side of BOUNDARY, every row of the tree's call must be too (its total is its end), else the context's end."""
    return min(max_context, BOUNDARY - int(copy)) if ar_total(pos, copy) <= BOUNDARY else max_context


class SplitAtBoundary(WrappedPiece):
    """A piece whose chain calls are cut at split_point and whose parts' results are joined, so every row
    is computed in a call on its AR call's side of BOUNDARY. Tree calls pass through (trees stop short of
    it), as does everything that is not `run`."""

    def __init__(self, piece, copy: bool) -> None:
        super().__init__(piece)
        self.copy = copy

    def tree_end(self, pos: int, max_context: int) -> int:
        return tree_end(pos, max_context, self.copy)

    def run(self, x, start: int, keep: int = 1, tree=None) -> dict:
        n = x.shape[1]
        cut = None if tree is not None else split_point(start, n, self.copy)
        if cut is None:
            return self.piece.run(x, start, keep, tree)
        kept = n if keep <= 0 else min(keep, n)
        first = self.piece.run(x[:, :cut], start, max(1, kept - (n - cut)))
        first = {k: v.copy() for k, v in first.items()}  # a piece may reuse its result buffers
        second = self.piece.run(x[:, cut:], start + cut, min(kept, n - cut))
        out = {}
        for name, tail in second.items():
            head = first[name]
            if name == "logits":  # the kept rows: those of the first part that are kept, then the second's
                from_first = kept - tail.shape[1]
                out[name] = np.concatenate([head[:, head.shape[1] - from_first:], tail], axis=1) if from_first > 0 \
                    else tail
            else:
                out[name] = np.concatenate([head, tail], axis=1)
        return out
