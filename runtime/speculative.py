"""The draft-then-verify loop, for every drafter (runtime/drafters.py) and draft-length policy
(runtime/policies.py).

State between steps: `history` holds the final tokens; all but the last are in every target cache.
A step drafts from the last one (at most the policy's budget), verifies all drafts with one `deep`
call over their shallow states (the self-drafter made them while drafting, so the shallow layers
never run twice on a token; for other drafters one shallow call makes them), and keeps the accepted
prefix plus the target's own next token. Caches are rolled back by moving the position: nothing is
copied or cleared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from .decode import Pieces, ids_array, prefill
from .drafters import Draft, Drafter
from .policies import DraftPolicy
from .sampling import SamplingParams, pick, probabilities, sample
from .stats import Stats


def verify(drafts: list[int], qs: list[np.ndarray] | None, logits: np.ndarray, params: SamplingParams,
           rng: np.random.Generator) -> list[int]:
    """Accepted drafts + the target's next token. logits[i] is the target's view after drafts[:i].

    Greedy: the longest prefix equal to the target's argmax. Sampling (Leviathan et al.): accept x ~ q
    with probability min(1, p(x)/q(x)); at the first rejection draw from norm(max(0, p - q)); after a
    full acceptance draw the bonus token from p. Both give exactly the target's distribution."""
    out = []
    for i, d in enumerate(drafts):
        if params.greedy:
            target = int(np.argmax(logits[i]))
            if d != target:
                return [*out, target]
        else:
            p, q = probabilities(logits[i], params), qs[i]
            if rng.random() * q[d] >= p[d]:  # reject with probability 1 - min(1, p/q)
                residual = np.maximum(p - q, 0.0)
                return [*out, sample(residual / residual.sum(), rng)]
        out.append(d)
    return [*out, pick(logits[len(drafts)], params, rng)]


def speculative(pieces: Pieces, drafter: Drafter, policy: DraftPolicy, prompt: list[int], params: SamplingParams,
                rng: np.random.Generator, stats: Stats, max_context: int,
                accept: Callable = verify) -> Iterator[list[int]]:
    """Draft, verify with one deep call, keep what the target accepts; yields the new final tokens."""
    hidden, logits = prefill(pieces, prompt, stats)
    drafter.start(prompt, hidden)
    history = [*prompt, pick(logits[0, -1], params, rng)]
    yield history[-1:]
    while True:
        pos = len(history) - 1  # history[-1] is final but in no cache yet
        t0 = time.perf_counter()
        budget = min(policy.budget(), max_context - pos - 1)  # every draft needs a cache slot
        draft = drafter.propose(history, budget, policy, params, rng) if budget > 0 else Draft([])
        t1 = time.perf_counter()
        hidden = draft.hidden
        if hidden is None:
            hidden = pieces.shallow.run(ids_array([history[-1], *draft.tokens]), pos)["hidden"]
        logits = pieces.deep.run(hidden, pos, keep=hidden.shape[1])["logits"][0]
        new = accept(draft.tokens, draft.qs, logits, params, rng)
        t2 = time.perf_counter()
        drafter.advance(hidden, pos, len(new))
        policy.observe(len(draft.tokens), len(new) - 1, t1 - t0, t2 - t1)
        stats.record_step(len(draft.tokens), len(new) - 1, t1 - t0, t2 - t1)
        history.extend(new)
        yield new
