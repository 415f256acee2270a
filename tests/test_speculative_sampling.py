"""Speculative sampling reproduces the target's distribution (Leviathan et al.), tested statistically.

Stated tests: Pearson chi-square goodness of fit (known p) and chi-square test of homogeneity
(speculative vs autoregressive samples), each rejecting at alpha = 0.001 with fixed seeds."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy import stats as sps
from specexport.runtime import load
from specexport.runtime.sampling import SamplingParams, sample
from specexport.runtime.speculative import verify

ALPHA = 1e-3
PARAMS = SamplingParams(temperature=1.0)


@pytest.mark.parametrize("q", [
    [0.25, 0.25, 0.25, 0.25],  # flat draft
    [0.7, 0.1, 0.1, 0.1],  # overconfident on a token the target dislikes
    [0.0, 0.5, 0.5, 0.0],  # draft misses tokens the target wants
])
def test_first_token_follows_target_for_toy_pair(q):
    p = np.array([0.1, 0.2, 0.3, 0.4])
    q = np.array(q)
    logits = np.log(np.stack([p, p]))  # the target's view before and after the draft
    rng = np.random.default_rng(2024)
    n = 40_000
    first = [verify([sample(q, rng)], [q], logits, PARAMS, rng)[0] for _ in range(n)]
    counts = np.bincount(first, minlength=4)
    assert sps.chisquare(counts, p * n).pvalue > ALPHA
    # acceptance rate matches alpha = sum(min(p, q)) within 4 standard errors
    accepted = 0
    for _ in range(10_000):
        d = sample(q, rng)
        accepted += len(verify([d], [q], logits, PARAMS, rng)) == 2
    alpha = np.minimum(p, q).sum()
    assert abs(accepted / 10_000 - alpha) < 4 * np.sqrt(alpha * (1 - alpha) / 10_000)


def test_tiny_model_speculative_sampling_matches_ar_in_distribution(tiny_bundles):
    session = load(tiny_bundles("ort", 2, adapter="untrained"))
    ids = session.prompt_ids("the quick brown fox", session.options())
    n = 1500

    def pairs(mode: str, seed0: int) -> Counter:
        c = Counter()
        for seed in range(seed0, seed0 + n):
            toks = session.generate_ids(ids, max_new_tokens=3, mode=mode, temperature=0.2, seed=seed,
                                        gamma=3, eta=0.0).tokens
            c[tuple(toks[1:3])] += 1  # tokens 2-3 come from speculative steps in mode "self"
        return c

    ar, spec = pairs("ar", 0), pairs("self", 100_000)
    common = [k for k in set(ar) | set(spec) if ar[k] + spec[k] >= 20]
    table = np.array([[ar[k] for k in common] + [n - sum(ar[k] for k in common)],
                      [spec[k] for k in common] + [n - sum(spec[k] for k in common)]])
    table = table[:, table.sum(0) > 0]
    assert table.shape[1] >= 5, "the test needs a spread-out distribution"
    assert sps.chi2_contingency(table).pvalue > ALPHA
