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
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..runtime import SpecExportError, load
from ..runtime.batching import BatchScheduler
from .machine import default_threads

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


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def drive(system: System, prompts: list, clients: int, jobs: list[int], time_limit: float) -> dict:
    """Runs requests `jobs` (indices into the prompts) from `clients` closed-loop clients."""
    jobs = list(jobs)
    lock = threading.Lock()
    done: list[tuple[int, list[int], float]] = []
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
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def stop(self) -> None:
        self.http.close()
        self.process.terminate()
        self.process.wait(60)


def summarize(system: str, clients: int, rounds: list[dict]) -> dict:
    """One cell from its rounds: tokens over the rounds' wall time (and over the process's CPU seconds, which a
    busy shared machine moves less than the wall clock), latency percentiles over every request."""
    latencies = sorted(s for r in rounds for s in r["latencies"])
    tokens = sum(len(t) for r in rounds for t in r["outputs"].values())
    wall, cpu = sum(r["wall_s"] for r in rounds), sum(r["cpu_s"] for r in rounds)
    return {"system": system, "clients": clients, "requests": len(latencies), "tokens": tokens, "wall_s": wall,
            "cpu_s": cpu, "tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu,
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
        t0 = time.perf_counter()
        scheduler = BatchScheduler(batch_single, max_batch=max_batch, threads=threads)
        print(f"batched cost model {scheduler.cost} (measured in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)

        def one_at_a_time(mode: str) -> System:
            return System(f"{mode}, one at a time", args.bundle,
                          lambda i: single.generate_ids(prompts[i], mode=mode, max_new_tokens=n).tokens)

        def batched_system(mode: str) -> System:
            return System(f"{mode}, batched", args.batch_bundle,
                          lambda i: scheduler.submit(prompts[i], mode=mode, max_new_tokens=n).result())

    systems = [one_at_a_time(m) for m in ["ar", *filter(None, args.modes.split(","))]]
    systems += [batched_system(m) for m in filter(None, args.batch_modes.split(","))]

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
            for ri, jobs in enumerate(chunks):
                k = (li + ri) % len(systems)
                for system in systems[k:] + systems[:k]:
                    runs[system.name].append(drive(system, prompts, clients, jobs, args.time_limit))
            for system in systems:
                cell = summarize(system.name, clients, runs[system.name])
                want = reference[system.bundle]
                cell["identical_to_ar"] = sum(t == want[j % len(prompts)] for r in runs[system.name]
                                              for j, t in r["outputs"].items())
                cells.append(cell)
                print(f"{system.name:24} clients {clients}: {cell['tokens_per_s']:6.1f} tokens/s"
                      f" ({cell['tokens_per_cpu_s']:.1f} per CPU s), p50 {cell['p50_s']:.1f} s,"
                      f" p95 {cell['p95_s']:.1f} s, {cell['identical_to_ar']}/{cell['requests']} identical to AR",
                      file=sys.stderr)
    finally:
        for server in servers:
            server.stop()
    if not servers:
        scheduler.close()
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "argv": sys.argv[1:], "threads": threads,
              "http": bool(servers), "cells": cells}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(table(cells, levels, [s.name for s in systems]))
    return 0


def table(cells: list[dict], levels: list[int], names: list[str]) -> str:
    """Markdown: a row per system; per client count its tokens/s (with its ratio to the fastest one-at-a-time
    system at that count), tokens per CPU second (ratio likewise), p50 / p95 latency and how many responses
    were AR's."""
    by = {(c["system"], c["clients"]): c for c in cells}
    head = "| system | " + " | ".join(f"{c} client{'s' * (c > 1)}: tokens/s, per CPU s, p50 / p95 s"
                                      for c in levels) + " |"
    lines = [head, "|---" * (len(levels) + 1) + "|"]
    for name in names:
        row = [name]
        for c in levels:
            cell = by[(name, c)]
            ratios = []
            for key in ("tokens_per_s", "tokens_per_cpu_s"):
                best = max(by[(other, c)][key] for other in names if "one at a time" in other)
                ratios.append(f"{cell[key]:.1f} ({cell[key] / best:.2f}×)")
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
