"""Batched calls on a standard-flavour bundle: are a batch's rows one-row calls bit for bit, and what does a
step cost by shape (rows x tokens) beside the default bundle's one-request steps.

    .venv/bin/python tools/experiments/batch_rows.py bundles/smollm2-std bundles/smollm2
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from specexport.runtime import load
from specexport.runtime.batching import BatchScheduler
from specexport.runtime.batching.goodput import BatchCost
from specexport.runtime.decode import ids_array, target_step


def median_ms(call, repeats: int = 9) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main(std_bundle: str, default_bundle: str) -> None:
    std, default = load(std_bundle), load(default_bundle)
    scheduler = BatchScheduler(std, max_batch=8, cost=BatchCost(0.04, 0.006, 0.005))  # cost unused here
    batched, single = scheduler.pieces, std.pieces
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 40000, size=n).tolist() for n in (9, 300, 17, 60, 129, 33, 5, 250)]
    steps = [rng.integers(3, 40000, size=n).tolist() for n in (4, 1, 3, 11, 2, 7, 1, 5)]
    width = max(map(len, steps))
    want = []
    for row, (prompt, new) in enumerate(zip(prompts, steps, strict=True)):
        single.deep.run(single.shallow.run(ids_array(prompt), 0)["hidden"], 0)
        h = single.shallow.run(ids_array(new), len(prompt))["hidden"]
        want.append((h[0], single.deep.run(h, len(prompt), keep=len(new))["logits"][0]))
        batched.deep.run(batched.shallow.run(ids_array(prompt), [row], [0])["hidden"], [row], [0])
    ids = np.array([new + new[-1:] * (width - len(new)) for new in steps])
    starts = [len(p) for p in prompts]
    h = batched.shallow.run(ids, list(range(8)), starts)["hidden"]
    logits = batched.deep.run(h, list(range(8)), starts, keep=width)["logits"]
    for row, (hidden, row_logits) in enumerate(want):
        n = len(steps[row])
        print(f"row {row} at {starts[row]}, {n} real token(s): hidden equal {np.array_equal(h[row, :n], hidden)},"
              f" logits equal {np.array_equal(logits[row, :n], row_logits)},"
              f" max |diff| {float(np.abs(logits[row, :n] - row_logits).max())}")

    pos = 100
    target_step(default.pieces, list(range(5, 5 + pos)), 0)

    def step(b: int, n: int):
        def call() -> None:
            states = batched.shallow.run(np.zeros((b, n), np.int64), list(range(b)), [pos] * b)["hidden"]
            batched.deep.run(states, list(range(b)), [pos] * b, keep=n)
        return call

    for round_ in range(2):  # the first round warms up
        line = [f"default bundle AR step {median_ms(lambda: target_step(default.pieces, [7], pos)):.0f} ms",
                f"verify 4 {median_ms(lambda: target_step(default.pieces, [7, 8, 9, 10], pos, keep=4)):.0f} ms"]
        line += [f"batched {b}x{n} {median_ms(step(b, n)):.0f} ms" for b, n in [(1, 1), (2, 1), (4, 1), (8, 1), (4, 4)]]
        print(f"round {round_}: " + ", ".join(line))
    scheduler.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
