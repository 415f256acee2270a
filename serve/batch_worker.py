"""`--batch N`: the Worker's interface over the runtime's batched scheduler, so up to N requests decode at
once, their calls of each piece run together (runtime/batching: a rowwise or standard-flavour bundle, every mode
a Session runs but PEARL's schedule). Each request's text is relayed to its Run by a thread of its own, which blocks
on the request's tokens; cancelling the Run (a client that left, shutdown) cancels the request, freeing its
cache rows."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading

from ..runtime import RunError, Session, SpecExportError
from ..runtime.batching import BatchRequest, BatchScheduler, BatchTextStream
from .errors import APIError
from .metrics import Metrics
from .protocol import GenerationRequest
from .worker import Counters, Failure, Outcome, Run

log = logging.getLogger("specexport.serve")


class BatchRun(Run):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.request: BatchRequest | None = None

    def cancel(self) -> None:
        super().cancel()
        if self.request is not None:
            self.request.cancel()


class BatchWorker:
    def __init__(self, session: Session, max_batch: int, metrics: Metrics | None = None) -> None:
        self.session = session
        self.scheduler = BatchScheduler(session, max_batch=max_batch)
        self.counters = Counters()
        self.metrics = metrics or Metrics()
        # waiting: for the relay to submit it, or for a cache row; the relays of the rest are decoding theirs
        self.metrics.watch(lambda: self.counters.queued + self.scheduler.waiting,
                           lambda: max(0, self.counters.running - self.scheduler.waiting))
        self.scheduler.on_step = self.metrics.step  # one observation per batched step, whatever its rows
        self._runs: set[BatchRun] = set()
        self._threads: set[threading.Thread] = set()
        self._closed = False

    def submit(self, request: GenerationRequest) -> Run:
        if self._closed:
            raise APIError(503, "the server is shutting down; send the request again later", None, "shutting_down")
        run = BatchRun(asyncio.get_running_loop())
        thread = threading.Thread(target=self._relay, args=(run, request), name="specexport-relay", daemon=True)
        with self.counters.lock:
            self.counters.queued += 1
            self._runs.add(run)
            self._threads.add(thread)
        thread.start()
        return run

    def close(self, timeout: float) -> None:
        """Cancels what is still waiting or running, waits (up to `timeout` seconds) for the relays, and stops
        the scheduler."""
        self._closed = True
        with self.counters.lock:
            runs, threads = list(self._runs), list(self._threads)
        for run in runs:
            run.cancel()
        for thread in threads:
            thread.join(timeout)
        self.scheduler.close()

    def _relay(self, run: BatchRun, request: GenerationRequest) -> None:
        counters = self.counters
        with counters.lock:
            counters.queued -= 1
            counters.running += 1
        try:
            try:
                run.request = self.scheduler.submit(request.prompt_ids, **dataclasses.asdict(request.options))
            except SpecExportError as exc:
                # a mode the batched scheduler does not run, or a prompt that does not fit: the client's to
                # change, unless the scheduler was closed under it by the server's shutdown
                self._fail(run, Failure(str(exc), client=not self._closed))
                return
            if run.cancelled:  # left before its request existed: cancel() could not reach it
                run.request.cancel()
            stream = BatchTextStream(run.request, self.session.codec)
            for delta in stream:
                run.post("text", delta)
            cancelled = stream.finish_reason in ("cancelled", None) or run.cancelled
            reason = stream.finish_reason if stream.finish_reason in ("eos", "stop", "length") else "length"
            outcome = Outcome(stream.text, run.request.tokens, reason, run.request.stats, cancelled)
            with counters.lock:
                counters.generated_tokens += len(outcome.token_ids)
                if cancelled:
                    counters.cancelled += 1
                    counters.last_cancelled_tokens = len(outcome.token_ids)
                else:
                    counters.completed += 1
            self.metrics.ended(outcome.stats, len(outcome.token_ids), cancelled, steps_timed=False)
            run.post("done", outcome)
        except RunError as exc:  # a batched step failed: the server's failure, not the request's
            self._fail(run, Failure(str(exc), client=False))
        except Exception as exc:
            log.exception("generation failed")
            self._fail(run, Failure(f"generation failed: {type(exc).__name__}: {exc}", client=False))
        finally:
            with counters.lock:
                counters.running -= 1
                self._runs.discard(run)
                self._threads.discard(threading.current_thread())

    def _fail(self, run: Run, failure: Failure) -> None:
        with self.counters.lock:
            self.counters.failed += 1
        self.metrics.refused(failure.client)
        run.post("error", failure)
