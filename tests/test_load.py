"""bench/load.py's ONNX Runtime GenAI systems: the worker's batch command against a fake onnxruntime_genai."""

from __future__ import annotations

import sys
import textwrap

import pytest
from specexport.bench import ortgenai as bench_ortgenai

FAKE_GENAI_ENGINE = '''
"""A stand-in for onnxruntime_genai's Engine: each request "generates" by counting up from its prompt's last id,
one token per run() for every request of the batch; 99 is the model's EOS (finishes without a token)."""
import json

print("noise on stdout that must not reach the protocol")


class Config:
    def __init__(self, path):
        self.max_batch = 4

    def overlay(self, text):
        self.max_batch = json.loads(text).get("engine", {}).get("static_batching", {}).get("max_batch_size", 4)


class Model:
    def __init__(self, config):
        self.max_batch = config.max_batch


class _Flag:
    def __init__(self, value):
        self.value = value


class EngineEventFlags:
    TOKEN, TURN_FINISHED, FAILED = _Flag(1), _Flag(2), _Flag(16)


class FinishReason:
    EOS, MAX_GENERATED_TOKENS = "eos", "max"


class Event:
    def __init__(self, request, flags, token=0, finish_reason=None):
        self.request, self.flags, self.token, self.finish_reason = request, _Flag(flags), token, finish_reason


class Request:
    def begin_turn(self, ids, options):
        self.ids, self.out, self.done = list(ids), [], False

    def close(self):
        pass


class TurnOptions:
    def __init__(self, request):
        self.request = request

    def set_do_sample(self, value):
        assert value is False

    def set_max_generated_tokens(self, n):
        self.request.limit = n


class Engine:
    def __init__(self, model):
        self.model, self.requests = model, []

    def create_request(self):
        self.requests.append(Request())
        return self.requests[-1]

    def create_event_buffer(self, capacity):
        return None

    def has_pending_requests(self):
        return any(not r.done for r in self.requests)

    def run(self, buffer):
        live = [r for r in self.requests if not r.done]
        assert len(live) <= self.model.max_batch, "more requests than the static batch holds"
        events = []
        for r in live:
            token = (r.out or r.ids)[-1] + 1
            if token == 99:
                r.done = True
                events.append(Event(r, 2, finish_reason=FinishReason.EOS))
                continue
            r.out.append(token)
            r.done = len(r.out) == r.limit
            events.append(Event(r, 3 if r.done else 1, token, FinishReason.MAX_GENERATED_TOKENS if r.done else None))
        self.requests = [r for r in self.requests if not r.done]
        return events
'''


def fake_genai(tmp_path, monkeypatch, ckpt_name: str = "ckpt"):
    lib = tmp_path / "lib"
    (lib / "onnxruntime_genai").mkdir(parents=True)
    (lib / "onnxruntime_genai" / "__init__.py").write_text(textwrap.dedent(FAKE_GENAI_ENGINE))
    meta = lib / "onnxruntime_genai-0.0.1.dist-info"
    meta.mkdir()
    meta.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-genai\nVersion: 0.0.1\n")
    monkeypatch.setenv("PYTHONPATH", str(lib))
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "cache"))
    ckpt = tmp_path / ckpt_name
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    found = bench_ortgenai.env_versions(sys.executable)
    built = bench_ortgenai.model_dir(ckpt, "sha", "fp32", found)  # as if the builder had run already
    built.mkdir(parents=True)
    (built / "genai_config.json").write_text("{}")
    return ckpt


def test_the_worker_runs_a_batch_through_the_engine_with_a_fake_library(tmp_path, monkeypatch):
    """The batch command end to end against a fake Engine: each request's answer as it finishes (EOS cut, the
    bundle's own EOS ids too), the Engine sized by the worker's MAX_BATCH, batch after batch, a fresh Engine
    after a failed batch. (The one-request path is test_bench's.)"""
    ckpt = fake_genai(tmp_path, monkeypatch)
    system = bench_ortgenai.OrtGenAISystem(ckpt, {99}, "fp32", threads=1, python=sys.executable, source_key="sha",
                                           max_batch=3)
    system.setup()
    got: list[tuple[int, list[int]]] = []
    try:
        system.generate_batch([([1, 10], 4), ([95], 10), ([50], 2)], lambda k, t: got.append((k, t)))
        assert got == [(2, [51, 52]), (0, [11, 12, 13, 14]), (1, [96, 97, 98])]  # in the order they finished
        got.clear()
        system.generate_batch([([5], 3)], lambda k, t: got.append((k, t)))
        assert got == [(0, [6, 7, 8])]
        assert system.cpu_s() >= 0
    finally:
        system.close()
    other = bench_ortgenai.OrtGenAISystem(ckpt, {97, 99}, "fp32", threads=1, python=sys.executable,
                                          source_key="sha", max_batch=4)
    other.setup()
    try:
        got.clear()
        other.generate_batch([([95], 10), ([1], 3), ([2], 3), ([3], 3)], lambda k, t: got.append((k, t)))
        assert dict(got) == {0: [96], 1: [2, 3, 4], 2: [3, 4, 5], 3: [4, 5, 6]}  # 97 is the bundle's EOS
        with pytest.raises(RuntimeError, match="more requests than the static batch holds"):
            other.generate_batch([([1], 2)] * 5, lambda k, t: None)
        got.clear()
        other.generate_batch([([1], 2)], lambda k, t: got.append((k, t)))  # a fresh Engine after a failure
        assert got == [(0, [2, 3])]
    finally:
        other.close()
