"""The batched scheduler (runtime/batching) on the tiny random Llama: a batched call's rows are one-row calls'
bit for bit, and every request's tokens are its AR output whatever runs beside it and whenever it arrives."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specexport.runtime import OptionError, SpecExportError, load
from specexport.runtime.batching import BatchScheduler
from specexport.runtime.batching.order import AdmissionQueue
from specexport.runtime.decode import ids_array

from .batch_calls import PINNED_COST, deep_calls, shared_drafts

# prompts of different lengths; the repetitive ones give prompt lookup drafts the tiny model accepts
PROMPTS = ["the quick brown fox", "write a haiku about the sea and the quick brown fox jumps over the lazy dog",
           "a hash table maps keys to values a hash table maps keys to", "what is seventeen times twenty three"]
LENGTHS = [40, 17, 33, 25]


@pytest.fixture(scope="module")
def session(tiny_bundles):
    return load(tiny_bundles("standard"))


@pytest.fixture(scope="module")
def expected(session):
    """Each prompt's ids and the bundle's own AR output for it (one request at a time)."""
    ids = [session.prompt_ids(p, session.options()) for p in PROMPTS]
    return ids, [session.generate_ids(i, mode="ar", max_new_tokens=max(LENGTHS)).tokens for i in ids]


def test_one_engine_and_one_piece_wrapper_for_one_sequence_or_many(session, expected):
    """A Session is the engine with one cache row, whose sequence calls the pieces themselves; a scheduler on it is
    the same engine with a row per request: the same piece wrapper (so the same manifest I/O check) on the same
    ONNX Runtime sessions, its cache rows its own."""
    from specexport.runtime.backends.ort import OrtPiece

    def unwrapped(piece):
        return getattr(piece, "piece", piece)  # the one-row padding, where this machine needs it

    assert session.engine.rows == 1 and session.pieces.shallow is session.engine.pieces["shallow"]
    with BatchScheduler(session, max_batch=3) as scheduler:
        assert scheduler.engine.rows == 3 and scheduler.one_row_calls == session.one_row_calls
        for name, piece in scheduler.engine.pieces.named().items():
            mine, theirs = unwrapped(piece), unwrapped(session.engine.pieces[name])
            assert type(mine) is OrtPiece and type(theirs) is OrtPiece, name
            assert mine.session is theirs.session and (mine.rows, theirs.rows) == (3, 1), name
        ids, reference = expected
        requests = [scheduler.submit(i, mode="lookup", max_new_tokens=12) for i in ids[:3]]
        assert [r.result() for r in requests] == [r[:12] for r in reference[:3]]


def test_batched_rows_are_one_row_calls_bit_for_bit(session):
    """Rows at different positions, with different numbers of real tokens, in one call: each row's hidden
    states and logits equal a one-row call's exactly (what makes batching lossless)."""
    with BatchScheduler(session, max_batch=3) as scheduler:
        batched, single = scheduler.pieces, session.pieces
        rng = np.random.default_rng(0)
        prompts = [rng.integers(3, 200, size=n).tolist() for n in (9, 30, 17)]
        steps = [rng.integers(3, 200, size=n).tolist() for n in (4, 1, 3)]  # padded to 4 in the batch
        want = []
        for row, (prompt, new) in enumerate(zip(prompts, steps, strict=True)):
            hidden = single.shallow.run(ids_array(prompt), 0)["hidden"]
            single.deep.run(hidden, 0)
            h = single.shallow.run(ids_array(new), len(prompt))["hidden"]
            want.append((h[0], single.deep.run(h, len(prompt), keep=len(new))["logits"][0]))
            hidden = batched.shallow.run_rows(ids_array(prompt), [row], [0])["hidden"]
            batched.deep.run_rows(hidden, [row], [0])
        ids = np.array([new + new[-1:] * (4 - len(new)) for new in steps])
        starts = [len(p) for p in prompts]
        h = batched.shallow.run_rows(ids, [0, 1, 2], starts)["hidden"]
        logits = batched.deep.run_rows(h, [0, 1, 2], starts, keep=4)["logits"]
        for row, (hidden, want_logits) in enumerate(want):
            n = len(steps[row])
            assert np.array_equal(h[row, :n], hidden)
            assert np.array_equal(logits[row, :n], want_logits)


def test_concurrent_requests_equal_ar(session, expected):
    """AR and lookup requests of different lengths, more than the rows, submitted at once from threads."""
    ids, reference = expected
    with BatchScheduler(session, max_batch=3, cost=PINNED_COST) as scheduler, deep_calls(scheduler) as calls:
        jobs = [(i, mode, n) for i, n in enumerate(LENGTHS) for mode in ("ar", "lookup")]
        requests = [None] * len(jobs)

        def client(j: int) -> None:
            i, mode, n = jobs[j]
            requests[j] = scheduler.submit(ids[i], mode=mode, max_new_tokens=n)
            requests[j].result()

        threads = [threading.Thread(target=client, args=(j,)) for j in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for (i, mode, n), request in zip(jobs, requests, strict=True):
        assert request.tokens == reference[i][:n], (PROMPTS[i], mode)
        assert request.finish_reason == "length"
    drafted = [r.stats.accepted for r in requests if r.opts.mode == "lookup"]
    assert sum(drafted) > 0, "no lookup draft was accepted: the speculative path went untested"
    assert shared_drafts(calls) > 0, "no draft was verified in a call other requests shared"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(len(PROMPTS))), max_batch=st.integers(1, 3),
       modes=st.lists(st.sampled_from(["ar", "lookup", "auto"]), min_size=len(PROMPTS), max_size=len(PROMPTS)))
def test_any_arrival_order_equals_ar(session, expected, order, max_batch, modes):
    ids, reference = expected
    with BatchScheduler(session, max_batch=max_batch) as scheduler:
        requests = {}
        for i in order:  # each waits for the previous one's first tokens, so they join mid-flight
            requests[i] = scheduler.submit(ids[i], mode=modes[i], max_new_tokens=LENGTHS[i])
            next(iter(requests[i]))
        for i, request in requests.items():
            request.result()
            assert request.tokens == reference[i][:LENGTHS[i]]


def test_sampling_ar_rows_equal_ar(session, expected):
    """A sampled AR request draws from its own seeded generator, as alone."""
    ids, _ = expected
    want = session.generate_ids(ids[0], mode="ar", max_new_tokens=20, temperature=0.9, seed=7).tokens
    with BatchScheduler(session, max_batch=2) as scheduler:
        beside = scheduler.submit(ids[1], mode="lookup", max_new_tokens=30)
        request = scheduler.submit(ids[0], mode="ar", max_new_tokens=20, temperature=0.9, seed=7)
        assert request.result() == want
        beside.result()


def test_cancel_frees_the_row(session, expected):
    ids, reference = expected
    with BatchScheduler(session, max_batch=1) as scheduler:
        first = scheduler.submit(ids[0], mode="ar", max_new_tokens=200)
        next(iter(first))
        first.cancel()
        second = scheduler.submit(ids[1], mode="lookup", max_new_tokens=10)
        assert second.result() == reference[1][:10]
        first.result()
        assert first.finish_reason == "cancelled" and len(first.tokens) < 200


def test_refusals_are_one_sentence(session, tiny_bundles):
    with pytest.raises(SpecExportError, match="--flavour standard"):
        BatchScheduler(tiny_bundles("ort", attention="gqa"), max_batch=2)
    with pytest.raises(OptionError, match="max_batch"):
        BatchScheduler(session, max_batch=0)
    with BatchScheduler(session, max_batch=1) as scheduler:
        with pytest.raises(OptionError, match="no adapter piece, so mode self"):  # this bundle has none
            scheduler.submit([5, 6], mode="self")
        with pytest.raises(OptionError, match="temperature"):
            scheduler.submit([5, 6], temperature=-1)
        with pytest.raises(SpecExportError, match="prompt is empty"):
            scheduler.submit([])
    with pytest.raises(SpecExportError, match="closed"):
        scheduler.submit([5, 6])


def test_admission_is_shortest_first_with_aging():
    class Req:
        def __init__(self, budget: int, submitted: float) -> None:
            self.budget, self.submitted = budget, submitted

    queue = AdmissionQueue(lambda r: r.budget * 0.01, aging=1.0)
    long, short = Req(500, 0.0), Req(10, 0.0)
    queue.push(long)
    queue.push(short)
    assert queue.pop(now=1.0) is short
    queue.push(short := Req(10, 9.0))
    assert queue.pop(now=10.0) is long  # waited 10 s: its 5 s of service has aged away


def test_text_stream_stops_as_session_does(session):
    prompt = PROMPTS[2]
    alone = session.generate(prompt, mode="ar", max_new_tokens=30)
    stop = alone.text[12:16]  # a stop string the AR text runs into
    want = session.generate(prompt, mode="ar", max_new_tokens=30, stop=[stop])
    with BatchScheduler(session, max_batch=2) as scheduler:
        beside = scheduler.stream(PROMPTS[0], mode="lookup", max_new_tokens=30)
        stream = scheduler.stream(prompt, mode="lookup", max_new_tokens=30, stop=[stop])
        assert "".join(stream) == want.text and stream.finish_reason == want.finish_reason == "stop"
        assert "".join(beside) == session.generate(PROMPTS[0], mode="ar", max_new_tokens=30).text


def test_cancel_while_waiting(session, expected):
    ids, reference = expected
    with BatchScheduler(session, max_batch=1) as scheduler:
        running = scheduler.submit(ids[0], mode="ar", max_new_tokens=30)
        waiting = scheduler.submit(ids[1], mode="ar", max_new_tokens=30)
        waiting.cancel()
        assert waiting.result() == [] and waiting.finish_reason == "cancelled"
        assert running.result() == reference[0][:30]


def test_rows_at_the_context_end_equal_ar(session):
    """Prompts near the context (256): the budget is what is left, and drafts never run past it."""
    long = session.codec.encode(" ".join(["a hash table maps keys to values"] * 40))[:230]
    other = session.codec.encode("the quick brown fox jumps over the lazy dog")
    want = session.generate_ids(long, mode="ar", max_new_tokens=100).tokens
    with BatchScheduler(session, max_batch=2) as scheduler:
        beside = scheduler.submit(other, mode="lookup", max_new_tokens=60)
        request = scheduler.submit(long, mode="lookup", max_new_tokens=100)
        assert request.result() == want and len(want) == 256 - 230
        assert beside.result() == session.generate_ids(other, mode="ar", max_new_tokens=60).tokens


def test_a_failed_step_ends_its_requests_and_the_loop_goes_on(session, expected):
    ids, reference = expected
    with BatchScheduler(session, max_batch=2) as scheduler:
        deep = scheduler.pieces.deep
        real_run, calls = deep.run_rows, []

        def failing(x, rows, starts, keep=1, *rest):
            if len(rows) == 2 and not calls:  # the first call that runs both rows
                calls.append(rows)
                raise SpecExportError("piece 'deep' failed: injected")
            return real_run(x, rows, starts, keep, *rest)

        deep.run_rows = failing
        with scheduler._wake:  # the loop admits both at once, so they share their first step
            first = scheduler.submit(ids[0], mode="ar", max_new_tokens=10)
            second = scheduler.submit(ids[1], mode="lookup", max_new_tokens=10)
        for request in (first, second):
            with pytest.raises(SpecExportError, match="injected"):
                request.result()
            assert request.finish_reason == "error"
        after = scheduler.submit(ids[2], mode="lookup", max_new_tokens=10)
        assert after.result() == reference[2][:10]


def test_ignore_eos_in_a_batch(session, expected):
    """A batched request with ignore_eos runs to its length past a token taken as EOS, as Session does."""
    ids, reference = expected
    eos = reference[0][3]
    real = session.codec.eos_ids
    with BatchScheduler(session, max_batch=2) as scheduler:
        scheduler.codec.eos_ids = {eos}  # the module's session shares this codec: put back below
        try:
            stop = reference[0].index(eos)
            cut = scheduler.submit(ids[0], mode="ar", max_new_tokens=LENGTHS[0])
            full = scheduler.submit(ids[0], mode="ar", max_new_tokens=LENGTHS[0], ignore_eos=True)
            assert cut.result() == reference[0][:stop] and cut.finish_reason == "eos"
            assert full.result() == reference[0][:LENGTHS[0]] and full.finish_reason == "length"
        finally:
            scheduler.codec.eos_ids = real


def test_a_scheduler_on_a_session_opens_no_piece_again(session, expected, monkeypatch):
    # the Session loaded every piece's weights; the scheduler shares its ONNX Runtime sessions (serve --batch
    # opens the bundle once) and still gives each request AR's tokens
    import onnxruntime as ort

    opened = []
    real = ort.InferenceSession

    class Counting(real):
        def __init__(self, *args, **kwargs):
            opened.append(args[0] if args else kwargs.get("path_or_bytes"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Counting)
    with BatchScheduler(session, max_batch=2) as scheduler:
        assert scheduler.pieces.deep.session is session.pieces.deep.session
        ids, reference = expected
        assert scheduler.submit(ids[0], max_new_tokens=16, mode="lookup").result() == reference[0][:16]
    assert opened == []
    # from a bundle path it opens the pieces itself
    with BatchScheduler(session.bundle.root, max_batch=1) as scheduler:
        assert scheduler.pieces.deep.session is not session.pieces.deep.session
    assert len(opened) >= 2
