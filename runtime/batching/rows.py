"""A piece run on several requests at once: one ONNX Runtime session, a pool of cache rows, per-row positions.

Only the standard graphs batch verification. ONNX Runtime's GroupQueryAttention (the `ort` flavour) refuses a
call of more than one row when it carries more than one token per row and a past ("batch_size must be 1 when
sequence_length > 1 and past context is given", onnxruntime 1.32), and every call of a multirow-padded piece
carries at least two tokens (exporter/multirow.py). The standard graphs scatter each row's new keys at that
row's own `position_ids` and mask by slot per row, so a row's results do not depend on the rows beside it:
on ONNX Runtime's CPU kernels they equal a one-row call's bit for bit (tests/test_batching.py checks it).

Each row of the pool is one request's cache, [kv_heads, context, head_dim] per layer. A call gathers its
rows' caches at the call's bucket (runtime/backends/buckets.py: every bucket gives the same logits), runs,
and writes back only the slots the call wrote, so rows may join, leave and sit idle between calls.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..backends.buckets import bucket
from ..backends.ort import session_options
from ..errors import RunError, SpecExportError
from ..manifest import Piece as PieceSpec


def check_batchable(name: str, spec: PieceSpec, root: Path) -> None:
    """Refuses, in one sentence, a piece whose graph cannot verify several requests in one call."""
    names = {t.name for t in spec.inputs}
    if "seqlens_k" in names:
        raise SpecExportError(f"bundle {root}'s {name} piece uses ONNX Runtime's GroupQueryAttention, which runs"
                              " one request at a time when it verifies drafts; build a bundle for batched serving"
                              " with `specexport build --flavour standard`")
    if not {"position_ids", "attention_bias"} <= names:
        raise SpecExportError(f"bundle {root}'s {name} piece predates per-row positions (no position_ids or"
                              " attention_bias input); rebuild it with `specexport build --flavour standard`")


class BatchedPiece:
    """`run(x, rows, starts, keep)`: x is [k, n] ids or [k, n, hidden] states for cache rows `rows`, row i's
    tokens at positions starts[i] .. starts[i] + n - 1; returns the piece's non-cache outputs, [k, ...]."""

    def __init__(self, name: str, path: Path, spec: PieceSpec, max_context: int, max_rows: int,
                 threads: int | None = None, session: ort.InferenceSession | None = None) -> None:
        """`session`: the piece as a Session already opened it (its weights are not loaded again); the caches
        are this piece's own either way, one row per request."""
        self.name, self.max_context = name, max_context
        if session is None:
            try:
                session = ort.InferenceSession(str(path), session_options(threads),
                                               providers=["CPUExecutionProvider"])
            except Exception as exc:
                raise SpecExportError(f"ONNX Runtime could not load piece {name!r} from {path}: {exc}") from None
        self.session = session
        self.input_names = {t.name for t in spec.inputs}
        self.primary = next(t.name for t in spec.inputs if t.name in ("input_ids", "hidden_in"))
        self.bias_dtype = next(t.dtype for t in spec.inputs if t.name == "attention_bias")
        self.results = [(t.name, np.dtype(t.dtype), t.shape) for t in spec.outputs if not t.name.startswith("present_")]
        self.caches: dict[str, np.ndarray] = {}  # past_* name -> [rows, kv_heads, context, head_dim]
        for t in spec.inputs:
            if t.name.startswith("past_"):
                self.caches[t.name] = np.zeros((max_rows, t.shape[1], max_context, t.shape[3]), dtype=t.dtype)
        self.binding = self.session.io_binding()

    def run(self, x: np.ndarray, rows: list[int], starts: list[int], keep: int = 1) -> dict[str, np.ndarray]:
        k, n = x.shape[:2]
        if max(starts) + n > self.max_context:
            raise RunError(f"piece {self.name!r}: a call of {n} tokens at position {max(starts)} runs past"
                                  f" the context of {self.max_context}")
        width = bucket(max(starts) + n, self.max_context)
        positions = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(n, dtype=np.int64)[None, :]
        b = self.binding
        b.clear_binding_inputs()
        b.clear_binding_outputs()
        b.bind_cpu_input(self.primary, np.ascontiguousarray(x))
        b.bind_cpu_input("position_ids", positions)
        b.bind_cpu_input("attention_bias", np.zeros((k, 1, n, width), dtype=self.bias_dtype))
        if "logits_to_keep" in self.input_names:
            b.bind_cpu_input("logits_to_keep", np.array([keep], dtype=np.int64))
        presents = {}
        for past, pool in self.caches.items():
            b.bind_cpu_input(past, pool[rows, :, :width])  # a gathered copy: the rows need not be adjacent
            out = np.empty((k, pool.shape[1], width, pool.shape[3]), dtype=pool.dtype)
            b.bind_ortvalue_output(past.replace("past_", "present_", 1), ort.OrtValue.ortvalue_from_numpy(out))
            presents[past] = out
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
        for past, out in presents.items():  # only the slots this call wrote: the rest is the row's as it was
            pool = self.caches[past]
            for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
                pool[row, :, start:start + n] = out[i, :, start:start + n]
        return results
