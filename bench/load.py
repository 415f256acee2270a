"""Serving under load, in one process: throughput and p50/p95 latency at several numbers of concurrent clients,
for requests served one at a time (a Session: each request holds it from its first token to its last) and for
the batched scheduler (runtime/batching), side by side in one run, with each response checked against AR.

    .venv/bin/python -m specexport.bench.load --bundle bundles/smollm2 --batch-bundle bundles/smollm2-std \
        --clients 1,2,4,8 --requests 16 --max-new-tokens 64 --out reports/load.json

With `--http` the same systems are `specexport serve` processes on 127.0.0.1 (the default bundle one request at
a time; the standard-flavour bundle with `--batch`), driven over HTTP by the clients with chat completions,
and the CPU seconds are the server process's.

Each client is a thread that sends its next request when the last one ends (closed loop) until the round's
requests have been sent or `--time-limit` seconds have passed; latency is from sending to the last token.
The `--requests` are split into `--rounds`, and the systems take turns round by round. Throughput is given
per wall second and per CPU second of the process: on a shared machine the second moves less with the load. No network:
in-process, the requests go straight to the runtime. The batched scheduler
needs standard-flavour pieces (`specexport build --flavour standard`), so its AR reference is that bundle's.

With `--genai`, ONNX Runtime GenAI runs beside them at the bundle's precision, on its own builder's export of the
bundle's source checkpoint in its worker process (bench/ortgenai.py; `--genai-python` or as `specexport bench`
finds the interpreter), its idle threads not spinning unless `--genai-spinning`: one request at a time, and
batched, the clients' requests gathered into static batches of up to the number of clients for its Engine
(StaticBatcher: on the CPU its Engine admits no request into a running batch). Its CPU seconds are the worker's;
its responses are compared with the default bundle's AR, which they need not equal (other graphs, other
rounding). Over `--http` too it is driven through that pipe.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime import SpecExportError, load
from ..runtime.batching import BatchScheduler
from .machine import default_threads
from .ortgenai import PRECISIONS as GENAI_PRECISIONS
from .ortgenai import OrtGenAISystem, process_cpu_s
from .systems import Skip

if TYPE_CHECKING:
    from ..runtime.session import Session

PROMPTS = [
    "Explain how a hash table works.", "Write a haiku about the sea.", "What is 17 times 23? Show your steps.",
    "List three uses of copper.", "Translate 'good morning, how are you?' into French and Spanish.",
    "Summarize: the cat sat on the mat because the mat was warm, and the dog lay by the door because the door"
    " was cold.", "Write a Python function that reverses a string.", "Why is the sky blue?",
    "Give a recipe for pancakes.", "What is the capital of Australia, and why is it not Sydney?",
    "Rewrite in the passive voice: The committee approved the budget. The mayor signed the law.",
    "Explain recursion to a child.", "Write a short email asking a colleague to review a pull request.",
    "Compare TCP and UDP in two sentences each.", "Name the planets of the solar system in order.",
    "Extract the dates: The meeting moved from 3 May to 7 May, and the launch from 1 June to 15 June.",
]


@dataclass
class System:
    name: str
    bundle: str  # whose AR its responses must equal
    run: Callable[[int], list[int]]  # prompt i, one request to its end, on the calling client's thread
    cpu: Callable[[], float] = lambda: cpu_s()  # CPU seconds so far of the process that serves it
    clients: Callable[[int], None] = lambda n: None  # told the number of clients before each run


# runs jobs (prompt ids, max new tokens) together, calling finished(k, tokens) as job k ends; returns when all have
RunBatch = Callable[[list[tuple[list[int], int]], Callable[[int, list[int]], None]], None]


class StaticBatcher:
    """Requests from many client threads run in static batches, as ONNX Runtime GenAI's Engine runs them on the
    CPU: what is waiting (up to `max_batch`) goes to `run_batch` together, and the next batch starts only when
    every request of this one has finished. Each request's answer is handed back as soon as it finishes.

    A batch waits up to `gather_s` after its first request for others to reach `max_batch`: when a batch ends,
    its clients send their next requests a moment apart, and without the wait the first alone would start the
    next batch. `max_batch` may be changed between runs (the load script sets it to the number of clients)."""

    def __init__(self, run_batch: RunBatch, max_batch: int, gather_s: float = 0.02) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.run_batch, self.max_batch, self.gather_s = run_batch, max_batch, gather_s
        self.batches: list[int] = []  # the size of every batch run so far
        self._waiting: list[_Job] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="static-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        """The request's new tokens, once its batch has run it to its end (blocks the calling thread)."""
        job = _Job(list(prompt_ids), max_new_tokens)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._waiting.append(job)
            self._cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.tokens

    def _take(self) -> list[_Job] | None:
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if not self._waiting:
                return None
            deadline = time.perf_counter() + self.gather_s
            while len(self._waiting) < self.max_batch and not self._closed:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, self._waiting = self._waiting[:self.max_batch], self._waiting[self.max_batch:]
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            self.batches.append(len(batch))

            def finished(k: int, tokens: list[int], batch: list[_Job] = batch) -> None:
                job = batch[k]
                if job.done.is_set():
                    raise RuntimeError(f"request {k} of the batch was answered twice")
                job.tokens = list(tokens)
                job.done.set()

            try:
                self.run_batch([(job.prompt, job.max_new_tokens) for job in batch], finished)
                failure: Exception = RuntimeError("the batch ended without answering this request")
            except Exception as exc:
                failure = exc
            for job in batch:
                if not job.done.is_set():
                    job.error = failure
                    job.done.set()

    def close(self) -> None:
        """Lets the batch that runs finish, fails the requests still waiting, and stops the dispatching thread."""
        with self._cond:
            self._closed = True
            left, self._waiting = self._waiting, []
            self._cond.notify_all()
        for job in left:
            job.error = RuntimeError("the batcher closed before running this request")
            job.done.set()
        self._thread.join()


@dataclass
class _Job:
    prompt: list[int]
    max_new_tokens: int
    tokens: list[int] | None = None
    error: Exception | None = None
    done: threading.Event = field(default_factory=threading.Event)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def drive(system: System, prompts: list, clients: int, jobs: list[int], time_limit: float) -> dict:
    """Runs requests `jobs` (indices into the prompts) from `clients` closed-loop clients."""
    jobs = list(jobs)
    lock = threading.Lock()
    done: list[tuple[int, list[int], float]] = []
    system.clients(clients)
    t0, c0 = time.perf_counter(), system.cpu()

    def client() -> None:
        while True:
            with lock:
                if not jobs or time.perf_counter() - t0 > time_limit:
                    return
                j = jobs.pop(0)
            start = time.perf_counter()
            tokens = system.run(j % len(prompts))
            with lock:
                done.append((j, tokens, time.perf_counter() - start))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall_s": time.perf_counter() - t0, "cpu_s": system.cpu() - c0, "latencies": [s for _, _, s in done],
            "outputs": {j: t for j, t, _ in done}}


class Server:
    """`specexport serve` in a process of its own on a free port of 127.0.0.1."""

    def __init__(self, bundle: str, threads: int, batch: int | None = None) -> None:
        cmd = [sys.executable, "-m", "specexport.cli.main", "serve", "--bundle", bundle, "--port", "0",
               "--threads", str(threads), "--log-level", "warning", *(["--batch", str(batch)] if batch else [])]
        self.process = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        for line in self.process.stderr:  # the line that names the port comes once the server listens
            found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
            if found:
                self.url = found.group(1)
                break
        else:
            raise SpecExportError(f"`specexport serve --bundle {bundle}` exited before listening")
        threading.Thread(target=self.process.stderr.read, daemon=True).start()  # keep its pipe from filling
        import httpx

        self.http = httpx.Client(timeout=1800, limits=httpx.Limits(max_connections=64))
        self.model = self.http.get(f"{self.url}/v1/models").json()["data"][0]["id"]

    def chat(self, prompt: str, mode: str, max_tokens: int) -> list[int]:
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "specexport": {"mode": mode, "return_token_ids": True}}
        reply = self.http.post(f"{self.url}/v1/chat/completions", json=body)
        reply.raise_for_status()
        return reply.json()["specexport"]["token_ids"]

    def cpu_s(self) -> float:
        return process_cpu_s(self.process.pid)

    def stop(self) -> None:
        self.http.close()
        self.process.terminate()
        self.process.wait(60)


def summarize(system: str, clients: int, rounds: list[dict]) -> dict:
    """One cell from its rounds: tokens over the rounds' wall time (and over the process's CPU seconds, which a
    busy shared machine moves less than the wall clock; None when a cell too short for the clock's 10 ms ticks
    shows none), latency percentiles over every request."""
    latencies = sorted(s for r in rounds for s in r["latencies"])
    tokens = sum(len(t) for r in rounds for t in r["outputs"].values())
    wall, cpu = sum(r["wall_s"] for r in rounds), sum(r["cpu_s"] for r in rounds)
    return {"system": system, "clients": clients, "requests": len(latencies), "tokens": tokens, "wall_s": wall,
            "cpu_s": cpu, "tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu if cpu > 0 else None,
            "p50_s": statistics.median(latencies),
            "p95_s": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", default="bundles/smollm2", help="the default bundle: one-at-a-time systems")
    ap.add_argument("--batch-bundle", default="bundles/smollm2-std", help="a standard-flavour build of it")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=16, help="requests per system and client count")
    ap.add_argument("--rounds", type=int, default=2, help="the requests split into rounds, the systems taking"
                    " turns round by round")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds per cell before no new request")
    ap.add_argument("--modes", default="auto", help="one-at-a-time modes besides ar (the best one: auto)")
    ap.add_argument("--batch-modes", default="ar,lookup,model,self,auto")
    ap.add_argument("--max-batch", type=int, default=None, help="cache rows (default: the most clients)")
    ap.add_argument("--http", action="store_true", help="drive `specexport serve` processes over HTTP")
    ap.add_argument("--genai", action="store_true", help="add ONNX Runtime GenAI at the bundle's precision, one"
                    " request at a time and in static batches of its Engine (in its worker process)")
    ap.add_argument("--genai-python", default=None, help="the interpreter with onnxruntime-genai (default: as"
                    " `specexport bench` finds it)")
    ap.add_argument("--genai-spinning", action="store_true", help="let GenAI's idle intra-op threads spin (its own"
                    " default; off unless given: specexport's pools stop spinning when a run ends)")
    ap.add_argument("--out", default="reports/load.json")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    n = args.max_new_tokens
    threads = default_threads()

    single = load(args.bundle, threads=threads)
    batch_single = load(args.batch_bundle, threads=threads)  # the batched bundle's own AR, the reference
    prompts = [single.prompt_ids(p, single.options()) for p in PROMPTS]
    if [batch_single.prompt_ids(p, batch_single.options()) for p in PROMPTS] != prompts:
        print("the two bundles tokenize the prompts differently; build both from the same model", file=sys.stderr)
        return 1
    max_batch = args.max_batch or max(levels)
    servers: list[Server] = []
    if args.http:
        one, batched = Server(args.bundle, threads), Server(args.batch_bundle, threads, batch=max_batch)
        servers = [one, batched]

        def one_at_a_time(mode: str) -> System:
            return System(f"{mode}, one at a time", args.bundle, lambda i: one.chat(PROMPTS[i], mode, n), one.cpu_s)

        def batched_system(mode: str) -> System:
            return System(f"{mode}, batched", args.batch_bundle, lambda i: batched.chat(PROMPTS[i], mode, n),
                          batched.cpu_s)
    else:
        scheduler = BatchScheduler(batch_single, max_batch=max_batch, threads=threads)

        def one_at_a_time(mode: str) -> System:
            return System(f"{mode}, one at a time", args.bundle,
                          lambda i: single.generate_ids(prompts[i], mode=mode, max_new_tokens=n).tokens)

        def batched_system(mode: str) -> System:
            return System(f"{mode}, batched", args.batch_bundle,
                          lambda i: scheduler.submit(prompts[i], mode=mode, max_new_tokens=n).result())

    systems = [one_at_a_time(m) for m in ["ar", *filter(None, args.modes.split(","))]]
    systems += [batched_system(m) for m in filter(None, args.batch_modes.split(","))]
    genai, batcher = None, None
    if args.genai:
        try:
            genai, batcher = start_genai(single, max_batch, threads, args.genai_python, args.genai_spinning)
        except SpecExportError:
            for server in servers:
                server.stop()
            raise
        systems += genai_systems(genai, batcher, prompts, n, args.bundle, max_batch)

    try:
        t0 = time.perf_counter()
        reference = {args.bundle: [single.generate_ids(p, mode="ar", max_new_tokens=n).tokens for p in prompts],
                     args.batch_bundle: [batch_single.generate_ids(p, mode="ar", max_new_tokens=n).tokens
                                         for p in prompts]}
        print(f"AR references in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        cells = []
        chunks = [list(range(args.requests))[i::args.rounds] for i in range(args.rounds)]
        for li, clients in enumerate(levels):
            # the systems take turns round by round, in an order that rotates, so that a busy spell of the shared
            # machine does not land on one system
            runs: dict[str, list[dict]] = {s.name: [] for s in systems}
            first_batch = len(batcher.batches) if batcher else 0
            for ri, jobs in enumerate(chunks):
                k = (li + ri) % len(systems)
                for system in systems[k:] + systems[:k]:
                    runs[system.name].append(drive(system, prompts, clients, jobs, args.time_limit))
            for system in systems:
                cell = summarize(system.name, clients, runs[system.name])
                want = reference[system.bundle]
                cell["identical_to_ar"] = sum(t == want[j % len(prompts)] for r in runs[system.name]
                                              for j, t in r["outputs"].items())
                if batcher and system.name == f"{genai.name}, batched":
                    cell["batch_sizes"] = batcher.batches[first_batch:]
                cells.append(cell)
                per_cpu = cell["tokens_per_cpu_s"]
                print(f"{system.name:24} clients {clients}: {cell['tokens_per_s']:6.1f} tokens/s"
                      f" ({'–' if per_cpu is None else f'{per_cpu:.1f}'} per CPU s), p50 {cell['p50_s']:.1f} s,"
                      f" p95 {cell['p95_s']:.1f} s, {cell['identical_to_ar']}/{cell['requests']} identical to AR",
                      file=sys.stderr)
    finally:
        for server in servers:
            server.stop()
        if batcher is not None:
            batcher.close()
        if genai is not None:
            genai.close()
    if not servers:
        scheduler.close()
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "argv": sys.argv[1:], "threads": threads,
              "http": bool(servers), "cells": cells}
    if genai is not None:
        report["genai"] = {"note": genai.note, "versions": genai.versions}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(table(cells, levels, [s.name for s in systems]))
    return 0


def start_genai(session: Session, max_batch: int, threads: int, python: str | None = None,
                spinning: bool = False) -> tuple[OrtGenAISystem, StaticBatcher]:
    """ONNX Runtime GenAI's export of the bundle's source checkpoint at the bundle's precision, its worker
    started (with an Engine of `max_batch` rows) and warmed up, and a StaticBatcher over its Engine. Its idle
    threads spin only if `spinning`: on a shared machine idle spinning threads take the cores from the running
    ones (which is why specexport's pools stop spinning when a run ends), and the comparison is of the code, not
    of that setting."""
    from ..exporter.model_source import find_checkpoint

    manifest = session.bundle.manifest
    if manifest.precision not in GENAI_PRECISIONS:
        raise SpecExportError(f"ONNX Runtime GenAI has no {manifest.precision} CPU build to match the bundle")
    genai = OrtGenAISystem(find_checkpoint(manifest.provenance.source_sha256), set(session.codec.eos_ids),
                           manifest.precision, threads, python, manifest.provenance.source_sha256,
                           log=lambda m: print(m, file=sys.stderr), max_batch=max_batch, spinning=spinning)
    try:
        genai.setup()
    except Skip as exc:
        raise SpecExportError(f"ONNX Runtime GenAI cannot run: {exc}") from None
    print(f"ONNX Runtime GenAI: {genai.note}", file=sys.stderr)
    warm = session.prompt_ids(PROMPTS[0], session.options())
    # the first calls of a fresh worker allocate what later ones reuse; our sessions warm up on the AR references
    genai.generate(warm, 8)
    genai.generate_batch([(warm, 8), (warm, 8)], lambda k, tokens: None)
    return genai, StaticBatcher(genai.generate_batch, max_batch)


def genai_systems(genai: OrtGenAISystem, batcher: StaticBatcher, prompts: list[list[int]], n: int, bundle: str,
                  max_batch: int) -> list[System]:
    """GenAI one request at a time (each holds the worker to its end) and in static batches of up to the number
    of clients; both compared with `bundle`'s AR, their CPU seconds the worker's."""

    def batch_of(clients: int) -> None:
        batcher.max_batch = min(clients, max_batch)

    return [System(f"{genai.name}, one at a time", bundle, lambda i: genai.generate(prompts[i], n).tokens,
                   genai.cpu_s),
            System(f"{genai.name}, batched", bundle, lambda i: batcher.submit(prompts[i], n), genai.cpu_s,
                   batch_of)]


def table(cells: list[dict], levels: list[int], names: list[str]) -> str:
    """Markdown: a row per system; per client count its tokens/s (with its ratio to the base: `auto, one at a
    time` when it ran, else the fastest of specexport's one-at-a-time systems at that count), tokens per CPU
    second (ratio likewise), p50 / p95 latency and how many responses were AR's."""
    by = {(c["system"], c["clients"]): c for c in cells}
    ours = [name for name in names if "one at a time" in name and not name.startswith("ortgenai")]
    head = "| system | " + " | ".join(f"{c} client{'s' * (c > 1)}: tokens/s, per CPU s, p50 / p95 s"
                                      for c in levels) + " |"
    lines = [head, "|---" * (len(levels) + 1) + "|"]
    for name in names:
        row = [name]
        for c in levels:
            cell = by[(name, c)]
            ratios = []
            for key in ("tokens_per_s", "tokens_per_cpu_s"):
                base = (by[("auto, one at a time", c)][key] if "auto, one at a time" in ours
                        else max((by[(other, c)][key] or 0.0 for other in ours), default=0.0))
                ratios.append("–" if cell[key] is None else
                              f"{cell[key]:.1f} ({cell[key] / base:.2f}×)" if base else f"{cell[key]:.1f}")
            row.append(f"{ratios[0]}, {ratios[1]}, {cell['p50_s']:.1f} / {cell['p95_s']:.1f},"
                       f" {cell['identical_to_ar']}/{cell['requests']} = AR")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def entry() -> int:
    try:
        return main()
    except SpecExportError as exc:  # a missing bundle, a bad option: one sentence
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(entry())
