"""ONNX Runtime backend: one InferenceSession per piece, KV caches preallocated once."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .. import attention_op
from ..errors import RunError, SpecExportError
from ..manifest import Piece as PieceSpec
from .buckets import CacheBuckets, bucket, dynamic_cache_len, relayout_host, relayout_in_place, view
from .cache_rows import CacheRows, check_poolable
from .common import DeviceStates, TreeMask, attention_bias, bias_input, bias_spec, check_io, control_feeds, slot_moves
from .ort_device import StateStore, bind_states, device_biases

_AXES = ("batch", "seq", "kept")  # the named axes of a piece's results that a call fixes
_shared_pool_threads: int | None = None  # size of the process-wide intra-op pool, once enabled


def use_shared_thread_pool(threads: int | None = None) -> None:
    """Run every piece opened from now on in one process-wide intra-op pool of `threads` threads.

    The pieces run one after another, never together, so one pool serves them all: its threads stay
    warm from one piece's call to the next, where a pool per session stops spinning when its run ends and
    wakes its threads on the next (a few percent of an int4 token for `auto`'s many small calls). ONNX Runtime
    then requires *every* session of the process to use that pool, including ones opened outside specexport,
    so this is for processes that own ONNX Runtime (the `specexport` commands call it); call it before opening
    any session."""
    global _shared_pool_threads
    threads = threads or os.cpu_count() or 1
    if _shared_pool_threads is None:
        ort.set_global_thread_pool_sizes(threads, 1)
        _shared_pool_threads = threads


def shared_pool_in_use() -> bool:
    """Whether this process put every ONNX Runtime session in one shared thread pool."""
    return _shared_pool_threads is not None


def session_options(threads: int | None = None, attention: str = "gqa", matmul: str = "mlas") -> ort.SessionOptions:
    """`attention` or `matmul` 'rowwise': the pieces use specexport's operators, whose library is registered
    here (runtime/attention_op.py); they run on the session's intra-op threads."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    if attention_op.needed(attention, matmul):
        attention_op.register(opts)
    if _shared_pool_threads is not None:
        opts.use_per_session_threads = False
        return opts
    opts.intra_op_num_threads = threads or os.cpu_count() or 1
    opts.inter_op_num_threads = 1
    # A pool's threads spin between the operators of a run (waking sleeping threads for each operator made an
    # int4 token much slower) and stop when the run ends, so the idle pools of the other pieces take no cores
    # from the one that runs (tools/experiments/thread_pools.py).
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    return opts


# ONNX Runtime's names for the element types the manifest spells as numpy's
ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
              "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(bool)": "bool"}


def _graph_io(args) -> dict[str, tuple[str, tuple]]:
    return {t.name: (ORT_DTYPES.get(t.type, t.type), tuple(t.shape)) for t in args}


def unloadable(name: str, path: Path, exc: Exception, attention: str, matmul: str) -> str:
    """Why ONNX Runtime could not open a piece, in one sentence: a graph that uses one of specexport's operators
    which the manifest does not declare names the manifest field; anything else is ONNX Runtime's own reason."""
    reason = " ".join(str(exc).split())
    used = re.search(rf"{attention_op.DOMAIN}:(\w+)\(-?\d+\) is not a registered function/op", reason)
    fields = {attention_op.OP_TYPE: ("graph.attention", attention),
              attention_op.MATMUL_OP_TYPE: ("graph.matmul", matmul),
              attention_op.GATHER_ROWS_OP_TYPE: ("graph.matmul", matmul)}
    if used and used.group(1) == attention_op.GATED_OP_TYPE:
        return (f"the graph of piece {name!r} uses specexport's {used.group(1)} operator, which comes only with"
                f" graph.attention or graph.matmul 'rowwise', but the manifest says {attention!r} and {matmul!r};"
                " rebuild the bundle")
    if used and used.group(1) in fields:
        field, said = fields[used.group(1)]
        return (f"the graph of piece {name!r} uses specexport's {used.group(1)} operator, but manifest field {field}"
                f" says {said!r}; rebuild the bundle")
    return f"ONNX Runtime could not load piece {name!r} from {path}: {reason.replace('. ', '; ')}"


def check_session_io(name: str, spec: PieceSpec, session: ort.InferenceSession) -> None:
    """Refuses, in one sentence, a piece whose graph's inputs or outputs are not those its manifest declares."""
    check_io(name, "input", list(spec.inputs), _graph_io(session.get_inputs()))
    check_io(name, "output", list(spec.outputs), _graph_io(session.get_outputs()))


# execution providers whose memory is a GPU's: a piece on one keeps its caches there (see OrtPiece)
DEVICE_PROVIDERS = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda"}
TRT_EP_CACHE = "tensorrt/ort-trt-ep"  # under the bundle: the TensorRT execution provider's engines


def provider_list(providers: list[str], bundle_root: Path) -> list:
    """`providers` for InferenceSession, with the TensorRT execution provider's engine and timing caches
    kept under the bundle (its engines take minutes to build; the cache makes that once per device)."""
    out: list = []
    for name in providers:
        if name == "TensorrtExecutionProvider":
            cache = str(bundle_root / TRT_EP_CACHE)
            out.append((name, {"trt_engine_cache_enable": True, "trt_engine_cache_path": cache,
                               "trt_timing_cache_enable": True, "trt_timing_cache_path": cache}))
        else:
            out.append(name)
    return out


class OrtPiece:
    """A piece whose caches live in OrtValues bound through IOBinding.

    ``kv_mode`` comes from the manifest: ``shared`` binds one buffer as both past and present (ORT's
    GroupQueryAttention writes in place); ``swap`` binds two buffers and swaps them after each call
    (graphs that return the whole updated cache), binding a cache length that follows the used length
    (buckets.py).

    On a GPU execution provider (CUDA, TensorRT) the caches are OrtValues in device memory, bound once, so
    no call moves them; shallow states and attention biases stay on the device too, token ids and positions
    go in and only the results sampling reads come out (`_run_device`, ort_device.py).

    A piece holds a cache row per sequence. With one row, `run` is that sequence's call, laid out as above.
    With several (`rows`), the caches are a pool in host memory (cache_rows.py), and `run_rows` runs several
    sequences' calls as one batched call, each row at its own positions; `run` is then row 0's call.
    """

    def __init__(self, name: str, path: Path, spec: PieceSpec, max_context: int, providers: list[str],
                 threads: int | None = None, attention: str = "gqa", matmul: str = "mlas", rows: int = 1,
                 session: ort.InferenceSession | None = None) -> None:
        """`session`: the piece as another OrtPiece opened it on the CPU (its weights are not loaded again);
        the caches are this piece's own either way."""
        self.name = name
        self.backend, self.handoff = "onnxruntime", "host"
        # the pool is the process's once enabled, for every session opened after (a shared session's too)
        self.shared_pool = shared_pool_in_use()
        if session is None:
            try:
                session = ort.InferenceSession(str(path), session_options(threads, attention, matmul),
                                               providers=provider_list(providers, Path(path).parent))
            except Exception as exc:
                raise SpecExportError(unloadable(name, path, exc, attention, matmul)) from None
        self.session = session
        self.inputs, self.outputs = list(spec.inputs), list(spec.outputs)
        check_session_io(name, spec, self.session)
        self.primary = next(t.name for t in self.inputs if t.name in ("input_ids", "hidden_in"))
        self.kv_mode = spec.kv.mode
        self.input_names = {t.name for t in self.inputs}
        self.bias_input = bias_input(self.inputs)
        self.result_names = [t.name for t in self.outputs if not t.name.startswith("present_")]
        self.binding = self.session.io_binding()
        self.max_context = max_context
        self._caches: list[tuple[str, str, list[ort.OrtValue]]] = []
        self._arrays: list[list[np.ndarray]] = []  # the caches' memory on the host: CPU OrtValues share it
        # the provider the session really got (ONNX Runtime falls back to the CPU when one is missing)
        self.device = next((DEVICE_PROVIDERS[p] for p in self.session.get_providers() if p in DEVICE_PROVIDERS),
                           None)
        self.rows = rows
        self._pool = None
        if rows > 1:
            if self.device is not None:
                raise SpecExportError(f"piece {name!r} keeps its caches on {self.device}, which holds one sequence;"
                                      " run several at once on the CPU provider")
            check_poolable(name, spec, Path(path).parent, attention)
            self._pool = CacheRows(spec, max_context, rows)
            self._bias_width_is_cache = self.bias_input.shape[-1] == "cache_len"
        # on the host: flat buffers for the full context, bound a bucket at a time (buckets.py)
        self._buckets = (CacheBuckets(max_context) if self.device is None and self._pool is None
                         and dynamic_cache_len(self.inputs) else None)
        self._bound = 0  # shared mode: the bucket the caches are bound at now (rebound when it changes)
        self._shapes: list[tuple[int, ...]] = []
        for t in self.inputs:
            if not t.name.startswith("past_") or self._pool is not None:
                continue
            shape = [1 if d == "batch" else max_context if d == "cache_len" else d for d in t.shape]
            n_buffers = 1 if self.kv_mode == "shared" else 2
            self._shapes.append(tuple(shape))
            if self._buckets is not None:
                arrays = [np.zeros(int(np.prod(shape)), dtype=t.dtype) for _ in range(n_buffers)]
                buffers = []  # views of the arrays, made per call at the call's bucket
            elif self.device is None:
                arrays = [np.zeros(shape, dtype=t.dtype) for _ in range(n_buffers)]
                buffers = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
            else:  # zeros, not uninitialised memory: a masked slot's NaN would still reach the softmax
                arrays = []
                buffers = [ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype=t.dtype), self.device, 0)
                           for _ in range(n_buffers)]
            self._caches.append((t.name, t.name.replace("past_", "present_", 1), buffers))
            self._arrays.append(arrays)
        # results go into arrays made for each call, shaped from the manifest's named axes (`seq`: the call's
        # tokens, `kept`: the logits' rows); reading them back through get_outputs would wrap every cache
        # too, at a cost that showed in the profile (BENCHMARKS.md)
        self._result_specs = [(t.name, np.dtype(t.dtype), t.shape) for t in self.outputs if t.name in self.result_names]
        self._shaped = all(isinstance(d, int) or d in _AXES for _, _, shape in self._result_specs for d in shape)
        if self.kv_mode == "shared" and self._buckets is None and self._pool is None:
            self._bind_caches()  # the same buffers every call: bound once, not 2 x layers binds a call
        if self.device is not None:
            self._init_device()

    def _bind_caches(self) -> None:
        for past, present, buffers in self._caches:
            self.binding.bind_ortvalue_input(past, buffers[0])
            self.binding.bind_ortvalue_output(present, buffers[-1])

    def _bind_bucket(self, start: int, n: int) -> int:
        """Binds every cache at the call's bucket, laying the caches out again first when it grew."""
        if self.kv_mode == "shared":
            return self._bind_shared_bucket(start, n)
        size, grown_from = self._buckets.for_call(start, n)
        for (past, present, _), arrays, shape in zip(self._caches, self._arrays, self._shapes, strict=True):
            if grown_from is not None:
                relayout_host(arrays[0], arrays[1], shape, grown_from, size)
                arrays.reverse()
            self.binding.bind_ortvalue_input(past, ort.OrtValue.ortvalue_from_numpy(view(arrays[0], shape, size)))
            self.binding.bind_ortvalue_output(present, ort.OrtValue.ortvalue_from_numpy(view(arrays[1], shape, size)))
        return size

    def _bind_shared_bucket(self, start: int, n: int) -> int:
        # a slot to spare: a one-token call's copied row goes to the next slot when the buffer has one
        size, grown_from = self._buckets.for_call(start, n + 1)
        if grown_from is None and size == self._bound:
            return size  # bound already: most calls rebind nothing
        for (past, present, _), arrays, shape in zip(self._caches, self._arrays, self._shapes, strict=True):
            if grown_from is not None:
                relayout_in_place(arrays[0], shape, grown_from, size)
            cache = ort.OrtValue.ortvalue_from_numpy(view(arrays[0], shape, size))
            self.binding.bind_ortvalue_input(past, cache)
            self.binding.bind_ortvalue_output(present, cache)
        self._bound = size
        return size

    def _bind_results(self, n: int, keep: int) -> dict[str, np.ndarray] | None:
        """Binds a fresh array to each result (binding a name again replaces its earlier binding, so the
        caches' stay) and returns them; None when a result's shape is not known before the call (ORT then
        allocates, and `get_outputs` reads them)."""
        if not self._shaped:
            for name in self.result_names:
                self.binding.bind_output(name, "cpu")
            return None
        axes = {"batch": 1, "seq": n, "kept": n if keep <= 0 else min(keep, n)}  # Slice(-keep:) stops at n
        results = {}
        for name, dtype, shape in self._result_specs:
            array = np.empty([axes.get(d, d) for d in shape], dtype=dtype)
            self.binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
            results[name] = array
        return results

    def run(self, x: np.ndarray, start: int, keep: int = 1, tree: TreeMask | None = None,
            extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """One sequence's call in cache row 0 (the `Piece` protocol, backends/common.py)."""
        if self._pool is not None:
            return self._run_pool(x, [0], [start], keep, None if tree is None else [tree], extra)
        if self.device is not None:
            return self._run_device(x, start, keep, tree, extra)
        n = x.shape[1]
        width = self.max_context
        if self._buckets is not None:
            width = self._bind_bucket(start, n)
        elif self.kv_mode == "swap":
            self._bind_caches()
        results = self._bind_results(n, keep)
        self.binding.bind_cpu_input(self.primary, x)
        for name, value in (extra or {}).items():
            self.binding.bind_cpu_input(name, value)
        bias = bias_spec(self.bias_input, start, n, width)
        for name, value in control_feeds(self.input_names, start, n, keep, tree, bias).items():
            self.binding.bind_cpu_input(name, value)
        try:
            self.session.run_with_iobinding(self.binding)
        except Exception as exc:  # ONNX Runtime's own message, in one sentence that names the piece and step
            reason = " ".join(str(exc).split())
            raise RunError(f"piece {self.name!r} failed at positions {start}..{start + n - 1} ({n} token(s)):"
                                  f" {reason}") from None
        if results is None:
            values = self.binding.get_outputs()
            # caches are bound first, then results, and get_outputs keeps the binding order
            results = dict(zip(self.result_names, (v.numpy() for v in values[-len(self.result_names):]),
                               strict=True))
        if self.kv_mode == "swap":
            for (_, _, buffers), arrays in zip(self._caches, self._arrays, strict=True):
                buffers.reverse()
                arrays.reverse()
        return results

    def run_rows(self, x: np.ndarray, rows: list[int], starts: list[int], keep: int = 1,
                 trees: list[TreeMask | None] | None = None,
                 extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Several sequences' calls as one: x is [k, n] ids or [k, n, hidden] states for cache rows `rows`, row
        i's tokens at positions starts[i] .. starts[i] + n - 1; `trees`, per row, the token tree its tokens form
        (None: a chain); `extra`, further [k, n, ...] inputs. Returns the non-cache outputs, [k, ...]. A row's
        results are those of the same call alone (tests/test_batching.py)."""
        if self._pool is None:
            if rows != [0]:
                raise SpecExportError(f"piece {self.name!r} holds one sequence's cache, not rows {rows}")
            return self.run(x, starts[0], keep, trees[0] if trees else None, extra)
        return self._run_pool(x, rows, starts, keep, trees, extra)

    @property
    def results(self) -> list[tuple[str, np.dtype, tuple]]:
        """The non-cache outputs: name, dtype and shape (with the named axes batch, seq and kept)."""
        return self._result_specs

    @property
    def moves_slots(self) -> bool:
        """Whether `move_slots` can run: the caches are host memory (a GPU provider's are not moved)."""
        return self.device is None

    def move_slots(self, src: list[int], dst: list[int], row: int = 0) -> None:
        """Copy every cache's entries at slots `src` to slots `dst` in cache row `row` (a token tree's accepted
        branch laid out as a chain). The cache the next call reads is the one moved: the only buffer in shared
        mode, the last call's present in swap mode; a slot that is its own destination is left alone."""
        if self.device is not None:
            raise SpecExportError(f"piece {self.name!r} keeps its caches on {self.device}, where slots are not moved")
        if self._pool is not None:
            self._pool.move_slots(row, src, dst)
            return
        moves = slot_moves(src, dst)
        if moves is None:
            return
        src_idx, dst_idx = moves
        for arrays, shape in zip(self._arrays, self._shapes, strict=True):
            cache = view(arrays[0], shape, self._buckets.size) if self._buckets is not None else arrays[0]
            cache[:, :, dst_idx] = cache[:, :, src_idx]  # the right side is a copy: overlapping slots are safe

    # -- several sequences' rows at once (cache_rows.py) -----------------------------------------------------

    def _run_pool(self, x: np.ndarray, rows: list[int], starts: list[int], keep: int,
                  trees: list[TreeMask | None] | None, extra: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        k, n = x.shape[:2]
        end = max(starts) + n
        if end > self.max_context:
            raise RunError(f"piece {self.name!r}: a call of {n} tokens at position {max(starts)} runs past"
                           f" the context of {self.max_context}")
        width = bucket(end, self.max_context)
        slots = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(n, dtype=np.int64)[None, :]
        positions = slots.copy()  # a tree's tokens take consecutive slots but sit at their depth's position
        in_place = self._pool.in_place
        bias_width = width if self._bias_width_is_cache or not in_place else end
        bias = np.zeros((k, 1, n, bias_width), dtype=self.bias_input.dtype)
        for i, tree in enumerate(trees or ()):
            if tree is not None:  # the row's own tree, as one sequence's call takes it (common.py)
                m = len(tree.depth)
                positions[i, :m] = tree.base + tree.depth
                bias[i, :, :m] = attention_bias(starts[i], m, bias_width, self.bias_input.dtype, tree)[0]
        b = self.binding  # a name bound again replaces its binding: the caches stay bound while their rows do
        b.bind_cpu_input(self.primary, np.ascontiguousarray(x))
        for name, value in (extra or {}).items():
            b.bind_cpu_input(name, np.ascontiguousarray(value))
        b.bind_cpu_input("position_ids", positions)
        b.bind_cpu_input("attention_bias", bias)
        if "logits_to_keep" in self.input_names:
            b.bind_cpu_input("logits_to_keep", np.array([keep], dtype=np.int64))
        if in_place:
            # each row's last new slot; causality is by slot, so a row sees only its own tokens and past
            b.bind_cpu_input("seqlens_k", (slots[:, -1]).astype(np.int32))
            b.bind_cpu_input("total_sequence_length", np.array(end, dtype=np.int32))
        written = self._pool.bind(b, rows, width)
        axes = {"batch": k, "seq": n, "kept": n if keep <= 0 else min(keep, n)}  # logits_to_keep's rows
        results = {name: np.empty([axes.get(d, d) for d in shape], dtype=dtype)
                   for name, dtype, shape in self._result_specs}
        for name, array in results.items():
            b.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        try:
            self.session.run_with_iobinding(b)
        except Exception as exc:  # as in `run`
            reason = " ".join(str(exc).split())
            raise RunError(f"piece {self.name!r} failed on a batch of {k} row(s) x {n} token(s) at positions"
                           f" from {min(starts)}: {reason}") from None
        self._pool.write_back(written, rows, starts, n)
        return results

    # -- on a GPU execution provider (ort_device.py) ---------------------------------------------------------

    def _init_device(self) -> None:
        # shallow's states stay in a device store that deep and the adapter read by address
        hidden = next((t for t in self.outputs if t.name == "hidden"), None)
        self._store = (StateStore(self.device, self.max_context, int(hidden.shape[-1]), hidden.dtype)
                       if hidden is not None and isinstance(hidden.shape[-1], int) else None)
        self._host_results = [spec for spec in self._result_specs if self._store is None or spec[0] != "hidden"]
        self._biases = device_biases(self.device)
        self._held: list = []  # what this call bound by address, kept alive until the next call

    def _run_device(self, x: np.ndarray | DeviceStates, start: int, keep: int, tree: TreeMask | None,
                    extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray | DeviceStates]:
        n = x.shape[1]
        if self.kv_mode == "swap":
            self._bind_caches()
        held: list = []
        results: dict = {}
        if self._store is not None:  # bound before the host results, so get_outputs ends with those
            results["hidden"] = self._store.bind_output(self.binding, "hidden", start, n)
        axes = {"batch": 1, "seq": n, "kept": n if keep <= 0 else min(keep, n)}
        for name, dtype, shape in self._host_results:  # only what sampling reads comes back to the host
            if self._shaped:
                results[name] = np.empty([axes.get(d, d) for d in shape], dtype=dtype)
                self.binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(results[name]))
            else:
                self.binding.bind_output(name, "cpu")
        if isinstance(x, DeviceStates):
            bind_states(self.binding, self.primary, x, self.device)
            held.append(x)
        else:
            self.binding.bind_cpu_input(self.primary, x)
        for name, value in (extra or {}).items():
            self.binding.bind_cpu_input(name, value)
        for name, value in control_feeds(self.input_names, start, n, keep, tree).items():
            self.binding.bind_cpu_input(name, value)
        if self.bias_input is not None:
            width, dtype = bias_spec(self.bias_input, start, n, self.max_context)
            held.append(self._biases.bind(self.binding, self.bias_input.name, start, n, width, dtype, tree))
        self._held = held
        try:
            self.session.run_with_iobinding(self.binding)
        except Exception as exc:  # as in `run`
            reason = " ".join(str(exc).split())
            raise RunError(f"piece {self.name!r} failed at positions {start}..{start + n - 1} ({n} token(s)):"
                                  f" {reason}") from None
        if not self._shaped and self._host_results:
            values = self.binding.get_outputs()[-len(self._host_results):]
            results.update((spec[0], v.numpy()) for spec, v in zip(self._host_results, values, strict=True))
        if self.kv_mode == "swap":
            for _, _, buffers in self._caches:
                buffers.reverse()
        return results
