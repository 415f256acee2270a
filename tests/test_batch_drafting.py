"""The batched scheduler's drafting models (issue 23, point 2): `model` rows draft with the drafter piece and
`self` rows with the adapter on shallow's early exit, batched across rows in cache rows of their own, beside
`ar` and `lookup` rows and `auto` rows that pick per step; every request's tokens are still its AR output."""

from __future__ import annotations

import threading

import pytest
import specexport.runtime.batching.scheduler as scheduler_module
from specexport.runtime import OptionError, load
from specexport.runtime.batching import BatchScheduler
from specexport.runtime.batching.goodput import BatchCost, DraftCost, Offer, plan
from specexport.runtime.decode import ids_array
from specexport.runtime.drafters import ModelDrafter, SelfDrafter
from specexport.runtime.policies import ConfidencePolicy
from specexport.runtime.sampling import SamplingParams

PROMPTS = ["the quick brown fox", "write a haiku about the sea and the quick brown fox jumps over the lazy dog",
           "a hash table maps keys to values a hash table maps keys to", "what is seventeen times twenty three",
           "explain how a hash table works"]
LENGTHS = [40, 17, 33, 25, 30]
MODES = ["model", "self", "auto", "lookup", "ar"]
# the tiny model's verification costs, with drafting calls made cheap enough that the plan drafts most steps
# (its measured drafting calls cost about a whole step, and the plan would draft only to probe)
COST = BatchCost(fixed_s=4e-4, per_row_s=7e-5, per_token_s=2e-5,
                 drafting={"model": DraftCost(2e-5, 1e-5), "self": DraftCost(2e-5, 1e-5)})


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
    with BatchScheduler(session, max_batch=4, cost=COST) as scheduler:
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
    for mode in ("model", "self"):
        accepted = sum(r.stats.accepted for r in requests if r.opts.mode == mode)
        assert accepted > 0, f"no {mode} draft was accepted: its drafting path went untested"
    auto = [r.stats.extra["auto_steps"] for r in requests if r.opts.mode == "auto"]
    assert sum(s["model"] + s["self"] for s in auto) > 0


def test_batched_drafts_are_one_requests_drafts(session, expected, monkeypatch):
    """What a row drafts in a batch, with the caches it keeps across steps (catching up on what other rows'
    steps, rejections and full acceptances left), is what one request's drafter drafts from scratch at the
    same history: the batched drafting calls read exactly the history a Session's would."""
    ids, _ = expected
    seen = []
    real_step = scheduler_module.step

    def recording(pieces, rows):
        seen.extend((r.source, r.limit, r.policy.eta, list(r.history), list(r.draft.tokens)) for r in rows
                    if r.source in ("model", "self"))
        return real_step(pieces, rows)

    monkeypatch.setattr(scheduler_module, "step", recording)
    with BatchScheduler(session, max_batch=3, cost=COST) as scheduler:
        # eta 0: no early stop, so that rows draft whole chains up to the plan's limit
        requests = [scheduler.submit(ids[i], mode=mode, max_new_tokens=24, eta=0.0)
                    for i, mode in [(0, "model"), (1, "self"), (2, "auto"), (3, "model"), (4, "self")]]
        for r in requests:
            r.result()
    assert {s[0] for s in seen} == {"model", "self"}
    assert {s[0] for s in seen if len(s[4]) > 1} == {"model", "self"}, "no chain of drafts was tested"
    greedy, p = SamplingParams(), session.pieces
    for source, limit, eta, history, drafts in seen:
        if source == "model":
            drafter = ModelDrafter(p)
            drafter.start(history, None)
        else:  # the adapter starts from the shallow states of every final position, as after a prefill
            drafter = SelfDrafter(p)
            drafter.start(history, p.shallow.run(ids_array(history[:-1]), 0)["hidden"])
        alone = drafter.propose(history, limit, ConfidencePolicy(limit, eta), greedy, None)
        assert alone.tokens == drafts, (source, len(history))


def test_sampling_is_reproducible_per_seed(session, expected):
    """Sampled requests of every drafting mode, admitted together: the same seeds give the same tokens in a
    new scheduler, another seed other tokens."""
    ids, _ = expected

    def run(seed: int) -> list[list[int]]:
        with BatchScheduler(session, max_batch=4, cost=COST) as scheduler:
            with scheduler._wake:  # admitted in one go, so that both runs take the same steps
                requests = [scheduler.submit(ids[i], mode=mode, max_new_tokens=20, temperature=0.8, seed=seed + i)
                            for i, mode in enumerate(["model", "self", "auto", "lookup"])]
            return [r.result() for r in requests]

    first = run(1)
    assert run(1) == first
    assert run(2) != first


def test_a_cancelled_model_request_frees_its_row(session, expected):
    """One cache row: a model request cancelled mid-flight gives it to the next model request, whose drafter
    cache row starts over (its tokens are its AR output)."""
    ids, reference = expected
    with BatchScheduler(session, max_batch=1, cost=COST) as scheduler:
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
    with BatchScheduler(session, max_batch=3, cost=COST) as scheduler:
        requests = [scheduler.submit(long, mode=mode, max_new_tokens=100, eta=0.0)
                    for mode in ("model", "self", "auto")]
        for request in requests:
            assert request.result() == want and len(want) == 256 - 230, request.opts.mode


def test_modes_the_scheduler_does_not_run_are_refused(session, tiny_bundles):
    with BatchScheduler(session, max_batch=1, cost=COST) as scheduler:
        with pytest.raises(OptionError, match="mode hier does not run batched"):
            scheduler.submit([5, 6], mode="hier")
    with BatchScheduler(load(tiny_bundles("standard")), max_batch=1, cost=COST) as scheduler:  # no drafting piece
        with pytest.raises(OptionError, match="no drafter piece, so mode model"):
            scheduler.submit([5, 6], mode="model")
        with pytest.raises(OptionError, match="no adapter piece, so mode self"):
            scheduler.submit([5, 6], mode="self")


def test_the_plan_weighs_drafting_calls():
    verify = dict(fixed_s=1.0, per_row_s=0.0, per_token_s=0.01)
    cheap = BatchCost(**verify, drafting={"model": DraftCost(0.001, 0.001)})
    dear = BatchCost(**verify, drafting={"model": DraftCost(1.0, 0.1)})
    model = [Offer("model", 3, 0.8)]
    assert plan([model], cheap) == [(model[0], 3)]  # cheap, likely accepted: draft the most
    assert plan([model], dear) == [None]  # a drafting call costs a step: not worth 0.8 of a token
    lookup = [Offer("lookup", 3, 0.8)]
    # free lookup drafts are taken beside a row whose model drafts are too dear
    assert plan([lookup, model], dear) == [(lookup[0], 3), None]
    # an auto row offering both takes the free one when they promise alike
    both = [Offer("lookup", 3, 0.8), Offer("model", 3, 0.8)]
    assert plan([both], cheap) == [(both[0], 3)]
    # a seldom-accepted model row drafts less than a well-accepted one beside it
    weak, strong = [Offer("model", 3, 0.2)], [Offer("model", 3, 0.9)]
    mixed = plan([weak, strong], BatchCost(**verify, drafting={"model": DraftCost(0.02, 0.05)}))
    assert (mixed[0][1] if mixed[0] else 0) < mixed[1][1]
