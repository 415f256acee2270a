"""SmartSpec's goodput for a batch: each step's drafts, row by row, from a cost model of the batched calls.

A batched call pads every row to the longest one, so verifying b rows of up to k drafts costs about
T(b, k + 1) = fixed + per_row * b + per_token * b * (k + 1) whatever the rows' own drafts. Drafting costs
nothing for prompt lookup; a drafting model runs one batched call per draft position for the rows still
drafting at it (the drafter piece for `model` rows, shallow + adapter for `self` rows), each call
D(r) = fixed + per_row * r for r rows. All terms are fitted to timed calls of the batched pieces.

Row i, drafting k_i tokens from a source whose acceptance it estimates at alpha_i, makes E(alpha_i, k_i)
tokens (runtime/policies.py). The plan is the rows' (source, k_i) with the most expected tokens per predicted
second (Liu et al., 2024): lightly loaded, long drafts pay; with many rows, padded slots and drafting calls
cost more than they promise and the k_i fall toward 0 (plain batched decoding), first for the rows whose
drafts are dear (a model's) or seldom accepted.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..policies import expected_tokens

ALPHA_CAP = 0.999  # E(alpha, k) grows without bound as alpha nears 1; no estimate is that sure


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


def _fit(design: list[list[float]], seconds: list[float]) -> list[float]:
    coef, *_ = np.linalg.lstsq(np.array(design), np.array(seconds), rcond=None)
    # a negative term is noise: no call gets cheaper with more rows or tokens
    return [max(float(c), 0.0) for c in coef]


@dataclass(frozen=True)
class DraftCost:
    """Predicted seconds of one drafting call (one token per row) of `rows` rows."""

    fixed_s: float
    per_row_s: float

    def call_s(self, rows: int) -> float:
        return self.fixed_s + self.per_row_s * rows if rows else 0.0

    @classmethod
    def measure(cls, call: Callable[[int], object], max_rows: int, repeats: int = 3) -> DraftCost:
        """Times `call(rows)` at 1, half and all of `max_rows` and fits the two terms."""
        sizes = sorted({(r,) for r in (1, max(1, max_rows // 2), max_rows)})
        return cls(*_fit([[1.0, r] for (r,) in sizes], _medians(call, sizes, repeats)))


@dataclass(frozen=True)
class BatchCost:
    """Predicted seconds of one batched step (shallow + deep) of `rows` rows of `n` tokens each, and of the
    drafting calls before it, by source ("model", "self"; prompt lookup is free)."""

    fixed_s: float
    per_row_s: float
    per_token_s: float
    drafting: dict[str, DraftCost] = field(default_factory=dict)

    def step_s(self, rows: int, n: int) -> float:
        return self.fixed_s + self.per_row_s * rows + self.per_token_s * rows * n

    def drafting_s(self, source: str, calls: int, row_tokens: int) -> float:
        """`calls` drafting calls of `source` that draft `row_tokens` tokens over all rows."""
        cost = self.drafting.get(source)
        return 0.0 if cost is None or not calls else cost.fixed_s * calls + cost.per_row_s * row_tokens

    @classmethod
    def measure(cls, step: Callable[[int, int], object], max_rows: int, max_n: int, repeats: int = 3) -> BatchCost:
        """Times `step(rows, n)` over a small grid and fits the three terms."""
        grid = sorted({(r, n) for r in {1, max(1, max_rows // 2), max_rows} for n in {1, max(1, max_n // 2), max_n}})
        return cls(*_fit([[1.0, r, r * n] for r, n in grid], _medians(step, grid, repeats)))


@dataclass(frozen=True)
class Offer:
    """What a row can draft this step from one source: up to `drafts` tokens, each accepted with probability
    `alpha` by the row's running estimate."""

    source: str  # "lookup", "model" or "self"
    drafts: int
    alpha: float


Choice = tuple[Offer, int] | None  # a row's source and how many drafts it takes; None: no drafts


def goodput(choices: list[Choice], cost: BatchCost) -> float:
    """Expected tokens per predicted second of a step in which row i drafts as choices[i] says."""
    return rater(choices[1:], cost)(choices[0])


def rater(others: list[Choice], cost: BatchCost) -> Callable[[Choice], float]:
    """The goodput of a step of the rows `others` and one more, as a function of that row's choice: the
    others are summed up once, so that trying one row's choices costs a pass over the rows, not one each."""
    tokens = sum(_tokens(c) for c in others)
    longest = max((c[1] for c in others if c is not None), default=0)
    calls: dict[str, int] = {}
    row_tokens: dict[str, int] = {}
    for c in others:
        if c is not None:
            calls[c[0].source] = max(calls.get(c[0].source, 0), c[1])
            row_tokens[c[0].source] = row_tokens.get(c[0].source, 0) + c[1]
    drafting = {s: cost.drafting_s(s, calls[s], row_tokens[s]) for s in calls}
    base, rows = sum(drafting.values()), len(others) + 1

    def rate(choice: Choice) -> float:
        if choice is None:
            return (tokens + 1.0) / (cost.step_s(rows, 1 + longest) + base)
        s, k = choice[0].source, choice[1]
        seconds = cost.step_s(rows, 1 + max(longest, k)) + base - drafting.get(s, 0.0)
        seconds += cost.drafting_s(s, max(calls.get(s, 0), k), row_tokens.get(s, 0) + k)
        return (tokens + _tokens(choice)) / seconds

    return rate


def _counts(offer: Offer, cap: int, cost: BatchCost) -> range:
    """The draft counts worth trying for a row under a cap: every one when its drafts cost calls; only the
    most when they are free (fewer would save padding only as a lower cap, which is tried too)."""
    top = min(cap, offer.drafts)
    return range(1 if offer.source in cost.drafting else top, top + 1)


def _tokens(choice: Choice) -> float:
    return 1.0 if choice is None else _expected(choice[0].alpha, choice[1])


@functools.lru_cache(maxsize=4096)
def _expected(alpha: float, k: int) -> float:
    # a plan asks for the same few (alpha, k) hundreds of times
    return expected_tokens(min(alpha, ALPHA_CAP), k)


def plan(offers: list[list[Offer]], cost: BatchCost) -> list[Choice]:
    """Each row's source and draft count for this step, from what each offers (an empty list: nothing).

    Every cap K from 0 to the longest offer is tried, each row drafting min(K, its offer) from the source that
    makes it the most tokens per second on its own; then, row by row, every other source and shorter count
    (or none) is tried in the whole step's goodput and kept if better. The best plan over the caps wins: the
    caps find where padding pays for all rows together, the row passes drop the drafts that do not."""
    longest = max((o.drafts for row in offers for o in row), default=0)
    best: list[Choice] = [None] * len(offers)
    best_rate = goodput(best, cost)
    alone = rater([], cost)
    for cap in range(1, longest + 1):
        choices = [max(((o, min(cap, o.drafts)) for o in row), key=alone) if row else None for row in offers]
        rate = goodput(choices, cost)
        for i, row in enumerate(offers):
            if not row:
                continue
            with_row = rater(choices[:i] + choices[i + 1:], cost)
            for option in [None, *((o, k) for o in row for k in _counts(o, cap, cost))]:
                option_rate = with_row(option)
                if option_rate > rate:
                    choices[i], rate = option, option_rate
        if rate > best_rate:
            best, best_rate = choices, rate
    return best
