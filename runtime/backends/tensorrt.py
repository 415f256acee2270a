"""TensorRT backend: one engine per piece, run with cuda-python (no torch), behind the same `Piece` protocol
as ONNX Runtime.

Per piece: the engine is deserialized once; one execution context per optimization profile (prefill,
decode, verify), sharing one scratch allocation since they run one after another on the one CUDA stream
all pieces share; KV caches allocated on the device once, at the full context. How a cache is bound
follows the piece's graph (the plan's ``kv.mode``):

* ``inplace`` (TensorScatter, TensorRT 10.15+): TensorRT's KV-cache update layer writes the new entries
  into the cache it reads, so the one buffer is bound as both ``past_*`` and ``present_*``;
* ``swap`` (ScatterElements, every TensorRT): the graph returns the whole updated cache, and binding one
  buffer as both input and output computes wrong results (a TensorRT defect, docs/tensorrt-jetson.md), so
  each cache has two device buffers whose roles swap after every call.

Rolling back after a rejected draft is free either way (attention masks positions past the query). Only
the small outputs (hidden states, logits rows, draft token and probability) are copied back.

Nothing here imports TensorRT or CUDA until a piece is opened; `check_engine_compat`, `select_profile`,
`check_engine_io` and `kv_binding_mode` are pure functions.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..errors import RunError, SpecExportError
from ..manifest import EnginePlan
from ..manifest import Piece as PieceSpec
from .buckets import CacheBuckets, Relayout, dynamic_cache_len
from .common import TensorSpec, TreeMask, bias_input, bias_spec, control_feeds

PRIMARY_INPUTS = ("input_ids", "hidden_in")
INPLACE_KV_FROM = (10, 15)  # TensorScatter / IKVCacheUpdateLayer: in-place cache writes
# The API this backend and the engine builder use (strongly typed networks, user-managed context memory,
# named tensor I/O) is TensorRT 10's; JetPack 6.0's TensorRT 8.6 lacks parts of it.
MIN_TENSORRT = (10,)
ADDRESS_ALIGNMENT = 256  # IExecutionContext::setTensorAddress: "at least 256-byte alignment", host memory included


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of ADDRESS_ALIGNMENT (the stride of buffers carved out of one
    allocation whose parts are bound as tensors)."""
    return -(-int(nbytes) // ADDRESS_ALIGNMENT) * ADDRESS_ALIGNMENT


def aligned_host_array(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A zeroed host array whose data starts on an ADDRESS_ALIGNMENT boundary (numpy guarantees only 16 or 64
    bytes), for shape tensors TensorRT reads from host memory."""
    nbytes = max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)
    raw = np.zeros(nbytes + ADDRESS_ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % ADDRESS_ALIGNMENT
    return raw[offset:offset + nbytes].view(dtype)[:int(np.prod(shape))].reshape(shape)


# -- pure functions (tested without a GPU) ---------------------------------------------------------

def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in str(text).split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_engine_compat(engine_meta: dict, trt_version: str, compute_capability: str, *,
                        bundle: str | Path = "BUNDLE") -> None:
    """Refuse (one sentence) an engine built for another TensorRT version or another GPU.

    Without version compatibility the TensorRT versions must match (major.minor.patch, and the build
    number when both record one); a version-compatible engine runs on the same or a newer TensorRT of
    the same major version. The compute capability must match unless the engine was built with
    hardware compatibility 'ampere+' (then any compute capability 8.0 or newer)."""
    file = engine_meta.get("file", "engine")
    built_v, run_v = _version(engine_meta.get("tensorrt_version", "")), _version(trt_version)
    built_cc, run_cc = str(engine_meta.get("compute_capability", "")), str(compute_capability)
    if engine_meta.get("version_compatible"):
        version_ok = bool(built_v) and run_v[:1] == built_v[:1] and run_v >= built_v
    else:
        n = max(3, min(len(built_v), len(run_v)))
        version_ok = len(built_v) >= 3 and built_v[:n] == run_v[:n]
    if engine_meta.get("hardware_compatibility") == "ampere+":
        cc_ok = _version(run_cc)[:1] >= (8,)
    else:
        cc_ok = _version(built_cc) == _version(run_cc) and bool(built_cc)
    if version_ok and cc_ok:
        return
    raise SpecExportError(
        f"{file} was built with TensorRT {engine_meta.get('tensorrt_version', '?')} for compute capability"
        f" {built_cc or '?'}, but this machine runs TensorRT {trt_version} on compute capability {run_cc};"
        f" TensorRT engines do not move between TensorRT versions or GPUs, so rebuild them on this device"
        f" with `specexport engines build {bundle}`")


def kv_binding_mode(kv_mode: str, trt_version: str) -> str:
    """How a piece's KV caches are bound under TensorRT ``trt_version``: 'inplace' (one buffer bound as input
    and output; only for TensorScatter graphs, which TensorRT 10.15+ updates in place) or 'swap' (two
    buffers, roles exchanged after each call). ONNX Runtime's shared-buffer mode is refused: TensorRT
    computes a buffer bound as both input and output of an ordinary graph wrong."""
    if kv_mode == "swap":
        return "swap"
    if kv_mode == "inplace":
        if _version(trt_version)[:2] < INPLACE_KV_FROM:
            raise SpecExportError(f"this piece updates its KV cache in place with TensorScatter, which TensorRT"
                                  f" {trt_version} cannot run (it arrives in 10.15); rebuild the bundle for this"
                                  " device's target with `specexport build --backend tensorrt --target NAME`")
        return "inplace"
    if kv_mode == "shared":
        raise SpecExportError("this piece binds one KV buffer as both input and output of ONNX Runtime's"
                              " GroupQueryAttention (the 'ort' flavour), which TensorRT cannot parse and would"
                              " compute wrong; rebuild the bundle with `specexport build --backend"
                              " tensorrt --target NAME`")
    raise SpecExportError(f"unknown KV cache mode {kv_mode!r} in the manifest; rebuild the bundle")


def select_profile(profiles: list[dict], n: int, keep: int, batch: int = 1) -> int:
    """The optimization profile for a call of ``n`` tokens keeping ``keep`` logits rows: 'decode' if it
    admits the call, then 'verify', then 'prefill'. Raises one sentence when none does."""
    def admits(p: dict) -> bool:
        seq = next((s for name, s in p["shapes"].items() if name in PRIMARY_INPUTS), None)
        if seq is None or not (seq["min"][1] <= n <= seq["max"][1] and seq["min"][0] <= batch <= seq["max"][0]):
            return False
        keep_range = p.get("values", {}).get("logits_to_keep")
        return keep_range is None or keep_range["min"][0] <= keep <= keep_range["max"][0]

    rank = {"decode": 0, "verify": 1, "prefill": 2}
    for i in sorted(range(len(profiles)), key=lambda i: rank.get(profiles[i]["name"], 3)):
        if admits(profiles[i]):
            return i
    widest = max((p["shapes"][k]["max"][1] for p in profiles for k in p["shapes"] if k in PRIMARY_INPUTS),
                 default=0)
    raise SpecExportError(f"no TensorRT optimization profile admits a call of {n} token(s) keeping {keep} logits"
                          f" row(s) (the engines take up to {widest} tokens); rebuild the plan with a larger"
                          " verify_max or context")


# TensorRT's DataType names -> the manifest's numpy dtype names
TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8", "UINT8": "uint8",
              "INT32": "int32", "INT64": "int64", "BOOL": "bool", "FP8": "float8_e4m3fn", "INT4": "int4"}


def _enum_name(value) -> str:
    """'HALF' for trt.DataType.HALF (pybind11 enums have .name; str() gives 'DataType.HALF')."""
    return str(getattr(value, "name", None) or str(value).rsplit(".", 1)[-1])


def engine_io(engine) -> dict[str, tuple[str, str, int]]:
    """An engine's I/O tensors as {name: ('input' | 'output', numpy dtype name, rank)}."""
    io = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        kind = "input" if _enum_name(engine.get_tensor_mode(name)) == "INPUT" else "output"
        dtype = _enum_name(engine.get_tensor_dtype(name))
        io[name] = (kind, TRT_DTYPES.get(dtype, dtype.lower()), len(engine.get_tensor_shape(name)))
    return io


def check_engine_io(io: dict[str, tuple[str, str, int]], inputs: list[TensorSpec], outputs: list[TensorSpec],
                    piece: str, bundle: str | Path = "BUNDLE") -> None:
    """Refuse (one sentence naming the tensor) an engine whose I/O names, dtypes or ranks differ from what the
    manifest says the piece takes and returns: binding by the manifest would feed such an engine wrong bytes."""
    want = {t.name: ("input", t.dtype, len(t.shape)) for t in inputs}
    want.update({t.name: ("output", t.dtype, len(t.shape)) for t in outputs})
    fix = (f"; the engine was not built from this bundle's pieces, so rebuild it with `specexport engines build"
           f" {bundle}`")
    for name, (kind, dtype, rank) in want.items():
        got = io.get(name)
        if got is None:
            raise SpecExportError(f"the TensorRT engine of piece {piece!r} has no {kind} {name!r}, which the manifest"
                                  f" lists{fix}")
        if got != (kind, dtype, rank):
            raise SpecExportError(f"the TensorRT engine of piece {piece!r} has {got[0]} {name!r} as {got[1]} of rank"
                                  f" {got[2]}, but the manifest says {kind} {dtype} of rank {rank}{fix}")
    extra = next((name for name in io if name not in want), None)
    if extra is not None:
        raise SpecExportError(f"the TensorRT engine of piece {piece!r} has {io[extra][0]} {extra!r}, which the manifest"
                              f" does not list{fix}")


def host_tensors(engine, trt, inputs: list[TensorSpec], outputs: list[TensorSpec], piece: str,
                 bundle: str | Path = "BUNDLE") -> set[str]:
    """The inputs TensorRT reads from host memory (shape tensors), by the engine's own get_tensor_location.
    Only small inputs of fixed shape can be host-side here, and caches and outputs are always bound on the
    device: anything else is refused in one sentence."""
    host = set()
    for t in [*inputs, *outputs]:
        if engine.get_tensor_location(t.name) != trt.TensorLocation.HOST:
            continue
        if t in outputs or t.name.startswith("past_") or not all(isinstance(d, int) for d in t.shape):
            raise SpecExportError(f"the TensorRT engine of piece {piece!r} wants {t.name!r} in host memory, which"
                                  f" this runtime binds on the device; rebuild the engines with `specexport engines"
                                  f" build {bundle}` from this bundle's plan")
        host.add(t.name)
    return host


# -- TensorRT and CUDA, imported lazily ------------------------------------------------------------

def import_tensorrt(hint: str = "") -> object:
    """The `tensorrt` module, or one sentence saying it is missing (``hint``: what to do instead, appended)."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise SpecExportError(
            f"TensorRT's Python bindings are not importable here ({exc}); on Jetson they come with"
            " JetPack in the system Python (python3-libnvinfer, see samples/jetson/README.md), on a desktop from"
            f" NVIDIA's `tensorrt` wheels{hint}") from None
    if not hasattr(trt, "Builder") or not hasattr(trt, "Runtime"):
        raise SpecExportError("the installed `tensorrt` package is a placeholder without the TensorRT libraries;"
                              f" install the real bindings (JetPack's python3-libnvinfer, or NVIDIA's wheels){hint}")
    return require_tensorrt_version(trt, hint)


def require_tensorrt_version(trt, hint: str = "") -> object:
    """``trt`` itself, or one sentence when it is older than MIN_TENSORRT (before any of its API is touched:
    TensorRT 8.6 would fail later with an AttributeError)."""
    version = str(getattr(trt, "__version__", "?"))
    if _version(version)[:len(MIN_TENSORRT)] < MIN_TENSORRT:
        raise SpecExportError(
            f"this machine's TensorRT is {version}, older than the TensorRT 10 that specexport needs (10.3 or newer"
            " is what it is checked against); on a Jetson upgrade to JetPack 6.1 or later, which ships TensorRT 10.3"
            " (JetPack 6.0 ships 8.6), elsewhere install NVIDIA's `tensorrt>=10.3` wheels"
            f" (samples/jetson/README.md){hint}")
    return trt


def cuda_runtime() -> object:
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.8
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python
        except ImportError as exc:
            raise SpecExportError(f"cuda-python is not importable ({exc}); install the one of the device's CUDA:"
                                  " `pip install 'cuda-python>=12.9.2,<13'` for CUDA 12 (JetPack 6), 'cuda-python"
                                  ">=13.0.1,<14' for CUDA 13 (JetPack 7)") from None
    return cudart


def cuda_check(result, what: str):
    """cuda-python calls return (error, *values): raise on error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RunError(f"CUDA call {what} failed with {err}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


def device_info(cudart, device: int = 0) -> dict:
    """The GPU's compute capability and name; one sentence when no GPU is visible."""
    err, count = cudart.cudaGetDeviceCount()
    if int(err) != 0 or count < 1:
        raise SpecExportError(f"no CUDA GPU is visible (cudaGetDeviceCount: {err}, {count} device(s)); TensorRT"
                              " engines are built and run on the GPU device itself")
    props = cuda_check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    name = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
    return {"compute_capability": f"{props.major}.{props.minor}", "name": name}


_STREAMS: dict[int, object] = {}


def shared_stream(cudart) -> object:
    """The one CUDA stream every piece runs on (pieces run one after another)."""
    key = id(cudart)
    if key not in _STREAMS:
        _STREAMS[key] = cuda_check(cudart.cudaStreamCreate(), "cudaStreamCreate")
    return _STREAMS[key]


def _handle(stream) -> int:
    get = getattr(stream, "getPtr", None)
    return int(get()) if get else int(stream)


class DeviceBuffer:
    def __init__(self, cudart, nbytes: int) -> None:
        self.cudart, self.nbytes = cudart, max(int(nbytes), 1)
        self.ptr = int(cuda_check(cudart.cudaMalloc(self.nbytes), "cudaMalloc"))

    def free(self) -> None:
        if self.ptr:
            self.cudart.cudaFree(self.ptr)
            self.ptr = 0


class TrtPiece:
    """One engine, its contexts (one per profile) and its device buffers; implements `Piece.run`."""

    def __init__(self, name: str, engine_bytes: bytes, spec: PieceSpec, plan: EnginePlan, max_context: int, trt, cudart,
                 trt_version: str, version_compatible: bool = False, bundle: str | Path = "BUNDLE") -> None:
        self.name, self.trt, self.cudart, self.bundle = name, trt, cudart, bundle
        self.backend, self.shared_pool, self.handoff = "tensorrt", False, "cuda-stream"
        self.inputs, self.outputs = list(spec.inputs), list(spec.outputs)
        self.input_names = {t.name for t in self.inputs}
        self.bias_input = bias_input(self.inputs)
        self.primary = next(t for t in self.inputs if t.name in PRIMARY_INPUTS)
        self.result_specs = [t for t in self.outputs if not t.name.startswith("present_")]
        self.profiles = list(plan.profiles)
        self.kv_mode = kv_binding_mode(plan.kv.get("mode", spec.kv.mode), trt_version)
        self.max_context = max_context
        self.keep_max = max(p.get("values", {}).get("logits_to_keep", {"max": [1]})["max"][0]
                            for p in self.profiles)
        self.stream = shared_stream(cudart)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        if version_compatible:  # such an engine carries its own lean runtime, which TensorRT must be allowed to run
            self.runtime.engine_host_code_allowed = True
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise SpecExportError(f"TensorRT could not deserialize the engine of piece {name!r}; rebuild it on this"
                                  f" device with `specexport engines build {bundle}`")
        if self.engine.num_optimization_profiles != len(self.profiles):
            raise SpecExportError(f"the engine of piece {name!r} has {self.engine.num_optimization_profiles}"
                                  f" optimization profiles, the plan {len(self.profiles)}; rebuild the engines with"
                                  f" `specexport engines build {bundle}`")
        check_engine_io(engine_io(self.engine), self.inputs, self.outputs, name, bundle)
        # where TensorRT reads each input from is the engine's to say (shape tensors: host memory)
        self.shape_tensors = host_tensors(self.engine, trt, self.inputs, self.outputs, name, bundle)
        self._buffers: list[DeviceBuffer] = []
        self.contexts = self._contexts()
        self._kv: list[tuple[str, str, list[DeviceBuffer], tuple[int, ...]]] = []
        for t in self.inputs:
            if t.name.startswith("past_"):
                present = t.name.replace("past_", "present_", 1)
                self._check_alias(t.name, present)
                shape = tuple(1 if d == "batch" else max_context if d == "cache_len" else int(d) for d in t.shape)
                nbytes = int(np.prod(shape)) * np.dtype(t.dtype).itemsize
                buffers = [self._alloc(nbytes) for _ in range(1 if self.kv_mode == "inplace" else 2)]
                for buf in buffers:  # zeroed once; positions past the query are masked anyway
                    cuda_check(cudart.cudaMemsetAsync(buf.ptr, 0, buf.nbytes, self.stream), "cudaMemsetAsync")
                self._kv.append((t.name, present, buffers, shape))
        self._kv_dtype = next((t.dtype for t in self.inputs if t.name.startswith("past_")), "float32")
        # swap mode (TensorRT before 10.15) reads and writes its whole bound cache each call: bind a bucket
        # that follows the used length (buckets.py); in place, the engine writes only the new entries
        self._buckets = (CacheBuckets(max_context) if self.kv_mode == "swap" and self._kv
                         and dynamic_cache_len(self.inputs) else None)
        self._in = {t.name: self._alloc(self._capacity(t)) for t in self.inputs
                    if not t.name.startswith("past_") and t.name not in self.shape_tensors}
        self._host_shape_values = {t.name: aligned_host_array(tuple(int(d) for d in t.shape), t.dtype)
                                   for t in self.inputs if t.name in self.shape_tensors}
        self._out = {t.name: self._alloc(self._capacity(t)) for t in self.result_specs}
        cuda_check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    # -- setup -----------------------------------------------------------------------------------

    def _check_alias(self, past: str, present: str) -> None:
        """The engine says which output shares an input's memory (TensorRT 10.15+): it must agree with the plan,
        or the binding below would be wrong."""
        aliased = getattr(self.engine, "get_aliased_input_tensor", None)
        if aliased is None:
            return
        source = aliased(present)
        if (source == past) != (self.kv_mode == "inplace"):
            raise SpecExportError(f"the engine of piece {self.name!r} {'updates' if source else 'does not update'}"
                                  f" {past!r} in place but the plan says {self.kv_mode!r}; re-plan and rebuild the"
                                  " engines with `specexport engines plan` and `specexport engines build`")

    def _alloc(self, nbytes: int) -> DeviceBuffer:
        buf = DeviceBuffer(self.cudart, nbytes)
        self._buffers.append(buf)
        return buf

    def _capacity(self, t: TensorSpec) -> int:
        dims = {"batch": 1, "seq": self.max_context, "cache_len": self.max_context, "kept": self.keep_max}
        return int(np.prod([dims.get(d, d) if isinstance(d, str) else d for d in t.shape] or [1])) * \
            np.dtype(t.dtype).itemsize

    def _contexts(self) -> list:
        """One context per profile; they share one scratch allocation when this TensorRT allows it."""
        trt, engine = self.trt, self.engine
        strategy = getattr(trt, "ExecutionContextAllocationStrategy", None)
        size_of = getattr(engine, "get_device_memory_size_for_profile_v2", None)
        contexts = []
        if strategy is not None and size_of is not None:
            scratch = self._alloc(max(size_of(i) for i in range(len(self.profiles))))
            for _ in self.profiles:
                ctx = engine.create_execution_context(strategy.USER_MANAGED)
                if hasattr(ctx, "set_device_memory"):
                    ctx.set_device_memory(scratch.ptr, scratch.nbytes)
                else:
                    ctx.device_memory = scratch.ptr
                contexts.append(ctx)
        else:
            contexts = [engine.create_execution_context() for _ in self.profiles]
        for i, ctx in enumerate(contexts):
            if not ctx.set_optimization_profile_async(i, _handle(self.stream)):
                raise SpecExportError(f"TensorRT refused optimization profile {i} for piece {self.name!r}")
        return contexts

    # -- Piece protocol ------------------------------------------------------------------------------

    def _h2d(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        if array.nbytes > buf.nbytes:
            raise SpecExportError(f"piece {self.name!r}: input of {array.nbytes} bytes exceeds its buffer;"
                                  " the call is longer than the context the engines were built for")
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        cuda_check(self.cudart.cudaMemcpyAsync(buf.ptr, array.ctypes.data, array.nbytes, kind, self.stream),
                   "cudaMemcpyAsync")

    def input_ptr(self, name: str) -> int:
        """The device buffer of input `name` (PEARL's handoff copies shallow states into deep's directly)."""
        return self._in[name].ptr

    def use_stream(self, stream) -> None:
        """Runs its calls on `stream` from now on. A method, so that a wrapper (a draft head's tap) passes it
        on: an attribute set on the wrapper would leave this piece on its old stream."""
        self.stream = stream

    def run(self, x: np.ndarray, start: int, keep: int = 1, tree: TreeMask | None = None,
            device_in: int | None = None, device_out: dict[str, int] | None = None,
            extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """`extra`: more inputs by name (the draft head's features);
        `device_in`: the primary input is already at this device address (x then only gives its shape);
        `device_out`: outputs written to these device addresses instead of the piece's own buffers (the
        host copies are still returned). Both are for runtime/backends/cuda_streams.py; by default neither is used."""
        n = x.shape[1]
        if start + n > self.max_context:
            raise RunError(f"positions {start}..{start + n - 1} exceed the {self.max_context}-token KV cache")
        index = select_profile(self.profiles, n, keep)
        ctx = self.contexts[index]
        slots = self._grow_bucket(start, n) if self._buckets is not None else self.max_context
        feeds = control_feeds(self.input_names, start, n, keep, tree,
                              bias_spec(self.bias_input, start, n, slots))
        feeds[self.primary.name] = np.ascontiguousarray(x, dtype=self.primary.dtype)
        feeds.update(extra or {})
        profile = self.profiles[index]["name"]
        for name, value in feeds.items():
            if name in self.shape_tensors:  # shape tensors are read from host memory
                host = self._host_shape_values[name]
                host[...] = value.reshape(host.shape)
                self._bind_shape(ctx, profile, name, host.shape)
                self._bind_address(ctx, name, host.ctypes.data)
                continue
            value = np.ascontiguousarray(value)
            self._bind_shape(ctx, profile, name, value.shape)
            if name == self.primary.name and device_in is not None:
                self._bind_address(ctx, name, device_in)
                continue
            self._h2d(self._in[name], value)
            self._bind_address(ctx, name, self._in[name].ptr)
        for past, present, buffers, shape in self._kv:
            self._bind_shape(ctx, profile, past, (*shape[:2], slots, *shape[3:]))
            # swap: two distinct buffers, never one as both; inplace: the one buffer TensorRT's cache update writes into
            self._bind_address(ctx, past, buffers[0].ptr)
            self._bind_address(ctx, present, buffers[-1].ptr)
        out_ptrs = {t.name: (device_out or {}).get(t.name, self._out[t.name].ptr) for t in self.result_specs}
        for t in self.result_specs:
            self._bind_address(ctx, t.name, out_ptrs[t.name])
        if not ctx.execute_async_v3(_handle(self.stream)):
            raise RunError(f"TensorRT failed to run piece {self.name!r}")
        results = {}
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for t in self.result_specs:  # only the small outputs come back; the caches stay on the device
            host = np.empty(tuple(ctx.get_tensor_shape(t.name)), dtype=t.dtype)
            cuda_check(self.cudart.cudaMemcpyAsync(host.ctypes.data, out_ptrs[t.name], host.nbytes, kind,
                                                   self.stream), "cudaMemcpyAsync")
            results[t.name] = host
        cuda_check(self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        for _, _, buffers, _ in self._kv:  # the updated cache is the next call's past (a no-op in place)
            buffers.reverse()
        return results

    # A refused shape or address leaves the previous one bound, and the engine would run on it: stop here.
    def _bind_shape(self, ctx, profile: str, name: str, shape: tuple[int, ...]) -> None:
        if not ctx.set_input_shape(name, tuple(shape)):
            raise RunError(f"the TensorRT engine of piece {self.name!r} refused shape {tuple(shape)} for input"
                                  f" {name!r} in its {profile!r} profile; the engine does not match the bundle's plan,"
                                  f" so rebuild the engines with `specexport engines build {self.bundle}`")

    def _bind_address(self, ctx, name: str, ptr: int) -> None:
        if not ctx.set_tensor_address(name, ptr):
            raise RunError(f"the TensorRT engine of piece {self.name!r} refused address 0x{ptr:x} for tensor"
                                  f" {name!r} (no such tensor, or an address it cannot use); rebuild the engines with"
                                  f" `specexport engines build {self.bundle}`")

    def _grow_bucket(self, start: int, n: int) -> int:
        """The call's cache length; when it outgrows the current bucket, every cache is laid out again into
        its other buffer (one 2-D copy, never within one buffer) and the buffers swap roles."""
        slots, grown_from = self._buckets.for_call(start, n)
        if grown_from is None:
            return slots
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        for _, _, buffers, shape in self._kv:
            copy = Relayout.of(shape[1], shape[3], np.dtype(self._kv_dtype).itemsize, grown_from, slots)
            for b in range(shape[0]):  # batch rows (1 today), each a whole [kv_heads, slots, head_dim] cache
                src = buffers[0].ptr + b * copy.src_pitch * copy.height
                dst = buffers[1].ptr + b * copy.dst_pitch * copy.height
                cuda_check(self.cudart.cudaMemcpy2DAsync(dst, copy.dst_pitch, src, copy.src_pitch, copy.width,
                                                         copy.height, kind, self.stream), "cudaMemcpy2DAsync")
            buffers.reverse()
        return slots

    def close(self) -> None:
        self.contexts = []
        for buf in self._buffers:
            buf.free()
        self._buffers = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def open_trt_piece(bundle, name: str, trt=None, cudart=None) -> TrtPiece:
    """The TensorRT piece ``name`` of a loaded bundle: checks the plan, the engine entry, the device and
    the engine's TensorRT version / compute capability before deserializing it. ``trt`` and ``cudart``
    default to the real modules (tests pass doubles to check call order only)."""
    # TensorRT first: on a machine without it, that is the one thing to say, whatever the bundle holds
    hint = "; to run this bundle here use --backend onnxruntime"
    trt = require_tensorrt_version(trt, hint) if trt is not None else import_tensorrt(hint)
    cudart = cudart or cuda_runtime()
    section = bundle.manifest.tensorrt
    plan = section.plan.get(name)
    if plan is None:
        raise SpecExportError(f"bundle {bundle.root} has no TensorRT plan for piece {name!r}; build it with"
                              " `specexport build --backend tensorrt --target NAME`")
    entry = section.engine(name)
    if entry is None:
        raise SpecExportError(f"bundle {bundle.root} has no TensorRT engine for piece {name!r}; build the engines"
                              f" on this device with `specexport engines build {bundle.root}`")
    device = device_info(cudart)
    check_engine_compat(dataclasses.asdict(entry), trt.__version__, device["compute_capability"], bundle=bundle.root)
    path = Path(bundle.root) / entry.file
    if not path.is_file():
        raise SpecExportError(f"{path} is missing; rebuild the engines with `specexport engines build {bundle.root}`")
    return TrtPiece(name, path.read_bytes(), bundle.pieces[name], plan, bundle.max_context, trt, cudart,
                    trt.__version__, entry.version_compatible, bundle=bundle.root)
