"""How many drafts a request verifies while other requests share the engine's calls (SmartSpec's goodput, per
request).

Alone, a request drafts as its mode and policy say. Sharing, a verified draft costs what it costs in a batched
call (`CallCost.charges`): the fixed and per-row terms are split among the rows, and a row longer than the others
pads every row of the call to its length, so each of its positions past the others' one costs b tokens (what
the engine charges it), unless the engine verifies it in a call of its own, paying that call's fixed term.
A drafting call keeps the other requests waiting too. So before each step the request takes the draft count k
in 0..its budget with the most expected tokens per second of its own:

    E(alpha, k) / (min(even + per_token * (1 + b * k), fixed + per_row + per_token * (1 + k)) + k * d)

for b requests sharing, even = (fixed + per_row * b) / b, alpha its running per-draft acceptance, and d its
drafting seconds per draft token as its own clock measures them (the others' waiting included); a plain step
(k = 0) costs even + per_token.

After `probe_every` x b plain steps in a row one step drafts a single token, or alpha would never be judged
again. A probe pads or splits the call every sharing request is in, and a drafter catching up keeps them waiting,
so the interval grows with b (the load probes about once per `probe_every` rounds, however many requests share
them), each probe doubles it, up to `max_probe_every`, and drafts that pay reset it. Where drafts would pay only
at an acceptance above `probe_alpha` (at four int4 rows on a 2-core CPU, above 0.975), nothing is probed: no
drafter here is accepted that often for long, and each probe costs every sharer.

A token tree is verified whole or not at all (its shape sizes it), but a probe is one token, its first branch's
first; a chain of prompt lookup's, which takes no budget of its own, is cut to k.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..drafters import Draft, Drafter
from ..engine.cost import CallCost
from ..policies import DraftPolicy, expected_tokens
from ..sampling import SamplingParams
from ..tree import tree_depth


class SharedDrafts:
    """`drafter` with its draft count chosen for the load (module docstring); the drafter itself while the
    request is alone in the engine."""

    def __init__(self, drafter: Drafter, cost: CallCost, sharing: Callable[[], int], clock: Callable[[], float],
                 prior: float = 0.5, weight: float = 0.05, probe_every: int = 8, max_probe_every: int = 64,
                 probe_alpha: float = 0.9) -> None:
        self.drafter, self.cost, self.sharing, self.clock = drafter, cost, sharing, clock
        self.name = drafter.name
        self.alpha, self.weight, self.probe_alpha = prior, weight, probe_alpha
        self.probe_every, self.min_probe_every, self.max_probe_every = probe_every, probe_every, max_probe_every
        self.draft_s = 0.0  # seconds per draft token, a running average
        self.idle = 0
        self.drafted = 0

    def start(self, prompt: list[int], hidden: np.ndarray) -> None:
        self.drafter.start(prompt, hidden)

    def best(self, budget: int, rows: int, alpha: float | None = None) -> int:
        """The draft count with the most expected tokens per second at acceptance `alpha` (None: the running one)."""
        c = self.cost
        a = min(self.alpha if alpha is None else alpha, 0.999)

        def seconds(k: int) -> float:
            padded = c.charges([1] * (rows - 1) + [1 + k])[-1]  # beside the others' one-token rows
            return padded if k == 0 else min(padded, c.call_s(1, 1 + k)) + k * self.draft_s

        return max(range(budget + 1), key=lambda k: expected_tokens(a, k) / seconds(k))

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        rows = self.sharing()
        probe = False
        if rows > 1:
            k = self.best(budget, rows)
            probe = k == 0
            if probe:
                self.idle += 1
                if self.idle <= self.probe_every * rows or self.best(budget, rows, self.probe_alpha) == 0:
                    self.drafted = 0
                    return Draft([])
                # if drafts still do not pay at the next probe, it will have come twice as late
                self.idle, self.probe_every = 0, min(2 * self.probe_every, self.max_probe_every)
            else:
                self.idle, self.probe_every = 0, self.min_probe_every
            budget = max(k, 1)
        t0 = self.clock()
        draft = self.drafter.propose(history, budget, policy, params, rng)
        if rows > 1 and len(draft.tokens) > budget and (draft.parents is None or probe):
            # a tree's first token in topological order is a child of its root: the probe's one-token chain
            cut = draft.hidden[:, :budget + 1] if draft.hidden is not None else None
            draft = Draft(draft.tokens[:budget], draft.qs[:budget] if draft.qs else draft.qs, cut, draft.catchup_s)
        if draft.tokens:
            seconds = max(0.0, self.clock() - t0 - draft.catchup_s) / len(draft.tokens)
            self.draft_s += self.weight * (seconds - self.draft_s)
        # a tree's best branch is judged in order too, as a chain as deep as the tree
        self.drafted = len(draft.tokens) if draft.parents is None else tree_depth(draft.parents) if draft.tokens else 0
        return draft

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        if self.drafted:  # judged in order: `final - 1` accepted, then one rejected if any
            accepted = final - 1
            for _ in range(accepted):
                self.alpha += self.weight * (1.0 - self.alpha)
            if accepted < self.drafted:
                self.alpha -= self.weight * self.alpha
        self.drafted = 0
        self.drafter.advance(hidden, pos, final)
