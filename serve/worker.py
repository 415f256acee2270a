"""One generation at a time on the Session, in a thread of its own, so the event loop keeps serving.

Requests queue for the one generation thread in arrival order. Each gets a Run: its text arrives as events
on an asyncio queue while the runtime produces it, and `cancel()` (the client left, the server is stopping)
ends it at the runtime's next step and gives the Session to the next request."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field

from ..runtime import RunError, Session, SpecExportError, TextStream
from ..runtime.stats import Stats
from .errors import APIError
from .metrics import Metrics
from .protocol import GenerationRequest

log = logging.getLogger("specexport.serve")


@dataclass
class Outcome:
    """A finished (or cancelled) generation."""

    text: str
    token_ids: list[int]
    finish_reason: str  # the runtime's: eos | stop | length
    stats: Stats
    cancelled: bool


@dataclass
class Failure:
    """A generation that raised: `client` when the request itself was at fault (a mode the bundle cannot run)."""

    message: str
    client: bool


class Run:
    """A request's generation as the event loop sees it: ("text", str) events, then ("done", Outcome) or
    ("error", Failure)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.events: asyncio.Queue[tuple[str, object]] = asyncio.Queue()
        self._loop = loop
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def post(self, kind: str, payload: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop has closed: nobody is waiting for this run any more
            pass


@dataclass
class Counters:
    queued: int = 0
    running: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    generated_tokens: int = 0
    last_cancelled_tokens: int | None = None  # how far the last cancelled run got (a disconnect must stop it)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # held by whoever changes a count

    def as_dict(self) -> dict:
        with self.lock:
            return {k: v for k, v in vars(self).items() if k != "lock"}


class Worker:
    def __init__(self, session: Session, metrics: Metrics | None = None) -> None:
        self.session = session
        self.counters = Counters()
        self.metrics = metrics or Metrics()
        self.metrics.watch(lambda: self.counters.queued, lambda: self.counters.running)
        self._queue: queue.Queue[tuple[Run, GenerationRequest] | None] = queue.Queue()
        self._runs: set[Run] = set()
        self._closed = False
        # daemon: a Worker nobody closed must not keep the process alive (the server closes its own)
        self._thread = threading.Thread(target=self._loop, name="specexport-generate", daemon=True)
        self._thread.start()

    def submit(self, request: GenerationRequest) -> Run:
        if self._closed:
            raise APIError(503, "the server is shutting down; send the request again later", None, "shutting_down")
        run = Run(asyncio.get_running_loop())
        with self.counters.lock:
            self.counters.queued += 1
            self._runs.add(run)
        self._queue.put((run, request))
        return run

    def close(self, timeout: float) -> None:
        """Cancels what is still queued or running and waits (up to `timeout` seconds) for the thread."""
        self._closed = True
        with self.counters.lock:
            runs = list(self._runs)
        for run in runs:
            run.cancel()
        self._queue.put(None)
        self._thread.join(timeout)  # a cancelled run ends within one decoding step

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            self._generate(*item)

    def _generate(self, run: Run, request: GenerationRequest) -> None:
        counters = self.counters
        with counters.lock:
            counters.queued -= 1
            counters.running += 1
        stream: TextStream | None = None
        stopped = True  # until the stream runs to its end
        started = False  # whether any text went out
        try:
            if not run.cancelled:  # a client that left while queued costs nothing
                stream = TextStream(self.session, request.prompt_ids, request.options)
                for delta in stream:
                    started = True
                    run.post("text", delta)
                    if run.cancelled:
                        break
                else:
                    stopped = False
                stream.close()
            self._finish(run, stream, stopped)
        except SpecExportError as exc:
            # a piece that failed is the server's fault; otherwise the runtime refused what the request asked
            # for (a mode the bundle cannot run), which it does before the first token
            self._fail(run, Failure(str(exc), client=not isinstance(exc, RunError) and not started))
        except Exception as exc:
            log.exception("generation failed")
            self._fail(run, Failure(f"generation failed: {type(exc).__name__}: {exc}", client=False))
        finally:
            if stream is not None:
                stream.close()  # gives the Session back whatever happened
            with counters.lock:
                counters.running -= 1
                self._runs.discard(run)

    def _finish(self, run: Run, stream: TextStream | None, cancelled: bool) -> None:
        if stream is None:
            outcome = Outcome("", [], "length", Stats(), True)
        else:
            gen = stream.generation()  # the stream has ended: this only collects it
            outcome = Outcome(gen.text, gen.tokens, gen.finish_reason, gen.stats, cancelled)
        with self.counters.lock:
            self.counters.generated_tokens += len(outcome.token_ids)
            if cancelled:
                self.counters.cancelled += 1
                self.counters.last_cancelled_tokens = len(outcome.token_ids)
            else:
                self.counters.completed += 1
        self.metrics.ended(outcome.stats, len(outcome.token_ids), cancelled, steps_timed=True)
        run.post("done", outcome)

    def _fail(self, run: Run, failure: Failure) -> None:
        with self.counters.lock:
            self.counters.failed += 1
        self.metrics.refused(failure.client)
        run.post("error", failure)
