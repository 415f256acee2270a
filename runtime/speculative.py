"""Kangaroo self-speculative decoding: draft with shallow + adapter, verify with one deep call.

State between steps: `pos` tokens are final and in every cache; `token` is final and in none yet.
A step drafts from `token` until the adapter's confidence drops below eta or gamma drafts exist,
runs the shallow layers on every drafted token as it goes (their h_l is stacked for `deep`, so the
shallow layers never run twice on a token), verifies all of them with one deep call, and keeps the
accepted prefix plus the target's own next token. Caches are rolled back by moving `pos`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from .decode import Pieces, ids_array, prefill
from .sampling import SamplingParams, pick, probabilities, sample
from .stats import Stats


def draft(pieces: Pieces, token: int, pos: int, pending: np.ndarray, gamma: int, eta: float,
          params: SamplingParams, rng: np.random.Generator):
    """Returns (drafts, their draft distributions or None when greedy, stacked h_l of token + drafts).

    `pending` holds h_l of positions the adapter has not seen yet (the prompt after a prefill, the
    last draft after a fully accepted step); they go into the adapter's first call of this step."""
    drafts, qs, hs = [], [], []
    x, stop = token, False
    while True:
        p = pos + len(hs)
        hs.append(pieces.shallow.run(ids_array([x]), p)["hidden"])
        if stop or len(drafts) == gamma:
            break
        h_in = np.concatenate([pending, hs[-1]], axis=1) if pending.shape[1] else hs[-1]
        out = pieces.adapter.run(h_in, p - pending.shape[1])
        pending = pending[:, :0]
        if params.greedy:
            x, confidence = int(out["top_token"][0, -1]), float(out["top_prob"][0, -1])
        else:
            q = probabilities(out["logits"][0, -1], params)
            if pieces.draft_vocab is not None:  # a pruned head's distribution, spread back over all ids
                q = np.bincount(pieces.draft_vocab, weights=q, minlength=pieces.vocab_size)
            x, confidence = sample(q, rng), float(q.max())
            qs.append(q)
        drafts.append(x)
        stop = confidence < eta
    return drafts, (qs if qs else None), np.concatenate(hs, axis=1)


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


def self_speculative(pieces: Pieces, prompt: list[int], params: SamplingParams, rng: np.random.Generator,
                     stats: Stats, gamma: int, eta: float, max_context: int) -> Iterator[list[int]]:
    stats.mode = "self"
    pending, logits = prefill(pieces, prompt, stats)
    pos, token = len(prompt), pick(logits[0, -1], params, rng)
    yield [token]
    while True:
        t0 = time.perf_counter()
        room = max_context - pos - 1  # the last draft's shallow state needs a slot too
        drafts, qs, hs = draft(pieces, token, pos, pending, min(gamma, room), eta, params, rng)
        t1 = time.perf_counter()
        logits = pieces.deep.run(hs, pos, keep=hs.shape[1])["logits"][0]
        new = verify(drafts, qs, logits, params, rng)
        t2 = time.perf_counter()
        # a fully accepted step leaves the last draft's h_l unseen by the adapter: hand it on
        pending = hs[:, len(drafts):] if len(new) > len(drafts) else hs[:, :0]
        stats.steps += 1
        stats.drafted += len(drafts)
        stats.accepted += len(new) - 1
        stats.draft_s += t1 - t0
        stats.verify_s += t2 - t1
        pos, token = pos + len(new), new[-1]
        yield new
