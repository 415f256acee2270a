"""ONNX Runtime on a GPU keeps the KV caches, the shallow states and the attention biases on the device; only
token ids and positions go in and only what sampling reads comes out. No GPU here: a test double (FakeCudaOrt)
makes CPU sessions report the CUDA provider, keeps "device" memory as host memory it tracks, and records every
binding and every host<->device transfer ONNX Runtime would make. The sessions still compute on the CPU with
what was bound (by address, too), so the tokens check that the right rows were bound. It checks calls and
placement only; it does not make the CUDA path verified."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from specexport.runtime import load
from specexport.runtime.backends import ort as ort_backend
from specexport.runtime.backends import ort_device
from specexport.runtime.backends.common import DeviceStates, join_states
from specexport.runtime.backends.ort import TRT_EP_CACHE, provider_list

from .conftest import make_noisy_drafter

CONTROL_INPUTS = {"input_ids", "position_ids", "seqlens_k", "total_sequence_length", "logits_to_keep"}
DEVICE_ONLY = ("past_", "present_", "hidden", "attention_bias")  # names (or prefixes) that must never be on the host


@dataclass
class Run:
    """One run_with_iobinding as the double saw it: each bound name -> (place, bytes, shape, value)."""

    piece: str
    inputs: dict
    outputs: dict
    events_before: int  # how many upload/download events had happened before this run

    def host(self, side: dict) -> dict:
        return {k: v for k, v in side.items() if v[0] == "host"}

    @property
    def tokens(self) -> int:
        name = "input_ids" if "input_ids" in self.inputs else "hidden_in"
        return self.inputs[name][2][1]


@dataclass
class FakeCudaOrt:
    """Test double of ONNX Runtime with a CUDA (or TensorRT) execution provider, over the real CPU build.

    "Device" OrtValues (made on "cuda") are host OrtValues the double tracks: an address bound on "cuda" must
    lie inside one of them, and is handed to the real CPU session as a host address. Transfers are counted as
    ONNX Runtime makes them: an input bound from host memory is copied in at every run, an output bound to host
    memory is copied out, ortvalue_from_numpy on "cuda" and update_inplace are uploads, numpy() of a device
    value and copy_outputs_to_cpu are downloads."""

    monkeypatch: pytest.MonkeyPatch
    provider: str = "CUDAExecutionProvider"
    runs: list[Run] = field(default_factory=list)
    events: list[tuple[str, str, int, object]] = field(default_factory=list)  # (up/down, what, bytes, value)
    device: dict[int, object] = field(default_factory=dict)  # id(value) -> the device value (kept alive)
    ranges: list[tuple[int, int]] = field(default_factory=list)  # device memory: (address, bytes)
    cache_binds: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        fake = self
        real_session = ort.InferenceSession
        real_from_numpy, real_from_shape = ort.OrtValue.ortvalue_from_numpy, ort.OrtValue.ortvalue_from_shape_and_type

        class DeviceValue(ort.OrtValue):
            def device_name(self) -> str:
                return "cuda"

            def numpy(self):
                fake.events.append(("down", "numpy", super().numpy().nbytes, self))
                return super().numpy()

            def update_inplace(self, data) -> None:
                fake.events.append(("up", "update_inplace", data.nbytes, self))
                super().update_inplace(data)

        def on_device(value, nbytes: int) -> DeviceValue:
            dv = DeviceValue(value._ortvalue, value._numpy_obj)
            fake.device[id(dv)] = dv
            fake.ranges.append((dv.data_ptr(), nbytes))
            return dv

        def from_numpy(array, device_type="cpu", device_id=0, vendor_id=-1):
            if device_type == "cpu":  # host memory shared with the array, as ORT's
                return real_from_numpy(array)
            assert device_type == "cuda" and device_id == 0, (device_type, device_id)
            value = on_device(real_from_numpy(array.copy()), array.nbytes)
            fake.events.append(("up", "ortvalue_from_numpy", array.nbytes, value))
            return value

        def from_shape(shape, element_type, device_type="cpu", device_id=0, vendor_id=-1, memory_info=None):
            value = real_from_shape(shape, element_type)
            if device_type == "cpu":
                return value
            assert device_type == "cuda" and device_id == 0, (device_type, device_id)
            return on_device(value, int(np.prod(shape)) * np.dtype(element_type).itemsize)

        class Binding:
            def __init__(self, real, piece: str) -> None:
                self._real, self.piece = real, piece
                self.inputs: dict = {}
                self.outputs: dict = {}

            def _place(self, value) -> str:
                return "device" if id(value) in fake.device else "host"

            def bind_cpu_input(self, name, array):
                self.inputs[name] = ("host", array.nbytes, array.shape, array.copy())
                self._real.bind_cpu_input(name, array)

            def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
                nbytes = int(np.prod(shape)) * np.dtype(element_type).itemsize
                assert device_type == "cuda", f"{name} bound by address on {device_type}"
                fake.check_range(buffer_ptr, nbytes, name)
                self.inputs[name] = ("device", nbytes, tuple(shape), buffer_ptr)
                self._real.bind_input(name, "cpu", 0, element_type, shape, buffer_ptr)

            def bind_ortvalue_input(self, name, value):
                if name.startswith("past_"):
                    fake.cache_binds[name] += 1
                nbytes = value.numpy().nbytes if self._place(value) == "host" else 0
                self.inputs[name] = (self._place(value), nbytes, tuple(value.shape()), value)
                self._real.bind_ortvalue_input(name, value)

            def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None,
                            buffer_ptr=None):
                if buffer_ptr is None:
                    self.outputs[name] = ("host" if device_type == "cpu" else "device", None, None, None)
                    return self._real.bind_output(name, device_type)
                nbytes = int(np.prod(shape)) * np.dtype(element_type).itemsize
                assert device_type == "cuda", f"{name} bound by address on {device_type}"
                fake.check_range(buffer_ptr, nbytes, name)
                self.outputs[name] = ("device", nbytes, tuple(shape), buffer_ptr)
                return self._real.bind_output(name, "cpu", 0, element_type, shape, buffer_ptr)

            def bind_ortvalue_output(self, name, value):
                place = self._place(value)
                self.outputs[name] = (place, value.numpy().nbytes if place == "host" else 0, tuple(value.shape()),
                                      value)
                self._real.bind_ortvalue_output(name, value)

            def copy_outputs_to_cpu(self):
                out = self._real.copy_outputs_to_cpu()
                fake.events.append(("down", "copy_outputs_to_cpu", sum(a.nbytes for a in out), None))
                return out

            def __getattr__(self, name):
                return getattr(self._real, name)

        class Session:
            def __init__(self, path, options, providers):
                names = [p if isinstance(p, str) else p[0] for p in providers]
                assert fake.provider in names, providers
                self.piece = Path(path).stem
                self._real = real_session(path, options, providers=["CPUExecutionProvider"])

            def get_providers(self):
                return [fake.provider, "CPUExecutionProvider"]

            def io_binding(self):
                return Binding(self._real.io_binding(), self.piece)

            def run_with_iobinding(self, binding, run_options=None):
                assert run_options is None  # the default synchronizes the provider's stream at the end of the run
                fake.runs.append(Run(binding.piece, dict(binding.inputs), dict(binding.outputs), len(fake.events)))
                return self._real.run_with_iobinding(binding._real)

            def __getattr__(self, name):
                return getattr(self._real, name)

        self.monkeypatch.setattr(ort_device, "_biases", {})  # the process's device buffers belong to this double
        self.monkeypatch.setattr(ort_backend.ort, "InferenceSession", Session)
        self.monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy", staticmethod(from_numpy))
        self.monkeypatch.setattr(ort.OrtValue, "ortvalue_from_shape_and_type", staticmethod(from_shape))

    def check_range(self, ptr: int, nbytes: int, name: str) -> None:
        assert any(start <= ptr and ptr + nbytes <= start + size for start, size in self.ranges), \
            f"{name} bound at {ptr:#x}+{nbytes}, outside every device allocation"

    def is_device(self, value) -> bool:
        return id(value) in self.device

    def reset(self) -> None:
        self.runs.clear()
        self.events.clear()


GPU_PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]


# -- a bundle with every piece: shallow, deep, an (untrained) adapter and a noisy drafter ---------------------

@pytest.fixture(scope="module")
def bundles(tiny_checkpoint, tmp_path_factory):
    """build(flavour) -> a bundle with every piece, memoised."""
    from specexport.exporter.build import build_bundle

    drafter = make_noisy_drafter(tiny_checkpoint, tmp_path_factory.mktemp("noisy-drafter"))
    built: dict[str, Path] = {}

    def build(flavour: str) -> Path:
        if flavour not in built:
            out = tmp_path_factory.mktemp("ort-device") / flavour
            # GroupQueryAttention: a bundle for ONNX Runtime's CUDA provider (the rowwise operator is CPU-only)
            build_bundle(out, model=str(tiny_checkpoint), drafter=str(drafter), adapter="untrained", exit_layer=2,
                         context=256, flavour=flavour, attention="gqa" if flavour == "ort" else None)
            built[flavour] = out
        return built[flavour]

    return build


@pytest.fixture(scope="module")
def full_bundle(bundles) -> Path:
    return bundles("ort")


@pytest.fixture(scope="module")
def cpu_session(full_bundle):
    return load(full_bundle, threads=1)


PROMPT = "hash table"
NEW = 24
MODES = {
    "ar": {"mode": "ar"},
    "self": {"mode": "self"},
    "model": {"mode": "model"},
    "lookup": {"mode": "lookup"},
    "hier": {"mode": "hier"},
    "tree": {"mode": "model", "tree": "4:3:2:10"},
    "auto": {"mode": "auto"},
    "pearl": {"mode": "self", "schedule": "pearl"},
    "self-sampled": {"mode": "self", "temperature": 0.8, "seed": 3},
}


def check_traffic(fake: FakeCudaOrt, vocab: dict[str, int]) -> dict[str, int]:
    """Every invariant of one generate call's runs; returns transfer totals."""
    totals = Counter()
    assert fake.runs
    for r in fake.runs:
        where = f"{r.piece} run with {r.tokens} token(s)"
        for side in (r.inputs, r.outputs):
            for name, (place, *_rest) in side.items():
                if name.startswith(DEVICE_ONLY):
                    assert place == "device", f"{where}: {name} crosses to the host"
        host_in = r.host(r.inputs)
        assert set(host_in) <= CONTROL_INPUTS, f"{where}: host inputs {sorted(host_in)}"
        h2d = sum(v[1] for v in host_in.values())
        # ids and positions (8 bytes a token each), seqlens_k and total_sequence_length (4), logits_to_keep (8)
        assert h2d <= 16 * r.tokens + 16, f"{where}: {h2d} bytes in"
        host_out = r.host(r.outputs)
        if r.piece == "shallow":
            assert not host_out, f"{where}: {sorted(host_out)} come back"
            assert r.outputs["hidden"][2] == (1, r.tokens, r.outputs["hidden"][2][2])
            continue
        keep = int(r.inputs["logits_to_keep"][3][0])
        kept = r.tokens if keep <= 0 else min(keep, r.tokens)
        heads = {"logits"} if r.piece == "deep" else {"logits", "top_token", "top_prob"}
        assert set(host_out) == heads, f"{where}: {sorted(host_out)} come back"
        row = vocab[r.piece] * 4 + (0 if r.piece == "deep" else 8 + 4)
        assert sum(v[1] for v in host_out.values()) == kept * row, f"{where}: more than {kept} kept row(s) back"
        totals["d2h"] += kept * row
        totals["h2d"] += h2d
    # outside the runs: no download at all; uploads only of tree masks, each bound by a run
    assert not [e for e in fake.events if e[0] == "down"], [e[:3] for e in fake.events if e[0] == "down"]
    uploads = [e for e in fake.events if e[0] == "up"]
    bound = {id(r.inputs["attention_bias"][3]) for r in fake.runs if is_mask(r)}
    assert all(id(value) in bound for _, _, _, value in uploads), "an upload no run binds"
    totals["uploads"], totals["upload_bytes"] = len(uploads), sum(e[2] for e in uploads)
    return totals


def vocab_sizes(session) -> dict[str, int]:
    p = session.pieces
    return {name: next(t.shape[-1] for t in getattr(p, name).outputs if t.name == "logits")
            for name in ("deep", "adapter", "drafter")}


@pytest.mark.parametrize("name", list(MODES))
def test_per_call_traffic_on_the_cuda_provider(full_bundle, cpu_session, monkeypatch, name):
    """Per generate call on the CUDA provider (the double): hidden states, caches and biases never cross,
    host->device bytes are the call's ids and positions, device->host bytes only the kept logits rows and the
    draft heads' top token and probability; tokens are the CPU runtime's."""
    opts = MODES[name]
    expected = cpu_session.generate(PROMPT, max_new_tokens=NEW, **opts).tokens
    fake = FakeCudaOrt(monkeypatch)
    gpu = load(full_bundle, providers=GPU_PROVIDERS, threads=1)
    assert gpu.pieces.shallow.device == "cuda" and gpu.pieces.deep.device == "cuda"
    assert gpu.generate(PROMPT, max_new_tokens=NEW, **opts).tokens == expected  # warms the zero buffers up
    fake.reset()
    out = gpu.generate(PROMPT, max_new_tokens=NEW, **opts)
    assert out.tokens == expected
    totals = check_traffic(fake, vocab_sizes(gpu))
    masked = [r for r in fake.runs if is_mask(r)]
    if name not in ("tree", "auto"):  # chains: every bias is a view of the zero buffer, uploaded in the warm-up
        assert not masked and totals["uploads"] == 0
        return
    deep = [i for i, r in enumerate(fake.runs) if r.piece == "deep" and is_mask(r)]
    assert deep  # greedy auto runs its tree here too (its floors leave the drafter's levels out)
    assert name == "auto" or any(r.piece == "drafter" for r in masked)
    for i in deep:  # a verify step's mask is uploaded once: deep binds shallow's upload, and uploads nothing
        before, after = fake.runs[i - 1], fake.runs[i]
        assert before.piece == "shallow" and before.inputs["attention_bias"][3] is after.inputs["attention_bias"][3]
        assert after.events_before == before.events_before
    assert 0 < totals["uploads"] <= len(masked) - len(deep)


def is_mask(run: Run) -> bool:
    """Whether the run's attention_bias was a tree mask (an uploaded value), not a view of the zero buffer."""
    return not isinstance(run.inputs["attention_bias"][3], int)


@pytest.mark.parametrize("name", ["ar", "self", "tree"])
def test_the_standard_flavour_swaps_device_caches_and_keeps_states_there(bundles, monkeypatch, name):
    """The standard (TensorRT-ready) graphs: two device buffers per cache, swapped per call, and a bias as wide as
    the context; the same invariants as the `ort` flavour's."""
    bundle, opts = bundles("standard"), MODES[name]
    expected = load(bundle, threads=1).generate(PROMPT, max_new_tokens=NEW, **opts).tokens
    fake = FakeCudaOrt(monkeypatch)
    gpu = load(bundle, providers=GPU_PROVIDERS, threads=1)
    assert gpu.pieces.deep.kv_mode == "swap"
    gpu.generate(PROMPT, max_new_tokens=NEW, **opts)  # warms the zero buffers up
    fake.reset()
    assert gpu.generate(PROMPT, max_new_tokens=NEW, **opts).tokens == expected
    totals = check_traffic(fake, vocab_sizes(gpu))
    assert all(r.inputs["attention_bias"][2][-1] == 256 for r in fake.runs)  # the cache's full width
    assert (totals["uploads"] > 0) == (name == "tree")


def test_the_tensorrt_execution_provider_takes_the_same_device_path(full_bundle, cpu_session, monkeypatch):
    """TensorRT's execution provider (the double claims it) keeps the same things on the device."""
    opts = MODES["tree"]
    expected = cpu_session.generate(PROMPT, max_new_tokens=NEW, **opts).tokens
    fake = FakeCudaOrt(monkeypatch, provider="TensorrtExecutionProvider")
    gpu = load(full_bundle, providers=["TensorrtExecutionProvider", *GPU_PROVIDERS], threads=1)
    gpu.generate(PROMPT, max_new_tokens=NEW, **opts)  # warms the zero buffers up
    fake.reset()
    assert gpu.generate(PROMPT, max_new_tokens=NEW, **opts).tokens == expected
    check_traffic(fake, vocab_sizes(gpu))
    assert any(r.inputs["hidden_in"][0] == "device" for r in fake.runs if r.piece == "deep")


def test_caches_live_on_the_device_and_are_bound_once(full_bundle, monkeypatch):
    fake = FakeCudaOrt(monkeypatch)
    gpu = load(full_bundle, providers=GPU_PROVIDERS, threads=1)
    pieces = [getattr(gpu.pieces, n) for n in ("shallow", "deep", "adapter", "drafter")]
    assert all(p.device == "cuda" for p in pieces)
    buffers = [b for p in pieces for _, _, bufs in p._caches for b in bufs]
    assert buffers and all(fake.is_device(b) for b in buffers)
    binds_after_load = sum(fake.cache_binds.values())
    for mode in ("ar", "self", "hier"):
        gpu.generate(PROMPT, max_new_tokens=12, mode=mode)
    # the shared caches were bound when the pieces opened, never again by a call
    assert binds_after_load == len(buffers) and sum(fake.cache_binds.values()) == binds_after_load


def test_the_doctor_checks_onnx_runtime_cuda_through_this_path(full_bundle, cpu_session, monkeypatch):
    """`specexport doctor`'s ort-cuda checks open the bundle the way this file does, so on a GPU they run the
    device path: here (the double) every doctor mode passes its identity check against the CPU's AR tokens with
    the shallow states bound on the device."""
    from specexport.doctor import checks

    prompts = ["hash table", "the quick brown fox"]
    reference = checks.decode(cpu_session, "ar", prompts, 12)
    fake = FakeCudaOrt(monkeypatch)
    session = checks.open_session(full_bundle, checks.ORT_CUDA)
    checks.decode(session, "ar", prompts, 12)  # warms the zero buffers up
    for mode in checks.MODES:
        fake.reset()
        checks.check_identity(session, mode, prompts, reference, 12, checks.ORT_CUDA)
        check_traffic(fake, vocab_sizes(session))
        assert any(r.inputs["hidden_in"][0] == "device" for r in fake.runs if r.piece == "deep"), mode


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                    reason="needs onnxruntime-gpu and an NVIDIA GPU: this ONNX Runtime has no CUDA execution provider")
def test_on_a_real_cuda_provider_states_stay_there_and_every_mode_is_lossless(full_bundle):
    """On a machine with onnxruntime-gpu and a GPU (none here: it skips, saying so): the pieces run on the CUDA
    provider, shallow's states come back as a device handle, and every mode gives the GPU's own AR tokens."""
    gpu = load(full_bundle, providers=GPU_PROVIDERS, threads=1)
    pieces = [getattr(gpu.pieces, n) for n in ("shallow", "deep", "adapter", "drafter")]
    assert all(p.device == "cuda" for p in pieces), "ONNX Runtime put a piece on the CPU"
    assert isinstance(gpu.pieces.shallow.run(np.array([[1, 2, 3]]), 0)["hidden"], DeviceStates)
    ar = gpu.generate(PROMPT, max_new_tokens=NEW, mode="ar").tokens
    for name, opts in MODES.items():
        if name != "self-sampled":
            assert gpu.generate(PROMPT, max_new_tokens=NEW, **opts).tokens == ar, name


def test_a_session_without_the_gpu_provider_keeps_host_caches(tiny_bundles):
    # asking for CUDA on a CPU-only build: ONNX Runtime falls back to the CPU, and so do the caches and states
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has the CUDA provider")
    session = load(tiny_bundles(attention="gqa"), providers=GPU_PROVIDERS, threads=1)
    assert session.pieces.deep.device is None and session.pieces.deep._arrays[0]
    hidden = session.pieces.shallow.run(np.array([[1, 2, 3]]), 0)["hidden"]
    assert isinstance(hidden, np.ndarray) and hidden.shape[:2] == (1, 3)
    assert session.generate("hash table", max_new_tokens=8, mode="ar").tokens


def test_the_tensorrt_provider_caches_engines_under_the_bundle(tmp_path):
    providers = provider_list(["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
                              tmp_path)
    name, options = providers[0]
    assert name == "TensorrtExecutionProvider" and providers[1:] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert options["trt_engine_cache_enable"] is True
    assert Path(options["trt_engine_cache_path"]) == tmp_path / TRT_EP_CACHE


# -- the handle the loop passes around, and the device biases ------------------------------------------------

class Store:
    device, hidden, row_bytes, ptr = "cuda", 4, 16, 0x1000


def test_device_states_slice_and_join_as_row_ranges():
    store = Store()
    s = DeviceStates(store, 10, 5)
    assert s.shape == (1, 5, 4) and s.ptr == 0x1000 + 10 * 16
    tail = s[:, 2:]
    assert (tail.first, tail.n) == (12, 3) and (s[:, :0].n, s[:, 1:3].first) == (0, 11)
    joined = join_states([s[:, :0], s[:, :2], tail])
    assert (joined.first, joined.n) == (10, 5)
    with pytest.raises(RuntimeError, match="not neighbouring rows"):
        join_states([s[:, :2], s[:, 3:]])
    with pytest.raises(TypeError, match="not copied to the host"):
        np.asarray(s)
    with pytest.raises(TypeError, match=r"\[:, a:b\]"):
        s[0]
    cpu = [np.ones((1, 2, 4)), np.zeros((1, 1, 4))]
    assert np.array_equal(join_states(cpu), np.concatenate(cpu, axis=1))  # the CPU path: numpy, as before


def test_zero_biases_are_views_of_one_buffer_up_to_a_cap(monkeypatch):
    from specexport.runtime.backends.common import TreeMask

    fake = FakeCudaOrt(monkeypatch)
    monkeypatch.setattr(ort_device, "ZEROS_MAX_BYTES", 4096)
    biases = ort_device.device_biases("cuda")
    first, zeros = biases.value(0, 8, 8, "float32", None)
    assert zeros and fake.is_device(first) and len(fake.events) == 1
    assert biases.value(9, 2, 11, "float32", None)[0] is first and len(fake.events) == 1  # a view: no upload
    big, _ = biases.value(0, 40, 40, "float32", None)  # 6,400 bytes: past the cap, uploaded for this call only
    assert big is not first and biases.zeros[np.dtype("float32")] is not big
    assert biases.value(9, 2, 11, "float32", None)[0] is not big
    tree = TreeMask.from_parents([-1, 0, 0], 5)
    mask, zeros = biases.value(5, 3, 8, "float32", tree)
    assert not zeros and biases.value(5, 3, 8, "float32", tree)[0] is mask  # the same mask again: no upload
    low = np.finfo("float32").min  # root at slot 5, two children: each sees the root and itself
    assert np.array_equal(mask.numpy()[0, 0], [[0] * 6 + [low, low], [0] * 7 + [low], [0] * 6 + [low, 0]])
