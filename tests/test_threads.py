"""Sessions and threads: one Session shared by threads gives each request what it gives serially; Sessions
side by side in one process do not disturb each other."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from specexport.runtime import SpecExportError, load

PROMPTS = ["hash table", "the sea", "seventeen times", "a short story about"]
MODES = ["ar", "self", "lookup", "auto"]


def _requests():
    return [(prompt, mode) for prompt in PROMPTS for mode in MODES[:2]] + \
        [(prompt, mode) for prompt in PROMPTS for mode in MODES[2:]]


def test_eight_threads_on_one_session_match_serial(tiny_bundles):
    session = load(tiny_bundles(adapter="untrained"), threads=1)
    requests = _requests()  # 16 requests: 4 prompts x 4 modes
    serial = [session.generate(p, max_new_tokens=24, mode=m).tokens for p, m in requests]
    start = threading.Barrier(8)

    def worker(i: int) -> list[list[int]]:
        start.wait()  # all eight ask at once
        return [session.generate(p, max_new_tokens=24, mode=m).tokens for p, m in requests[i::8] * 2]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(worker, range(8)))
    for i, got in enumerate(results):
        assert got == [serial[j] for j in range(i, len(requests), 8)] * 2, i


def test_two_sessions_in_two_threads(tiny_bundles):
    bundles = [tiny_bundles(adapter="untrained"), tiny_bundles("ort", 1)]
    sessions = [load(b, threads=1) for b in bundles]
    serial = [[s.generate(p, max_new_tokens=24, mode="auto").tokens for p in PROMPTS] for s in sessions]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda s: [s.generate(p, max_new_tokens=24, mode="auto").tokens for p in PROMPTS],
                                sessions))
    assert results == serial


def test_a_thread_cannot_interleave_two_requests_on_one_session(tiny_bundles):
    session = load(tiny_bundles(adapter="untrained"), threads=1)
    first = session.stream("hash table", max_new_tokens=24, mode="ar")
    next(iter(first))  # the first request holds the session
    with pytest.raises(SpecExportError, match="already running a request on this Session"):
        session.generate("the sea", max_new_tokens=4)
    first.close()  # given back: the next request runs
    assert session.generate("the sea", max_new_tokens=4, mode="ar").tokens


def test_a_piece_that_fails_mid_generation_is_named_and_the_session_goes_on(tiny_bundles, monkeypatch):
    session = load(tiny_bundles(adapter="untrained"), threads=1)
    expected = session.generate("the sea", max_new_tokens=12, mode="self").tokens
    deep = session.pieces.deep
    real, calls = deep.session.run_with_iobinding, {"n": 0}

    def failing(binding):
        calls["n"] += 1
        if calls["n"] == 3:  # the third call to `deep`: mid-generation
            raise RuntimeError("Non-zero status code returned while running MatMul node (simulated)")
        return real(binding)

    monkeypatch.setattr(deep.session, "run_with_iobinding", failing)
    with pytest.raises(SpecExportError, match=r"piece 'deep' failed at positions \d+\.\.\d+ .*simulated"):
        session.generate("the sea", max_new_tokens=12, mode="self")
    assert session.generate("the sea", max_new_tokens=12, mode="self").tokens == expected


def test_a_pieces_pool_spins_within_its_runs_only(tiny_bundles):
    """`load`'s pieces each have a pool of their own: its threads spin between a run's operators (sleeping there
    made an int4 token much slower, tools/experiments/thread_pools.py) and stop at the run's end, so idle pools
    take no cores from the piece that runs."""
    session = load(tiny_bundles(adapter="untrained"), threads=2)
    for name in ("shallow", "deep"):
        opts = getattr(session.pieces, name).session.get_session_options()
        assert opts.intra_op_num_threads == 2 and opts.use_per_session_threads
        assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "1"
        assert opts.get_session_config_entry("session.force_spinning_stop") == "1"
