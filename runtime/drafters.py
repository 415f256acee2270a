"""Drafters: what proposes the tokens the target verifies.

One protocol, `Drafter`, for every schedule. Every drafter sees the same thing: `history`, the final tokens
so far, whose last one is final but in no cache yet, at position len(history) - 1. `start` begins a
generation; `propose` drafts up to `budget` tokens as a `Draft`; after verification the sequential loop calls
`advance` with the shallow states of the verified positions and how many of them became final, so each
drafter brings its own state (caches, pending states) up to date whichever drafter ran.

A drafter that drafts one token at a time (`OneByOne`: self, model, head) also answers `step`, one draft after
a given token, and `rollback` to a final history; its `propose` is those steps in a loop, and PEARL's drafter
thread (runtime/pearl.py) calls them directly, telling it through `verified` which positions became final.

- `SelfDrafter`: Kangaroo's shallow layers + adapter (the target's own early exit).
- `ModelDrafter`: an independent small LM, the bundle's `drafter` piece, with its own cache.
- `LookupDrafter`: prompt lookup: copies what followed the last n-gram's earlier occurrence; no model.
- `HierDrafter`: HiSpec: the model drafts, the self-draft path screens, deep verifies what survives.
- `AutoDrafter`: picks one of the others per step by expected tokens per second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .backends.common import Piece, join_states
from .decode import Pieces, ids_array
from .policies import DraftPolicy, DraftSignal
from .sampling import SamplingParams, probabilities, sample
from .stats import Stats


@dataclass(frozen=True)
class Step:
    """One draft token: the draft for position pos + 1 after the token at pos, its distribution (sampling only)
    and the drafter's confidence; `hidden` is the shallow state of position pos when the drafter made it (the
    self-draft), else None."""

    hidden: np.ndarray | None
    token: int
    q: np.ndarray | None
    signal: DraftSignal
    catchup: bool = False  # it read a backlog first (the prompt, positions others verified): not a per-step cost


@dataclass
class Draft:
    tokens: list[int]
    qs: list[np.ndarray] | None = None  # the draft distributions over the full vocabulary (sampling only)
    hidden: np.ndarray | None = None  # shallow states of history[-1] + tokens, when the drafter made them
    catchup_s: float = 0.0  # seconds spent reading history the drafter had not seen yet (not a per-step cost)
    parents: list[int] | None = None  # a token tree: each of [history[-1], *tokens]'s parent (runtime/tree.py)
    ahead: list[int] = field(default_factory=list)  # a tree's branch past its final tokens (tree.settle_branch)


class Drafter(Protocol):
    name: str

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        """A new generation: `hidden` holds the shallow states of the prompt (the prefill's)."""
        ...

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        ...

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        """`hidden` [1, n, H] are the shallow states of positions pos.. of the step; the first `final`
        of those positions are now final."""
        ...


class OneByOne(Drafter, Protocol):
    """A drafter that can draft one token at a time, as PEARL's drafter thread asks (self, model and head;
    lookup copies a span at once, and the trees, hier and auto decide over a whole step)."""

    # whether its steps carry the shallow states `deep` verifies; such a drafter's one-token shallow call is its
    # attribute `shallow(token, pos)`, which a schedule may replace (PEARL's TensorRT handoff does)
    makes_hidden: bool

    def step(self, token: int, pos: int, params: SamplingParams, rng: np.random.Generator | None) -> Step:
        """The draft for position pos + 1, after `token` at pos: the last final token, or the previous step's
        draft (steps go up one position at a time until a rollback)."""
        ...

    def rollback(self, history: list[int]) -> None:
        """Drafting restarts after the final `history`: every token of it but the last was a step's input or
        its draft before."""
        ...

    def verified(self, pos: int, final: int) -> None:
        """Positions pos .. pos + final - 1 became final in `deep`'s last call. Called on the verifier's thread
        while steps run on another, so a drafter only copies what it needs here, under its own lock."""
        ...


def one_token_steps(drafter: OneByOne, history: list[int], budget: int, policy: DraftPolicy,
                    params: SamplingParams, rng: np.random.Generator) -> tuple[list[Step], float]:
    """A sequential step's chain: `drafter.step` from history[-1] until the budget or the policy stops it; and
    the seconds of the first step when it read a backlog (the prompt, or positions other drafters verified),
    which is not a per-step cost."""
    pos = len(history) - 1
    steps: list[Step] = []
    token, catchup = history[-1], 0.0
    while len(steps) < budget:
        t0 = time.perf_counter()
        steps.append(drafter.step(token, pos + len(steps), params, rng))
        if steps[-1].catchup:
            catchup = time.perf_counter() - t0
        token = steps[-1].token
        if not policy.keep_going(len(steps), steps[-1].signal):
            break
    return steps, catchup


def draft_of(steps: list[Step], catchup: float, hidden: np.ndarray | None = None) -> Draft:
    qs = [s.q for s in steps if s.q is not None]
    return Draft([s.token for s in steps], qs or None, hidden, catchup)


def choose(out: dict[str, np.ndarray], params: SamplingParams, rng: np.random.Generator,
           vocab_map: np.ndarray | None, vocab_size: int) -> tuple[int, np.ndarray | None, DraftSignal]:
    """The next draft token from a drafting piece's outputs (adapter or drafter: logits, top_token,
    top_prob); greedy reads two numbers, sampling draws from the (pruned) head's distribution."""
    logits = out["logits"][0, -1]
    if params.greedy:
        return int(out["top_token"][0, -1]), None, DraftSignal(float(out["top_prob"][0, -1]), logits)
    q = probabilities(logits, params)
    if vocab_map is not None:  # a pruned head's distribution, spread back over all ids
        q = np.bincount(vocab_map, weights=q, minlength=vocab_size)
    return sample(q, rng), q, DraftSignal(float(q.max()), logits)


class AdapterState:
    """The adapter's cache, for every drafter that runs it: the cache holds positions [0, seen);
    `pending` holds the shallow states of final positions [seen, pos) it has not read yet (the prompt
    after a prefill, the last draft after a fully accepted step, positions other drafters verified)."""

    def __init__(self, piece: Piece) -> None:
        self.piece = piece
        self.seen = 0
        self.pending: np.ndarray | None = None

    def start(self, hidden: np.ndarray) -> None:
        self.seen, self.pending = 0, hidden

    def read(self, h: np.ndarray, pos: int, keep: int = 1) -> dict[str, np.ndarray]:
        """Run the adapter over the pending states and `h` (the states of positions pos..); returns its
        outputs for the last `keep` of them."""
        h_in = join_states([self.pending, h]) if self.pending.shape[1] else h
        out = self.piece.run(h_in, self.seen, keep)
        self.seen, self.pending = pos + h.shape[1], self.pending[:, :0]
        return out

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        end = pos + final
        if self.seen >= end:  # the adapter read past the accepted tokens: roll back
            self.seen, self.pending = end, hidden[:, :0]
        elif self.seen >= pos:
            self.pending = hidden[:, self.seen - pos:final]
        else:  # this step did not read the adapter: its states queue behind the pending ones
            self.pending = join_states([self.pending, hidden[:, :final]])


class SelfDrafter:
    """Kangaroo's double early exit: shallow layers + adapter, token by token.

    The shallow states it computes on the way are the verifier's input, so `deep` never makes the
    shallow layers run twice on a token. `shallow` is the one-token shallow call; PEARL's TensorRT handoff
    replaces it with one that also leaves the state on the device for `deep`."""

    name = "self"
    makes_hidden = True

    def __init__(self, pieces: Pieces) -> None:
        self.pieces = pieces
        self.adapter = AdapterState(pieces.adapter)
        self.shallow: Callable[[int, int], np.ndarray] = (
            lambda token, pos: pieces.shallow.run(ids_array([token]), pos)["hidden"])

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self.adapter.start(hidden)

    def step(self, token: int, pos: int, params: SamplingParams, rng: np.random.Generator | None) -> Step:
        h = self.shallow(token, pos)
        backlog = self.adapter.pending.shape[1]
        x, q, signal = choose(self.adapter.read(h, pos), params, rng, self.pieces.draft_vocab,
                              self.pieces.vocab_size)
        return Step(h, x, q, signal, backlog > 1)

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        steps, catchup = one_token_steps(self, history, budget, policy, params, rng)
        last = steps[-1].token if steps else history[-1]
        # the last draft's state too: deep verifies every drafted position
        states = [*(s.hidden for s in steps), self.shallow(last, len(history) - 1 + len(steps))]
        return draft_of(steps, catchup, join_states(states))

    def rollback(self, history: list[int]) -> None:
        end = len(history) - 1
        # every verified position was drafted from, so the adapter has read all final positions
        if self.adapter.seen < end:
            raise RuntimeError(f"self-draft rollback to {end} but the adapter has read only {self.adapter.seen}")
        self.adapter.seen, self.adapter.pending = end, self.adapter.pending[:, :0]

    def verified(self, pos: int, final: int) -> None:
        pass  # its steps read the very states deep verified

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        self.adapter.advance(hidden, pos, final)


def fed_prefix(fed: list[int], seq: list[int], start: int, limit: int) -> int:
    """How many leading positions of a drafter's cache (`fed`: the token at each position) hold `seq`,
    scanning from `start`, below which the caller knows they agree, up to `limit`."""
    k = start
    while k < limit and fed[k] == seq[k]:
        k += 1
    return k


class ModelDrafter:
    """An independent small LM (the bundle's `drafter` piece) drafting token by token.

    Its cache is tracked by the tokens fed at each position (`fed`); `seq` is what it drafts from: the final
    tokens, then its own drafts. A step feeds only the positions of `seq` not already in the cache with the
    right token, so after a rejection the positions past the accepted prefix are simply rewritten, and the
    first step is the drafter's prefill. The first `synced` positions of `fed` are known to hold `seq`, and
    the first `final` of `seq` are final, so a step compares only the positions after them."""

    name = "model"
    makes_hidden = False

    def __init__(self, pieces: Pieces) -> None:
        self.piece = pieces.drafter
        self.vocab_map = pieces.drafter_vocab
        self.vocab_size = pieces.vocab_size
        self.start([], None)

    def start(self, prompt: list[int], hidden: np.ndarray | None) -> None:
        self.fed: list[int] = []
        self.seq, self.synced, self.final = list(prompt), 0, 0

    def _resync(self, history: list[int], final: int) -> None:
        """Draft from `history`, of which the first `final` tokens are final. What the cache holds is known to
        agree with it as far as the old `seq` was final: other drafters may have run steps since."""
        self.synced = min(self.synced, self.final, len(history) - 1)
        self.seq, self.final = list(history), final

    def _feed(self, end: int) -> tuple[dict[str, np.ndarray], int]:
        """Feed seq[:end] where the cache lacks it: the piece's outputs (their last row: the next-token logits
        after seq[end - 1]) and how many positions it read."""
        limit = min(len(self.fed), end - 1)  # seq[end - 1]'s logits are needed, so it is always fed
        at = fed_prefix(self.fed, self.seq, min(self.synced, limit), limit)
        out = self.piece.run(ids_array(self.seq[at:end]), at)
        self.fed[at:] = self.seq[at:end]
        self.synced = end
        return out, end - at

    def catch_up(self, history: list[int], final: int | None = None) -> dict[str, np.ndarray]:
        """Feed the history the cache lacks, through history[-1]; the outputs hold its next-token logits.
        `final`: how many leading tokens are final, when the rest are not verified yet (all by default)."""
        self._resync(history, len(history) if final is None else final)
        return self._feed(len(history))[0]

    def step(self, token: int, pos: int, params: SamplingParams, rng: np.random.Generator | None) -> Step:
        del self.seq[pos + 1:]
        if len(self.seq) == pos:
            self.seq.append(token)
        out, read = self._feed(pos + 1)
        x, q, signal = choose(out, params, rng, self.vocab_map, self.vocab_size)
        # more than the last draft + the target's token: the prefill, or other drafters' steps
        return Step(None, x, q, signal, read > 2)

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        self._resync(history, len(history))
        return draft_of(*one_token_steps(self, history, budget, policy, params, rng))

    def rollback(self, history: list[int]) -> None:
        # PEARL: history[:-1] are the old final tokens and the accepted drafts, all of them in the old `seq`
        self.seq, self.synced = list(history), min(self.synced, len(history) - 1)
        self.final = len(history)

    def verified(self, pos: int, final: int) -> None:
        pass  # a step compares its cache with the tokens

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        pass  # the next propose compares its cache with the history


LOOKUP_MAX_TOKENS = 10  # as Hugging Face's prompt_lookup_num_tokens in its examples


class LookupDrafter:
    """Prompt lookup: find the longest n-gram (max_ngram down to min_ngram) ending the history that
    occurred earlier in prompt + generated text, and propose what followed its most recent earlier
    occurrence. No model runs, so its drafts cost nothing but verification: it drafts up to its own
    `max_tokens` (not the policy's gamma, which weighs a model's per-token cost) and never asks the
    policy to stop early (it has no confidence to report). For sampling its q is a point mass, so
    verification accepts x with probability p(x) and resamples from p without x.

    An index maps each n-gram to where its latest occurrence ends; it only grows with the history."""

    name = "lookup"

    def __init__(self, vocab_size: int, max_context: int, max_tokens: int = LOOKUP_MAX_TOKENS,
                 max_ngram: int = 3, min_ngram: int = 2) -> None:
        self.vocab_size, self.max_context = vocab_size, max_context
        self.max_tokens, self.max_ngram, self.min_ngram = max_tokens, max_ngram, min_ngram
        self.start([], None)

    def start(self, prompt: list[int], hidden: np.ndarray | None) -> None:
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> the end position of its latest occurrence
        self.indexed = 0  # n-grams ending before this position are in `ends`

    def _index(self, history: list[int], upto: int) -> None:
        for end in range(self.indexed, upto):
            for n in range(self.min_ngram, min(self.max_ngram, end + 1) + 1):
                self.ends[tuple(history[end - n + 1:end + 1])] = end
        self.indexed = max(self.indexed, upto)

    def match(self, history: list[int], final: int | None = None) -> tuple[int, int]:
        """(n, end): the longest n-gram ending the history that occurred before, and where its latest
        earlier occurrence ends; (0, -1) when there is none. Only n-grams within the first `final` tokens
        (all by default) enter the index, which never forgets: tokens not verified yet stay out of it."""
        # not the suffix itself: that occurrence is no evidence
        self._index(history, len(history) - 1 if final is None else min(final, len(history) - 1))
        for n in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            end = self.ends.get(tuple(history[-n:]))
            if end is not None:
                return n, end
        return 0, -1

    def agreement(self, history: list[int], end: int, cap: int) -> int:
        """How many tokens, up to `cap`, end both the history and its earlier occurrence ending at `end`: the
        length of the copy in progress, which the n-gram index alone caps at max_ngram."""
        k = 0
        while k < cap and end - k >= 0 and history[end - k] == history[len(history) - 1 - k]:
            k += 1
        return k

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        n, end = self.match(history)
        if n == 0:
            return Draft([])
        room = self.max_context - len(history)  # every draft needs a cache slot
        drafts = history[end + 1:end + 1 + min(self.max_tokens, room)]
        qs = None if params.greedy else [np.eye(1, self.vocab_size, d)[0] for d in drafts]
        return Draft(drafts, qs)

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        pass  # the index catches up with the history on the next match


class HierDrafter:
    """HiSpec-style hierarchy: the model drafter proposes; the self-draft path screens the draft with one
    `shallow` call over [history[-1], *drafts] (the very states `deep` then verifies) and one `adapter`
    call over them, and the draft is cut after the first token the adapter disagrees with.

    That first disputed token is still verified: whether a token is verified must not depend on the
    token itself, or sampling would be biased (keeping x only when x equals the adapter's pick raises
    x's probability); a cut decided by the tokens before it is a stopping rule, lossless like a policy's
    `keep_going`. It costs one more verified position and lets the target accept what the adapter
    doubted."""

    name = "hier"

    def __init__(self, pieces: Pieces, stats: Stats) -> None:
        self.pieces = pieces
        self.model = ModelDrafter(pieces)
        self.adapter = AdapterState(pieces.adapter)
        self.stats = stats
        stats.extra.setdefault("screen_cut", 0)
        stats.extra.setdefault("screened", 0)

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self.model.start(prompt, hidden)
        self.adapter.start(hidden)

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        draft = self.model.propose(history, budget, policy, params, rng)
        tokens, n = draft.tokens, len(draft.tokens)
        if n == 0:
            return draft
        pos = len(history) - 1
        hidden = self.pieces.shallow.run(ids_array([history[-1], *tokens]), pos)["hidden"]
        keep = n
        if n > 1:  # the adapter's picks for drafts 1..n-1 (the last one's verdict could cut nothing)
            picks = self.adapter.read(hidden[:, :n - 1], pos, keep=n - 1)["top_token"][0]
            disputed = np.flatnonzero(picks != np.asarray(tokens[:n - 1]))
            keep = int(disputed[0]) + 1 if disputed.size else n
        self.stats.extra["screened"] += n
        self.stats.extra["screen_cut"] += n - keep
        qs = draft.qs[:keep] if draft.qs is not None else None
        return Draft(tokens[:keep], qs, hidden[:, :keep + 1], draft.catchup_s)

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        self.model.advance(hidden, pos, final)
        self.adapter.advance(hidden, pos, final)


@dataclass
class Estimate:
    """Running averages of one choice's steps in one context: tokens made per step (the target's own
    included) and seconds per step (drafting + verification), so tokens per second = tokens / seconds."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0
    last_step: float = -1
    weight: float = 0.25  # how fast old steps are forgotten
    revisit: int = 16  # steps unused before it is tried again; doubles each time a retry loses

    def update(self, tokens: int, seconds: float, step: float) -> None:
        w = 1.0 if self.steps == 0 else self.weight
        self.tokens += w * (tokens - self.tokens)
        self.seconds += w * (seconds - self.seconds)
        self.steps += 1
        self.last_step = step

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


PLAIN = "ar"  # the choice of drafting nothing: a plain target step
COPY_RUN = 8  # tokens of agreement with an earlier occurrence from which auto treats a match as a copy
Context = int | tuple[int, int]  # a copy's length, and with sharers the load's bucket too (AutoDrafter.pick)
NO_MATCH = 0  # the context of a step where prompt lookup has nothing to propose


@dataclass
class AutoMemory:
    """What auto has learned, kept by the session from one generation to the next: an estimate per
    (choice, context) and the step count their revisit intervals are measured in. A new request starts
    from the choices that led before instead of trying every one again, and keeps adapting as it goes."""

    estimates: dict[tuple[str, Context], Estimate]
    step: float = 0


class AutoDrafter:
    """Per step, the choice with the best expected tokens per second, among the bundle's drafters, prompt
    lookup and (unless a token tree is among the drafters) a plain target step.

    Estimates are kept per context, the length of the copy in progress: no lookup match, a 2- or 3-token
    match, or 8 and more tokens that agree with the earlier occurrence (`COPY_RUN`). Choices are compared
    within the step's context only, because every drafter does better while the answer copies its prompt:
    a long copy's lookup steps measured against the tree's average over all text would win by the text
    alone. Lookup is a choice only where it has a match (it is free, and on prompts the answer repeats,
    such as summarization, RAG or translation, its long copies win even against the tree, which grafts the
    same branch but pays its drafter calls and extra verified tokens).

    The floored token tree (runtime/tree.py) makes the plain-or-speculate call itself, per step, from the
    drafter's probabilities, so with a tree there is no separate plain choice: a running average of the
    tree's yield, which swings from 1 to 10 tokens a step, chose plain steps far too often and ran slower
    than the tree alone (docs/journal/2026-11-23.md).

    A choice not tried yet in the context, or not for its revisit interval, is tried (the text changes, and
    so do the winners). A retry that still loses doubles that interval, up to `max_revisit`, so a clear
    loser costs a few steps rather than one in every `revisit`; leading resets it. `memory` carries the
    estimates between generations (Session keeps one per set of choices). Every wrapped drafter's
    `advance` runs every step, so all stay consistent whichever drafted."""

    name = "auto"

    def __init__(self, drafters: list[Drafter], lookup: LookupDrafter, stats: Stats, lookup_min_ngram: int = 2,
                 revisit: int = 16, max_revisit: int = 128, memory: AutoMemory | None = None,
                 clock: Callable[[], float] = time.perf_counter, sharing: Callable[[], int] | None = None) -> None:
        self.drafters = {d.name: d for d in [*drafters, lookup]}
        self.lookup, self.lookup_min_ngram = lookup, lookup_min_ngram
        self.revisit, self.max_revisit = revisit, max_revisit
        self.contexts = (NO_MATCH, *range(lookup_min_ngram, lookup.max_ngram + 1), COPY_RUN)
        # a floored tree makes the plain-or-speculate call itself (runtime/tree.py) ...
        tree = any("tree" in n for n in self.drafters)
        self.always = [d.name for d in drafters] + ([] if tree else [PLAIN])
        # ... from the drafter's probabilities alone, which do not see other sequences sharing the calls: while
        # they do (`sharing`: how many sequences share them), a verified row costs more than alone, and a plain
        # step is a choice again
        self.sharing = sharing
        self.plain_when_shared = tree and sharing is not None
        self.clock = clock  # a sequence's own seconds: with others sharing its calls, its share of them
        self.memory = memory if memory is not None else AutoMemory({})
        plain = [PLAIN] if self.plain_when_shared else []
        self.steps = stats.extra.setdefault("auto_steps", dict.fromkeys([*self.drafters, *self.always, *plain], 0))
        self.choice: tuple[str, Context] | None = None  # None: the loop skipped propose (no budget this step)
        self.retry = False

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        for d in self.drafters.values():
            d.start(prompt, hidden)

    @property
    def step(self) -> float:
        return self.memory.step

    @step.setter
    def step(self, value: float) -> None:
        self.memory.step = value

    def estimate(self, choice: str, context: Context) -> Estimate:
        key = (choice, context)
        if key not in self.memory.estimates:
            self.memory.estimates[key] = Estimate(revisit=self.revisit)
        return self.memory.estimates[key]

    def context(self, history: list[int]) -> int:
        """The step's context: NO_MATCH, or the length of the copy in progress (2, 3, ... or COPY_RUN)."""
        n, end = self.lookup.match(history)
        if n < self.lookup_min_ngram:
            return NO_MATCH
        run = self.lookup.agreement(history, end, COPY_RUN)
        return max(k for k in self.contexts if k <= run)

    def pick(self, history: list[int]) -> tuple[str, Context]:
        copy = self.context(history)
        sharers = self.sharing() if self.sharing is not None else 1
        # with others sharing the calls a verified token costs what it costs in their batched calls, so the
        # estimates are kept per load too (1, 2, 3-4, 5-8 ... sequences): the same choice measured alone would
        # lead under load, where it does not pay
        context = copy if self.sharing is None else (copy, (sharers - 1).bit_length())
        plain = [PLAIN] if self.plain_when_shared and sharers > 1 else []
        names = [*self.always, *plain, *([self.lookup.name] if copy != NO_MATCH else [])]
        ests = {n: self.estimate(n, context) for n in names}
        stale = [n for n in names if ests[n].steps == 0 or self.step - ests[n].last_step > ests[n].revisit]
        self.retry = bool(stale)
        if stale:  # untried ones first, then the longest unused
            return min(stale, key=lambda n: (ests[n].steps > 0, ests[n].last_step)), context
        return max(names, key=lambda n: ests[n].rate), context

    def record(self, choice: tuple[str, Context], tokens: int, seconds: float, retry: bool = False) -> None:
        """One step of `choice`, a (choice, context) pair (`retry`: picked because it was stale, not because
        it led): update its running averages and its revisit interval."""
        name, context = choice
        est = self.estimate(name, context)
        est.update(tokens, seconds, self.step)
        self.steps[name] += 1
        rivals = [e for (_, c), e in self.memory.estimates.items() if c == context and e.steps]
        if est.rate >= max(e.rate for e in rivals):
            est.revisit = self.revisit
        elif retry:
            est.revisit = min(2 * est.revisit, self.max_revisit)

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        t0 = self.clock()
        self.choice = self.pick(history)
        name = self.choice[0]
        draft = Draft([]) if name == PLAIN else self.drafters[name].propose(history, budget, policy, params, rng)
        self.proposed_at = self.clock()
        self.draft_s = max(0.0, self.proposed_at - t0 - draft.catchup_s)
        return draft

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        if self.choice is not None:
            seconds = self.draft_s + self.clock() - self.proposed_at  # drafting + verification
            self.record(self.choice, final, seconds, self.retry)
            self.choice = None
        # the revisit intervals count rounds: sequences sharing one memory each add their share of a step
        self.step += 1 if self.sharing is None else 1 / max(1, self.sharing())
        for d in self.drafters.values():
            d.advance(hidden, pos, final)
