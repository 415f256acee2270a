"""A piece run on several requests at once: one ONNX Runtime session, a pool of cache rows, per-row positions.

Two kinds of graphs batch verification. The standard graphs scatter each row's new keys at that row's own
`position_ids` and mask by slot per row. The `ort` graphs built with `--attention rowwise` use specexport's
row-invariant attention operator (runtime/attention_op.py), which takes a `seqlens_k` per row and computes
each row alone. Either way a row's results do not depend on the rows beside it: on ONNX Runtime's CPU kernels
they equal a one-row call's bit for bit (tests/test_batching.py, tests/test_batching_rowwise.py). ONNX
Runtime's own GroupQueryAttention (the other `ort` graphs) refuses a call of more than one row when it
carries more than one token per row and a past ("batch_size must be 1 when sequence_length > 1 and past
context is given", onnxruntime 1.32), so those bundles do not batch.

Each row of the pool is one request's cache, [kv_heads, context, head_dim] per layer. A standard call gathers
its rows' caches at the call's bucket (runtime/backends/buckets.py: every bucket gives the same logits), runs,
and writes back only the slots the call wrote, so rows may join, leave and sit idle between calls. The
operator writes its cache in place: a call whose rows are neighbours in the pool, in order, binds that range
of the pool itself as past and present; other calls bind a gathered copy as both and write back the slots the
call wrote.

The weight MatMuls may round a call of one row in all (one row, one token) otherwise than a row of a bigger
call: int4 MatMulNBits on AVX2 x86 does (runtime/row_padding.py). A row of a call of two rows or more rounds
as the request's verification rows and its padded one-token AR calls do, so the rule is the Session's: where
the Session runs one-row calls as two rows (`pad_one_row`, set by the scheduler from the Session's choice or
from the same load-time probe), a batched call of one row and one token runs as that token and a copy of it
at the next slot, and nothing else is padded. A piece whose graph pads its own one-row calls needs nothing.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort

from ..backends.buckets import bucket
from ..backends.common import TreeMask, attention_bias, slot_moves
from ..backends.ort import check_session_io, session_options, unloadable
from ..bundle import Bundle
from ..errors import RunError, SpecExportError
from ..manifest import Piece as PieceSpec
from ..row_padding import one_row_calls_differ


def check_batchable(name: str, spec: PieceSpec, root: Path, attention: str = "gqa") -> None:
    """Refuses, in one sentence, a piece whose graph cannot verify several requests in one call."""
    names = {t.name for t in spec.inputs}
    if "seqlens_k" in names and attention != "rowwise":
        raise SpecExportError(f"bundle {root}'s {name} piece uses ONNX Runtime's GroupQueryAttention, which runs"
                              " one request at a time when it verifies drafts; build a bundle for batched serving"
                              " with `specexport build --attention rowwise` (the `ort` flavour on the CPU) or"
                              " `--flavour standard`")
    if not {"position_ids", "attention_bias"} <= names:
        raise SpecExportError(f"bundle {root}'s {name} piece predates per-row positions (no position_ids or"
                              " attention_bias input); rebuild it with `specexport build --flavour standard`")


class BatchedPiece:
    """`run(x, rows, starts, keep)`: x is [k, n] ids or [k, n, hidden] states for cache rows `rows`, row i's
    tokens at positions starts[i] .. starts[i] + n - 1; returns the piece's non-cache outputs, [k, ...]."""

    def __init__(self, name: str, path: Path, spec: PieceSpec, max_context: int, max_rows: int,
                 threads: int | None = None, session: ort.InferenceSession | None = None,
                 attention: str = "gqa", matmul: str = "mlas") -> None:
        """`session`: the piece as a Session already opened it (its weights are not loaded again, and the
        operator library was registered for it); the caches are this piece's own either way, one row per
        request. `attention`, `matmul`: the bundle's `graph.attention` and `graph.matmul`."""
        self.name, self.max_context = name, max_context
        if session is None:
            try:
                options = session_options(threads, attention, matmul)
            except SpecExportError as exc:
                op = "attention" if attention == "rowwise" else "matmul"
                raise SpecExportError(f"bundle piece {name!r} uses specexport's row-invariant {op} operator,"
                                      f" but {exc}") from None
            try:
                session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            except Exception as exc:
                raise SpecExportError(unloadable(name, path, exc, attention, matmul)) from None
        check_session_io(name, spec, session)
        self.session = session
        self.input_names = {t.name for t in spec.inputs}
        self.in_place = "seqlens_k" in self.input_names  # the rowwise operator: one cache bound as past and present
        self.pad_one_row = False  # a call of one row and one token runs as two rows (see the module's docstring)
        self.primary = next(t.name for t in spec.inputs if t.name in ("input_ids", "hidden_in"))
        bias = next(t for t in spec.inputs if t.name == "attention_bias")
        self.bias_dtype, self.bias_whole_cache = bias.dtype, bias.shape[-1] == "cache_len"
        self.results = [(t.name, np.dtype(t.dtype), t.shape) for t in spec.outputs if not t.name.startswith("present_")]
        self.caches: dict[str, np.ndarray] = {}  # past_* name -> [rows, kv_heads, context, head_dim]
        for t in spec.inputs:
            if t.name.startswith("past_"):
                self.caches[t.name] = np.zeros((max_rows, t.shape[1], max_context, t.shape[3]), dtype=t.dtype)
        self.binding = self.session.io_binding()
        self._bound: tuple[int, int] | None = None  # the pool's rows bound in place as the caches, if any

    def run(self, x: np.ndarray, rows: list[int], starts: list[int], keep: int = 1,
            trees: list[TreeMask | None] | None = None,
            extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """`trees`: per row, the token tree its call's tokens form (None: a chain); `extra`: further [k, n, ...]
        inputs (the draft head's features)."""
        k, n = x.shape[:2]
        if self.pad_one_row and k * n == 1 and starts[0] + 2 <= self.max_context and not (trees and trees[0]):
            # the token and a copy at the next slot, which the row's next call writes before anything reads it
            both = {name: np.concatenate([v, v], axis=1) for name, v in (extra or {}).items()}
            results = self._run(np.concatenate([x, x], axis=1), rows, starts, 2 if keep >= 1 else keep, None, both)
            return {name: value[:, :1] for name, value in results.items()}
        return self._run(x, rows, starts, keep, trees, extra)

    def _run(self, x: np.ndarray, rows: list[int], starts: list[int], keep: int,
             trees: list[TreeMask | None] | None, extra: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        k, n = x.shape[:2]
        end = max(starts) + n
        if end > self.max_context:
            raise RunError(f"piece {self.name!r}: a call of {n} tokens at position {max(starts)} runs past"
                                  f" the context of {self.max_context}")
        width = bucket(end, self.max_context)
        slots = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(n, dtype=np.int64)[None, :]
        positions = slots.copy()  # a tree's tokens take consecutive slots but sit at their depth's position
        bias_width = width if self.bias_whole_cache or not self.in_place else end
        bias = np.zeros((k, 1, n, bias_width), dtype=self.bias_dtype)
        for i, tree in enumerate(trees or ()):
            if tree is not None:  # the row's own tree, as one sequence's call takes it (backends/common.py)
                m = len(tree.depth)
                positions[i, :m] = tree.base + tree.depth
                bias[i, :, :m] = attention_bias(starts[i], m, bias_width, self.bias_dtype, tree)[0]
        b = self.binding  # a name bound again replaces its binding: the caches stay bound while their rows do
        b.bind_cpu_input(self.primary, np.ascontiguousarray(x))
        for name, value in (extra or {}).items():
            b.bind_cpu_input(name, np.ascontiguousarray(value))
        b.bind_cpu_input("position_ids", positions)
        b.bind_cpu_input("attention_bias", bias)
        if "logits_to_keep" in self.input_names:
            b.bind_cpu_input("logits_to_keep", np.array([keep], dtype=np.int64))
        if self.in_place:
            # each row's last new slot; causality is by slot, so a row sees only its own tokens and past
            b.bind_cpu_input("seqlens_k", (slots[:, -1]).astype(np.int32))
            b.bind_cpu_input("total_sequence_length", np.array(end, dtype=np.int32))
            written = self._bind_in_place(rows, width)
        else:
            written = self._bind_gathered(rows, width)
        axes = {"batch": k, "seq": n, "kept": n if keep <= 0 else min(keep, n)}  # logits_to_keep's rows
        results = {name: np.empty([axes.get(d, d) for d in shape], dtype=dtype) for name, dtype, shape in self.results}
        for name, array in results.items():
            b.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        try:
            self.session.run_with_iobinding(b)
        except Exception as exc:
            reason = " ".join(str(exc).split())
            raise RunError(f"piece {self.name!r} failed on a batch of {k} row(s) x {n} token(s): {reason}"
                                  ) from None
        for past, out in written.items():  # only the slots this call wrote: the rest is the row's as it was
            pool = self.caches[past]
            for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
                pool[row, :, start:start + n] = out[i, :, start:start + n]
        return results

    def move_slots(self, row: int, src: list[int], dst: list[int]) -> None:
        """Copies cache row `row`'s entries at slots `src` to slots `dst` (a token tree's accepted branch laid
        out as its chain; OrtPiece.move_slots for one sequence)."""
        moves = slot_moves(src, dst)
        if moves is None:
            return
        src_idx, dst_idx = moves
        for pool in self.caches.values():
            pool[row, :, dst_idx] = pool[row, :, src_idx]  # the right side is a copy: overlapping slots are safe

    def _bind_gathered(self, rows: list[int], width: int) -> dict[str, np.ndarray]:
        """Standard graphs: the rows' caches gathered as past, a fresh present; returns the presents to write back."""
        presents = {}
        for past, pool in self.caches.items():
            self.binding.bind_cpu_input(past, pool[rows, :, :width])  # a copy: the rows need not be adjacent
            out = np.empty((len(rows), pool.shape[1], width, pool.shape[3]), dtype=pool.dtype)
            present = ort.OrtValue.ortvalue_from_numpy(out)
            self.binding.bind_ortvalue_output(past.replace("past_", "present_", 1), present)
            presents[past] = out
        return presents

    def _bind_in_place(self, rows: list[int], width: int) -> dict[str, np.ndarray]:
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
            self.binding.bind_ortvalue_input(past, value)
            self.binding.bind_ortvalue_output(past.replace("past_", "present_", 1), value)
            if not neighbours:
                copies[past] = cache
        return copies


class _RowZero:
    """A batched piece seen as one request's piece in cache row 0 (for the load-time probe)."""

    def __init__(self, piece: BatchedPiece) -> None:
        self.piece = piece

    def run(self, x: np.ndarray, start: int, keep: int = 1) -> dict[str, np.ndarray]:
        return self.piece.run(x, [0], [start], keep)


def pads_one_row_calls(source: object, bundle: Bundle, shallow: BatchedPiece, deep: BatchedPiece) -> bool:
    """Whether shallow and deep must run a call of one row and one token as two rows: the Session's choice
    when the scheduler shares one (`one_row_calls` 'session'), else the Session's load-time probe run on the
    batched pieces' row 0 (its caches are rewritten before any request reads them)."""
    if hasattr(source, "one_row_calls"):
        return source.one_row_calls == "session"
    probe = SimpleNamespace(shallow=_RowZero(shallow), deep=_RowZero(deep))
    return one_row_calls_differ(probe, bundle.manifest.model.dims.vocab, bundle.pieces["deep"].min_rows,
                                bundle.max_context)
