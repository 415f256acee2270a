"""PEARL scheduling (Liu et al., ICLR 2025): the drafter and the verifier run at the same time.

The sequential loop (runtime/speculative.py) drafts, then verifies, then drafts again, so one of the two
always waits. Here the drafter runs on a thread of its own and never waits for a verdict:

- pre-verify: after a rejection the verifier runs `deep` on the step's first position as soon as the
  first draft exists, while the drafter drafts the next ones; if that first draft is rejected, drafting
  stops at once and restarts from the target's token;
- post-verify: while `deep` verifies the drafts it has, the drafter keeps drafting from the optimistic
  end (up to the policy's budget of drafts not yet handed over); when everything is accepted those
  drafts are the next verification's input, otherwise they are discarded and the drafter rolls back.

So the draft length adapts by itself: each verification takes whatever was drafted while the previous
one ran. Every verified position carries a draft, so a verification of n positions judges n drafts and
yields the accepted ones plus, at the first rejection, the target's token (no bonus token: the drafter
has already drafted past the last position). Greedy output equals the target's; sampling is Leviathan
et al.'s rejection rule, with randomness keyed by position (see `keyed_rng`), so the output for a seed
does not depend on how the two threads happened to interleave (it is another sample than the sequential
loop's for the same seed, which draws from one stream in call order; both follow the target's
distribution).

Any drafter that drafts one token at a time runs here, through the drafters' own protocol (runtime/drafters.py
`OneByOne`: `step`, `rollback`, `verified`): the self-draft, the drafter piece and the draft head. Threads and
handoff: the drafter thread owns the drafting pieces (shallow + adapter for the self-draft, the drafter piece,
the head); the verifier (the caller's thread) owns `deep` (and, for a drafter that makes no shallow states,
`shallow`). No piece ever runs on both threads. Drafts and the self-draft's shallow states pass from the
drafter to the verifier as immutable `Step`s under one condition variable; a rollback is a request the drafter
applies on its own thread before its next step, and a step that was running when the request came is dropped.
The head reads the target's states of the verified positions, which the verifier copies out of `deep`'s last
call for it (`verified`) before it asks for a rollback. ONNX Runtime releases the GIL while a piece runs, so
the two threads really overlap; each session needs a thread pool of its own (not the process-wide shared
pool), sized by `pearl_threads`. On TensorRT the same loop runs with the two threads on two CUDA streams
(runtime/backends/cuda_streams.py, not run on a GPU yet).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np

from .backends.common import join_states
from .decode import Pieces, ids_array, prefill
from .drafters import OneByOne, Step
from .errors import SpecExportError
from .policies import DraftPolicy
from .sampling import SamplingParams, pick
from .speculative import judge
from .stats import Stats

DRAFT_KEY, VERIFY_KEY = 0, 1
DRAFTER_PIECES = ("shallow", "adapter", "drafter", "head")


def pearl_threads(total: int) -> dict[str, int]:
    """Intra-op threads per piece when drafter and verifier run side by side on `total` cores: every piece
    gets them all. The drafter is idle most of the time (its window fills long before `deep` returns), so
    splitting the cores starves `deep` more than sharing them slows it (on 2 cores every split ran slower
    than sharing; BENCHMARKS.md)."""
    n = max(1, total)
    return {"deep": n, **dict.fromkeys(DRAFTER_PIECES, n)}


def keyed_rng(seed: int, kind: int, pos: int, epoch: int) -> np.random.Generator:
    """The random stream of one decision: the draft for position `pos` or its verification, in `epoch`
    (the number of rollbacks so far). Each key is used once, so draws are independent, and the same
    decisions get the same draws however the threads interleave."""
    return np.random.default_rng((seed, kind, pos, epoch))


class HostHandoff:
    """CPU: the self-draft's shallow states reach `deep` inside the items, as numpy arrays."""

    def __init__(self, pieces: Pieces) -> None:
        self.pieces = pieces

    def shallow(self, token: int, pos: int) -> np.ndarray:
        return self.pieces.shallow.run(ids_array([token]), pos)["hidden"]

    def deep(self, items: list[Step], tokens: list[int], pos: int) -> np.ndarray:
        """Logits [n, V] of positions pos..pos+n-1: `tokens` are their tokens, for drafters without states."""
        if items[0].hidden is not None:
            hidden = join_states([it.hidden for it in items])
        else:
            hidden = self.pieces.shallow.run(ids_array(tokens), pos)["hidden"]
        return self.pieces.deep.run(hidden, pos, keep=len(items))["logits"][0]

    def close(self) -> None:
        pass


class DraftWorker:
    """The drafter thread and its handoff to the verifier.

    `items` hold this epoch's steps for positions base, base + 1, ...; the first `taken` went to the
    verifier. The drafter runs while fewer than `window` items wait and the policy has not paused it,
    and stops at the end of the context."""

    def __init__(self, drafter: OneByOne, policy: DraftPolicy, params: SamplingParams, seed: int,
                 max_context: int) -> None:
        self.drafter, self.policy, self.params = drafter, policy, params
        self.seed, self.max_context = seed, max_context
        self.cv = threading.Condition()
        self.items: list[Step] = []
        self.base = self.taken = self.run_length = 0
        self.window = 1
        self.paused = False
        self.epoch = 0
        self.request: list[int] | None = None  # final history to roll back to, applied by the drafter thread
        self.next: tuple[int, int] = (0, 0)  # (token, position) the drafter steps from next
        self.closing = False
        self.error: BaseException | None = None
        self.dropped = 0  # steps thrown away: drafted past a rejection, or running when it came
        self.thread = threading.Thread(target=self._run, name="specexport-pearl-drafter", daemon=True)

    # -- verifier side ---------------------------------------------------------------------------

    def start(self, history: list[int]) -> None:
        """Draft from the first token after the prefill (the drafter has read the prompt)."""
        self.base, self.next = len(history) - 1, (history[-1], len(history) - 1)
        self.window = max(1, self.policy.budget())
        self.thread.start()

    def take(self) -> tuple[int, int, list[Step]]:
        """(position, epoch, items) of every draft not handed over yet, waiting for at least one (none only
        at the end of the context); the drafter may then draft `policy.budget()` more while the verifier
        works."""
        with self.cv:
            while self.error is None and (self.request is not None or len(self.items) == self.taken):
                if self.request is None and self.next[1] >= self.max_context:
                    return self.base + self.taken, self.epoch, []
                self.cv.wait()
            if self.error is not None:
                raise self.error
            del self.items[:self.taken]  # verified and accepted, or the verifier would have asked to roll back
            self.base += self.taken
            chunk = list(self.items)
            self.taken = len(chunk)
            self.window, self.run_length, self.paused = max(1, self.policy.budget()), 0, False
            self.cv.notify_all()
            return self.base, self.epoch, chunk

    def rollback(self, history: list[int]) -> None:
        """The verifier rejected a draft: drafting restarts from the final `history` in a new epoch."""
        with self.cv:
            self.request = list(history)
            self.epoch += 1
            self.dropped += len(self.items) - self.taken
            self.cv.notify_all()

    def close(self) -> None:
        with self.cv:
            self.closing = True
            self.cv.notify_all()
        if self.thread.is_alive():
            self.thread.join()

    # -- drafter thread --------------------------------------------------------------------------

    def _may_step(self) -> bool:
        waiting = len(self.items) - self.taken
        return not self.paused and waiting < self.window and self.next[1] < self.max_context

    def _run(self) -> None:
        try:
            while True:
                with self.cv:
                    while not self.closing and self.request is None and not self._may_step():
                        self.cv.wait()
                    if self.closing:
                        return
                    if self.request is not None:
                        history, self.request = self.request, None
                        self.drafter.rollback(history)
                        self.items, self.base, self.taken = [], len(history) - 1, 0
                        self.run_length, self.paused = 0, False
                        self.next = (history[-1], len(history) - 1)
                        if not self._may_step():
                            continue
                    (token, pos), epoch, run = self.next, self.epoch, self.run_length
                rng = None if self.params.greedy else keyed_rng(self.seed, DRAFT_KEY, pos + 1, epoch)
                item = self.drafter.step(token, pos, self.params, rng)  # the pieces run outside the lock
                keep_going = self.policy.keep_going(run + 1, item.signal)
                with self.cv:
                    if self.request is not None or self.closing:
                        self.dropped += 1
                        continue
                    self.items.append(item)
                    self.run_length += 1
                    self.paused = not keep_going
                    self.next = (item.token, pos + 1)
                    self.cv.notify_all()
        except BaseException as exc:  # handed to the verifier, which raises it in its own thread
            with self.cv:
                self.error = exc
                self.cv.notify_all()


def judge_items(items: list[Step], logits: np.ndarray, params: SamplingParams, seed: int, pos: int,
                epoch: int) -> tuple[list[int], int]:
    """(new final tokens, accepted drafts): logits[i] is the target's view of position pos + i + 1, whose
    draft is items[i].token, judged by the sequential loop's rule with a draw keyed by position. No bonus
    token: the drafter has already drafted past the last position."""
    for i, item in enumerate(items):
        rng = None if params.greedy else keyed_rng(seed, VERIFY_KEY, pos + i + 1, epoch)
        instead = judge(item.token, item.q, logits[i], params, rng)
        if instead is not None:
            return [*(it.token for it in items[:i]), instead], i
    return [it.token for it in items], len(items)


def check_thread_pools(pieces: Pieces) -> None:
    """Refuse (one sentence) to run PEARL when every ONNX Runtime session shares the process-wide pool:
    the drafter and `deep` would then take turns on the same threads instead of running side by side."""
    if pieces.deep.shared_pool:
        raise SpecExportError("schedule 'pearl' runs the drafter and `deep` side by side, but this process put"
                              " every ONNX Runtime session in one shared thread pool (use_shared_thread_pool);"
                              " open the bundle in a process that does not, or use --schedule sequential")


def make_handoff(pieces: Pieces, self_draft: bool):
    """The handoff of shallow states between the threads: host arrays for ONNX Runtime, device buffers and
    CUDA events between two streams for TensorRT (imported only then)."""
    if pieces.deep.handoff == "cuda-stream":
        from .backends.cuda_streams import StreamHandoff

        return StreamHandoff(pieces, self_draft)
    return HostHandoff(pieces)


def pearl(pieces: Pieces, drafter: OneByOne, policy: DraftPolicy, prompt: list[int], params: SamplingParams,
          rng: np.random.Generator, stats: Stats, max_context: int, handoff=None) -> Iterator[list[int]]:
    """Drafter and verifier side by side; returns the loop that yields the new final tokens, as `speculative`
    does, once it has checked the pieces can run side by side (so a refusal comes before any token)."""
    check_thread_pools(pieces)
    return _side_by_side(pieces, drafter, policy, prompt, params, rng, stats, max_context, handoff)


def _side_by_side(pieces: Pieces, drafter: OneByOne, policy: DraftPolicy, prompt: list[int], params: SamplingParams,
                  rng: np.random.Generator, stats: Stats, max_context: int, handoff) -> Iterator[list[int]]:
    handoff = handoff or make_handoff(pieces, drafter.makes_hidden)
    if drafter.makes_hidden:  # its one-token shallow call, through the handoff (on TensorRT: to the device too)
        drafter.shallow = handoff.shallow
    worker = None
    try:
        hidden, logits = prefill(pieces, prompt, stats)
        history = [*prompt, pick(logits[0, -1], params, rng)]
        seed = int(rng.integers(2**63))  # the keyed draws of this generation
        drafter.start(prompt, hidden)
        worker = DraftWorker(drafter, policy, params, seed, max_context)
        stats.extra["schedule"] = "pearl"
        worker.start(history)
        yield history[-1:]
        while True:
            t0 = time.perf_counter()
            pos, epoch, items = worker.take()
            if not items:  # the context is full
                return
            t1 = time.perf_counter()
            tokens = [history[-1], *(it.token for it in items[:-1])]
            logits = handoff.deep(items, tokens, pos)
            new, accepted = judge_items(items, logits, params, seed, pos, epoch)
            drafter.verified(pos, len(new))
            if accepted < len(items):
                worker.rollback([*history, *new])  # before yielding, so the drafter restarts at once
            t2 = time.perf_counter()
            policy.observe(len(items), accepted, t1 - t0, t2 - t1)
            stats.record_step(len(items), accepted, t1 - t0, t2 - t1)
            history.extend(new)
            yield new
    finally:
        if worker is not None:
            worker.close()  # joins the drafter thread: the pieces are idle when the next generation starts
            stats.extra["dropped_drafts"] = worker.dropped
        handoff.close()
