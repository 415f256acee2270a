"""Draft-length policies: how many tokens a step may draft, and when drafting stops early.

A policy answers two questions, both from what is already known, so that every policy is lossless:
`budget()` before a step (the most drafts; 0 means a plain autoregressive step) and
`keep_going(n, signal)` after each draft token. `observe` feeds back what the step cost and how much
of the draft the target accepted, for policies that adapt.

Under PEARL (runtime/pearl.py) `keep_going` runs on the drafter's thread while `budget` and `observe`
run on the verifier's, so `keep_going` must only read the policy's settings, never its running state.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .errors import SpecExportError


@dataclass
class DraftSignal:
    """What the drafter knew about its last token: its probability and (when available) the logits."""

    top_prob: float
    logits: np.ndarray | None = None

    @property
    def entropy(self) -> float:
        """Entropy (nats) of the draft distribution; 0 when the drafter gave no logits (lookup)."""
        if self.logits is None:
            return 0.0
        z = self.logits.astype(np.float64) - self.logits.max()
        p = np.exp(z)
        p /= p.sum()
        return float(-(p * np.log(np.maximum(p, 1e-30))).sum())


class DraftPolicy(Protocol):
    name: str

    def budget(self) -> int:
        """The most tokens the next step may draft (0: no speculation this step)."""
        ...

    def keep_going(self, drafted: int, signal: DraftSignal) -> bool:
        """Whether to draft another token after `drafted` tokens, the last one described by `signal`."""
        ...

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """The outcome of a step."""
        ...


class _GammaBudget:
    """For policies that offer every step `gamma` drafts and learn nothing from how steps went."""

    def budget(self) -> int:
        return self.gamma

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass


@dataclass
class FixedPolicy(_GammaBudget):
    """Always draft gamma tokens."""

    gamma: int
    name: str = "fixed"

    def keep_going(self, drafted: int, signal: DraftSignal) -> bool:
        return True


@dataclass
class ConfidencePolicy(_GammaBudget):
    """Kangaroo's double early exit: stop once the draft token's probability falls below eta."""

    gamma: int
    eta: float
    name: str = "confidence"

    def keep_going(self, drafted: int, signal: DraftSignal) -> bool:
        return signal.top_prob >= self.eta


# AdaEDL's scale of the entropy in its bound (only (1 - lambda)^2 / scale matters: the entropy in nats
# above which drafting stops, 0.31 here) and lambda, the best of a sweep on the default bundle by the
# pieces' measured costs (BENCHMARKS.md, "Measurements behind constants in the code").
ENTROPY_SCALE = 0.2
ENTROPY_LAMBDA = 0.75


@dataclass
class EntropyPolicy(_GammaBudget):
    """AdaEDL (Agrawal et al., 2024): stop once the entropy-based lower bound on the draft token's
    acceptance probability, 1 - sqrt(scale * H) with H the draft distribution's entropy, falls below
    lambda. Drafters that give only a top probability (prompt lookup) have no entropy: never stop early.
    Lambda stays fixed here (AdaEDL also moves it with the observed acceptance rate)."""

    gamma: int
    lam: float = ENTROPY_LAMBDA
    scale: float = ENTROPY_SCALE
    name: str = "entropy"

    def keep_going(self, drafted: int, signal: DraftSignal) -> bool:
        if signal.logits is None:
            return True
        return 1.0 - math.sqrt(self.scale * signal.entropy) >= self.lam


@dataclass
class CostModel:
    """Predicted seconds of one step: drafting k tokens costs k * draft_s, verifying n positions
    (k drafts + the last final token) verify_s + verify_per_token_s * n (a line fitted to measurements)."""

    draft_s: float
    verify_s: float
    verify_per_token_s: float
    measured: dict = field(default_factory=dict)  # the medians the fit came from (seconds), for reports

    def step_s(self, k: int) -> float:
        return k * self.draft_s + self.verify_s + self.verify_per_token_s * (k + 1)

    @classmethod
    def measure(cls, draft: Callable[[], object], verify: Callable[[int], object], gamma_max: int,
                repeats: int = 7, clock: Callable[[], float] = time.perf_counter) -> CostModel:
        """Time one draft step and verification of 1..gamma_max + 1 positions (medians of `repeats`, after a
        warm-up round) and fit the line. The calls take turns, round after round, so a busy moment of the
        machine slows every size alike instead of tilting the line. `clock`: the request's own seconds (its
        share of calls it shares with other sequences: runtime/batching)."""
        sizes = list(range(1, gamma_max + 2))
        calls = [draft, *(lambda n=n: verify(n) for n in sizes)]
        times: list[list[float]] = [[] for _ in calls]
        for round_ in range(repeats + 1):
            for call, seconds in zip(calls, times, strict=True):
                t0 = clock()
                call()
                if round_:
                    seconds.append(clock() - t0)
        draft_s, *verify_s = (statistics.median(t) for t in times)
        slope, intercept = np.polyfit(sizes, verify_s, 1) if len(sizes) > 1 else (0.0, verify_s[0])
        # a negative slope is measurement noise: verification never gets cheaper with more positions
        return cls(draft_s, float(intercept) + min(float(slope), 0.0), max(float(slope), 0.0),
                   {"draft_s": draft_s, "verify_s": dict(zip(sizes, verify_s, strict=True))})


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one step makes when each of k drafts is accepted with probability alpha, independently, up to
    the first rejection; the target's own token included: (1 - alpha^(k+1)) / (1 - alpha)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class GoodputPolicy:
    """SmartSpec's goodput (Liu et al., 2024): before each step pick the k in 0..gamma_max with the most
    expected tokens per predicted second, E(k) / T(k), from the cost model and a running per-token
    acceptance estimate alpha (an exponential average over every judged draft, starting at `prior`).

    k = 0 is a plain target step, which judges no draft and so would never update alpha: after
    `probe_every` such steps in a row, one step drafts a single token to look again."""

    gamma_max: int
    cost: CostModel
    prior: float = 0.5
    weight: float = 0.05  # about the last 20 judged drafts: steadier near the threshold than faster weights
    probe_every: int = 8
    name: str = "goodput"
    alpha: float = field(init=False)
    idle: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.alpha = self.prior

    def best(self) -> int:
        a = min(self.alpha, 0.999)
        return max(range(self.gamma_max + 1), key=lambda k: expected_tokens(a, k) / self.cost.step_s(k))

    def budget(self) -> int:
        k = self.best()
        self.idle = self.idle + 1 if k == 0 else 0
        if self.idle > self.probe_every:
            self.idle = 0
            return 1
        return k

    def keep_going(self, drafted: int, signal: DraftSignal) -> bool:
        return True

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        # the drafts are judged in order until the first rejection: `accepted` successes, then one failure
        for _ in range(accepted):
            self.alpha += self.weight * (1.0 - self.alpha)
        if accepted < drafted:
            self.alpha -= self.weight * self.alpha


POLICY_NAMES = ("fixed", "confidence", "entropy", "goodput")
POLICY_FORMS = "fixed[:GAMMA], confidence[:ETA], entropy[:LAMBDA] or goodput[:GAMMA_MAX]"


@dataclass(frozen=True)
class PolicySpec:
    """A draft-length policy as a request names it: its name and the number it gave, if any (range-checked)."""

    name: str
    value: int | float | None = None

    @classmethod
    def parse(cls, spec: str | None) -> PolicySpec:
        """From a policy's command-line form (None: confidence); a bad name or number is one sentence."""
        name, _, arg = (spec or "confidence").strip().partition(":")
        if name not in POLICY_NAMES:
            raise SpecExportError(f"unknown draft-length policy {name!r}; use {POLICY_FORMS}")
        try:
            value = (int(arg) if name in ("fixed", "goodput") else float(arg)) if arg else None
        except ValueError:
            raise SpecExportError(f"policy {spec!r} has a bad number after ':'; use {POLICY_FORMS}, such as fixed:6"
                                  " or entropy:0.5") from None
        if value is not None:
            ok, why = {"fixed": (value >= 0, "GAMMA must be 0 or more (0: no drafting)"),
                       "confidence": (0.0 <= value <= 1.0, "ETA is a probability, between 0 and 1"),
                       "entropy": (value < 1.0, "LAMBDA bounds an acceptance probability, so it must be below 1"),
                       "goodput": (value >= 1, "GAMMA_MAX must be at least 1")}[name]
            _check(ok, spec, why)
        return cls(name, value)

    def resolve(self, gamma: int, eta: float) -> tuple[str, int | float]:
        """(name, its number): the number given, else the request's (or the bundle's) gamma or eta, or entropy's
        own default; both are checked where they enter (runtime/options.py, the manifest)."""
        if self.value is not None:
            return self.name, self.value
        return self.name, {"fixed": gamma, "confidence": eta, "entropy": ENTROPY_LAMBDA, "goodput": gamma}[self.name]


def parse_policy(spec: str | None, gamma: int, eta: float) -> tuple[str, int | float]:
    """(name, its number) from a policy's command-line form, range-checked; the number defaults to the
    bundle's (or the user's) gamma or eta."""
    return PolicySpec.parse(spec).resolve(gamma, eta)


def make_policy(spec: str | None, gamma: int, eta: float,
                cost: Callable[[int], CostModel] | None = None) -> DraftPolicy:
    """A policy from its command-line form: fixed[:GAMMA], confidence[:ETA], entropy[:LAMBDA] or
    goodput[:GAMMA_MAX] (None: confidence).

    `gamma` and `eta` are the bundle's (or the user's) defaults (gamma is also entropy's and goodput's most
    drafts per step); `cost(gamma_max)` returns the cost model goodput needs (measured once, when first
    asked for)."""
    return policy_of(*parse_policy(spec, gamma, eta), gamma, cost)


def policy_of(name: str, value: int | float, gamma: int, cost: Callable[[int], CostModel] | None = None
              ) -> DraftPolicy:
    """The policy `parse_policy` names, with its number (a request's plan holds both: runtime/plan.py)."""
    if name == "fixed":
        return FixedPolicy(int(value))
    if name == "confidence":
        return ConfidencePolicy(gamma, float(value))
    if name == "entropy":
        return EntropyPolicy(gamma, float(value))
    if cost is None:
        raise SpecExportError("the goodput policy needs a cost model of the pieces, which only a loaded session"
                              " measures; use it through Session.generate or pass cost=")
    return GoodputPolicy(int(value), cost(int(value)))


def _check(ok: bool, spec: str | None, why: str) -> None:
    if not ok:
        raise SpecExportError(f"policy {spec!r} is out of range: {why}")


GOODPUT_MODES = ("self", "model", "lookup")
COST_POSITION = 256  # where the pieces are timed: a typical prompt's length (attention grows with it)


def measure_cost(pieces, mode: str, gamma_max: int, max_context: int, repeats: int = 5,
                 clock: Callable[[], float] = time.perf_counter) -> CostModel:
    """Time `mode`'s pieces for the goodput policy: a draft step (self: shallow + adapter on one token;
    model: the drafter piece; lookup: free) and a verification of n positions (deep on n states plus the
    shallow calls that make them). Call it between generations: it writes cache positions near
    COST_POSITION, which a generation rewrites before it reads them."""
    from .decode import ids_array

    if mode not in GOODPUT_MODES:
        raise SpecExportError(f"the goodput policy has a cost model for modes {', '.join(GOODPUT_MODES)}, not"
                              f" {mode!r}; use another --policy or one of those modes")
    pos = max(0, min(COST_POSITION, max_context - gamma_max - 2))
    ids = ids_array([0] * (gamma_max + 1))
    states = pieces.shallow.run(ids, pos)["hidden"]

    def verify(n: int) -> None:
        pieces.shallow.run(ids[:, :1 if mode == "self" else n], pos)  # self: the last draft's state only
        pieces.deep.run(states[:, :n], pos, keep=n)

    def draft() -> None:
        if mode == "self":
            pieces.adapter.run(pieces.shallow.run(ids[:, :1], pos)["hidden"], pos)
        elif mode == "model":
            pieces.drafter.run(ids[:, :1], pos)

    return CostModel.measure(draft, verify, gamma_max, repeats, clock)
