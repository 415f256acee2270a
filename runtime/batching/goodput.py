"""SmartSpec's goodput for a batch: each step's speculation length k from the rows that run it.

A batched call pads every row to the longest one, so a step of b rows drafting up to k tokens costs about
T(b, k + 1) = fixed + per_row * b + per_token * b * (k + 1) (fitted to timed calls of the batched pieces)
whatever the rows' own drafts. Row i, with d_i drafts on offer and acceptance estimate alpha_i, then makes
E(alpha_i, min(k, d_i)) tokens (runtime/policies.py). The step takes the k that maximises the batch's
expected tokens per predicted second (Liu et al., 2024): at a light load long drafts pay, at a heavy one
the padded slots cost more than they promise and k falls toward 0 (plain batched decoding).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..policies import expected_tokens


@dataclass(frozen=True)
class BatchCost:
    """Predicted seconds of one batched step (shallow + deep) of `rows` rows of `n` tokens each."""

    fixed_s: float
    per_row_s: float
    per_token_s: float

    def step_s(self, rows: int, n: int) -> float:
        return self.fixed_s + self.per_row_s * rows + self.per_token_s * rows * n

    @classmethod
    def measure(cls, step: Callable[[int, int], object], max_rows: int, max_n: int, repeats: int = 3) -> BatchCost:
        """Times `step(rows, n)` over a small grid (medians of `repeats` after a warm-up, the sizes taking
        turns so a busy moment of the shared machine slows them alike) and fits the three terms."""
        grid = sorted({(r, n) for r in {1, max(1, max_rows // 2), max_rows} for n in {1, max(1, max_n // 2), max_n}})
        times: dict[tuple[int, int], list[float]] = {size: [] for size in grid}
        for round_ in range(repeats + 1):
            for size in grid:
                t0 = time.perf_counter()
                step(*size)
                if round_:
                    times[size].append(time.perf_counter() - t0)
        a = np.array([[1.0, r, r * n] for r, n in grid])
        y = np.array([statistics.median(times[size]) for size in grid])
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        # a negative term is noise: no step gets cheaper with more rows or tokens
        return cls(max(float(coef[0]), 0.0), max(float(coef[1]), 0.0), max(float(coef[2]), 0.0))


def speculation_length(offered: list[int], alphas: list[float], cost: BatchCost) -> int:
    """The k (0 .. the longest offer) with the most expected tokens per second for rows offering `offered`
    drafts with acceptance estimates `alphas`."""
    def goodput(k: int) -> float:
        tokens = sum(expected_tokens(min(a, 0.999), min(k, d)) for d, a in zip(offered, alphas, strict=True))
        return tokens / cost.step_s(len(offered), 1 + max(min(k, d) for d in offered))

    return max(range(max(offered, default=0) + 1), key=goodput)
