"""One request in the batched scheduler: the caller's handle, a stream of token lists."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

from ..decode import emitted
from ..errors import SpecExportError
from ..options import Options
from ..plan import Plan
from ..stats import Stats

_END = object()


class BatchRequest:
    """What `BatchScheduler.submit` returns. Iterate it for the new tokens, a list per step; `tokens`,
    `finish_reason` ("length", "eos", "cancelled") and `stats` are final once the iteration ends. A failure
    of the pieces ends it with a RunError; the other requests run on."""

    def __init__(self, prompt_ids: list[int], opts: Options, budget: int, eos_ids: set[int], plan: Plan) -> None:
        self.prompt_ids, self.opts, self.budget, self.eos_ids = list(prompt_ids), opts, budget, eos_ids
        self.plan = plan  # the options resolved (runtime/plan.py)
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.stats = Stats(mode=opts.mode)  # the plan's label once it runs
        self.submitted = time.perf_counter()
        self._chunks: queue.Queue = queue.Queue()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop the request at the next step boundary and free its cache row (a disconnected client)."""
        self._cancelled.set()

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            chunk = self._chunks.get()
            if chunk is _END:
                return
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk

    def result(self) -> list[int]:
        """Waits for the request's end and returns all of its tokens."""
        for _ in self:
            pass
        return self.tokens

    # -- the scheduler's side -------------------------------------------------------------------------

    def emit(self, tokens: list[int]) -> bool:
        """Hands the step's final tokens to the caller, cut at the budget and at an end-of-sequence token (as
        Session does); True once the request is done."""
        tokens, ended = emitted(tokens, self.budget - len(self.tokens), self.eos_ids, self.opts.ignore_eos)
        if ended:
            self.finish_reason = "eos"
            self.stats.eos_tokens = 1
        self.tokens.extend(tokens)
        self.stats.new_tokens = len(self.tokens)
        if tokens:
            self._chunks.put(tokens)
        if self.finish_reason is None and len(self.tokens) >= self.budget:
            self.finish_reason = "length"
        return self.finish_reason is not None

    def end(self, reason: str | None = None, error: SpecExportError | None = None) -> None:
        self.finish_reason = self.finish_reason or reason
        self.stats.decode_s = time.perf_counter() - self.submitted - self.stats.prefill_s
        if error is not None:
            self._chunks.put(error)
        self._chunks.put(_END)
