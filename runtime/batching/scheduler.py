"""`BatchScheduler`: many requests at once on one bundle, verified together in batched `deep` calls.

    scheduler = BatchScheduler(session, max_batch=4)      # or a bundle path
    request = scheduler.submit(prompt_ids, max_new_tokens=64, mode="lookup")
    for tokens in request:                                # new token ids, a list per step
        ...
    request.cancel()                                      # frees its cache row at the next step
    for text in scheduler.stream("Write a haiku.", stop=["\n\n"]):   # text, as Session.stream gives it
        ...

One thread drives the loop. Between steps, finished and cancelled rows free their cache row and waiting
requests take free rows (order.py), each read in by a prefill of its own; then every running row drafts
(prompt lookup, or nothing for AR), the step's speculation length is chosen for the batch (goodput.py), and
one step runs them all (step.py). Each request gets exactly the tokens it would get alone from the bundle's
AR (greedy), whatever runs beside it: its rows are computed bit for bit as a one-row call's (rows.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..bundle import Bundle, load_bundle
from ..drafters import LOOKUP_MAX_TOKENS, LookupDrafter
from ..errors import SpecExportError
from ..options import Limits, OptionError, Options, make_options
from ..sampling import SamplingParams
from ..text import TextCodec, check_prompt_fits
from .goodput import BatchCost, Offer, plan
from .order import AdmissionQueue
from .request import BatchRequest, Row
from .rows import BatchedPiece, check_batchable
from .step import BatchPieces, prefill, step
from .text import BatchTextStream

if TYPE_CHECKING:
    from ..session import Session

BATCH_MODES = ("ar", "lookup")  # auto means lookup here: the one drafter that batches today
ALPHA_PRIOR = 0.5


class BatchScheduler:
    def __init__(self, source: Session | str | Path, max_batch: int = 4, threads: int | None = None,
                 cost: BatchCost | None = None, max_draft: int = LOOKUP_MAX_TOKENS) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise OptionError(f"max_batch must be a positive integer, not {max_batch!r}")
        bundle: Bundle = load_bundle(source) if isinstance(source, (str, Path)) else source.bundle
        for name in ("shallow", "deep"):
            check_batchable(name, bundle.pieces[name], bundle.root)
        self.bundle, self.max_batch, self.max_draft = bundle, max_batch, max_draft
        self.codec = source.codec if not isinstance(source, (str, Path)) else TextCodec(bundle.root,
                                                                                         bundle.manifest.tokenizer)
        self._defaults = dataclasses.asdict(bundle.manifest.generation)
        self._limits = Limits(bundle.max_context, bundle.max_context - 1)

        def open_piece(name: str) -> BatchedPiece:
            return BatchedPiece(name, bundle.piece_path(name), bundle.pieces[name], bundle.max_context, max_batch,
                                threads)

        self.pieces = BatchPieces(open_piece("shallow"), open_piece("deep"))
        self.cost = cost or self._measure_cost()
        self._tau = {"ar": 1.0, "lookup": 1.0}  # tokens per step lately, by mode: the admission order's guess
        self._alpha = ALPHA_PRIOR  # acceptance lately over all lookup rows: a joining row's starting estimate
        self._waiting = AdmissionQueue(self._service_s)
        self._free = list(range(max_batch))
        self._rows: list[Row] = []
        self._closed = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="specexport-batch", daemon=True)
        self._thread.start()

    # -- the caller's side ---------------------------------------------------------------------------

    def options(self, **overrides) -> Options:
        """The bundle's defaults with `overrides`, checked as Session's are, for a mode that batches."""
        opts = make_options(self._defaults, overrides, self._limits)
        mode = "lookup" if opts.mode == "auto" else opts.mode
        if mode not in BATCH_MODES:
            raise OptionError(f"mode {opts.mode!r} drafts with a model piece, which the batched scheduler does not"
                              " run; use mode ar or lookup (auto is lookup here)")
        if opts.tree or opts.schedule != "sequential" or opts.verify != "exact" or opts.policy:
            raise OptionError("the batched scheduler verifies exactly and picks each step's draft length itself;"
                              " drop tree, schedule, verify and policy")
        return dataclasses.replace(opts, mode=mode)

    def submit(self, prompt_ids: list[int], **options) -> BatchRequest:
        """Queues a request (token ids, e.g. `session.prompt_ids(text, opts)`); iterate the returned
        BatchRequest for its tokens. Bad options or a prompt that does not fit raise at once."""
        opts = self.options(**options)
        max_context = self.bundle.max_context
        check_prompt_fits(len(prompt_ids), opts.max_new_tokens, max_context)
        request = BatchRequest(prompt_ids, opts, min(opts.max_new_tokens, max_context - len(prompt_ids)),
                               self.codec.eos_ids)
        with self._wake:
            if self._closed:
                raise SpecExportError("this BatchScheduler is closed; open another to submit requests")
            if request.budget == 0:
                request.end("length")
                return request
            self._waiting.push(request)
            self._wake.notify()
        return request

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
            opts = request.opts
            lookup = (LookupDrafter(self.bundle.manifest.model.dims.vocab, self.bundle.max_context,
                                    opts.gamma or self.max_draft) if opts.mode == "lookup" else None)
            row = Row(request, self._free.pop(), list(request.prompt_ids),
                      SamplingParams(opts.temperature, opts.top_k, opts.top_p), np.random.default_rng(opts.seed),
                      lookup, self._alpha)
            joining.append(row)
        return joining

    def _run(self, call, rows: list[Row]) -> None:
        """Runs a prefill or a step; a failure ends the requests it was for, and the loop goes on."""
        try:
            call(rows)
        except Exception as exc:  # the pieces' failure is these requests' end, never the scheduler's
            error = exc if isinstance(exc, SpecExportError) else SpecExportError(f"batched step failed: {exc}")
            for row in rows:
                if row.request.finish_reason is None:
                    row.request.finish_reason = "error"
                    row.request.end(error=error)
                    self._release(row)
            self._rows = [r for r in self._rows if r not in rows]

    def _prefill(self, rows: list[Row]) -> None:
        (row,) = rows
        t0 = time.perf_counter()
        first = prefill(self.pieces, row)
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
        offers = [[Offer("lookup", d, r.alpha)] if (d := r.propose(room)) else [] for r in rows]
        for r, choice in zip(rows, plan(offers, self.cost), strict=True):
            r.cut(choice[1] if choice else 0)
        t1 = time.perf_counter()
        news = step(self.pieces, rows)
        t2 = time.perf_counter()
        for row, new in zip(rows, news, strict=True):
            drafted, accepted = len(row.draft.tokens), len(new) - 1
            row.request.stats.record_step(drafted, accepted, t1 - t0, t2 - t1)
            if drafted:
                row.observe(drafted, accepted)
                self._alpha = 0.95 * self._alpha + 0.05 * row.alpha
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

    def _measure_cost(self) -> BatchCost:
        """Times batched steps once, in row slots nobody holds yet (the rows are rewritten before they are read)."""
        rows = list(range(self.max_batch))
        pos = max(0, min(128, self.bundle.max_context - self.max_draft - 2))  # a typical short prompt's end

        def timed(b: int, n: int) -> None:
            hidden = self.pieces.shallow.run(np.zeros((b, n), dtype=np.int64), rows[:b], [pos] * b)["hidden"]
            self.pieces.deep.run(hidden, rows[:b], [pos] * b, keep=n)

        return BatchCost.measure(timed, self.max_batch, self.max_draft + 1)
