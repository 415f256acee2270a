"""One request in the batched scheduler: the caller's handle (a stream of token lists) and, while it holds
a cache row, its decoding state."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..decode import emitted
from ..drafters import AdapterState, Draft, LookupDrafter
from ..errors import SpecExportError
from ..options import Options
from ..plan import Plan
from ..policies import ConfidencePolicy
from ..sampling import SamplingParams
from ..stats import Stats
from .drafter_cache import DrafterCache
from .goodput import Choice, Offer

_END = object()
PROBE_EVERY = 8  # steps without drafts after which a row drafts one token
REVISIT = 32  # steps after which a source the row did not draft with drafts one token


class BatchRequest:
    """What `BatchScheduler.submit` returns. Iterate it for the new tokens, a list per step; `tokens`,
    `finish_reason` ("length", "eos", "cancelled") and `stats` are final once the iteration ends. A failure
    of the pieces ends it with a RunError; the other requests run on."""

    def __init__(self, prompt_ids: list[int], opts: Options, budget: int, eos_ids: set[int], plan: Plan) -> None:
        self.prompt_ids, self.opts, self.budget, self.eos_ids = list(prompt_ids), opts, budget, eos_ids
        self.plan = plan  # the options resolved (runtime/plan.py)
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
        tokens, ended = emitted(tokens, self.budget - len(self.tokens), self.eos_ids, self.opts.ignore_eos)
        if ended:
            self.finish_reason = "eos"
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
    the last in the row's caches. `sources` are what it may draft with (none: AR), each with its running
    acceptance estimate in `alpha`; the drafting models' caches are tracked in `drafter` and `adapter`."""

    request: BatchRequest
    slot: int
    history: list[int]
    params: SamplingParams
    rng: np.random.Generator
    alpha: dict[str, float]  # source -> per-draft acceptance estimate (an exponential average)
    lookup: LookupDrafter | None = None
    drafter: DrafterCache | None = None  # the drafter piece's cache row (source "model")
    adapter: AdapterState | None = None  # the adapter's cache row and the states it has not read (source "self")
    gamma: int = 0  # the most drafts a model drafts in a step ...
    policy: ConfidencePolicy | None = None  # ... stopping early when a draft's probability falls below eta
    lookup_draft: Draft = field(default_factory=lambda: Draft([]))  # what prompt lookup found this step
    draft: Draft = field(default_factory=lambda: Draft([]))  # the step's drafts, as verified
    source: str | None = None  # what drafted this step's `draft`
    limit: int = 0  # the most drafts this step takes (the plan's)
    steps: int = 0
    idle: int = 0  # steps in a row without drafts
    judged: dict[str, int] = field(default_factory=dict)  # source -> the step its drafts were last judged

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(self.alpha)

    def offers(self, room: int) -> list[Offer]:
        """What the row can draft this step: prompt lookup's drafts are found now (no model runs), a model's
        only promised (up to gamma tokens, drafted if the plan takes them)."""
        self.draft, self.source, self.limit = Draft([]), None, 0
        offers = []
        if room <= 0:
            return offers
        if self.lookup is not None:
            found = self.lookup.propose(self.history, room, None, self.params, self.rng)
            self.lookup_draft = Draft(found.tokens[:room], found.qs[:room] if found.qs else None)
            if found.tokens:
                offers.append(Offer("lookup", len(self.lookup_draft.tokens), self.alpha["lookup"]))
        offers += [Offer(s, min(self.gamma, room), self.alpha[s]) for s in ("model", "self") if s in self.alpha]
        return offers

    def probed(self, offers: list[Offer], choice: Choice) -> Choice:
        """The plan's choice for the row, unless an estimate needs a fresh look: after PROBE_EVERY steps without
        drafts the row drafts one token from its most promising source, and a source it has not drafted with
        for REVISIT steps (auto) drafts one token. An estimate that fell low, or a source the plan never picked,
        would otherwise never be judged again (one request's goodput policy and auto look again likewise)."""
        if not offers:
            return choice
        if choice is None and self.idle >= PROBE_EVERY:
            return max(offers, key=lambda o: o.alpha), 1
        stale = [o for o in offers if self.steps - self.judged.setdefault(o.source, self.steps) >= REVISIT]
        if stale and (choice is None or choice[0].source != stale[0].source):
            return stale[0], 1
        return choice

    def take(self, choice: Choice) -> None:
        """Sets the step's source and draft limit from the plan; lookup's drafts are cut to it at once, a
        model's are drafted after (runtime/batching/drafting.py)."""
        self.steps += 1
        if choice is None:
            self.idle += 1
            return
        offer, k = choice
        self.source, self.limit, self.idle = offer.source, k, 0
        self.judged[offer.source] = self.steps
        if offer.source == "lookup":
            d = self.lookup_draft
            self.draft = Draft(d.tokens[:k], d.qs[:k] if d.qs else None)

    def observe(self, drafted: int, accepted: int, weight: float = 0.05) -> None:
        """The step's verdict on the drafts of its source."""
        # judged in order until the first rejection: `accepted` successes, then one failure
        alpha = self.alpha[self.source]
        for _ in range(accepted):
            alpha += weight * (1.0 - alpha)
        if accepted < drafted:
            alpha -= weight * alpha
        self.alpha[self.source] = alpha
