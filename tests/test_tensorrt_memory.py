"""What the TensorRT backend asks of device memory, checked with the test doubles of tests/test_tensorrt_calls
(no GPU: `CudaRuntimeDouble` keeps each allocation as host bytes and refuses, with an AssertionError, any copy
whose source and destination overlap or that leaves its allocation).

- Token trees never move a cache slot: the rows a step makes final are the tree's leading chain, already at
  the slots a sequence gives them, so no copy inside a cache buffer is ever needed (the compaction that
  copied an accepted branch into place inside one buffer overlapped its own source when the branch skipped
  a sibling, which `cudaMemcpy2DAsync` leaves undefined).
- A bucket's growth lays the cache out again with one 2-D copy per cache into the other buffer, and the
  bytes land where the bigger bucket's layout puts them.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specexport.exporter.tensorrt.engines import build_engines, plan_bundle
from specexport.runtime.backends.common import TreeMask
from specexport.runtime.backends.tensorrt import open_trt_piece
from specexport.runtime.bundle import load_bundle
from specexport.runtime.drafters import Draft
from specexport.runtime.tree import settle_branch, walk

from .test_tensorrt_calls import CudaRuntimeDouble, TensorRTDouble
from .test_tensorrt_fp16 import make_tiny_bundle

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _built(out, checkpoint, context):
    make_tiny_bundle(out, checkpoint, context=context, adapter=False)
    plan_bundle(out, "orin-nano")
    build_engines(out, trt=TensorRTDouble(), cudart=CudaRuntimeDouble(), log=lambda m: None)
    return load_bundle(out)


def _engines(tmp_path_factory, checkpoint, context: int):
    """Engines of a tiny bundle at ``context``, their timing cache in a folder of their own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECEXPORT_CACHE", str(tmp_path_factory.mktemp("timing")))
        return _built(tmp_path_factory.mktemp(f"mem{context}") / "b", checkpoint, context)


@pytest.fixture(scope="module")
def engines_128(tmp_path_factory, tiny_checkpoint):
    return _engines(tmp_path_factory, tiny_checkpoint, 128)


@pytest.fixture(scope="module")
def engines_512(tmp_path_factory, tiny_checkpoint):
    return _engines(tmp_path_factory, tiny_checkpoint, 512)


def _open(bundle, name="deep"):
    trt, cuda = TensorRTDouble(), CudaRuntimeDouble()
    return open_trt_piece(bundle, name, trt=trt, cudart=cuda), cuda


def _device_copies(cuda):
    d2d = cuda.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    return [c for c in cuda.calls if c[0] == "cudaMemcpy2DAsync" or (c[0] == "cudaMemcpyAsync" and c[1] == d2d)]


def test_the_double_refuses_an_overlapping_copy():
    """The check every test below relies on: the compaction of path [0, 2, 3, 4] at slot s as one 2-D copy
    (slots s+2..s+4 onto s+1..s+3 of every head, inside one buffer) is refused; the same run copied slot by
    slot in order is not."""
    cuda = CudaRuntimeDouble()
    heads, slots, row = 2, 128, 32
    _, base = cuda.cudaMalloc(heads * slots * row)
    s, d2d = 10, cuda.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    with pytest.raises(AssertionError, match="overlapping copy"):
        cuda.cudaMemcpy2DAsync(base + (s + 1) * row, slots * row, base + (s + 2) * row, slots * row, 3 * row,
                               heads, d2d, 0)
    for i in range(3):
        cuda.cudaMemcpy2DAsync(base + (s + 1 + i) * row, slots * row, base + (s + 2 + i) * row, slots * row, row,
                               heads, d2d, 0)
    with pytest.raises(AssertionError, match="in no allocation"):
        cuda.cudaMemcpy2DAsync(base, slots * row, base + row, slots * row, row, heads + 1, d2d, 0)


@st.composite
def trees_and_targets(draw):
    """A token tree (node i carries token i, so siblings never share a token) and the target's greedy choice
    at every node: one of its children, or a token outside the tree."""
    n = draw(st.integers(1, 12))
    parents = [-1, *(draw(st.integers(0, i - 1)) for i in range(1, n))]
    children = {i: [j for j in range(n) if parents[j] == i] for i in range(n)}
    vocab = n + 1
    logits = np.zeros((n, vocab), np.float32)
    for i in range(n):
        pick = draw(st.sampled_from([*children[i], n]))  # token n: in no branch
        logits[i, pick] = 1.0
    return parents, logits


@SETTINGS
@given(tree=trees_and_targets(), pos=st.integers(1, 100))
def test_tree_steps_never_move_a_cache_slot(engines_128, tree, pos):
    """Whatever branch the target accepts, the rows made final are the tree's first slots in sequence
    (row i at slot pos + i), so the next step starts right after them and no cache byte is copied on the
    device; the caches hold exactly what they held."""
    parents, logits = tree
    n = len(parents)
    if pos + n > 128:
        pos = 128 - n
    draft = Draft(tokens=list(range(1, n)), parents=parents)
    path, _ = walk([-1, *draft.tokens], parents, logits)
    final = settle_branch(draft, logits)[0]
    assert path[:len(final)] == list(range(len(final)))  # final rows sit at pos, pos+1, ...
    piece, cuda = _open(engines_128)
    rng = np.random.default_rng(n * 1000 + pos)
    caches = [b for _, _, buffers, _ in piece._kv for b in buffers]
    for b in caches:  # stands for what earlier calls wrote
        cuda.write(b.ptr, rng.integers(0, 256, b.nbytes, dtype=np.uint8).tobytes())
    before = {b.ptr: cuda.read(b.ptr, b.nbytes) for b in caches}
    cuda.calls.clear()
    piece.run(np.zeros((1, n, 64), np.float16), pos, keep=n, tree=TreeMask.from_parents(parents, pos))
    nxt = pos + len(final)
    if nxt < 128:
        piece.run(np.zeros((1, 1, 64), np.float16), nxt, keep=1)
    assert _device_copies(cuda) == []
    assert {b.ptr: cuda.read(b.ptr, b.nbytes) for b in caches} == before
    piece.close()


@SETTINGS
@given(ends=st.lists(st.integers(1, 511), min_size=1, max_size=4, unique=True).map(sorted))
def test_bucket_growth_copies_every_head_into_the_bigger_layout(engines_512, ends):
    """A sequence of calls continuing one another (the first at position 0): whenever the bucket grows, each
    cache is copied once, from the buffer bound as past into the other, without overlap, and every head's
    used slots land at the start of that head's run of slots in the bigger bucket."""
    piece, cuda = _open(engines_512)
    rng = np.random.default_rng(sum(ends))
    start = 0
    for end in [*ends, 512]:
        if end <= start:
            continue
        pasts = [buffers[0] for _, _, buffers, _ in piece._kv]
        for b in pasts:  # stands for what the engine wrote so far
            cuda.write(b.ptr, rng.integers(0, 256, b.nbytes, dtype=np.uint8).tobytes())
        src_bytes = {b.ptr: cuda.read(b.ptr, b.nbytes) for b in pasts}
        old = piece._buckets.size
        cuda.calls.clear()
        piece.run(np.zeros((1, end - start, 64), np.float16), start, keep=1)
        new = piece._buckets.size
        copies = _device_copies(cuda)
        if new == old or start == 0:
            assert copies == []
        else:
            assert len(copies) == len(piece._kv)
            for copy, (_, _, buffers, shape) in zip(copies, piece._kv, strict=True):
                _, dst, dpitch, src, spitch, width, height, _ = copy
                _, heads, _, head_dim = shape
                row = head_dim * 2
                assert src in src_bytes and {src, dst} == {b.ptr for b in buffers}
                assert (width, height, spitch, dpitch) == (old * row, heads, old * row, new * row)
                moved = cuda.read(dst, heads * new * row)
                for h in range(heads):
                    assert moved[h * new * row:h * new * row + old * row] == \
                        src_bytes[src][h * old * row:(h + 1) * old * row]
        start = end
    piece.close()


def test_pearl_ring_slots_and_every_bound_address_are_256_byte_aligned(engines_128):
    """PEARL's handoff on TensorRT pieces (the doubles): shallow binds each ring slot as its output, which
    TensorRT takes only on a 256-byte boundary (the double's set_tensor_address asserts it for every address,
    the host-side shape tensors included), although one position's state is 128 bytes here; deep still reads
    the states as consecutive rows of its input."""
    from types import SimpleNamespace

    from specexport.runtime.backends.cuda_streams import RING, StreamHandoff
    from specexport.runtime.drafters import Step
    from specexport.runtime.policies import DraftSignal

    trt, cuda = TensorRTDouble(), CudaRuntimeDouble()
    pieces = SimpleNamespace(**{n: open_trt_piece(engines_128, n, trt=trt, cudart=cuda) for n in ("shallow", "deep")})
    handoff = StreamHandoff(pieces, self_draft=True)
    row = 64 * 2  # the tiny model's hidden size, fp16
    assert handoff.row == row
    states = {}
    for pos in range(RING + 3):  # every slot, and the first ones again
        h = handoff.shallow(pos % 50, pos)
        _, ptr = handoff._slot(pos)
        states[pos] = bytes([pos % 256]) * row  # stands for what shallow wrote into its slot
        cuda.write(ptr, states[pos])
    bound = [c[3] for c in trt.calls if c[0] == "context.set_tensor_address"]
    assert len(bound) > RING and all(ptr % 256 == 0 for ptr in bound)
    items = [Step(h, 1, None, DraftSignal(1.0)) for _ in range(3)]
    handoff.deep(items, [1, 2, 3], RING)
    dst = pieces.deep.input_ptr("hidden_in")
    assert cuda.read(dst, 3 * row) == states[RING] + states[RING + 1] + states[RING + 2]
    handoff.close()
    for piece in vars(pieces).values():
        piece.close()


def test_pearl_takes_the_stream_handoff_through_a_head_tap(engines_128):
    """With a draft head `deep` is wrapped (FeatureTap): PEARL still sees a TensorRT piece and takes the CUDA
    streams' handoff, and the streams reach the wrapped engine. TensorRT and CUDA are the test doubles here."""
    from types import SimpleNamespace

    from specexport.runtime.backends.cuda_streams import StreamHandoff
    from specexport.runtime.head import FeatureTap
    from specexport.runtime.pearl import make_handoff

    trt, cuda = TensorRTDouble(), CudaRuntimeDouble()
    pieces = SimpleNamespace(**{n: open_trt_piece(engines_128, n, trt=trt, cudart=cuda) for n in ("shallow", "deep")})
    engine, shared = pieces.deep, pieces.deep.stream
    pieces.deep = FeatureTap(engine)
    handoff = make_handoff(pieces, self_draft=True)
    assert isinstance(handoff, StreamHandoff)
    assert engine.stream == handoff.verify_stream and pieces.shallow.stream == handoff.draft_stream
    handoff.close()
    assert engine.stream == shared
    for piece in (pieces.shallow, engine):
        piece.close()
