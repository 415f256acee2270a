"""Speculative sampling follows the target's distribution in every mode that samples: auto, PEARL with the
drafter piece, top-k and top-p, a vocabulary-pruned draft head; and the bonus token after a full acceptance
is drawn from the target's last row.

Stated test (the model runs): the randomized probability integral transform. For each of DRAWS fixed-seed
generations of NEW_TOKENS tokens, every emitted token x at context c becomes u = F_c(x-) + V p_c(x), V ~
U(0, 1), where p_c is the target's sampling distribution at c (temperature, top-k, top-p applied; computed
by one target call over the whole output) and F_c its CDF in a fixed order of the vocabulary that depends
on c only. When every token follows p_c, the u are i.i.d. U(0, 1) (Rosenblatt), whatever the order. Two
orders, each tested by a one-sample Kolmogorov-Smirnov test against U(0, 1) at ALPHA / 2 (Bonferroni):
the target's own probabilities (catches a wrong temperature, top-k or top-p), and the drafter's q_c /
p_c (a broken verification leans towards what the drafter proposes, which puts its excess at small u).
With ~4,800 u per run the test rejects the classic bug of resampling from p instead of the residual
norm(max(0, p - q)) at p < 1e-10 (test_the_test_catches_a_biased_verification), where the chi-square of
AR against speculative pairs (tests/test_drafters.py) has no power. Every speculative run must also
have drafts both accepted and rejected (runtime/stats.py), so both branches of the rule were exercised.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps
from specexport.runtime import load
from specexport.runtime.decode import ids_array, target_step
from specexport.runtime.drafters import ModelDrafter
from specexport.runtime.policies import FixedPolicy
from specexport.runtime.sampling import SamplingParams, probabilities, sample
from specexport.runtime.speculative import speculative, verify
from specexport.runtime.stats import Stats

from .test_drafters import PrunedHead
from .test_speculative_sampling import ALPHA

DRAWS = 300  # generations per run, each with its own seed
NEW_TOKENS = 16
PROMPT = "hash table"


@pytest.fixture(scope="module")
def bundle(drafting_bundles) -> Path:
    """The tiny target with an untrained adapter and a drafter piece that agrees with it about half the
    time (the target with 1% weight noise; conftest's, shared with tests/test_drafters.py)."""
    return drafting_bundles("ort")


@pytest.fixture(scope="module")
def session(bundle):
    return load(bundle, threads=1)


def _spread(rows: np.ndarray, vocab: np.ndarray | None, size: int) -> np.ndarray:
    """A (pruned) head's distributions over all ids, as runtime/drafters.choose spreads them."""
    return rows if vocab is None else np.stack([np.bincount(vocab, weights=r, minlength=size) for r in rows])


def draft_rows(pieces, seq: list[int], n: int, params: SamplingParams, drafters: tuple[str, ...]) -> np.ndarray:
    """The mean draft distribution of `drafters` ('self', 'model') at the last n positions of `seq`."""
    rows = []
    if "model" in drafters:
        logits = pieces.drafter.run(ids_array(seq), 0, keep=n)["logits"][0]
        rows.append(_spread(probabilities(logits, params), pieces.drafter_vocab, pieces.vocab_size))
    if "self" in drafters:
        hidden = pieces.shallow.run(ids_array(seq), 0)["hidden"]
        logits = pieces.adapter.run(hidden, 0, keep=n)["logits"][0]
        rows.append(_spread(probabilities(logits, params), pieces.draft_vocab, pieces.vocab_size))
    return np.mean(rows, axis=0)


def pit(pieces, prompt: list[int], tokens: list[int], params: SamplingParams, drafters: tuple[str, ...],
        rng: np.random.Generator, eos: int | None) -> dict[str, np.ndarray]:
    """The randomized PIT values of one output (an EOS that ended it included), in both orders."""
    tokens = [*tokens, eos] if eos is not None else list(tokens)
    seq, n = prompt + tokens[:-1], len(tokens)
    p = probabilities(target_step(pieces, seq, 0, keep=n)[1][0], params)
    x = np.asarray(tokens)
    px = p[np.arange(n), x]
    assert np.all(px > 0), "a token the target's sampler cannot emit (outside its top-k / top-p) came out"
    q = draft_rows(pieces, seq, n, params, drafters)
    out = {}
    v = rng.random(n)
    for name, score in (("p", p), ("q/p", np.where(p > 0, q / np.maximum(p, 1e-300), -1.0))):
        ids = np.broadcast_to(np.arange(p.shape[1]), p.shape)
        order = np.lexsort((ids, -score), axis=-1)  # descending score, ties by id: fixed given the context
        ranked = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(ranked, axis=-1) - ranked  # mass ahead of each ranked token
        where = np.argmax(order == x[:, None], axis=-1)
        out[name] = before[np.arange(n), where] + v * px
    return out


def pit_pvalues(us: dict[str, list[float]]) -> dict[str, float]:
    return {name: sps.kstest(values, "uniform").pvalue for name, values in us.items()}


def sample_runs(session, params: SamplingParams, drafters: tuple[str, ...], seed0: int = 1000,
                **how) -> tuple[dict[str, float], Counter, list[list[int]]]:
    """DRAWS generations of NEW_TOKENS through the session; (PIT p-values, summed stats, outputs)."""
    prompt = session.prompt_ids(PROMPT, session.options())
    eos = next(iter(session.codec.eos_ids))
    rng = np.random.default_rng(7)
    us: dict[str, list[float]] = {"p": [], "q/p": []}
    total, outputs = Counter(), []
    for seed in range(seed0, seed0 + DRAWS):
        out = session.generate_ids(prompt, max_new_tokens=NEW_TOKENS, temperature=params.temperature,
                                   top_k=params.top_k, top_p=params.top_p, seed=seed, **how)
        s = out.stats
        total.update(drafted=s.drafted, accepted=s.accepted, **s.extra.get("auto_steps", {}))
        outputs.append(out.tokens)
        for name, values in pit(session.pieces, prompt, out.tokens, params, drafters, rng,
                                eos if out.finish_reason == "eos" else None).items():
            us[name].extend(values)
        assert not out.lossy
    return pit_pvalues(us), total, outputs


def assert_lossless(pvalues: dict[str, float], total: Counter, speculative_run: bool = True) -> None:
    assert min(pvalues.values()) > ALPHA / 2, pvalues
    if speculative_run:
        assert 0 < total["accepted"] < total["drafted"], total  # drafts both accepted and rejected


# -- the bonus token ---------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_k=3), SamplingParams(1.0, top_p=0.6)])
def test_bonus_token_follows_the_targets_last_row(params):
    """Two drafts from q = the target's own rows are always accepted; the bonus must then follow the
    target's third row (its view after both drafts), not a draft row. Chi-square goodness of fit."""
    rows = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.05, 0.15, 0.5, 0.3]]))
    p = probabilities(rows, params)
    rng = np.random.default_rng(11)
    n = 10_000
    bonus = np.zeros(4, dtype=int)
    for _ in range(n):
        drafts = [sample(p[0], rng), sample(p[1], rng)]
        out = verify(drafts, [p[0], p[1]], rows, params, rng)
        assert out[:2] == drafts and len(out) == 3
        bonus[out[2]] += 1
    keep = p[2] > 0
    assert bonus[~keep].sum() == 0  # never a token the sampler cut
    assert sps.chisquare(bonus[keep], p[2][keep] * n).pvalue > ALPHA
    # the same test rejects a bonus drawn from the last draft's row
    wrong = (p[1][keep] + 1e-3) / (p[1][keep] + 1e-3).sum()
    assert sps.chisquare(bonus[keep], wrong * n).pvalue < ALPHA


def test_bonus_token_after_a_full_acceptance_with_a_disagreeing_draft():
    """q differs from p, so drafts are accepted and rejected; the bonus of the steps that accepted both
    drafts follows the target's last row (conditioning on acceptance must not tilt it)."""
    params = SamplingParams(1.0)
    rows = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.6, 0.1, 0.1, 0.2]]))
    q = [np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.7, 0.1, 0.1, 0.1])]
    rng = np.random.default_rng(12)
    bonus, lengths = np.zeros(4, dtype=int), Counter()
    for _ in range(40_000):
        out = verify([sample(q[0], rng), sample(q[1], rng)], q, rows, params, rng)
        lengths[len(out)] += 1
        if len(out) == 3:
            bonus[out[2]] += 1
    assert lengths[1] > 0 and lengths[2] > 0 and lengths[3] > 5_000, lengths
    assert sps.chisquare(bonus, np.exp(rows[2]) * bonus.sum()).pvalue > ALPHA


# -- the statistic itself --------------------------------------------------------------------------------


def biased_runs(session, rule) -> dict[str, float]:
    """DRAWS generations of the sequential loop with the drafter piece and a given verification rule."""
    params = SamplingParams(0.8)
    prompt = session.prompt_ids(PROMPT, session.options())
    eos = next(iter(session.codec.eos_ids))
    rng_pit = np.random.default_rng(7)
    us: dict[str, list[float]] = {"p": [], "q/p": []}
    for seed in range(DRAWS):
        loop = speculative(session.pieces, ModelDrafter(session.pieces), FixedPolicy(3), prompt, params,
                           np.random.default_rng(seed), Stats(), session.bundle.max_context,
                           accept=partial(verify, rule=rule))
        tokens: list[int] = []
        for new in loop:
            tokens += new
            if len(tokens) >= NEW_TOKENS or eos in tokens:
                break
        loop.close()
        tokens = tokens[:NEW_TOKENS]
        ended = eos in tokens
        tokens = tokens[:tokens.index(eos)] if ended else tokens
        for name, values in pit(session.pieces, prompt, tokens, params, ("model",), rng_pit,
                                eos if ended else None).items():
            us[name].extend(values)
    return pit_pvalues(us)


def test_the_test_catches_a_biased_verification(session):
    """The PIT test has power where it matters: the rule with one classic bug (after a rejection, draw from
    the target's p instead of the residual max(0, p - q)) fails it (the right rule passes the same statistic
    in every test below)."""
    def resample_from_p(draft, q, logits, params, rng):
        p = probabilities(logits, params)
        return None if rng.random() * q[draft] < p[draft] else sample(p, rng)

    assert biased_runs(session, resample_from_p)["q/p"] < 1e-6


# -- every sampling mode against the target ----------------------------------------------------------------


def test_ar_control(session):
    """AR draws through the same statistic (no drafts): the target rows the PIT uses are AR's."""
    pvalues, _, _ = sample_runs(session, SamplingParams(0.8), ("self", "model"), mode="ar")
    assert_lossless(pvalues, Counter(), speculative_run=False)


def test_auto_sampling_follows_the_target(session):
    pvalues, total, _ = sample_runs(session, SamplingParams(0.8), ("self", "model"), mode="auto")
    assert_lossless(pvalues, total)
    assert total["self"] > 0 and total["model"] > 0, total  # auto really switched between drafters


def test_pearl_with_the_drafter_piece_follows_the_target(bundle):
    session = load(bundle, threads=1)  # PEARL: a pool per piece (the module's session is not shared anyway)
    pvalues, total, _ = sample_runs(session, SamplingParams(0.8), ("model",), mode="model", schedule="pearl",
                                    policy="fixed:3")
    last = session.generate(PROMPT, max_new_tokens=8, temperature=0.8, mode="model", schedule="pearl",
                            policy="fixed:3").stats
    assert last.extra["schedule"] == "pearl" and last.mode == "model, pearl"
    assert_lossless(pvalues, total)


@pytest.mark.parametrize(("mode", "params"), [
    ("self", SamplingParams(1.0, top_k=8)),
    ("model", SamplingParams(0.9, top_p=0.7)),
    ("auto", SamplingParams(0.7, top_k=20, top_p=0.9)),
])
def test_top_k_and_top_p_follow_the_target(session, mode, params):
    drafters = ("self", "model") if mode == "auto" else (mode,)
    pvalues, total, _ = sample_runs(session, params, drafters, mode=mode, gamma=3, eta=0.0)
    assert_lossless(pvalues, total)


def test_pruned_draft_vocabulary_follows_the_target(bundle):
    """FR-Spec: the drafter's head covers every third id only (a stand-in for a pruned drafter piece); the
    target verifies over the full vocabulary, so ids outside the head still come out, at their rate."""
    session = load(bundle, threads=1)
    vocab = np.arange(0, session.pieces.vocab_size, 3)
    session.pieces.drafter, session.pieces.drafter_vocab = PrunedHead(session.pieces.drafter, vocab), vocab
    pvalues, total, outputs = sample_runs(session, SamplingParams(0.8), ("model",), mode="model", gamma=3, eta=0.0)
    assert_lossless(pvalues, total)
    emitted = np.concatenate([np.asarray(t, dtype=np.int64) for t in outputs])
    outside = ~np.isin(emitted, vocab)
    assert 0.2 < outside.mean() < 0.9, outside.mean()  # most of the target's mass lies outside the head
