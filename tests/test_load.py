"""bench/load.py's ONNX Runtime GenAI systems: the static batcher that gathers the clients' requests (against a
scripted stand-in for GenAI's Engine, so no GenAI is needed), the worker's batch command against a fake
onnxruntime_genai, and the whole load script with `--genai` on tiny bundles where the real GenAI interpreter
exists (`make bench-env`)."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest
from specexport.bench import load as bench_load
from specexport.bench import ortgenai as bench_ortgenai
from specexport.bench.load import StaticBatcher, System, drive

from .conftest import fake_genai_library


class ScriptedEngine:
    """Stands in for GenAI's Engine behind StaticBatcher: job k of a batch "generates" its max_new_tokens tokens
    counting up from its prompt's last id, one token per `step_s`, and is reported when its last token is out;
    the batch returns when its longest job is done. Records every batch it ran and every answer it gave."""

    def __init__(self, step_s: float = 0.01, fail_on: int | None = None) -> None:
        self.step_s, self.fail_on = step_s, fail_on
        self.batches: list[list[tuple[list[int], int]]] = []
        self.answers: list[tuple[int, int]] = []  # (batch number, job index)
        self.lock = threading.Lock()

    def __call__(self, jobs: list[tuple[list[int], int]], finished) -> None:
        with self.lock:
            number = len(self.batches)
            self.batches.append(jobs)
        if number == self.fail_on:
            raise RuntimeError("scripted failure")
        t0 = time.perf_counter()
        for k in sorted(range(len(jobs)), key=lambda k: jobs[k][1]):
            ids, n = jobs[k]
            time.sleep(max(0.0, t0 + n * self.step_s - time.perf_counter()))
            self.answers.append((number, k))
            finished(k, list(range(ids[-1] + 1, ids[-1] + 1 + n)))


def expected(prompt: list[int], n: int) -> list[int]:
    return list(range(prompt[-1] + 1, prompt[-1] + 1 + n))


def run_together(clients: list) -> None:
    """Starts every client on a thread of its own and waits for all of them."""
    threads = [threading.Thread(target=c) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_batches_are_bounded_and_every_request_is_answered_once_with_its_own_tokens():
    engine = ScriptedEngine()
    batcher = StaticBatcher(engine, max_batch=3)
    prompts = [[i * 100] for i in range(10)]
    results: dict[int, list[int]] = {}
    try:
        run_together([lambda i=i: results.__setitem__(i, batcher.submit(prompts[i], 4 + i)) for i in range(10)])
    finally:
        batcher.close()
    assert results == {i: expected(prompts[i], 4 + i) for i in range(10)}
    assert all(1 <= len(b) <= 3 for b in engine.batches) and sum(map(len, engine.batches)) == 10
    assert batcher.batches == [len(b) for b in engine.batches]
    assert len(engine.answers) == len(set(engine.answers)) == 10  # once each


def test_a_batch_gathers_requests_that_arrive_a_moment_apart():
    engine = ScriptedEngine()
    batcher = StaticBatcher(engine, max_batch=4, gather_s=0.5)

    def client(i: int) -> None:
        time.sleep(0.02 * i)
        batcher.submit([i], 2)

    try:
        run_together([lambda i=i: client(i) for i in range(4)])
    finally:
        batcher.close()
    assert batcher.batches == [4]


def test_latency_runs_from_submit_to_the_requests_own_last_token():
    """In a batch of a short and a long request, the short one's client has its answer when its last token is
    out, not when the batch ends; drive() measures from sending to that answer."""
    engine = ScriptedEngine(step_s=0.02)
    batcher = StaticBatcher(engine, max_batch=2, gather_s=0.5)
    prompts = [[1], [2]]
    lengths = {0: 1, 1: 25}  # 0.02 s against 0.5 s
    system = System("scripted, batched", "bundle", lambda i: batcher.submit(prompts[i], lengths[i]),
                    cpu=lambda: 0.0)
    try:
        run = drive(system, prompts, clients=2, jobs=[0, 1], time_limit=60)
    finally:
        batcher.close()
    assert batcher.batches == [2] and run["outputs"] == {0: expected([1], 1), 1: expected([2], 25)}
    short, long = sorted(run["latencies"])
    assert short < 0.3 <= 0.5 <= long, run["latencies"]


def run_clients(batcher: StaticBatcher, prompts: list[list[int]], n: int) -> list[object]:
    """Each prompt from a thread of its own at once; each outcome its tokens or its error's message."""
    outcomes: list[object] = []

    def client(prompt: list[int]) -> None:
        try:
            outcomes.append(batcher.submit(prompt, n))
        except RuntimeError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=client, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_a_failed_batch_fails_its_requests_and_the_next_batch_runs():
    engine = ScriptedEngine(fail_on=0)
    batcher = StaticBatcher(engine, max_batch=2, gather_s=0.5)
    try:
        assert run_clients(batcher, [[0], [1]], 3) == ["scripted failure"] * 2
        assert batcher.submit([7], 3) == expected([7], 3)
    finally:
        batcher.close()
    assert batcher.batches == [2, 1]


def test_an_unanswered_or_twice_answered_request_fails_and_close_refuses_more():
    def forgets(jobs, finished):
        finished(0, [1])

    def twice(jobs, finished):
        finished(0, [1])
        finished(0, [2])

    for runner, error in ((forgets, "the batch ended without answering this request"),
                          (twice, "request 0 of the batch was answered twice")):
        batcher = StaticBatcher(runner, max_batch=2, gather_s=0.5)
        try:
            assert sorted(map(str, run_clients(batcher, [[0], [1]], 1))) == ["[1]", error]
        finally:
            batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit([0], 1)


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
    return fake_genai_library(tmp_path, monkeypatch, FAKE_GENAI_ENGINE, ckpt_name)


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


def test_load_script_with_genai_on_tiny_bundles(genai_python, tiny_bundles, tiny_checkpoint, tmp_path, monkeypatch,
                                                capsys):
    """The load script with --genai on the tiny model: GenAI's builder on its checkpoint (offline, into a
    temporary cache), its worker one request at a time and in static batches of up to the client count, beside
    AR; every request answered, the table's GenAI rows filled, each cell's batch sizes in the report."""
    from specexport.exporter import model_source

    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_source, "find_checkpoint", lambda digest: tiny_checkpoint)
    out = tmp_path / "load.json"
    code = bench_load.main(["--bundle", str(tiny_bundles("ort")), "--batch-bundle", str(tiny_bundles("standard")),
                            "--clients", "1,3", "--requests", "6", "--rounds", "1", "--max-new-tokens", "8",
                            "--modes", "", "--batch-modes", "ar", "--genai", "--genai-python", genai_python,
                            "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    cells = {(c["system"], c["clients"]): c for c in report["cells"]}
    for name in ("ortgenai-fp32, one at a time", "ortgenai-fp32, batched"):
        for clients in (1, 3):
            cell = cells[(name, clients)]
            assert cell["requests"] == 6 and 0 < cell["tokens"] <= 48 and cell["cpu_s"] >= 0  # in 10 ms ticks
            assert 0 <= cell["identical_to_ar"] <= 6
    assert cells[("ortgenai-fp32, batched", 1)]["batch_sizes"] == [1] * 6
    sizes = cells[("ortgenai-fp32, batched", 3)]["batch_sizes"]
    assert sum(sizes) == 6 and max(sizes) <= 3
    assert report["genai"]["versions"]["onnxruntime-genai"] and "spinning off" in report["genai"]["note"]
    table = capsys.readouterr().out
    assert "| ortgenai-fp32, batched |" in table and "| ar, batched |" in table
