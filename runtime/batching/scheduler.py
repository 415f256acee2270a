"""`BatchScheduler`: many requests at once on one bundle: the decode engine (runtime/engine) with a cache row per
request, their calls of each piece run together.

    scheduler = BatchScheduler(session, max_batch=4)      # or a bundle path
    request = scheduler.submit(prompt_ids, max_new_tokens=64, mode="auto")
    for tokens in request:                                # new token ids, a list per step
        ...
    request.cancel()                                      # frees its cache row after its current step
    for text in scheduler.stream("Write a haiku.", stop=["\\n\\n"]):   # text, as Session.stream gives it
        ...

A request that holds a cache row runs a Session's own decoding loop (runtime/assemble.py: the same plan,
drafters, policies, trees and verification) on a thread of its own, on its views of the engine's pieces; the
engine runs the rows' calls of a piece as one batched call. So every mode a Session runs runs batched, and a
request gets exactly the tokens it would get alone from the bundle, whatever runs beside it, except PEARL's
schedule, whose drafter runs beside the target on threads of its own and is refused. Between requests, free
rows go to the waiting request with the shortest expected service (order.py). What `auto` measures (its
choices' tokens per second) is measured in the batched steps it runs in, so its choices follow the load.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..assemble import decoder
from ..bundle import Bundle, load_bundle
from ..context import DecodeContext
from ..decode import Pieces
from ..drafters import LOOKUP_MAX_TOKENS
from ..engine import Engine, SequenceClock, open_pieces, sequence_pieces
from ..engine.calls import LONG_CALL
from ..engine.cost import CallCost
from ..engine.pieces import cpu_sessions
from ..errors import RunError, SpecExportError
from ..options import Limits, OptionError, Options, make_options
from ..plan import Capabilities, Plan, make_plan
from ..row_padding import one_row_calls
from ..sampling import SamplingParams
from ..text import TextCodec, check_prompt_fits
from ..tree import trees_in_full
from .drafts import SharedDrafts
from .order import AdmissionQueue
from .request import BatchRequest
from .text import BatchTextStream

if TYPE_CHECKING:
    from ..session import Session


@dataclasses.dataclass
class StepCounts:
    """The deep calls so far (each request's steps and its prefill's): how many, the rows they ran in all, and the
    most rows in one (a call of several rows is work that one request at a time would have done in as many)."""

    steps: int = 0
    row_steps: int = 0
    max_rows: int = 0

    def record(self, rows: int) -> None:
        self.steps += 1
        self.row_steps += rows
        self.max_rows = max(self.max_rows, rows)


class BatchScheduler:
    def __init__(self, source: Session | str | Path, max_batch: int = 4, threads: int | None = None,
                 max_draft: int = LOOKUP_MAX_TOKENS, cost: CallCost | None = None) -> None:
        """`cost`: what a batched verification call costs (cost.py); measured here, in a second or two, unless
        given."""
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise OptionError(f"max_batch must be a positive integer, not {max_batch!r}")
        alone = isinstance(source, (str, Path))
        bundle: Bundle = load_bundle(source) if alone else source.bundle
        self.bundle, self.max_batch, self.max_draft = bundle, max_batch, max_draft
        self.codec = TextCodec(bundle.root, bundle.manifest.tokenizer) if alone else source.codec
        self._defaults = dataclasses.asdict(bundle.manifest.generation)
        self._limits = Limits(bundle.max_context, bundle.max_context - 1)
        # a Session's weights and its finding on one-row calls are shared: the bundle opens once
        pools = open_pieces(bundle, "onnxruntime", None, threads, max_batch,
                            None if alone else cpu_sessions(source.engine.pieces),
                            None if alone else source.one_row_calls == "session")
        self.cost = cost or self._measure_cost(pools["shallow"], pools["deep"])
        self.engine = Engine(pools, max_batch, self.cost, on_call=self._observe)
        template = self._pieces(0)
        # what the requests' loops read, auto's estimates and the cost models shared among them
        self.context = DecodeContext.of(template, bundle.root, bundle.max_context, bundle.manifest.precision,
                                        bundle.manifest.speculative,
                                        trees_in_full(bundle.manifest.graph.attention, template))
        self._capabilities = Capabilities.of(self.context)
        self._tau: dict[str, float] = {}  # tokens per step lately, by mode: the admission order's guess
        self._step_s = 0.0  # a verification call's seconds lately
        self.counts = StepCounts()
        # called after each batched verification call with its rows and seconds
        self.on_step = None
        self._waiting = AdmissionQueue(self._service_s)
        self._free = list(range(max_batch))
        self._running: dict[int, tuple[BatchRequest, threading.Thread]] = {}
        self._closed = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="specexport-batch", daemon=True)
        self._thread.start()

    # -- the caller's side ---------------------------------------------------------------------------

    def options(self, **overrides) -> Options:
        """The bundle's defaults with `overrides`, checked and planned as Session's are (runtime/plan.py), for
        a plan that batches; anything else raises OptionError, one sentence."""
        opts = make_options(self._defaults, overrides, self._limits)
        self.plan(opts)
        return opts

    def plan(self, opts: Options) -> Plan:
        """Session's plan for `opts` (the same refusals, in the same words), when the batched steps can run it."""
        plan = make_plan(opts, self._capabilities, self.max_draft)
        if plan.schedule != "sequential":
            raise OptionError(f"schedule {plan.schedule} does not run batched (its drafter runs beside the target on"
                              " threads of its own); drop schedule, or use a Session")
        return plan

    def submit(self, prompt_ids: list[int], **options) -> BatchRequest:
        """Queues a request (token ids, e.g. `session.prompt_ids(text, opts)`); iterate the returned
        BatchRequest for its tokens. Bad options or a prompt that does not fit raise at once."""
        opts = make_options(self._defaults, options, self._limits)
        plan = self.plan(opts)
        max_context = self.bundle.max_context
        check_prompt_fits(len(prompt_ids), opts.max_new_tokens, max_context)
        request = BatchRequest(prompt_ids, opts, min(opts.max_new_tokens, max_context - len(prompt_ids)),
                               self.codec.eos_ids, plan)
        with self._wake:
            if self._closed:
                raise SpecExportError("this BatchScheduler is closed; open another to submit requests")
            if request.budget == 0:
                request.end("length")
                return request
            self._waiting.push(request)
            self._wake.notify()
        return request

    @property
    def waiting(self) -> int:
        """Requests submitted that do not hold a cache row yet."""
        return len(self._waiting)

    def stream(self, prompt: str, **options) -> BatchTextStream:
        """A text prompt, formatted and encoded as Session.stream does; iterate the result for text."""
        opts = self.options(**options)
        ids = self.codec.encode(self.codec.format(prompt, opts.system, opts.chat))
        return BatchTextStream(self.submit(ids, **options), self.codec)

    def close(self) -> None:
        """Cancels what is still waiting or running and stops the loop."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    def __enter__(self) -> BatchScheduler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- admission -------------------------------------------------------------------------------------

    def _loop(self) -> None:
        with self._wake:
            while True:
                while not self._closed and not (self._free and len(self._waiting)):
                    self._wake.wait()
                if self._closed:
                    break
                for request in self._waiting.drop_cancelled():
                    request.end("cancelled")
                while self._free and len(self._waiting):
                    request = self._waiting.pop()
                    row = self._free.pop()
                    thread = threading.Thread(target=self._serve, args=(request, row), daemon=True,
                                              name=f"specexport-row-{row}")
                    self._running[row] = request, thread
                    thread.start()
            running = list(self._running.values())
        for request, _ in running:
            request.cancel()
        for _, thread in running:
            thread.join()
        for request in self._waiting.drain():
            request.end("cancelled")

    def _pieces(self, row: int, clock: SequenceClock | None = None) -> Pieces:
        return sequence_pieces(self.engine.views(row, clock), self.bundle)

    def _serve(self, request: BatchRequest, row: int) -> None:
        """A request's whole decoding in cache row `row`, on this thread."""
        opts, stats = request.opts, request.stats
        clock = SequenceClock()
        # auto's memory and the cost models are shared; its estimates are measured in the request's own seconds
        ctx = dataclasses.replace(self.context, pieces=self._pieces(row, clock), clock=clock,
                                  sharing=lambda: self.engine.live,
                                  drafts=lambda d: SharedDrafts(d, self.cost, lambda: self.engine.live, clock))
        waited = 0.0
        self.engine.join()
        try:
            if not request.cancelled:
                waited = time.perf_counter() - request.submitted
                loop = decoder(ctx, request.plan, list(request.prompt_ids),
                               SamplingParams(opts.temperature, opts.top_k, opts.top_p),
                               np.random.default_rng(opts.seed), stats)
                try:
                    for tokens in loop:
                        if request.emit(tokens) or request.cancelled:
                            break
                finally:
                    loop.close()
            stats.prefill_s += waited  # a request's time to its first token includes its wait for a row
            # a loop that ran out filled the context: its length, as a Session says
            request.end("cancelled" if request.cancelled else "length")
        except Exception as exc:  # the pieces' failure is this request's end, never the scheduler's
            error = exc if isinstance(exc, SpecExportError) else RunError(f"batched decoding failed: {exc}")
            request.finish_reason = "error"
            request.end(error=error)
        finally:
            self.engine.leave()
            steps = stats.steps - 1  # the prefill's call is one of them
            if steps > 0:
                made = stats.new_tokens + stats.eos_tokens
                self._tau[opts.mode] = 0.9 * self._tau.get(opts.mode, 1.0) + 0.1 * made / steps
            with self._wake:
                del self._running[row]
                self._free.append(row)
                self._wake.notify()

    def _observe(self, piece: str, rows: int, seconds: float) -> None:
        if piece != "deep":
            return
        self.counts.record(rows)
        self._step_s = seconds if not self._step_s else 0.9 * self._step_s + 0.1 * seconds
        if self.on_step is not None:
            self.on_step(rows, seconds)

    @property
    def pieces(self) -> Pieces:
        """The engine's pieces, a cache row per request (OrtPiece.run_rows), shallow and deep padded where one-row
        calls need it (row_padding.py)."""
        return self.engine.pieces

    @property
    def one_row_calls(self) -> str:
        """As Session.one_row_calls: how a one-token call of shallow and deep keeps verification's arithmetic."""
        spec = self.bundle.pieces["deep"]
        return one_row_calls(self.engine.pieces, spec.min_rows, spec.one_row_padding)

    def _measure_cost(self, shallow, deep) -> CallCost:
        """Times batched shallow + deep calls in row slots nobody holds yet (rewritten before they are read)."""
        rows = list(range(self.max_batch))
        pos = max(0, min(128, self.bundle.max_context - LONG_CALL - 1))  # a typical short prompt's end

        def timed(b: int, n: int) -> None:
            hidden = shallow.run_rows(np.zeros((b, n), dtype=np.int64), rows[:b], [pos] * b)["hidden"]
            deep.run_rows(hidden, rows[:b], [pos] * b, keep=n)

        return CallCost.measure(timed, self.max_batch, LONG_CALL)

    def _service_s(self, request: BatchRequest) -> float:
        steps = request.budget / self._tau.get(request.opts.mode, 1.0)
        return steps * (self._step_s or 0.01)
