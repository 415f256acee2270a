"""Drafters: what proposes the tokens the target verifies.

Every drafter sees the same thing: `history`, the final tokens so far, whose last one is final but in
no cache yet, at position len(history) - 1. `propose` returns a `Draft`; after verification the loop
calls `advance` with the shallow states of the verified positions and how many of them became final,
so each drafter brings its own state (caches, pending states) up to date whichever drafter ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .decode import Pieces, ids_array
from .policies import DraftPolicy, DraftSignal
from .sampling import SamplingParams, probabilities, sample


@dataclass
class Draft:
    tokens: list[int]
    qs: list[np.ndarray] | None = None  # the draft distributions over the full vocabulary (sampling only)
    hidden: np.ndarray | None = None  # shallow states of history[-1] + tokens, when the drafter made them


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


class SelfDrafter:
    """Kangaroo's double early exit: shallow layers + adapter, token by token.

    The shallow states it computes on the way are the verifier's input, so `deep` never makes the
    shallow layers run twice on a token. The adapter's cache holds positions [0, seen); `pending`
    holds the shallow states of final positions [seen, pos) it has not read yet (the prompt after a
    prefill, the last draft after a fully accepted step, positions other drafters verified)."""

    name = "self"

    def __init__(self, pieces: Pieces) -> None:
        self.pieces = pieces
        self.seen = 0
        self.pending: np.ndarray | None = None

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self.seen, self.pending = 0, hidden

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        p = self.pieces
        pos = len(history) - 1
        drafts, qs, hs = [], [], []
        x, stop = history[-1], False
        while True:
            hs.append(p.shallow.run(ids_array([x]), pos + len(hs))["hidden"])
            if stop or len(drafts) == budget:
                break
            h_in = np.concatenate([self.pending, hs[-1]], axis=1) if self.pending.shape[1] else hs[-1]
            out = p.adapter.run(h_in, self.seen)
            self.seen, self.pending = pos + len(hs), self.pending[:, :0]
            x, q, signal = choose(out, params, rng, p.draft_vocab, p.vocab_size)
            drafts.append(x)
            if q is not None:
                qs.append(q)
            stop = not policy.keep_going(len(drafts), signal)
        return Draft(drafts, qs or None, np.concatenate(hs, axis=1))

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        end = pos + final
        if self.seen >= end:  # the adapter read past the accepted tokens: roll back
            self.seen, self.pending = end, hidden[:, :0]
        elif self.seen >= pos:
            self.pending = hidden[:, self.seen - pos:final]
        else:  # this step did not draft with the adapter: its states queue behind the pending ones
            self.pending = np.concatenate([self.pending, hidden[:, :final]], axis=1)
