"""The batch scheduler on `ort` bundles built with --attention rowwise (the row-invariant attention operator), at
fp32, int8 and int4: concurrent requests in every batched mode, rows joining mid-way and prompts of different
lengths, each get exactly their AR tokens; a call of one row pads as the Session does; a scheduler opened from a
path registers the operator and probes as a Session would; `serve --batch 4` gives four clients AR's text."""

from __future__ import annotations

import numpy as np
import pytest
from specexport.runtime import SpecExportError, attention_op, load
from specexport.runtime.batching import BatchScheduler
from specexport.runtime.row_padding import TwoRowCalls

from .test_rowwise_bundles import rowwise_bundle  # noqa: F401  (the tiny rowwise bundles, built once here)

pytestmark = pytest.mark.skipif(not attention_op.available(), reason="the attention operator is not built")

# prompts of different lengths, and each a different number of new tokens: rows leave and join at different steps
JOBS = [("hash table", "ar", 20), ("the quick brown fox jumps over the lazy dog", "lookup", 28),
        ("write a haiku about the sea", "model", 24), ("a hash table maps keys to values", "self", 30),
        ("the quick brown fox", "auto", 18), ("write a haiku about the sea", "lookup", 12)]


def ar_tokens(session, prompt: str, n: int) -> list[int]:
    return session.generate(prompt, mode="ar", max_new_tokens=n).tokens


def tokens_of(request) -> list[int]:
    return [t for step in request for t in step]


def padded_pair(scheduler, pad: bool) -> tuple:
    """The scheduler's shallow and deep with the one-row padding (TwoRowCalls) or without it."""
    raw = [getattr(p, "piece", p) for p in (scheduler.pieces.shallow, scheduler.pieces.deep)]
    return tuple(TwoRowCalls(p, scheduler.bundle.max_context) for p in raw) if pad else tuple(raw)


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_concurrent_rows_are_ar(rowwise_bundle, precision):  # noqa: F811
    session = load(rowwise_bundle(precision))
    want = [ar_tokens(session, prompt, n) for prompt, _, n in JOBS]
    opts = session.options()
    with BatchScheduler(session, max_batch=3) as scheduler:
        requests = [scheduler.submit(session.prompt_ids(p, opts), mode=m, max_new_tokens=n) for p, m, n in JOBS[:2]]
        first = next(iter(requests[0]))  # the first two are running: the rest join mid-way
        got = [first + tokens_of(requests[0]), tokens_of(requests[1])]
        requests = [scheduler.submit(session.prompt_ids(p, opts), mode=m, max_new_tokens=n) for p, m, n in JOBS[2:]]
        got += [tokens_of(r) for r in requests]
        counts = scheduler.counts
    for (prompt, mode, _), tokens, ar in zip(JOBS, got, want, strict=True):
        assert tokens == ar, (precision, prompt, mode)
    assert counts.max_rows == 3 and counts.steps < counts.row_steps, counts  # the rows were verified together
    assert scheduler.one_row_calls == session.one_row_calls


def test_one_row_calls_pad_as_the_session_does(rowwise_bundle):  # noqa: F811
    """The rule, checked on this machine: a row of a call of several rows rounds as a one-row call padded to two
    tokens; where the Session pads, the batched piece pads a call of one row and one token, and only that."""
    session = load(rowwise_bundle("int4"))
    scheduler = BatchScheduler(session, max_batch=3)
    try:
        ids = session.prompt_ids("the quick brown fox jumps over the lazy dog", session.options())
        prompt = np.asarray([ids[:-1]] * 3, dtype=np.int64)
        last = np.asarray([[ids[-1]], [ids[3]], [ids[5]]], dtype=np.int64)  # a different next token per row
        at = [prompt.shape[1]] * 3

        def row_zero(rows: list[int], pad: bool) -> np.ndarray:
            shallow, deep = padded_pair(scheduler, pad)
            deep.run_rows(shallow.run_rows(prompt[:len(rows)], rows, [0] * len(rows))["hidden"], rows,
                          [0] * len(rows))
            hidden = shallow.run_rows(last[:len(rows)], rows, at[:len(rows)])["hidden"]
            return deep.run_rows(hidden, rows, at[:len(rows)])["logits"][0].copy()

        both = row_zero([0, 1], pad=False)
        np.testing.assert_array_equal(row_zero([0, 1], pad=True), both)  # two rows: nothing is padded
        np.testing.assert_array_equal(row_zero([0, 2, 1], pad=False), both)  # three rows, a gathered copy
        np.testing.assert_array_equal(row_zero([0], pad=True), both)  # one row padded: a row of many
        if session.one_row_calls == "session":  # this CPU's one-row MatMul rounds otherwise: the reason to pad
            assert not np.array_equal(row_zero([0], pad=False), both)
    finally:
        scheduler.close()


def test_a_lone_row_keeps_the_caches_of_a_verification_call(rowwise_bundle):  # noqa: F811
    """End to end at int4: a request decoded alone (every call one row and one token) leaves in its cache row the
    very keys and values one call over its whole history writes (a row of many, as verification's); unpadded,
    on a CPU where the Session pads, they differ."""
    session = load(rowwise_bundle("int4"))
    ids = session.prompt_ids("the quick brown fox", session.options())
    with BatchScheduler(session, max_batch=2) as scheduler:
        def caches_after_ar(pad: bool) -> list[np.ndarray]:
            shallow, deep = padded_pair(scheduler, pad)
            pooled = scheduler.engine.pieces  # what the next request's views call
            pooled.shallow, pooled.deep = shallow, deep
            pools = [pool for piece in (shallow, deep) for pool in piece._pool.caches.values()]
            for pool in pools:
                pool[:] = 0
            history = ids + tokens_of(scheduler.submit(ids, mode="ar", max_new_tokens=16))
            lone = int(pools[0][1].any())  # the row the request took; the other gets the whole history at once
            written = len(history) - 1  # the last token is never fed
            whole = np.asarray([history[:written]], dtype=np.int64)
            deep.run_rows(shallow.run_rows(whole, [1 - lone], [0])["hidden"], [1 - lone], [0])
            return [pool[row, :, :written].copy() for pool in pools for row in (lone, 1 - lone)]

        padded = caches_after_ar(session.one_row_calls == "session")
        for lone, whole in zip(padded[::2], padded[1::2], strict=True):
            np.testing.assert_array_equal(lone, whole)
        if session.one_row_calls == "session":
            unpadded = caches_after_ar(False)
            assert any(not np.array_equal(a, b) for a, b in zip(unpadded[::2], unpadded[1::2], strict=True))


def test_a_scheduler_from_a_path_registers_the_operator_and_probes(rowwise_bundle):  # noqa: F811
    root = rowwise_bundle("int4")
    session = load(root)
    prompt, n = "write a haiku about the sea", 20
    want = ar_tokens(session, prompt, n)
    with BatchScheduler(root, max_batch=2) as scheduler:
        assert scheduler.one_row_calls == session.one_row_calls
        ids = session.prompt_ids(prompt, session.options())
        requests = [scheduler.submit(ids, mode=mode, max_new_tokens=n) for mode in ("ar", "model")]
        assert [tokens_of(r) for r in requests] == [want, want]


def test_a_path_without_the_operator_is_refused_in_one_sentence(rowwise_bundle, monkeypatch):  # noqa: F811
    root = rowwise_bundle("fp32")  # built while the operator loads
    missing = f"specexport was installed without its attention operator; {attention_op.HOW_TO_BUILD}"
    monkeypatch.setattr(attention_op, "load_error", lambda: missing)
    with pytest.raises(SpecExportError, match="row-invariant attention operator, but specexport was installed") as err:
        BatchScheduler(root, max_batch=2)
    assert ". " not in str(err.value)


def test_a_manifest_that_misstates_a_graph_is_refused_by_both_engines(rowwise_bundle, tmp_path):  # noqa: F811
    import json
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(rowwise_bundle("fp32"), copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    logits = next(t for t in manifest["pieces"]["deep"]["outputs"] if t["name"] == "logits")
    logits["dtype"] = "float16"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    said = r"manifest field pieces.deep.outputs gives 'logits' as float16.* but the piece's graph has float32"
    with pytest.raises(SpecExportError, match=said):
        load(copy)
    with pytest.raises(SpecExportError, match=said):  # opened from the path: the scheduler checks its own sessions
        BatchScheduler(copy, max_batch=2)


def test_gqa_bundles_are_refused_in_one_sentence(tiny_bundles):
    with pytest.raises(SpecExportError, match=r"GroupQueryAttention.*--attention rowwise.*--flavour standard") as err:
        BatchScheduler(tiny_bundles("ort", attention="gqa"), max_batch=2)
    assert ". " not in str(err.value)


def test_serve_batch_4_on_int4_gives_four_clients_ar_text(rowwise_bundle):  # noqa: F811
    pytest.importorskip("starlette", reason="the serve extra installs starlette and uvicorn")
    pytest.importorskip("uvicorn", reason="the serve extra installs starlette and uvicorn")
    openai = pytest.importorskip("openai", reason="the dev extra installs the openai client")
    from specexport.serve import create_app

    from .test_serve import ThreadServer
    from .test_serve_batch import chat_concurrently

    session = load(rowwise_bundle("int4"))
    jobs = [("explain how a hash table works", "lookup", 24), ("write a haiku about the sea", "self", 20),
            ("a hash table maps keys to values", "model", 28), ("the quick brown fox", "ar", 16)]
    want = [session.generate(p, mode="ar", max_new_tokens=n) for p, _, n in jobs]
    server = ThreadServer(create_app(session, batch=4))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        replies = chat_concurrently(client, server.app.state.model.name, jobs)
        for job, reply, ar in zip(jobs, replies, want, strict=True):
            assert reply.model_extra["specexport"]["token_ids"] == ar.tokens, job
            assert reply.choices[0].message.content == ar.text, job
        counts = server.app.state.worker.scheduler.counts
        assert counts.max_rows >= 2 and counts.steps < counts.row_steps, counts
    finally:
        server.stop()


def _hide(bundle, tmp_path, field: str):
    import json
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["graph"][field]  # what a manifest without the field means: ONNX Runtime's own operator
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_a_manifest_that_hides_the_attention_operator_is_refused_naming_the_field(rowwise_bundle, tmp_path):  # noqa: F811
    copy = _hide(rowwise_bundle("fp32"), tmp_path, "attention")
    said = (r"the graph of piece '\w+' uses specexport's RowInvariantAttention operator,"
            r" but manifest field graph.attention")
    with pytest.raises(SpecExportError, match=said) as err:
        load(copy)
    assert ". " not in str(err.value)


def test_a_manifest_that_hides_the_matmul_operator_is_refused_naming_the_field(tiny_checkpoint, tmp_path):
    from specexport.exporter.build import build_bundle

    build_bundle(tmp_path / "built", model=str(tiny_checkpoint), context=128, adapter="none", drafter="none",
                 precision="int4", attention="gqa", matmul="rowwise")
    copy = _hide(tmp_path / "built", tmp_path, "matmul")
    said = (r"the graph of piece '\w+' uses specexport's (RowInvariantMatMulNBits|GatherRowsNBits) operator,"
            r" but manifest field graph.matmul")
    with pytest.raises(SpecExportError, match=said) as err:
        load(copy)
    assert ". " not in str(err.value)
