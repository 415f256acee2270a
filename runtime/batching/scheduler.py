"""`BatchScheduler`: many requests at once on one bundle, verified together in batched `deep` calls.

    scheduler = BatchScheduler(session, max_batch=4)      # or a bundle path
    request = scheduler.submit(prompt_ids, max_new_tokens=64, mode="lookup")
    for tokens in request:                                # new token ids, a list per step
        ...
    request.cancel()                                      # frees its cache row at the next step
    for text in scheduler.stream("Write a haiku.", stop=["\n\n"]):   # text, as Session.stream gives it
        ...

One thread drives the loop. Between steps, finished and cancelled rows free their cache row and waiting
requests take free rows (order.py), each read in by a prefill of its own; then every running row offers
what it can draft (prompt lookup's drafts, found at once; up to gamma of a model's), the step's plan picks
each row's source and draft count for the batch (goodput.py), the drafting models draft for all their rows
at once (drafting.py), and one step verifies them all (step.py). Each request gets exactly the tokens it
would get alone from the bundle's AR (greedy), whatever runs beside it: its rows are computed bit for bit
as a one-row call's (rows.py).

Modes and what their rows draft with ("sources"): ar nothing; lookup prompt lookup; model the drafter
piece; self the adapter on shallow's early exit; auto, per step, whichever of prompt lookup and the
bundle's drafting pieces the plan expects the most of (the token trees one request's auto may run are not
batched, nor is hier).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from ..backends.common import WrappedPiece
from ..backends.ort import OrtPiece
from ..bundle import Bundle, load_bundle
from ..choices import MODES
from ..drafters import LOOKUP_MAX_TOKENS, AdapterState, LookupDrafter
from ..errors import RunError, SpecExportError
from ..options import Limits, OptionError, Options, make_options
from ..plan import Capabilities, Plan, make_plan
from ..policies import ConfidencePolicy
from ..sampling import SamplingParams
from ..text import TextCodec, check_prompt_fits
from .drafter_cache import DrafterCache
from .drafting import DraftHead, draft_with_adapter, draft_with_drafter
from .goodput import BatchCost, DraftCost, plan
from .order import AdmissionQueue
from .request import BatchRequest, Row
from .rows import BatchedPiece, check_batchable, pads_one_row_calls
from .step import BatchPieces, prefill, step
from .text import BatchTextStream

if TYPE_CHECKING:
    from ..session import Session

MODE_SOURCES = {"ar": (), "lookup": ("lookup",), "model": ("model",), "self": ("self",)}  # auto: the bundle's
SOURCE_PIECES = {"model": "drafter", "self": "adapter"}
BATCH_MODES = tuple(m for m in MODES if m in MODE_SOURCES or m == "auto")  # in choices.py's order
ALPHA_PRIOR = 0.5


@dataclasses.dataclass
class StepCounts:
    """The batched steps so far: how many, the rows they verified in all, and the most rows in one (a step of
    several rows is work that one request at a time would have done in as many steps)."""

    steps: int = 0
    row_steps: int = 0
    max_rows: int = 0

    def record(self, rows: int) -> None:
        self.steps += 1
        self.row_steps += rows
        self.max_rows = max(self.max_rows, rows)


def opened_session(source, name: str) -> ort.InferenceSession | None:
    """The ONNX Runtime session a Session opened for piece `name` on the CPU, which the scheduler shares
    rather than loading the weights a second time; None for a bundle path, another backend or a device."""
    piece = getattr(getattr(source, "pieces", None), name, None)
    while isinstance(piece, WrappedPiece):  # the Session's padding and feature taps around the piece
        piece = piece.piece
    return piece.session if isinstance(piece, OrtPiece) and piece.device is None else None


class BatchScheduler:
    def __init__(self, source: Session | str | Path, max_batch: int = 4, threads: int | None = None,
                 cost: BatchCost | None = None, max_draft: int = LOOKUP_MAX_TOKENS) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise OptionError(f"max_batch must be a positive integer, not {max_batch!r}")
        bundle: Bundle = load_bundle(source) if isinstance(source, (str, Path)) else source.bundle
        attention = bundle.manifest.graph.attention
        for name in bundle.pieces:
            check_batchable(name, bundle.pieces[name], bundle.root, attention)
        self.bundle, self.max_batch, self.max_draft = bundle, max_batch, max_draft
        self.codec = source.codec if not isinstance(source, (str, Path)) else TextCodec(bundle.root,
                                                                                         bundle.manifest.tokenizer)
        self._defaults = dataclasses.asdict(bundle.manifest.generation)
        self._limits = Limits(bundle.max_context, bundle.max_context - 1)
        self._capabilities = Capabilities.of_bundle(bundle)

        def open_piece(name: str) -> BatchedPiece:
            return BatchedPiece(name, bundle.piece_path(name), bundle.pieces[name], bundle.max_context, max_batch,
                                threads, opened_session(source, name), attention, bundle.manifest.graph.matmul)

        def open_head(name: str) -> DraftHead | None:
            if name not in bundle.pieces:
                return None
            return DraftHead(open_piece(name), bundle.draft_vocab(name), bundle.manifest.model.dims.vocab)

        self.pieces = BatchPieces(open_piece("shallow"), open_piece("deep"), open_head("adapter"),
                                  open_head("drafter"))
        pad = pads_one_row_calls(source, bundle, self.pieces.shallow, self.pieces.deep)
        self.pieces.shallow.pad_one_row = self.pieces.deep.pad_one_row = pad
        self.sources = ("lookup", *(s for s, piece in SOURCE_PIECES.items() if piece in bundle.pieces))
        self.cost = self._measure_cost(cost)
        self._tau = dict.fromkeys(BATCH_MODES, 1.0)  # tokens per step lately, by mode: the admission order's guess
        # acceptance lately over all rows, by source: a joining row's starting estimate
        self._alpha = dict.fromkeys(self.sources, ALPHA_PRIOR)
        self.counts = StepCounts()
        # called on the loop's thread after each step with its rows and seconds (drafting included)
        self.on_step: Callable[[int, float], None] | None = None
        self._waiting = AdmissionQueue(self._service_s)
        self._free = list(range(max_batch))
        self._rows: list[Row] = []
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
        if plan.mode not in BATCH_MODES:
            raise OptionError(f"mode {plan.mode} does not run batched (the batched scheduler drafts with prompt"
                              f" lookup, the drafter piece and the adapter alone); use one of {', '.join(BATCH_MODES)}")
        if plan.tree is not None or plan.schedule != "sequential" or plan.lossy or opts.policy:
            raise OptionError("the batched scheduler verifies exactly and picks each step's draft length itself;"
                              " drop tree, schedule, verify and policy")
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

    # -- the loop ------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self._rows and not len(self._waiting):
                    self._wake.wait()
                if self._closed:
                    break
                for request in self._waiting.drop_cancelled():
                    request.end("cancelled")
                joining = self._admit()
            for row in joining:
                self._run(self._prefill, [row])
            self._rows = [r for r in self._rows if not self._finished(r)]
            if self._rows:
                self._run(self._step, self._rows)
            self._rows = [r for r in self._rows if not self._finished(r)]
        for row in self._rows:
            row.request.end("cancelled")
        for request in self._waiting.drain():
            request.end("cancelled")

    def _admit(self) -> list[Row]:
        joining = []
        while self._free and len(self._waiting):
            request = self._waiting.pop()
            if request.cancelled:
                request.end("cancelled")
                continue
            joining.append(self._row(request, self._free.pop()))
        return joining

    def _row(self, request: BatchRequest, slot: int) -> Row:
        opts, plan = request.opts, request.plan
        sources = self.sources if plan.mode == "auto" else MODE_SOURCES[plan.mode]
        lookup = (LookupDrafter(self.bundle.manifest.model.dims.vocab, self.bundle.max_context, plan.lookup_tokens)
                  if "lookup" in sources else None)
        if plan.mode == "auto":
            request.stats.extra["auto_steps"] = dict.fromkeys(["ar", *sources], 0)
        return Row(request, slot, list(request.prompt_ids), SamplingParams(opts.temperature, opts.top_k, opts.top_p),
                   np.random.default_rng(opts.seed), {s: self._alpha[s] for s in sources}, lookup,
                   DrafterCache() if "model" in sources else None, gamma=plan.gamma,
                   policy=ConfidencePolicy(plan.gamma, plan.eta))

    def _run(self, call, rows: list[Row]) -> None:
        """Runs a prefill or a step; a failure ends the requests it was for, and the loop goes on."""
        try:
            call(rows)
        except Exception as exc:  # the pieces' failure is these requests' end, never the scheduler's
            # whatever broke a step the requests had been admitted to, it is not their fault
            error = exc if isinstance(exc, RunError) else RunError(f"batched step failed: {exc}")
            for row in rows:
                if row.request.finish_reason is None:
                    row.request.finish_reason = "error"
                    row.request.end(error=error)
                    self._release(row)
            self._rows = [r for r in self._rows if r not in rows]

    def _prefill(self, rows: list[Row]) -> None:
        (row,) = rows
        t0 = time.perf_counter()
        first, hidden = prefill(self.pieces, row)
        if "self" in row.sources:
            row.adapter = AdapterState(None)  # its bookkeeping only: drafting.py runs the batched adapter
            row.adapter.start(hidden)
        request = row.request
        request.stats.prompt_tokens = len(row.history)
        request.stats.prefill_s = time.perf_counter() - t0 + (t0 - request.submitted)  # its wait included
        request.stats.steps += 1
        row.history.extend(first)
        self._rows.append(row)
        if request.emit(first):
            self._retire(row)

    def _step(self, rows: list[Row]) -> None:
        t0 = time.perf_counter()
        room = min(self.bundle.max_context - len(r.history) for r in rows)  # each row's last draft needs a slot
        offers = [r.offers(room) for r in rows]
        for row, row_offers, choice in zip(rows, offers, plan(offers, self.cost), strict=True):
            row.take(row.probed(row_offers, choice))
        by_drafter = [r for r in rows if r.source == "model"]
        if by_drafter:
            draft_with_drafter(self.pieces.drafter, by_drafter)
        by_adapter = [r for r in rows if r.source == "self"]
        if by_adapter:
            draft_with_adapter(self.pieces.shallow, self.pieces.adapter, by_adapter)
        t1 = time.perf_counter()
        news, hidden = step(self.pieces, rows)
        t2 = time.perf_counter()
        self.counts.record(len(rows))
        if self.on_step is not None:
            self.on_step(len(rows), t2 - t0)
        for i, (row, new) in enumerate(zip(rows, news, strict=True)):
            drafted, accepted = len(row.draft.tokens), len(new) - 1
            stats = row.request.stats
            stats.record_step(drafted, accepted, t1 - t0, t2 - t1)
            if "auto_steps" in stats.extra:
                stats.extra["auto_steps"][row.source if drafted else "ar"] += 1
            if drafted:
                row.observe(drafted, accepted)
                self._alpha[row.source] = 0.95 * self._alpha[row.source] + 0.05 * row.alpha[row.source]
            if row.adapter is not None:  # the states of the step's final positions, for the adapter to read
                row.adapter.advance(hidden[i:i + 1], len(row.history) - 1, len(new))
            mode = row.request.opts.mode
            self._tau[mode] = 0.9 * self._tau[mode] + 0.1 * len(new)
            row.history.extend(new)
            if row.request.emit(new):
                self._retire(row)

    def _finished(self, row: Row) -> bool:
        if row.request.finish_reason is None and row.request.cancelled:
            row.request.end("cancelled")
            self._release(row)
        return row.request.finish_reason is not None

    def _retire(self, row: Row) -> None:
        row.request.end()
        self._release(row)

    def _release(self, row: Row) -> None:
        with self._wake:
            self._free.append(row.slot)

    def _service_s(self, request: BatchRequest) -> float:
        steps = request.budget / self._tau[request.opts.mode]
        return steps * self.cost.step_s(self.max_batch, 2)

    def _measure_cost(self, given: BatchCost | None) -> BatchCost:
        """Times batched steps and drafting calls once (what `given` does not say), in row slots nobody holds
        yet (the rows are rewritten before they are read)."""
        rows = list(range(self.max_batch))
        pos = max(0, min(128, self.bundle.max_context - self.max_draft - 2))  # a typical short prompt's end
        p = self.pieces

        def ids(b: int, n: int = 1) -> np.ndarray:
            return np.zeros((b, n), dtype=np.int64)

        def timed(b: int, n: int) -> None:
            hidden = p.shallow.run(ids(b, n), rows[:b], [pos] * b)["hidden"]
            p.deep.run(hidden, rows[:b], [pos] * b, keep=n)

        drafting_calls = {
            "model": lambda b: p.drafter.piece.run(ids(b), rows[:b], [pos] * b),
            "self": lambda b: p.adapter.piece.run(p.shallow.run(ids(b), rows[:b], [pos] * b)["hidden"], rows[:b],
                                                  [pos] * b),
        }
        cost = given or BatchCost.measure(timed, self.max_batch, self.max_draft + 1)
        missing = {s: DraftCost.measure(drafting_calls[s], self.max_batch) for s in self.sources
                   if s in drafting_calls and s not in cost.drafting}
        return dataclasses.replace(cost, drafting={**cost.drafting, **missing}) if missing else cost

