"""The batched scheduler runs every mode a Session runs (runtime/engine/calls.py): the drafter piece's chains
and trees, the adapter's early exit, hier, the draft-length policies and auto, each request in cache rows of
its own beside the others, its calls merged with theirs; every request's tokens are still its AR output."""

from __future__ import annotations

import threading

import pytest
from specexport.runtime import OptionError, load
from specexport.runtime.batching import BatchScheduler

from .batch_calls import PINNED_COST, deep_calls, shared_drafts

PROMPTS = ["the quick brown fox", "write a haiku about the sea and the quick brown fox jumps over the lazy dog",
           "a hash table maps keys to values a hash table maps keys to", "what is seventeen times twenty three",
           "explain how a hash table works"]
LENGTHS = [40, 17, 33, 25, 30]
MODES = ["model", "self", "auto", "lookup", "ar", "hier"]


@pytest.fixture(scope="module")
def session(drafting_bundle):
    return load(drafting_bundle)


@pytest.fixture(scope="module")
def expected(session):
    ids = [session.prompt_ids(p, session.options()) for p in PROMPTS]
    return ids, [session.generate_ids(i, mode="ar", max_new_tokens=max(LENGTHS)).tokens for i in ids]


def test_mixed_modes_joining_and_leaving_equal_ar(session, expected):
    """Every mode on every prompt, more requests than rows, submitted from threads at staggered moments so
    that rows join and leave mid-flight: each request's tokens are its AR output from a plain Session."""
    ids, reference = expected
    jobs = [(i, mode) for i in range(len(PROMPTS)) for mode in MODES]
    requests: list = [None] * len(jobs)
    under_way = [threading.Event() for _ in jobs]
    with BatchScheduler(session, max_batch=4, cost=PINNED_COST) as scheduler, deep_calls(scheduler) as calls:
        def client(j: int) -> None:
            i, mode = jobs[j]
            if j >= 3:  # three at once, then each once the one three before it has its first tokens
                under_way[j - 3].wait()
            try:
                requests[j] = scheduler.submit(ids[i], mode=mode, max_new_tokens=LENGTHS[i])
                chunks = iter(requests[j])
                next(chunks)
            finally:
                under_way[j].set()
            for _ in chunks:
                pass

        threads = [threading.Thread(target=client, args=(j,)) for j in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for (i, mode), request in zip(jobs, requests, strict=True):
        assert request.tokens == reference[i][:LENGTHS[i]], (PROMPTS[i], mode)
        assert request.finish_reason == "length"
    for mode in ("model", "self", "hier"):
        accepted = sum(r.stats.accepted for r in requests if r.opts.mode == mode)
        assert accepted > 0, f"no {mode} draft was accepted: its drafting path went untested"
    auto = [r.stats.extra["auto_steps"] for r in requests if r.opts.mode == "auto"]
    assert sum(n for s in auto for source, n in s.items() if source not in ("ar", "lookup")) > 0
    assert shared_drafts(calls) > 0, "no draft was verified in a call other requests shared"


def test_trees_policies_and_relaxed_rules_run_batched(session, expected):
    """Token trees (their accepted branches' cache slots moved within each request's row), the goodput and
    fixed policies and specdec verification, side by side with chains: greedy exact ones equal AR; specdec is
    the Session's own relaxed output for the same request."""
    ids, reference = expected
    jobs = [(0, {"mode": "model", "tree": "6:3:2"}), (1, {"mode": "model", "tree": "4:2:2:4"}),
            (2, {"mode": "self", "policy": "goodput"}), (3, {"mode": "model", "policy": "fixed:3"}),
            (4, {"mode": "lookup", "verify": "specdec"})]
    with BatchScheduler(session, max_batch=5, cost=PINNED_COST) as scheduler, deep_calls(scheduler) as calls:
        with scheduler._wake:  # admitted together, so that their calls meet
            requests = [scheduler.submit(ids[i], max_new_tokens=LENGTHS[i], **o) for i, o in jobs]
        for r in requests:
            r.result()
        assert scheduler.counts.max_rows > 1, "no verification call ran several requests"
    assert shared_drafts(calls, tree=True) > 0, "no token tree was verified in a call other requests shared"
    for (i, overrides), request in zip(jobs, requests, strict=True):
        if "verify" in overrides:
            alone = session.generate_ids(ids[i], max_new_tokens=LENGTHS[i], **overrides)
            assert request.tokens == alone.tokens and request.stats.lossy
        else:
            assert request.tokens == reference[i][:LENGTHS[i]], overrides
    assert sum(r.stats.accepted for r in requests[:2]) > 0, "no tree draft was accepted"


def test_sampling_alone_in_the_engine_is_the_sessions_per_seed(session, expected):
    """A sampled request alone in the engine draws as it does in a Session: the same seed, the same tokens, in
    every drafting mode. (Sharing, its draft counts follow the load, so which draws it makes depends on timing;
    its distribution is the target's either way.)"""
    ids, _ = expected
    with BatchScheduler(session, max_batch=1) as scheduler:
        for i, mode in enumerate(["model", "self", "hier", "lookup"]):
            options = dict(mode=mode, max_new_tokens=20, temperature=0.8, seed=3 + i)
            alone = session.generate_ids(ids[i], **options).tokens
            assert scheduler.submit(ids[i], **options).result() == alone, mode
            assert scheduler.submit(ids[i], **{**options, "seed": 99}).result() != alone, mode


def test_a_cancelled_model_request_frees_its_row(session, expected):
    """One cache row: a model request cancelled mid-flight gives it to the next model request, whose drafter
    cache row starts over (its tokens are its AR output)."""
    ids, reference = expected
    with BatchScheduler(session, max_batch=1, cost=PINNED_COST) as scheduler:
        first = scheduler.submit(ids[0], mode="model", max_new_tokens=200)
        next(iter(first))
        first.cancel()
        second = scheduler.submit(ids[2], mode="model", max_new_tokens=30)
        assert second.result() == reference[2][:30]
        assert second.stats.accepted > 0
        first.result()
        assert first.finish_reason == "cancelled" and len(first.tokens) < 200


def test_drafting_rows_at_the_context_end_equal_ar(session):
    """Prompts near the context (256): a drafting model's chain and its catch-up never run past it."""
    long = session.codec.encode(" ".join(["a hash table maps keys to values"] * 40))[:230]
    want = session.generate_ids(long, mode="ar", max_new_tokens=100).tokens
    with BatchScheduler(session, max_batch=3) as scheduler:
        requests = [scheduler.submit(long, mode=mode, max_new_tokens=100, eta=0.0)
                    for mode in ("model", "self", "auto")]
        for request in requests:
            assert request.result() == want and len(want) == 256 - 230, request.opts.mode


def test_modes_without_their_piece_are_refused(tiny_bundles):
    with BatchScheduler(load(tiny_bundles("standard")), max_batch=1) as scheduler:  # no drafting piece
        with pytest.raises(OptionError, match="no drafter piece, so mode model"):
            scheduler.submit([5, 6], mode="model")
        with pytest.raises(OptionError, match="no adapter piece, so mode self"):
            scheduler.submit([5, 6], mode="self")
