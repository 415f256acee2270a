"""The decode engine: sequences' decoding loops on one set of pieces with a cache row each, their calls of a piece
merged into one batched call.

Each sequence runs the one decoding loop (`assemble.decoder`: every drafter, policy, tree and verification rule)
on its view of the pieces (`views`). An engine of one row is a Session's: its one sequence calls the pieces
directly, there being nothing to merge (and PEARL's drafter may run beside the target). In an engine of several
rows (the batch scheduler's) a view's call does not run at once: it waits until every sequence in the engine
has a call waiting, and then the waiting calls of the earliest stage of a step (drafting pieces, then shallow,
then deep) run, one batched call per piece with a row per sequence (`OrtPiece.run_rows`). Every step ends with
a deep call, so sequences meet there and verify together; a sequence whose step drafts while another's verifies
lets the drafting run first. A sequence alone in the engine runs each call the moment it asks, on its own
thread.

A row of a batched call is computed as the same row alone (backends/cache_rows.py), so each sequence's tokens
are exactly those it would get alone, whatever runs beside it. Calls longer than LONG_CALL tokens (a joining
sequence's prompt) run alone rather than pad every other row to their length, and the verification calls
(shallow, deep) of unlike lengths are grouped as the measured cost of a batched call says pays best (cost.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..backends.common import Pieces, TreeMask
from ..errors import RunError, SpecExportError
from .cost import CallCost, partition

STAGES = {"drafter": 0, "adapter": 0, "head": 0, "shallow": 1, "deep": 2}  # a step calls them in this order
VERIFYING = ("shallow", "deep")  # the pieces whose calls `cost` prices
LONG_CALL = 16


@dataclass
class Call:
    """One sequence's call of a piece, waiting to run: x is [1, n] ids or [1, n, hidden] states at `start`."""

    piece: str
    row: int
    x: np.ndarray
    start: int
    keep: int
    tree: TreeMask | None
    extra: dict[str, np.ndarray] | None
    result: dict[str, np.ndarray] | None = None
    error: BaseException | None = None
    done: bool = False
    charged_s: float = 0.0  # its share of the batched call's seconds (Engine._shares)

    @property
    def n(self) -> int:
        return self.x.shape[1]

    @property
    def kept(self) -> int:
        """How many trailing tokens' logits the caller asked for."""
        return self.n if self.keep <= 0 else min(self.keep, self.n)


class Engine:
    """The pieces, with `rows` cache rows each (`run_rows`), and the rendezvous of the sequences that call them.
    `cost` prices a batched shallow + deep call (None: merge every verification call into one);
    `on_call(piece, rows, seconds)` is called after each batched call, on the thread that ran it."""

    def __init__(self, pieces: Pieces, rows: int = 1, cost: CallCost | None = None,
                 on_call: Callable[[str, int, float], None] | None = None) -> None:
        self.pieces, self.rows, self.cost, self.on_call = pieces, rows, cost, on_call
        self._cond = threading.Condition()
        self._live = 0  # sequences in the engine: each either computes on its own thread or has a call waiting
        self._waiting: list[Call] = []
        self._running = False
        self._idle = 0

    @property
    def live(self) -> int:
        return self._live

    def views(self, row: int, clock: SequenceClock | None = None) -> Pieces:
        """The sequence in cache row `row`'s pieces: in an engine of one row, the pieces themselves; else views
        whose calls meet the other sequences' here (SequencePiece), timed by `clock`."""
        if self.rows == 1:
            return replace(self.pieces)
        clock = clock or SequenceClock()
        return replace(self.pieces, **{name: SequencePiece(self, name, row, clock) for name in self.pieces.named()})

    def join(self) -> None:
        with self._cond:
            self._live += 1

    def leave(self) -> None:
        with self._cond:
            self._live -= 1
            self._cond.notify_all()  # the sequences left may all be waiting now

    def call(self, call: Call) -> dict[str, np.ndarray]:
        """Runs `call` once every sequence has one waiting (see the module's docstring); its results, [1, ...]."""
        with self._cond:
            if self._live <= 1 and not self._waiting and not self._running:
                return self._alone(call)
            self._waiting.append(call)
            while not call.done:
                if not self._running and len(self._waiting) >= self._live:
                    batch = self._take()
                    self._running = True
                    self._cond.release()
                    try:
                        self._execute(batch)
                    finally:
                        self._cond.acquire()
                        self._running = False
                        self._cond.notify_all()
                else:
                    self._cond.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def _alone(self, call: Call) -> dict[str, np.ndarray]:
        """The one sequence in the engine: its call runs as it stands (the lock is held and released here)."""
        self._running = True
        self._cond.release()
        try:
            t0 = time.perf_counter()
            piece = self.pieces[call.piece]
            result = piece.run_rows(call.x, [call.row], [call.start], call.keep,
                                    None if call.tree is None else [call.tree], call.extra)
            call.charged_s = time.perf_counter() - t0
            if self.on_call is not None:
                self.on_call(call.piece, 1, call.charged_s)
            return result
        finally:
            self._cond.acquire()
            self._running = False
            self._cond.notify_all()

    def _take(self) -> list[list[Call]]:
        """The waiting calls of the earliest stage, grouped one batched call per piece (long calls alone)."""
        stage = min(STAGES[c.piece] for c in self._waiting)
        now = [c for c in self._waiting if STAGES[c.piece] == stage]
        self._waiting = [c for c in self._waiting if STAGES[c.piece] != stage]
        self._idle = len(self._waiting)  # sequences that wait, idle, while these calls run
        groups: dict[str, list[Call]] = {}
        alone = []
        for c in now:
            if c.n > LONG_CALL:
                alone.append([c])
            else:
                groups.setdefault(c.piece, []).append(c)
        merged = []
        for piece, calls in groups.items():
            if piece in VERIFYING:
                merged += [[calls[i] for i in part] for part in partition([c.n for c in calls], self.cost)]
            else:
                merged.append(calls)
        return [*alone, *merged]

    def _execute(self, batch: list[list[Call]]) -> None:
        for group in [g for whole in batch for g in self._fitting(whole)]:
            t0 = time.perf_counter()
            try:
                results = self._run(sorted(group, key=lambda c: c.row))
            except Exception as exc:  # the group's sequences end with the failure; the others run on
                error = exc if isinstance(exc, SpecExportError) else RunError(f"batched call failed: {exc}")
                for c in group:
                    c.error = error
            else:
                for c, result in results:
                    c.result = result
            seconds = time.perf_counter() - t0
            # the time of the sequences left waiting meanwhile is charged too, to the calls that kept them waiting
            for c, share in zip(group, self._shares(group), strict=True):
                c.charged_s, c.done = seconds * share * (1 + self._idle), True
            if self.on_call is not None:
                self.on_call(group[0].piece, len(group), seconds)

    def _shares(self, group: list[Call]) -> list[float]:
        """Each call's share of a batched call's seconds: of a verification call priced by `cost`, its charge
        (`CallCost.charges`: a long draft pays for the padding it causes; where rows cost little beside the
        weights' traffic, as at fp32, they are charged little); of any other call, its share of the tokens."""
        if self.cost is None or group[0].piece not in VERIFYING:
            tokens = sum(c.n for c in group)
            return [c.n / tokens for c in group]
        weights = self.cost.charges([c.n for c in group])
        total = sum(weights)
        return [w / total for w in weights]

    def _fitting(self, group: list[Call]) -> list[list[Call]]:
        """`group` less the calls that padding to its longest would carry past the context, each of which runs
        alone."""
        n, end = max(c.n for c in group), self.pieces[group[0].piece].max_context
        near = [c for c in group if c.start + n > end]
        fit = [c for c in group if c.start + n <= end]
        return [*([fit] if fit else []), *([c] for c in near)] if near else [group]

    def _run(self, calls: list[Call]) -> list[tuple[Call, dict[str, np.ndarray]]]:
        """One batched call: each row padded to the longest by repeating its last entry (trailing slots no real
        token reads before the row's next call rewrites them); each call gets back its own rows."""
        piece = self.pieces[calls[0].piece]
        n = max(c.n for c in calls)
        keep = max(n - c.n + c.kept for c in calls)  # the trailing rows that hold every call's kept ones

        def padded(v: np.ndarray) -> np.ndarray:
            return v[0] if v.shape[1] == n else np.concatenate([v[0], np.repeat(v[0, -1:], n - v.shape[1], axis=0)])

        x = np.stack([padded(c.x) for c in calls])
        extra = {name: np.stack([padded(c.extra[name]) for c in calls]) for name in calls[0].extra or {}}
        trees = [c.tree for c in calls] if any(c.tree is not None for c in calls) else None
        out = piece.run_rows(x, [c.row for c in calls], [c.start for c in calls], keep, trees, extra or None)
        axes = {name: shape[1] if len(shape) > 1 else None for name, _, shape in piece.results}
        mine = []
        for i, c in enumerate(calls):
            first = c.n - c.kept - (n - keep)  # the call's first kept row among the call's kept ones
            result = {}
            for name, value in out.items():
                if axes.get(name) == "seq":
                    result[name] = value[i:i + 1, :c.n]
                elif axes.get(name) == "kept":
                    result[name] = value[i:i + 1, first:first + c.kept]
                else:
                    result[name] = value[i:i + 1]
            mine.append((c, result))
        return mine


class SequenceClock:
    """A sequence's own seconds: the wall clock less the time its calls waited for other sequences' and ran for
    them (a batched call is charged to its sequences by `Engine._shares`). What a sequence's choices
    cost the sequences sharing its calls is what auto should weigh, not the wall time of a step they all wait
    for alike."""

    def __init__(self) -> None:
        self.others_s = 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self.others_s


class SequencePiece:
    """One sequence's view of a piece of an engine of several rows: the one-sequence `run` of
    runtime/backends/common.Piece, in cache row `row`, through the engine."""

    def __init__(self, engine: Engine, name: str, row: int, clock: SequenceClock) -> None:
        self.engine, self.name, self.row, self.clock = engine, name, row, clock
        self.pooled = engine.pieces[name]
        self.input_names = self.pooled.input_names
        self.moves_slots = self.pooled.moves_slots
        self.backend, self.shared_pool, self.handoff = self.pooled.backend, self.pooled.shared_pool, self.pooled.handoff

    def run(self, x: np.ndarray, start: int, keep: int = 1, tree: TreeMask | None = None,
            extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        if isinstance(x, np.ndarray) and x.shape[0] != 1:
            raise SpecExportError(f"piece {self.name!r} of one sequence takes one row, not {x.shape[0]}")
        call = Call(self.name, self.row, x, start, keep, tree, extra)
        t0 = time.perf_counter()
        try:
            return self.engine.call(call)
        finally:
            self.clock.others_s += max(0.0, time.perf_counter() - t0 - call.charged_s)

    def move_slots(self, src: list[int], dst: list[int]) -> None:
        # the row is this sequence's alone and no call of it is running: no need to wait for the others
        self.pooled.move_slots(src, dst, self.row)

