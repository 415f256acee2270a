"""A piece's caches as a pool of rows, one per sequence, for calls that run several sequences at once.

Each row is one sequence's cache, [kv_heads, context, head_dim] per layer, in host memory. Two kinds of graphs
take calls of several rows. The standard graphs scatter each row's new keys at that row's own `position_ids`
and return the whole cache: a call binds a gathered copy of its rows at the call's bucket as past (every
bucket gives the same logits, buckets.py) and a fresh present, and only the slots the call wrote go back to
the pool, so rows may join, leave and sit idle between calls. specexport's row-invariant attention operator
(the `ort` graphs built with `--attention rowwise`, runtime/attention_op.py) writes its one buffer in place:
a call whose rows are neighbours in the pool, in order, binds that range of the pool itself as past and
present; other calls bind a gathered copy as both and write back the slots the call wrote.

ONNX Runtime's own GroupQueryAttention refuses a call of more than one row when it carries more than one
token per row and a past ("batch_size must be 1 when sequence_length > 1 and past context is given",
onnxruntime 1.32), so those graphs keep one row (`check_poolable`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..errors import SpecExportError
from ..manifest import Piece as PieceSpec
from .common import slot_moves


def check_poolable(name: str, spec: PieceSpec, root: Path, attention: str) -> None:
    """Refuses, in one sentence, a piece whose graph cannot run several sequences' calls as one."""
    names = {t.name for t in spec.inputs}
    if "seqlens_k" in names and attention != "rowwise":
        raise SpecExportError(f"bundle {root}'s {name} piece uses ONNX Runtime's GroupQueryAttention, which runs"
                              " one request at a time when it verifies drafts; build a bundle for batched serving"
                              " with `specexport build --attention rowwise` (the `ort` flavour on the CPU) or"
                              " `--flavour standard`")
    if not {"position_ids", "attention_bias"} <= names:
        raise SpecExportError(f"bundle {root}'s {name} piece predates per-row positions (no position_ids or"
                              " attention_bias input); rebuild it with `specexport build --flavour standard`")


class CacheRows:
    """The pool: past_* name -> [rows, kv_heads, context, head_dim], and what one call binds of it."""

    def __init__(self, spec: PieceSpec, max_context: int, rows: int) -> None:
        self.in_place = "seqlens_k" in {t.name for t in spec.inputs}  # the operator: one buffer, past and present
        self.caches: dict[str, np.ndarray] = {
            t.name: np.zeros((rows, t.shape[1], max_context, t.shape[3]), dtype=t.dtype)
            for t in spec.inputs if t.name.startswith("past_")}
        self._bound: tuple[int, int] | None = None  # the pool's rows bound in place as the caches, if any

    def bind(self, binding: ort.IOBinding, rows: list[int], width: int) -> dict[str, np.ndarray]:
        """Binds the call's caches; returns what `write_back` copies into the pool after the call."""
        return self._bind_in_place(binding, rows, width) if self.in_place else self._bind_gathered(binding, rows,
                                                                                                     width)

    def write_back(self, written: dict[str, np.ndarray], rows: list[int], starts: list[int], n: int) -> None:
        for past, out in written.items():  # only the slots this call wrote: the rest is the row's as it was
            pool = self.caches[past]
            for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
                pool[row, :, start:start + n] = out[i, :, start:start + n]

    def move_slots(self, row: int, src: list[int], dst: list[int]) -> None:
        """Copies row `row`'s entries at slots `src` to slots `dst` (a token tree's accepted branch laid out as
        its chain)."""
        moves = slot_moves(src, dst)
        if moves is None:
            return
        src_idx, dst_idx = moves
        for pool in self.caches.values():
            pool[row, :, dst_idx] = pool[row, :, src_idx]  # the right side is a copy: overlapping slots are safe

    def _bind_gathered(self, binding: ort.IOBinding, rows: list[int], width: int) -> dict[str, np.ndarray]:
        """Standard graphs: the rows' caches gathered as past, a fresh present, which is written back."""
        presents = {}
        for past, pool in self.caches.items():
            binding.bind_cpu_input(past, pool[rows, :, :width])  # a copy: the rows need not be adjacent
            out = np.empty((len(rows), pool.shape[1], width, pool.shape[3]), dtype=pool.dtype)
            binding.bind_ortvalue_output(past.replace("past_", "present_", 1), ort.OrtValue.ortvalue_from_numpy(out))
            presents[past] = out
        return presents

    def _bind_in_place(self, binding: ort.IOBinding, rows: list[int], width: int) -> dict[str, np.ndarray]:
        """The operator's in-place caches: neighbouring rows in order bind the pool's own range (nothing to write
        back), others a gathered copy at the call's bucket, bound as both past and present (written back)."""
        lo = rows[0]
        neighbours = rows == list(range(lo, lo + len(rows)))
        if neighbours and self._bound == (lo, len(rows)):
            return {}
        self._bound = (lo, len(rows)) if neighbours else None
        copies = {}
        for past, pool in self.caches.items():
            cache = pool[lo:lo + len(rows)] if neighbours else np.ascontiguousarray(pool[rows, :, :width])
            value = ort.OrtValue.ortvalue_from_numpy(cache)  # shares the array's memory
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(past.replace("past_", "present_", 1), value)
            if not neighbours:
                copies[past] = cache
        return copies
