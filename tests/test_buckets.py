"""Cache lengths that follow the used length (runtime/backends/buckets.py) in swap mode: the buckets, the
re-layout when one grows, and the standard graphs on ONNX Runtime giving the same logits at every bucket."""

from __future__ import annotations

import numpy as np
import pytest
from specexport.runtime import load
from specexport.runtime.backends import buckets
from specexport.runtime.backends.buckets import (
    BUCKET_MIN,
    CacheBuckets,
    Relayout,
    bucket,
    relayout_host,
    relayout_in_place,
    view,
)


def test_buckets_double_from_the_least_and_stop_at_the_context():
    assert bucket(1, 2048) == BUCKET_MIN and bucket(BUCKET_MIN, 2048) == BUCKET_MIN
    assert bucket(BUCKET_MIN + 1, 2048) == 2 * BUCKET_MIN and bucket(2048, 2048) == 2048
    assert bucket(1500, 1536) == 1536 and bucket(5, 64) == 64


def test_a_bucket_grows_once_keeps_through_rollbacks_and_restarts_with_a_sequence():
    b = CacheBuckets(1024)
    assert b.for_call(0, 100) == (128, None)
    assert b.for_call(100, 28) == (128, None)
    assert b.for_call(128, 3) == (256, 128)  # grows: lay the cache out again from 128
    assert b.for_call(120, 2) == (256, None)  # a rollback keeps the bigger bucket
    assert b.for_call(0, 5) == (128, None)  # a new sequence starts small


def test_the_relayout_keeps_every_head_s_slots():
    shape = (1, 3, 64, 4)  # a buffer for a 64-slot context
    rng = np.random.default_rng(0)
    src, dst = np.zeros(int(np.prod(shape)), np.float32), np.full(int(np.prod(shape)), np.nan, np.float32)
    old = rng.standard_normal((1, 3, 16, 4)).astype(np.float32)
    view(src, shape, 16)[...] = old
    relayout_host(src, dst, shape, 16, 32)
    assert np.array_equal(view(dst, shape, 32)[:, :, :16], old)
    copy = Relayout.of(kv_heads=3, head_dim=4, itemsize=4, old=16, new=32)
    assert (copy.width, copy.height, copy.src_pitch, copy.dst_pitch) == (256, 3, 256, 512)


@pytest.mark.parametrize(("heads", "old", "new"), [(3, 16, 32), (1, 8, 64), (4, 5, 6), (2, 32, 64)])
def test_the_in_place_relayout_moves_every_head_as_the_two_buffer_one_does(heads, old, new):
    shape = (1, heads, 64, 4)
    rng = np.random.default_rng(heads * old)
    flat = rng.standard_normal(int(np.prod(shape))).astype(np.float32)  # what lies past the bucket is noise
    cache = view(flat, shape, old).copy()
    other = np.full_like(flat, np.nan)
    relayout_host(flat, other, shape, old, new)
    relayout_in_place(flat, shape, old, new)
    assert np.array_equal(view(flat, shape, new)[:, :, :old], cache)
    assert np.array_equal(view(flat, shape, new)[:, :, :old], view(other, shape, new)[:, :, :old])


def _logits(session, ids: np.ndarray, calls: list[int]) -> np.ndarray:
    p, pos, out = session.pieces, 0, []
    for n in calls:
        hidden = p.shallow.run(ids[:, pos:pos + n], pos)["hidden"]
        out.append(p.deep.run(hidden, pos, keep=n)["logits"].reshape(n, -1).copy())
        pos += n
    return np.concatenate(out)


@pytest.fixture(scope="module")
def standard_bundles(tiny_checkpoint, tmp_path_factory):
    from specexport.exporter.build import build_bundle

    root = tmp_path_factory.mktemp("standard")
    built = {}
    for precision in ("fp32", "fp16"):
        built[precision] = root / precision
        build_bundle(built[precision], model=str(tiny_checkpoint), exit_layer=2, context=512, flavour="standard",
                     adapter="none", precision=precision)
    return built


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_standard_graphs_give_the_same_logits_at_every_bucket(standard_bundles, monkeypatch, precision):
    rng = np.random.default_rng(1)
    ids = rng.integers(5, 200, size=(1, 300))
    calls = [120, 1, 3, 2, 1, 5, 1, 1, 4, 2, 30, 1, 3, 100, 2, 1]  # crosses 128 and 256 in multi-row calls
    session = load(standard_bundles[precision], threads=1)
    assert session.pieces.deep.kv_mode == "swap"
    bucketed = _logits(session, ids, calls)
    assert session.pieces.deep._buckets.size == 512 and session.pieces.shallow._buckets.size == 512
    monkeypatch.setattr(buckets, "BUCKET_MIN", 512)  # every call bound at the whole context
    whole = _logits(load(standard_bundles[precision], threads=1), ids, calls)
    assert np.array_equal(bucketed, whole)


def test_the_ort_graphs_give_the_same_logits_at_every_bucket(tiny_bundles, monkeypatch):
    # GroupQueryAttention's one buffer is bound at a bucket too (with a slot to spare for a one-token call's
    # copied row): one-token calls right at 126, 127 and 255 cross into the next bucket
    rng = np.random.default_rng(2)
    ids = rng.integers(5, 200, size=(1, 300))
    calls = [100, 20, 5, 1, 1, 1, 2, 3, 120, 1, 1, 1, 5, 30, 1, 4, 2]
    session = load(tiny_bundles("ort", 2, 512), threads=1)
    deep = session.pieces.deep
    deep = getattr(deep, "piece", deep)  # under the session's own padding, where this machine needs it
    assert deep.kv_mode == "shared" and deep._buckets is not None
    bucketed = _logits(session, ids, calls)
    assert deep._buckets.size == deep._bound == 512
    monkeypatch.setattr(buckets, "BUCKET_MIN", 1 << 20)  # every call bound at the whole context
    whole = _logits(load(tiny_bundles("ort", 2, 512), threads=1), ids, calls)
    assert np.array_equal(bucketed, whole)


def test_lossless_modes_cross_buckets_in_the_ort_graphs(tiny_bundles):
    session = load(tiny_bundles("ort", 2, 512, "untrained"), threads=1)
    ar = session.generate("hash table", max_new_tokens=300, mode="ar").tokens
    assert len(ar) == 300  # from the prompt's bucket of 128 through 256 to 512
    for mode in ("self", "lookup", "auto"):
        out = session.generate("hash table", max_new_tokens=300, mode=mode)
        assert out.tokens == ar and out.stats.drafted > 0, mode


def test_lossless_modes_cross_buckets(standard_bundles):
    session = load(standard_bundles["fp32"], threads=1)
    ar = session.generate("hash table", max_new_tokens=200, mode="ar").tokens
    assert len(ar) == 200
    for mode in ("lookup",):
        assert session.generate("hash table", max_new_tokens=200, mode=mode).tokens == ar, mode


def test_kv_traffic_per_step_follows_the_bucket():
    from specexport.exporter.tensorrt.traffic import step_bytes

    layers = {"shallow": (2, 3, 64), "deep": (28, 3, 64)}  # SmolLM2-135M's caches
    per_slot = 30 * 2 * 3 * 64 * 2  # fp16 keys and values over 30 layers
    early = step_bytes(layers, 2, position=100, context=2048)
    assert early["swap, whole context"] == 3 * per_slot * 2048  # ~141.6 MB: the 3 x 47 MB
    assert early["swap, bucketed"] == 3 * per_slot * 128
    assert early["in place (10.15+)"] == per_slot * 2050
    late = step_bytes(layers, 2, position=2000, context=2048)
    assert late["swap, bucketed"] == late["swap, whole context"]


def test_in_place_graphs_are_bound_whole_at_any_context(tiny_checkpoint, tmp_path):
    """The TensorScatter form fixes cache_len at the context: no bucket, whatever the context (its build's
    parity check runs the pieces on ONNX Runtime)."""
    from specexport.exporter.build import build_bundle

    out = tmp_path / "inplace"
    build_bundle(out, model=str(tiny_checkpoint), context=256, adapter="none", backend="tensorrt",
                 target="rtx-4090", plan_only=True)
    session = load(out, threads=1)
    assert session.pieces.deep._buckets is None
    assert len(session.generate("hash table", max_new_tokens=150, mode="ar").tokens) == 150
