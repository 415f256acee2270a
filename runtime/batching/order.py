"""Who takes a free cache row next when more requests wait than rows are free (LAPS-SD's idea, simplified).

LAPS-SD (Li, Chen, Li) orders speculative requests by their predicted remaining time, which depends on the
output length *and* the acceptance rate. A waiting request has not run yet, so its prediction is its token
budget over the tokens a step of its mode has been making lately (the scheduler's running mean of all rows
of that mode; 1 for AR): shortest expected service first. Aging keeps a long request from waiting forever:
every second waited takes `aging` seconds off its predicted service. Rows are not preempted once admitted
(LAPS-SD's least-attained-service phase needs preemption; here a row runs to its end).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .request import BatchRequest


class AdmissionQueue:
    def __init__(self, service_s: Callable[[BatchRequest], float], aging: float = 1.0) -> None:
        self.service_s, self.aging = service_s, aging
        self._waiting: list[BatchRequest] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def push(self, request: BatchRequest) -> None:
        self._waiting.append(request)

    def pop(self, now: float | None = None) -> BatchRequest:
        """The waiting request with the least aged expected service (the earliest on a tie)."""
        now = time.perf_counter() if now is None else now

        def score(item: tuple[int, BatchRequest]) -> tuple[float, int]:
            i, r = item
            return self.service_s(r) - self.aging * (now - r.submitted), i

        i, request = min(enumerate(self._waiting), key=score)
        del self._waiting[i]
        return request

    def drop_cancelled(self) -> list[BatchRequest]:
        gone = [r for r in self._waiting if r.cancelled]
        self._waiting = [r for r in self._waiting if not r.cancelled]
        return gone

    def drain(self) -> list[BatchRequest]:
        waiting, self._waiting = self._waiting, []
        return waiting
