"""What a batched verification call costs, and which calls to merge given that.

A batched call pads every row to its longest, so k rows of up to n tokens cost about
T(k, n) = fixed + per_row * k + per_token * k * n whatever their own lengths; the terms are fitted to timed
calls of the bundle's shallow + deep (`CallCost.measure`). Where the weights' memory traffic dominates (fp32)
the fixed term is large and merging pays even with padding; where rows are compute-bound (int4 on a small CPU)
the per-token term is, and a long draft beside short ones is better verified in a call of its own than
padding them all (`partition`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


def _medians(call: Callable, sizes: list, repeats: int) -> list[float]:
    """Median seconds of `call(*size)` per size, after a warm-up round; the sizes take turns round by round so
    that a busy moment of the shared machine slows them alike instead of tilting the fit."""
    times: dict = {size: [] for size in sizes}
    for round_ in range(repeats + 1):
        for size in sizes:
            t0 = time.perf_counter()
            call(*size)
            if round_:
                times[size].append(time.perf_counter() - t0)
    return [statistics.median(times[size]) for size in sizes]


@dataclass(frozen=True)
class CallCost:
    """Predicted seconds of one batched call of `rows` rows of `n` tokens each."""

    fixed_s: float
    per_row_s: float
    per_token_s: float

    def call_s(self, rows: int, n: int) -> float:
        return self.fixed_s + self.per_row_s * rows + self.per_token_s * rows * n

    def charges(self, lengths: list[int]) -> list[float]:
        """Each row's share of one batched call of rows of `lengths` tokens, padded to the longest (they sum to
        `call_s`): the fixed and per-row terms split evenly, each padded position's term among the rows that
        reach it (the airport game's Shapley split), so a one-token row beside a long draft pays for one
        position and the draft for the padding it causes."""
        k = len(lengths)
        even = (self.fixed_s + self.per_row_s * k) / k
        reach, position, acc = {}, 0, 0.0  # reach[m]: what a row of m tokens pays for its positions
        for i, m in enumerate(sorted(lengths)):
            acc += self.per_token_s * k / (k - i) * (m - position)  # k - i rows reach these positions
            position, reach[m] = m, acc
        return [even + reach[m] for m in lengths]

    @classmethod
    def measure(cls, call: Callable[[int, int], object], max_rows: int, max_n: int, repeats: int = 3) -> CallCost:
        """Times `call(rows, n)` over a small grid and fits the three terms."""
        grid = sorted({(r, n) for r in {1, max(1, max_rows // 2), max_rows} for n in {1, max(1, max_n // 2), max_n}})
        design = np.array([[1.0, r, r * n] for r, n in grid])
        coef, *_ = np.linalg.lstsq(design, np.array(_medians(call, grid, repeats)), rcond=None)
        # a negative term is noise: no call gets cheaper with more rows or tokens
        return cls(*(max(float(c), 0.0) for c in coef))


def partition(lengths: list[int], cost: CallCost | None) -> list[list[int]]:
    """The calls (by index) grouped into batched calls with the least predicted seconds in all: calls of like
    lengths share one, a long one beside short ones runs alone when padding them costs more than its own call.
    Groups are runs of the calls sorted by length (an optimal grouping always is); no cost model: one call."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if cost is None or len(order) < 2:
        return [order]
    best = [0.0] + [float("inf")] * len(order)  # best[j]: the first j calls (in `order`) grouped at least cost
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):
            seconds = best[i] + cost.call_s(j - i, lengths[order[j - 1]])
            if seconds < best[j]:
                best[j], cut[j] = seconds, i
    groups, j = [], len(order)
    while j:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]
