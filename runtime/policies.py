"""Draft-length policies: how many tokens a step may draft, and when drafting stops early.

A policy answers two questions, both from what is already known, so that every policy is lossless:
`budget()` before a step (the most drafts; 0 means a plain autoregressive step) and
`keep_going(n, signal)` after each draft token. `observe` feeds back what the step cost and how much
of the draft the target accepted, for policies that adapt.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass
class FixedPolicy:
    """Always draft gamma tokens."""

    gamma: int
    name: str = "fixed"

    def budget(self) -> int:
        return self.gamma

    def keep_going(self, drafted: int, signal: DraftSignal) -> bool:
        return True

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass


@dataclass
class ConfidencePolicy:
    """Kangaroo's double early exit: stop once the draft token's probability falls below eta."""

    gamma: int
    eta: float
    name: str = "confidence"

    def budget(self) -> int:
        return self.gamma

    def keep_going(self, drafted: int, signal: DraftSignal) -> bool:
        return signal.top_prob >= self.eta

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass


POLICY_NAMES = ("fixed", "confidence")


def make_policy(spec: str | None, gamma: int, eta: float, **context) -> DraftPolicy:
    """A policy from its command-line form: fixed[:GAMMA] or confidence[:ETA] (None: confidence).

    `gamma` and `eta` are the bundle's (or the user's) defaults; `context` carries what adaptive
    policies need (e.g. a cost model) and is ignored by the others."""
    name, _, arg = (spec or "confidence").partition(":")
    try:
        if name == "fixed":
            return FixedPolicy(int(arg) if arg else gamma)
        if name == "confidence":
            return ConfidencePolicy(gamma, float(arg) if arg else eta)
    except ValueError:
        raise SpecExportError(f"policy {spec!r} has a bad number after ':'; e.g. fixed:6 or confidence:0.6") from None
    raise SpecExportError(f"unknown draft-length policy {name!r}; use one of {', '.join(POLICY_NAMES)}")
