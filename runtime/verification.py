"""Verification rules: how the target's logits judge a draft.

`exact` (runtime/speculative.py `verify`) is the default for every drafter and lossless: greedy keeps
the prefix equal to the target's argmax, sampling is Leviathan et al.'s rejection rule. `specdec` is
SpecDec's relaxed rule (Xia et al., 2023), an explicit opt-in that trades exactness for acceptance:
a draft token passes when it is among the target's top-beta tokens and its log-probability is within
tau of the top token's. Its output is not the target's greedy output (except with beta = 1), so the
stats are marked lossy.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from .sampling import SamplingParams
from .speculative import verify

SPECDEC_BETA = 3
SPECDEC_TAU = 2.0


def rank(logits: np.ndarray, token: int) -> int:
    """The token's place in the target's order (0 = the argmax); ties go to the lower id, as np.argmax."""
    value = logits[token]
    return int((logits > value).sum() + (logits[:token] == value).sum())


def specdec_accepts(logits: np.ndarray, token: int, beta: int, tau: float) -> bool:
    # log p(top1) - log p(token) is a difference of logits: the softmax's normaliser cancels
    gap = float(logits.max()) - float(logits[token])
    return rank(logits, token) < beta and gap <= tau


def specdec_verify(beta: int, tau: float) -> Callable:
    """The relaxed rule with `verify`'s signature (greedy only): at the first failing draft the target's
    argmax is emitted; after a fully accepted draft, the target's bonus argmax (verify's greedy pick)."""

    def judge(draft: int, q, logits: np.ndarray, params: SamplingParams, rng) -> int | None:
        return None if specdec_accepts(logits, draft, beta, tau) else int(np.argmax(logits))

    return partial(verify, rule=judge)


def make_verify(rule: str, beta: int | None = None, tau: float | None = None) -> Callable:
    """The acceptance function for `speculative(..., accept=...)`: a plan's rule with its beta and tau
    (runtime/plan.py checks them and applies the defaults)."""
    if rule == "specdec":
        return specdec_verify(SPECDEC_BETA if beta is None else beta, SPECDEC_TAU if tau is None else tau)
    return verify
