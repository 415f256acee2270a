"""One request in the batched scheduler: the caller's handle (a stream of token lists) and, while it holds
a cache row, its decoding state."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..drafters import Draft, LookupDrafter
from ..errors import SpecExportError
from ..options import Options
from ..sampling import SamplingParams
from ..stats import Stats

_END = object()


class BatchRequest:
    """What `BatchScheduler.submit` returns. Iterate it for the new tokens, a list per step; `tokens`,
    `finish_reason` ("length", "eos", "cancelled") and `stats` are final once the iteration ends. A failure
    of the pieces ends it with that SpecExportError; the other requests run on."""

    def __init__(self, prompt_ids: list[int], opts: Options, budget: int, eos_ids: set[int]) -> None:
        self.prompt_ids, self.opts, self.budget, self.eos_ids = list(prompt_ids), opts, budget, eos_ids
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.stats = Stats(mode=f"batched-{opts.mode}")
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
        tokens = tokens[: self.budget - len(self.tokens)]
        for i, token in enumerate(tokens):
            if token in self.eos_ids:
                tokens, self.finish_reason = tokens[:i], "eos"
                break
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


@dataclass
class Row:
    """A request's state while it holds cache row `slot`: `history` is the prompt and the final tokens, all but
    the last in the row's caches."""

    request: BatchRequest
    slot: int
    history: list[int]
    params: SamplingParams
    rng: np.random.Generator
    lookup: LookupDrafter | None  # None: autoregressive
    alpha: float  # running per-draft acceptance estimate (an exponential average), for the goodput choice
    draft: Draft = field(default_factory=lambda: Draft([]))

    def propose(self, room: int) -> int:
        """Finds this step's drafts (prompt lookup costs no model call) and returns how many there are."""
        self.draft = Draft([])
        if self.lookup is not None and room > 0:
            found = self.lookup.propose(self.history, room, None, self.params, self.rng)
            self.draft = Draft(found.tokens[:room], found.qs[:room] if found.qs else None)
        return len(self.draft.tokens)

    def cut(self, k: int) -> None:
        """Keeps the first k drafts: the step's speculation length."""
        d = self.draft
        self.draft = Draft(d.tokens[:k], d.qs[:k] if d.qs else None)

    def observe(self, drafted: int, accepted: int, weight: float = 0.05) -> None:
        # judged in order until the first rejection: `accepted` successes, then one failure
        for _ in range(accepted):
            self.alpha += weight * (1.0 - self.alpha)
        if accepted < drafted:
            self.alpha -= weight * self.alpha
