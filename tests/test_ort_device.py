"""ONNX Runtime on a GPU keeps the KV caches on the device. No GPU here: a test double (FakeCudaOrt) makes a
CPU session report the CUDA provider and records where each cache was asked for and how often it was bound.
It checks calls only; it does not make the CUDA path verified."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnxruntime as ort
import pytest
from specexport.runtime import load
from specexport.runtime.backends import ort as ort_backend
from specexport.runtime.backends.ort import TRT_EP_CACHE, provider_list


class FakeCudaOrt:
    """Sessions that claim the CUDA execution provider but run on the CPU; OrtValues asked for on "cuda" are
    made on the host and recorded; every bind of a cache is counted."""

    def __init__(self, monkeypatch) -> None:
        self.allocations: list[tuple[str, tuple]] = []
        self.cache_binds: Counter = Counter()
        real_session, real_value = ort.InferenceSession, ort.OrtValue.ortvalue_from_numpy
        fake = self

        class Binding:
            def __init__(self, real) -> None:
                self._real = real

            def bind_ortvalue_input(self, name, value):
                if name.startswith("past_"):
                    fake.cache_binds[name] += 1
                return self._real.bind_ortvalue_input(name, value)

            def __getattr__(self, name):
                return getattr(self._real, name)

        class Session:
            def __init__(self, path, options, providers):
                names = [p if isinstance(p, str) else p[0] for p in providers]
                assert "CUDAExecutionProvider" in names, providers
                self._real = real_session(path, options, providers=["CPUExecutionProvider"])

            def get_providers(self):
                return ["CUDAExecutionProvider", "CPUExecutionProvider"]

            def io_binding(self):
                return Binding(self._real.io_binding())

            def run_with_iobinding(self, binding):
                return self._real.run_with_iobinding(binding._real)

            def __getattr__(self, name):
                return getattr(self._real, name)

        def value_from_numpy(array, device="cpu", device_id=0):
            if device == "cpu":  # the host's results and caches share the array's memory, as ORT's do
                return real_value(array)
            self.allocations.append((device, tuple(array.shape)))
            return real_value(array.copy())  # "device memory": the array's copy, no longer the caller's

        monkeypatch.setattr(ort_backend.ort, "InferenceSession", Session)
        monkeypatch.setattr(ort_backend.ort.OrtValue, "ortvalue_from_numpy", staticmethod(value_from_numpy))


def test_caches_live_on_the_device_and_are_bound_once(tiny_bundles, monkeypatch):
    bundle = tiny_bundles(adapter="untrained")
    cpu = load(bundle, threads=1)
    expected = {mode: cpu.generate("hash table", max_new_tokens=24, mode=mode).tokens for mode in ("ar", "self")}

    fake = FakeCudaOrt(monkeypatch)
    gpu = load(bundle, providers=["CUDAExecutionProvider", "CPUExecutionProvider"], threads=1)
    caches = [(p.name, past) for p in (gpu.pieces.shallow, gpu.pieces.deep, gpu.pieces.adapter)
              for past, _, _ in p._caches]
    assert all(p.device == "cuda" for p in (gpu.pieces.shallow, gpu.pieces.deep, gpu.pieces.adapter))
    assert len(fake.allocations) == len(caches) and all(device == "cuda" for device, _ in fake.allocations)
    binds_after_load = sum(fake.cache_binds.values())
    for mode, tokens in expected.items():
        assert gpu.generate("hash table", max_new_tokens=24, mode=mode).tokens == tokens, mode
    # the shared caches were bound when the pieces opened, never again by a call
    assert binds_after_load == len(caches) and sum(fake.cache_binds.values()) == binds_after_load


def test_a_session_without_the_gpu_provider_keeps_host_caches(tiny_bundles):
    # asking for CUDA on a CPU-only build: ONNX Runtime falls back to the CPU, and so do the caches
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has the CUDA provider")
    session = load(tiny_bundles(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"], threads=1)
    assert session.pieces.deep.device is None and session.pieces.deep._arrays[0]
    assert session.generate("hash table", max_new_tokens=8, mode="ar").tokens


def test_the_tensorrt_provider_caches_engines_under_the_bundle(tmp_path):
    providers = provider_list(["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
                              tmp_path)
    name, options = providers[0]
    assert name == "TensorrtExecutionProvider" and providers[1:] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert options["trt_engine_cache_enable"] is True
    assert Path(options["trt_engine_cache_path"]) == tmp_path / TRT_EP_CACHE
