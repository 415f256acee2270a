"""CALL ORDER ONLY. `TensorRTDouble` and `CudaRuntimeDouble` are test doubles of the `tensorrt` module and of
cuda-python's runtime: they record which API calls the engine builder and the TensorRT piece make, in
which order and with which arguments (the CUDA double also keeps each allocation as host bytes and refuses
copies that overlap or leave their allocation). They build nothing and compute nothing, so these tests verify the
sequence of calls (strongly typed network, parse_from_file, workspace cap, timing cache shared across
pieces and reused across runs, three profiles with shape-tensor values, the swap of two KV buffers that
are never bound as both input and output), NOT that TensorRT accepts the graphs or computes the right
numbers. That needs a GPU: tests/test_tensorrt_gpu.py. The in-place binding (one buffer as both past and
present, only for TensorScatter graphs) and `specexport build` without --plan-only are covered the same
way: which calls, in which order, with which buffers.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import onnx
import pytest
from specexport.exporter.tensorrt.engines import build_engines, plan_bundle
from specexport.runtime.backends.common import TreeMask
from specexport.runtime.backends.tensorrt import open_trt_piece
from specexport.runtime.bundle import load_bundle

from .test_tensorrt_fp16 import make_tiny_bundle


class TensorRTDouble:
    """Test double of the `tensorrt` module: records calls; no engine is ever built (call order only)."""

    __version__ = "10.3.0.30"

    def __init__(self, version: str | None = None):
        if version:
            self.__version__ = version
        self._setup()

    class Logger:
        WARNING = 2

        def __init__(self, level):
            self.level = level

    class NetworkDefinitionCreationFlag:
        STRONGLY_TYPED = 1

    class MemoryPoolType:
        WORKSPACE = "WORKSPACE"

    class BuilderFlag:
        VERSION_COMPATIBLE = "VERSION_COMPATIBLE"

    class HardwareCompatibilityLevel:
        AMPERE_PLUS = "AMPERE_PLUS"

    class ExecutionContextAllocationStrategy:
        USER_MANAGED = "USER_MANAGED"

    # enum members as the bindings show them: objects with a .name
    DataType = SimpleNamespace(**{n: SimpleNamespace(name=n) for n in
                                  ("FLOAT", "HALF", "BF16", "INT8", "UINT8", "INT32", "INT64", "BOOL")})
    TensorIOMode = SimpleNamespace(INPUT=SimpleNamespace(name="INPUT"), OUTPUT=SimpleNamespace(name="OUTPUT"))
    TensorLocation = SimpleNamespace(DEVICE=SimpleNamespace(name="DEVICE"), HOST=SimpleNamespace(name="HOST"))
    NUMPY_TO_TRT: ClassVar[dict[str, str]] = {
        "float32": "FLOAT", "float16": "HALF", "int8": "INT8", "uint8": "UINT8", "int32": "INT32", "int64": "INT64",
        "bool": "BOOL"}

    def _setup(self):
        self.calls: list[tuple] = []
        self.refuse_shape: set[str] = set()  # tensors whose set_input_shape returns False
        self.refuse_address: set[str] = set()  # tensors whose set_tensor_address returns False
        self.location: dict[str, str] = {}  # get_tensor_location overrides: tensor -> "HOST" or "DEVICE"
        fake = self

        class Cache:
            def __init__(self, data):
                self.data = data

            def serialize(self):
                fake.calls.append(("cache.serialize",))
                return b"timing-cache:" + self.data

        class Profile:
            def set_shape(self, name, lo, opt, hi):
                fake.calls.append(("profile.set_shape", name, list(lo), list(opt), list(hi)))

            def set_shape_input(self, name, lo, opt, hi):
                fake.calls.append(("profile.set_shape_input", name, list(lo), list(opt), list(hi)))

        class Config:
            def __init__(self):
                self.profiles = 0

            def set_memory_pool_limit(self, pool, size):
                fake.calls.append(("config.set_memory_pool_limit", pool, size))

            def __setattr__(self, key, value):
                if key != "profiles":
                    fake.calls.append(("config." + key, value))
                object.__setattr__(self, key, value)

            def set_flag(self, flag):
                fake.calls.append(("config.set_flag", flag))

            def create_timing_cache(self, data):
                fake.calls.append(("config.create_timing_cache", bytes(data)))
                return Cache(bytes(data))

            def set_timing_cache(self, cache, ignore_mismatch):
                fake.calls.append(("config.set_timing_cache", id(cache), ignore_mismatch))
                return True

            def add_optimization_profile(self, profile):
                fake.calls.append(("config.add_optimization_profile",))
                self.profiles += 1
                return self.profiles - 1

        class Network:
            def __init__(self, flags):
                self.flags, self.inputs = flags, []

            @property
            def num_inputs(self):
                return len(self.inputs)

            def get_input(self, i):
                return self.inputs[i]

        class Builder:
            def __init__(self, logger):
                fake.calls.append(("Builder",))

            def create_network(self, flags):
                fake.calls.append(("builder.create_network", flags))
                return Network(flags)

            def create_builder_config(self):
                fake.calls.append(("builder.create_builder_config",))
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                fake.calls.append(("builder.build_serialized_network", config.profiles))
                form = b"inplace:" if getattr(network, "inplace", False) else b"swap:"
                return b"fake-engine:" + form + json.dumps(network.io).encode()  # the I/O the engine reports

        class OnnxParser:
            num_errors = 0

            def __init__(self, network, logger):
                self.network = network

            def parse_from_file(self, path):
                fake.calls.append(("parser.parse_from_file", path))
                model = onnx.load(path, load_external_data=False)
                self.network.inputs = [SimpleNamespace(name=v.name, is_shape_tensor=v.name == "logits_to_keep")
                                       for v in model.graph.input]

                def io(v, mode):
                    dtype = onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name
                    return [v.name, mode, fake.NUMPY_TO_TRT[dtype], len(v.type.tensor_type.shape.dim),
                            "HOST" if v.name == "logits_to_keep" else "DEVICE"]
                self.network.io = [*(io(v, "INPUT") for v in model.graph.input),
                                   *(io(v, "OUTPUT") for v in model.graph.output)]
                self.network.inplace = any(n.op_type == "TensorScatter" for n in model.graph.node)
                return True

        class Context:
            def __init__(self, index):
                self.index, self.shapes = index, {}

            def set_device_memory(self, ptr, size):
                fake.calls.append(("context.set_device_memory", ptr, size))

            def set_optimization_profile_async(self, i, stream):
                fake.calls.append(("context.set_optimization_profile_async", i, stream))
                self.profile = i
                return True

            def set_input_shape(self, name, shape):
                fake.calls.append(("context.set_input_shape", self.profile, name, tuple(shape)))
                if name in fake.refuse_shape:
                    return False
                self.shapes[name] = tuple(shape)
                return True

            def set_tensor_address(self, name, ptr):
                fake.calls.append(("context.set_tensor_address", self.profile, name, ptr))
                assert ptr % 256 == 0, f"{name} bound at 0x{ptr:x}, not 256-byte aligned (setTensorAddress)"
                return name not in fake.refuse_address

            def execute_async_v3(self, stream):
                fake.calls.append(("context.execute_async_v3", self.profile, stream))
                return True

            def get_tensor_shape(self, name):
                primary = self.shapes.get("hidden_in") or self.shapes.get("input_ids")
                return {"hidden": (1, primary[1], 64), "logits": (1, 1, 300), "top_token": (1, 1),
                        "top_prob": (1, 1)}[name]

        class Engine:
            num_optimization_profiles = 3

            def __init__(self, inplace, io):
                self.contexts, self.inplace = 0, inplace
                self.io = {t[0]: t for t in io}  # name -> [name, mode, dtype, rank, location]

            def get_aliased_input_tensor(self, name):
                return name.replace("present_", "past_", 1) if self.inplace and name.startswith("present_") else None

            @property
            def num_io_tensors(self):
                return len(self.io)

            def get_tensor_name(self, i):
                return list(self.io)[i]

            def get_tensor_mode(self, name):
                return getattr(fake.TensorIOMode, self.io[name][1])

            def get_tensor_dtype(self, name):
                return getattr(fake.DataType, self.io[name][2])

            def get_tensor_shape(self, name):
                return (-1,) * self.io[name][3]

            def get_tensor_location(self, name):
                return getattr(fake.TensorLocation, fake.location.get(name, self.io[name][4]))

            def is_shape_inference_io(self, name):  # what the plan's analysis says, whatever the location
                return name == "logits_to_keep"

            def get_device_memory_size_for_profile_v2(self, i):
                return 1000 * (i + 1)

            def create_execution_context(self, strategy=None):
                fake.calls.append(("engine.create_execution_context", strategy))
                self.contexts += 1
                return Context(self.contexts - 1)

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, data):
                fake.calls.append(("runtime.deserialize_cuda_engine", bytes(data[:12])))
                head, _, io = bytes(data).partition(b"[")
                return Engine(head == b"fake-engine:inplace:", json.loads(b"[" + io))

        self.Builder, self.OnnxParser, self.Runtime = Builder, OnnxParser, Runtime


class CudaRuntimeDouble:
    """Test double of cuda-python's runtime module (no GPU): hands out fake device pointers backed by host
    bytearrays, so device-to-device copies and memsets really move bytes there, and every copy is checked
    the way the CUDA runtime documents its arguments: each range inside one allocation, and source and
    destination never overlapping ("the memory areas may not overlap"). A violation raises AssertionError
    in the test. Host-to-device and device-to-host copies are recorded and bounds-checked on the device
    side only. It computes nothing: what TensorRT would write is never written."""

    ALIGN = 256  # cudaMalloc returns at least 256-byte aligned addresses

    class cudaMemcpyKind:
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2
        cudaMemcpyDeviceToDevice = 3

    def __init__(self, major=8, minor=7):
        self.calls: list[tuple] = []
        self.next_ptr = 0x1000
        self.memory: dict[int, bytearray] = {}  # base address -> the allocation's bytes
        self.props = SimpleNamespace(major=major, minor=minor, name=b"Fake Orin (test double)")

    def cudaGetDeviceCount(self):
        return 0, 1

    def cudaGetDeviceProperties(self, device):
        return 0, self.props

    def cudaStreamCreate(self):
        return 0, 77

    def cudaMalloc(self, nbytes):
        self.next_ptr += 0x100000
        assert nbytes <= 0x100000 - self.ALIGN, "the double's address space holds allocations up to 1 MiB"
        self.memory[self.next_ptr] = bytearray(nbytes)
        self.calls.append(("cudaMalloc", nbytes, self.next_ptr))
        return 0, self.next_ptr

    def cudaFree(self, ptr):
        self.memory.pop(ptr, None)
        return (0,)

    def locate(self, ptr: int, nbytes: int) -> tuple[int, int]:
        """(allocation base, offset) of [ptr, ptr + nbytes), which must lie inside one live allocation."""
        for base, data in self.memory.items():
            if base <= ptr and ptr + nbytes <= base + len(data):
                return base, ptr - base
        raise AssertionError(f"device range 0x{ptr:x}+{nbytes} lies in no allocation")

    def read(self, ptr: int, nbytes: int) -> bytes:
        base, off = self.locate(ptr, nbytes)
        return bytes(self.memory[base][off:off + nbytes])

    def write(self, ptr: int, data: bytes) -> None:
        base, off = self.locate(ptr, len(data))
        self.memory[base][off:off + len(data)] = data

    def _copy_2d(self, dst, dpitch, src, spitch, width, height):
        assert width <= dpitch and width <= spitch, f"width {width} exceeds a pitch ({dpitch}, {spitch})"
        if height == 0 or width == 0:
            return
        src_rows = [(src + r * spitch, src + r * spitch + width) for r in range(height)]
        dst_rows = [(dst + r * dpitch, dst + r * dpitch + width) for r in range(height)]
        for lo, hi in src_rows + dst_rows:
            self.locate(lo, hi - lo)
        for s_lo, s_hi in src_rows:
            for d_lo, d_hi in dst_rows:
                assert s_hi <= d_lo or d_hi <= s_lo, (
                    f"overlapping copy: source 0x{s_lo:x}..0x{s_hi:x} and destination 0x{d_lo:x}..0x{d_hi:x}")
        rows = [self.read(lo, hi - lo) for lo, hi in src_rows]
        for (lo, _), row in zip(dst_rows, rows, strict=True):
            self.write(lo, row)

    def cudaMemsetAsync(self, ptr, value, nbytes, stream):
        self.calls.append(("cudaMemsetAsync", ptr, nbytes))
        self.write(ptr, bytes([value]) * nbytes)
        return (0,)

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        self.calls.append(("cudaMemcpyAsync", kind, nbytes))
        if kind == self.cudaMemcpyKind.cudaMemcpyDeviceToDevice:
            self._copy_2d(dst, nbytes, src, nbytes, nbytes, 1)
        elif kind == self.cudaMemcpyKind.cudaMemcpyHostToDevice:
            self.locate(dst, nbytes)
        else:
            self.locate(src, nbytes)
        return (0,)

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        self.calls.append(("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind))
        assert kind == self.cudaMemcpyKind.cudaMemcpyDeviceToDevice, "only device-to-device 2-D copies are modelled"
        self._copy_2d(dst, dpitch, src, spitch, width, height)
        return (0,)

    def cudaStreamSynchronize(self, stream):
        self.calls.append(("cudaStreamSynchronize",))
        return (0,)

    # streams and events (runtime/backends/cuda_streams.py): handles only, nothing waits
    cudaStreamNonBlocking = 1
    cudaEventDisableTiming = 2

    def cudaStreamCreateWithFlags(self, flags):
        self.next_handle = getattr(self, "next_handle", 100) + 1
        return 0, self.next_handle

    cudaEventCreateWithFlags = cudaStreamCreateWithFlags

    def cudaStreamWaitEvent(self, stream, event, flags):
        return (0,)

    def cudaEventRecord(self, event, stream):
        return (0,)

    def cudaEventDestroy(self, event):
        return (0,)

    def cudaStreamDestroy(self, stream):
        return (0,)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """The device-wide timing cache goes to a fresh folder per test, not the shared one."""
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def planned(tmp_path_factory, tiny_checkpoint):
    out = make_tiny_bundle(tmp_path_factory.mktemp("calls") / "b", tiny_checkpoint)
    plan_bundle(out, "orin-nano")
    return out


@pytest.fixture()
def bundle(planned, tmp_path):
    out = tmp_path / "b"
    shutil.copytree(planned, out)
    return out


def _names(calls):
    return [c[0] for c in calls]


def test_build_engines_call_order(bundle):
    trt, cuda = TensorRTDouble(), CudaRuntimeDouble()
    manifest = build_engines(bundle, trt=trt, cudart=cuda, log=lambda m: None).to_dict()
    names = _names(trt.calls)
    assert names.count("Builder") == 1  # one builder for all pieces
    parses = [c[1] for c in trt.calls if c[0] == "parser.parse_from_file"]
    assert [p.split("/")[-1] for p in parses] == ["shallow.onnx", "deep.onnx", "adapter.onnx"]
    assert all(c[1] == 1 << 1 for c in trt.calls if c[0] == "builder.create_network")  # STRONGLY_TYPED bit
    # per piece: network -> parse -> config (workspace, level, timing cache) -> 3 profiles -> build
    for start in [i for i, n in enumerate(names) if n == "builder.create_network"]:
        seq = names[start:names.index("builder.build_serialized_network", start) + 1]
        assert seq[:3] == ["builder.create_network", "parser.parse_from_file", "builder.create_builder_config"]
        assert seq.index("config.set_memory_pool_limit") < seq.index("config.add_optimization_profile")
        assert seq.count("config.add_optimization_profile") == 3 and seq[-1] == "builder.build_serialized_network"
    assert ("config.set_memory_pool_limit", "WORKSPACE", 512 << 20) in trt.calls
    assert ("config.builder_optimization_level", 3) in trt.calls
    caches = {c[1] for c in trt.calls if c[0] == "config.set_timing_cache"}
    assert len(caches) == 1  # one timing cache object shared by the three pieces
    assert names.count("config.create_timing_cache") == 1 and names.count("cache.serialize") == 1
    shape_inputs = [c for c in trt.calls if c[0] == "profile.set_shape_input"]
    assert {c[1] for c in shape_inputs} == {"logits_to_keep"}
    assert ["logits_to_keep", [1], [1], [1]] == list(shape_inputs[1][1:])  # deep's decode profile, by value
    kv = [c for c in trt.calls if c[0] == "profile.set_shape" and c[1] == "past_key.0"]
    assert all(c[2] == c[3] == c[4] == [1, 2, 128, 16] for c in kv)

    engines = manifest["tensorrt"]["engines"]
    assert [e["piece"] for e in engines] == ["shallow", "deep", "adapter"]
    for e in engines:
        assert e["tensorrt_version"] == "10.3.0.30" and e["compute_capability"] == "8.7"
        assert e["built_with"] == "python-api" and (bundle / e["file"]).is_file()
        assert manifest["files"][e["file"]] == e["sha256"]
    assert (bundle / "tensorrt" / "timing.cache").read_bytes().startswith(b"timing-cache:")
    load_bundle(bundle)  # manifest rewritten with every checksum right

    # a second run loads the saved timing cache: reused across runs
    trt2 = TensorRTDouble()
    build_engines(bundle, trt=trt2, cudart=CudaRuntimeDouble(), log=lambda m: None, pieces=["deep"])
    loaded = [c for c in trt2.calls if c[0] == "config.create_timing_cache"]
    assert loaded and loaded[0][1].startswith(b"timing-cache:")
    assert [e["piece"] for e in json.loads((bundle / "manifest.json").read_text())["tensorrt"]["engines"]] == \
        ["shallow", "deep", "adapter"]


def test_build_refuses_another_gpu_than_planned(bundle):
    from specexport.runtime.errors import SpecExportError

    with pytest.raises(SpecExportError, match=r"compute capability 8\.9 but the plan is for target orin-nano"):
        build_engines(bundle, trt=TensorRTDouble(), cudart=CudaRuntimeDouble(8, 9), log=lambda m: None)


def test_trt_piece_call_order_and_kv_swap(bundle):
    trt, cuda = TensorRTDouble(), CudaRuntimeDouble()
    build_engines(bundle, trt=trt, cudart=cuda, log=lambda m: None)
    b = load_bundle(bundle)
    trt.calls.clear()
    piece = open_trt_piece(b, "deep", trt=trt, cudart=cuda)
    names = _names(trt.calls)
    assert names[0] == "runtime.deserialize_cuda_engine"
    assert names.count("engine.create_execution_context") == 3  # one context per profile
    assert [c[1] for c in trt.calls if c[0] == "context.set_optimization_profile_async"] == [0, 1, 2]
    assert len({c[1] for c in trt.calls if c[0] == "context.set_device_memory"}) == 1  # one shared scratch

    def run(n, start, keep):
        trt.calls.clear()
        out = piece.run(np.zeros((1, n, 64), np.float16), start, keep=keep)
        addresses = {c[2]: c[3] for c in trt.calls if c[0] == "context.set_tensor_address"}
        profile = next(c[1] for c in trt.calls if c[0] == "context.execute_async_v3")
        order = _names(trt.calls)
        assert order.index("context.set_input_shape") < order.index("context.execute_async_v3")
        assert order[-1] == "context.execute_async_v3"
        return out, addresses, profile

    _, first, profile = run(20, 0, 1)
    assert profile == 0  # prefill
    for i in range(2):
        for kind in ("key", "value"):
            assert first[f"past_{kind}.{i}"] != first[f"present_{kind}.{i}"]  # never one buffer for both
    assert first["logits_to_keep"] == piece._host_shape_values["logits_to_keep"].ctypes.data  # host memory
    out, second, profile = run(1, 20, 1)
    assert profile == 1  # decode
    assert second["past_key.0"] == first["present_key.0"] and second["present_key.0"] == first["past_key.0"]
    assert set(out) == {"logits"} and out["logits"].shape == (1, 1, 300)
    _, third, profile = run(7, 21, 7)
    assert profile == 2  # verify
    assert third["past_key.0"] == first["past_key.0"]
    # only the small outputs come back: one device-to-host copy per call (logits), none for the caches
    cuda.calls.clear()
    run(1, 28, 1)
    d2h = [c for c in cuda.calls if c[0] == "cudaMemcpyAsync" and c[1] == 2]
    assert len(d2h) == 1 and d2h[0][2] == 300 * 4
    piece.close()


def test_trt_piece_tree_call_feeds_a_cache_wide_bias(bundle):
    """A token tree's call feeds an attention_bias as wide as the cache."""
    trt, cuda = TensorRTDouble(), CudaRuntimeDouble()
    build_engines(bundle, trt=trt, cudart=cuda, log=lambda m: None)
    piece = open_trt_piece(load_bundle(bundle), "deep", trt=trt, cudart=cuda)
    trt.calls.clear()
    piece.run(np.zeros((1, 5, 64), np.float16), 21, keep=5, tree=TreeMask.from_parents([-1, 0, 0, 1, 2], 21))
    shapes = {c[2]: c[3] for c in trt.calls if c[0] == "context.set_input_shape"}
    assert tuple(shapes["attention_bias"]) == (1, 1, 5, 128)
    piece.close()


def test_open_refuses_an_engine_from_another_tensorrt(bundle):
    from specexport.runtime.errors import SpecExportError

    build_engines(bundle, trt=TensorRTDouble(), cudart=CudaRuntimeDouble(), log=lambda m: None)
    newer = TensorRTDouble()
    newer.__version__ = "10.7.0.23"
    with pytest.raises(SpecExportError, match="rebuild them on this device with `specexport engines build"):
        open_trt_piece(load_bundle(bundle), "deep", trt=newer, cudart=CudaRuntimeDouble())


@pytest.fixture(scope="module")
def planned_inplace(tmp_path_factory, tiny_checkpoint):
    out = make_tiny_bundle(tmp_path_factory.mktemp("calls-inplace") / "b", tiny_checkpoint, inplace=True)
    plan_bundle(out, "rtx-4090")
    return out


def test_trt_piece_inplace_binding_call_order(planned_inplace, tmp_path):
    """TensorScatter engines (TensorRT 10.15+): one device buffer per cache, bound as both past and present, the
    same buffer on every call; the double's engine reports the aliasing as TensorRT's does."""
    bundle = tmp_path / "b"
    shutil.copytree(planned_inplace, bundle)
    trt, cuda = TensorRTDouble("10.15.1.4"), CudaRuntimeDouble(8, 9)
    build_engines(bundle, trt=trt, cudart=cuda, log=lambda m: None)
    cuda.calls.clear()
    piece = open_trt_piece(load_bundle(bundle), "deep", trt=trt, cudart=cuda)
    kv_bytes = 1 * 2 * 128 * 16 * 2  # [batch, kv_heads, context, head_dim] fp16
    assert sum(1 for c in cuda.calls if c[0] == "cudaMalloc" and c[1] == kv_bytes) == 4  # 2 layers x K, V: one each
    seen = []
    for n, start, keep in ((20, 0, 1), (1, 20, 1), (7, 21, 7)):
        trt.calls.clear()
        piece.run(np.zeros((1, n, 64), np.float16), start, keep=keep)
        addresses = {c[2]: c[3] for c in trt.calls if c[0] == "context.set_tensor_address"}
        assert addresses["past_key.0"] == addresses["present_key.0"]  # in place: TensorRT requires the same memory
        seen.append(addresses["past_value.1"])
    assert len(set(seen)) == 1  # nothing swaps
    piece.close()
    from specexport.runtime.errors import SpecExportError

    old = TensorRTDouble("10.13.3.9")  # an engine from another TensorRT: refused before anything is bound
    with pytest.raises(SpecExportError, match="rebuild them on this device"):
        open_trt_piece(load_bundle(bundle), "deep", trt=old, cudart=CudaRuntimeDouble(8, 9))


def test_trt_piece_refuses_an_engine_that_disagrees_with_the_plan(planned_inplace, tmp_path):
    from specexport.runtime.errors import SpecExportError

    bundle = tmp_path / "b"
    shutil.copytree(planned_inplace, bundle)
    trt = TensorRTDouble("10.15.1.4")
    build_engines(bundle, trt=trt, cudart=CudaRuntimeDouble(8, 9), log=lambda m: None)
    engine = bundle / "tensorrt" / "deep.engine"
    engine.write_bytes(engine.read_bytes().replace(b"fake-engine:inplace:", b"fake-engine:swap:"))
    with pytest.raises(SpecExportError, match=r"does not update 'past_key.0' in place but the plan says 'inplace'"):
        open_trt_piece(load_bundle(bundle, verify=False), "deep", trt=trt, cudart=CudaRuntimeDouble(8, 9))


def test_build_without_plan_only_builds_engines_into_the_bundle(tmp_path, tiny_checkpoint, monkeypatch):
    """`specexport build --backend tensorrt --target orin-nano` on a machine with TensorRT (here: the double)
    exports, checks, plans and builds the engines before the bundle is committed; every file, the engines
    and scripts under tensorrt/ included, is checksummed in the manifest."""
    from click.testing import CliRunner
    from specexport.cli.main import main
    from specexport.exporter.tensorrt import engines as trt_build
    from specexport.runtime.backends import tensorrt as trt_backend

    trt, cuda = TensorRTDouble(), CudaRuntimeDouble()
    for module in (trt_backend, trt_build):
        monkeypatch.setattr(module, "import_tensorrt", lambda hint="": trt)
        monkeypatch.setattr(module, "cuda_runtime", lambda: cuda)
    out = tmp_path / "b"
    result = CliRunner().invoke(main, ["build", "--model", str(tiny_checkpoint), "--target", "orin-nano", "--out",
                                       str(out), "--context", "128", "--adapter", "none"])
    assert result.exit_code == 0, result.output
    assert "3 engine(s) built" not in result.output and "2 engine(s) built" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    engines = manifest["tensorrt"]["engines"]
    assert [e["piece"] for e in engines] == ["shallow", "deep"] and all(e["built_with"] == "python-api"
                                                                        for e in engines)
    for rel in ("tensorrt/shallow.engine", "tensorrt/deep.engine", "tensorrt/build_deep.sh"):
        assert rel in manifest["files"] and (out / rel).is_file()
    load_bundle(out)  # every checksum verifies
    names = _names(trt.calls)
    assert names.count("Builder") == 1 and names.count("builder.build_serialized_network") == 2
    # the engines were built inside the bundle's temporary folder, before it was renamed into place
    parsed = [c[1] for c in trt.calls if c[0] == "parser.parse_from_file"]
    assert all(".b.partial-" in p for p in parsed)
    assert not list(tmp_path.glob(".b.partial-*"))

    # the same build refused for another GPU than the target's: nothing written
    wrong = CudaRuntimeDouble(8, 9)
    for module in (trt_backend, trt_build):
        monkeypatch.setattr(module, "cuda_runtime", lambda: wrong)
    again = CliRunner().invoke(main, ["build", "--model", str(tiny_checkpoint), "--target", "orin-nano", "--out",
                                      str(tmp_path / "c"), "--context", "128", "--adapter", "none"])
    assert again.exit_code == 1 and "compute capability 8.9 but target orin-nano is 8.7" in again.output
    assert not (tmp_path / "c").exists()


def test_adopt_records_trtexec_engines_call_order(bundle):
    """After the plan's trtexec scripts ran (here: engine files the double can deserialize), --adopt loads each
    engine once to check it and records it as built by trtexec, without building anything."""
    from specexport.runtime.errors import SpecExportError

    trt = TensorRTDouble()
    with pytest.raises(SpecExportError, match=r"run tensorrt/build_shallow\.sh first"):
        build_engines(bundle, trt=trt, cudart=CudaRuntimeDouble(), adopt=True, log=lambda m: None)
    # stands for trtexec: engine files the double can deserialize
    build_engines(bundle, trt=TensorRTDouble(), cudart=CudaRuntimeDouble(), log=lambda m: None)
    trt.calls.clear()
    manifest = build_engines(bundle, trt=trt, cudart=CudaRuntimeDouble(), adopt=True, log=lambda m: None).to_dict()
    names = _names(trt.calls)
    assert "Builder" not in names and names.count("runtime.deserialize_cuda_engine") == 3
    assert {e["built_with"] for e in manifest["tensorrt"]["engines"]} == {"trtexec"}
    load_bundle(bundle)


def test_trt_piece_binds_a_cache_that_follows_the_used_length(tmp_path, tiny_checkpoint):
    """Swap mode (TensorRT before 10.15): each call binds the cache at its bucket, and crossing into a bigger
    one lays every cache out again with one 2-D copy into the other buffer, never within one."""
    out = make_tiny_bundle(tmp_path / "b512", tiny_checkpoint, context=512, adapter=False)
    manifest = plan_bundle(out, "orin-nano").to_dict()
    deep_profiles = manifest["tensorrt"]["plan"]["deep"]["profiles"]
    assert all(p["shapes"]["past_key.0"]["min"][2] == 128 and p["shapes"]["past_key.0"]["max"][2] == 512
               for p in deep_profiles)
    trt, cuda = TensorRTDouble(), CudaRuntimeDouble()
    build_engines(out, trt=trt, cudart=cuda, log=lambda m: None)
    piece = open_trt_piece(load_bundle(out), "deep", trt=trt, cudart=cuda)
    kv = piece._kv[0][3]  # (batch, kv_heads, context, head_dim)

    def call(n, start):
        trt.calls.clear()
        cuda.calls.clear()
        piece.run(np.zeros((1, n, 64), np.float16), start, keep=1)
        shapes = {c[2]: c[3] for c in trt.calls if c[0] == "context.set_input_shape"}
        return shapes, [c for c in cuda.calls if c[0] == "cudaMemcpy2DAsync"]

    shapes, copies = call(100, 0)
    assert shapes["past_key.0"][2] == 128 and shapes["attention_bias"][-1] == 128 and not copies
    past_before = piece._kv[0][2][0].ptr
    shapes, copies = call(3, 127)  # positions 127..129: the 256 bucket
    assert shapes["past_key.0"][2] == 256 and shapes["attention_bias"][-1] == 256
    assert len(copies) == len(piece._kv)  # one copy per cache
    _, dst, dpitch, src, spitch, width, height, kind = copies[0]
    row = kv[3] * 2  # head_dim fp16 values
    assert (dpitch, spitch, width, height, kind) == (256 * row, 128 * row, 128 * row, kv[1], 3)
    assert src == past_before and dst != src  # from the current cache into the other buffer
    shapes, copies = call(1, 110)  # a rollback keeps the bucket
    assert shapes["past_key.0"][2] == 256 and not copies
    shapes, copies = call(20, 0)  # a new sequence starts small again
    assert shapes["past_key.0"][2] == 128 and not copies
    piece.close()


@pytest.mark.parametrize(("call", "tensor", "words"), [
    ("shape", "past_key.1", r"refused shape \(1, 2, 128, 16\) for input 'past_key.1' in its 'prefill' profile"),
    ("shape", "logits_to_keep", r"refused shape \(1,\) for input 'logits_to_keep'"),
    ("address", "present_value.0", r"refused address 0x[0-9a-f]+ for tensor 'present_value.0'"),
    ("address", "logits", r"refused address 0x[0-9a-f]+ for tensor 'logits'"),
])
def test_trt_piece_stops_when_tensorrt_refuses_a_shape_or_address(bundle, call, tensor, words):
    """set_input_shape and set_tensor_address return False when TensorRT refuses (the previous binding then
    stays in place): the call stops before execute_async_v3 with one sentence naming the piece and the tensor."""
    from specexport.runtime.errors import SpecExportError

    trt, cuda = TensorRTDouble(), CudaRuntimeDouble()
    build_engines(bundle, trt=trt, cudart=cuda, log=lambda m: None)
    piece = open_trt_piece(load_bundle(bundle), "deep", trt=trt, cudart=cuda)
    getattr(trt, f"refuse_{call}").add(tensor)
    trt.calls.clear()
    with pytest.raises(SpecExportError, match=f"engine of piece 'deep' {words}.*specexport engines build"):
        piece.run(np.zeros((1, 20, 64), np.float16), 0, keep=1)
    assert "context.execute_async_v3" not in _names(trt.calls)
    piece.close()


class TensorRT86Double(TensorRTDouble):
    """The double as TensorRT 8.6.2 (JetPack 6.0) looks to this code: no strongly typed networks, no
    ExecutionContextAllocationStrategy."""

    __version__ = "8.6.2"

    class NetworkDefinitionCreationFlag:
        EXPLICIT_BATCH = 0

    def __getattribute__(self, name):
        if name == "ExecutionContextAllocationStrategy":
            raise AttributeError(name)
        return super().__getattribute__(name)


TOO_OLD = r"this machine's TensorRT is 8\.6\.2, older than the TensorRT 10 that specexport needs.*JetPack 6\.1 or later"


def test_tensorrt_8_6_is_refused_in_one_sentence(bundle, monkeypatch):
    """TensorRT 8.6: `engines build`, build_engines and opening an engine each refuse with the version needed and
    how to get it, before touching an API 8.6 lacks (which used to end in an AttributeError)."""
    from click.testing import CliRunner
    from specexport.cli.main import main
    from specexport.exporter.tensorrt import engines as trt_build
    from specexport.runtime.backends import tensorrt as trt_backend
    from specexport.runtime.errors import SpecExportError

    with pytest.raises(SpecExportError, match=TOO_OLD):
        build_engines(bundle, trt=TensorRT86Double(), cudart=CudaRuntimeDouble(), log=lambda m: None)
    build_engines(bundle, trt=TensorRTDouble(), cudart=CudaRuntimeDouble(), log=lambda m: None)
    with pytest.raises(SpecExportError, match=TOO_OLD + ".*--backend onnxruntime"):
        open_trt_piece(load_bundle(bundle), "deep", trt=TensorRT86Double(), cudart=CudaRuntimeDouble())

    old, cuda = TensorRT86Double(), CudaRuntimeDouble()
    monkeypatch.setattr(trt_backend, "cuda_runtime", lambda: cuda)
    monkeypatch.setattr(trt_build, "cuda_runtime", lambda: cuda)
    monkeypatch.setitem(sys.modules, "tensorrt", old)  # what `import tensorrt` finds
    result = CliRunner().invoke(main, ["engines", "build", str(bundle)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and re.search(TOO_OLD, errors[0]), result.output


def test_trt_piece_binds_by_the_engines_tensor_location(bundle):
    """get_tensor_location decides host or device memory: an input the engine keeps on the device is copied
    there and bound by its device address, even when it is used for shape inference; a host-side input is
    bound by a host address."""
    trt, cuda = TensorRTDouble(), CudaRuntimeDouble()
    build_engines(bundle, trt=trt, cudart=cuda, log=lambda m: None)
    trt.location["logits_to_keep"] = "DEVICE"
    piece = open_trt_piece(load_bundle(bundle), "deep", trt=trt, cudart=cuda)
    trt.calls.clear()
    cuda.calls.clear()
    piece.run(np.zeros((1, 20, 64), np.float16), 0, keep=1)
    bound = {c[2]: c[3] for c in trt.calls if c[0] == "context.set_tensor_address"}
    assert bound["logits_to_keep"] == piece.input_ptr("logits_to_keep") and bound["logits_to_keep"] in cuda.memory
    h2d = [c[2] for c in cuda.calls if c[0] == "cudaMemcpyAsync" and c[1] == 1]
    assert 8 in h2d  # the int64 value went to the device
    piece.close()
    trt.location["logits_to_keep"] = "HOST"
    piece = open_trt_piece(load_bundle(bundle), "deep", trt=trt, cudart=cuda)
    trt.calls.clear()
    piece.run(np.zeros((1, 20, 64), np.float16), 0, keep=1)
    bound = {c[2]: c[3] for c in trt.calls if c[0] == "context.set_tensor_address"}
    assert bound["logits_to_keep"] == piece._host_shape_values["logits_to_keep"].ctypes.data
    piece.close()


@pytest.mark.parametrize(("tensor", "words"), [
    ("position_ids", "wants 'position_ids' in host memory"),  # a per-call shape: cannot be a fixed host array
    ("past_key.0", "wants 'past_key.0' in host memory"),
    ("logits", "wants 'logits' in host memory"),
])
def test_trt_piece_refuses_host_memory_it_cannot_bind(bundle, tensor, words):
    from specexport.runtime.errors import SpecExportError

    trt = TensorRTDouble()
    build_engines(bundle, trt=trt, cudart=CudaRuntimeDouble(), log=lambda m: None)
    trt.location[tensor] = "HOST"
    with pytest.raises(SpecExportError, match=f"engine of piece 'deep' {words}.*specexport engines build"):
        open_trt_piece(load_bundle(bundle), "deep", trt=trt, cudart=CudaRuntimeDouble())


def _tamper_inputs(spec):
    spec["inputs"] = [t for t in spec["inputs"] if t["name"] != "attention_bias"]


def _input(spec, name):
    return next(t for t in spec["inputs"] if t["name"] == name)


@pytest.mark.parametrize(("change", "words"), [
    (lambda spec: _input(spec, "past_value.1").update(dtype="float32"),
     r"has input 'past_value\.1' as float16 of rank 4, but the manifest says input float32 of rank 4"),
    (lambda spec: _input(spec, "hidden_in").update(shape=["batch", "seq"]),
     r"has input 'hidden_in' as float16 of rank 3, but the manifest says input float16 of rank 2"),
    (lambda spec: spec["outputs"].append({"name": "top_token", "dtype": "int64", "shape": ["batch", "kept"]}),
     r"has no output 'top_token', which the manifest lists"),
    (_tamper_inputs, r"has input 'attention_bias', which the manifest does not list"),
])
def test_trt_piece_refuses_an_engine_whose_io_differs_from_the_manifest(bundle, change, words):
    """Names, dtypes and ranks of the engine's I/O against the manifest's piece, at load, naming the tensor."""
    from specexport.runtime.errors import SpecExportError

    trt = TensorRTDouble()
    build_engines(bundle, trt=trt, cudart=CudaRuntimeDouble(), log=lambda m: None)
    manifest = json.loads((bundle / "manifest.json").read_text())
    change(manifest["pieces"]["deep"])
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecExportError, match=f"TensorRT engine of piece 'deep' {words}.*specexport engines build"):
        open_trt_piece(load_bundle(bundle, verify=False), "deep", trt=trt, cudart=CudaRuntimeDouble())


def test_adopt_refuses_an_engine_whose_io_differs_from_the_manifest(bundle):
    """--adopt (engines trtexec built from the plan's scripts) compares each engine's I/O with the manifest too."""
    from specexport.runtime.errors import SpecExportError

    build_engines(bundle, trt=TensorRTDouble(), cudart=CudaRuntimeDouble(), log=lambda m: None)
    manifest = json.loads((bundle / "manifest.json").read_text())
    _input(manifest["pieces"]["shallow"], "input_ids").update(dtype="int32")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecExportError, match=r"piece 'shallow' has input 'input_ids' as int64 of rank 2, but the"
                                              r" manifest says input int32 of rank 2"):
        build_engines(bundle, trt=TensorRTDouble(), cudart=CudaRuntimeDouble(), adopt=True, log=lambda m: None)
