"""The row-invariant attention operator (native/row_attention.cc, runtime/attention_op.py) on tiny graphs: it
computes attention as a NumPy reference does, and every output row carries the same bits as the same row
computed alone: in a call of one row, in a batch of one, or with the masked slots among its visible ones
taken out of the cache (a token tree's branch laid out as a chain)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from specexport.runtime import attention_op

from .attention_calls import (
    CONTEXT,
    NEG,
    Call,
    op_session,
    reference,
    window_bias,
)

pytestmark = pytest.mark.skipif(not attention_op.available(), reason="the attention operator is not built")


@pytest.mark.parametrize(("head_dim", "packed", "softcap"), [(64, False, 0.0), (64, True, 0.0), (256, False, 0.0),
                                                              (24, True, 0.0), (32, False, 5.0)])
def test_matches_numpy_reference(head_dim, packed, softcap):
    rng = np.random.default_rng(head_dim)
    past, rows = [70, 3], 5
    bias = np.zeros((2, 1, rows, 75), np.float32)
    bias[0, 0, 3, [10, 40, 71]] = NEG  # a tree's other branch and two slots behind a window
    bias[1, 0, :, 1] = -np.inf
    bias[1, 0, 2, 0] = 0.5  # a real (unmasked) bias value is added
    call = Call(rng, head_dim, past, rows, bias=bias)
    out, present_key, _ = call.run(op_session(head_dim, packed, softcap=softcap), packed)
    want, want_keys = reference(call, softcap)
    np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(present_key, want_keys, rtol=1e-5, atol=1e-6)
    # slots the call does not write keep the past's bits
    untouched = np.ones(CONTEXT, bool)
    untouched[70:75] = False
    np.testing.assert_array_equal(present_key[0][:, untouched], call.k_cache[0][:, untouched])


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 32), batch=st.integers(1, 4), head_dim=st.sampled_from([64, 256, 24]),
       past=st.lists(st.integers(0, 120), min_size=4, max_size=4), window=st.sampled_from([None, 7, 50]),
       masked=st.sampled_from([0.0, 0.3]), tree=st.booleans(), seed=st.integers(0, 2**16))
def test_each_row_is_the_row_computed_alone(rows, batch, head_dim, past, window, masked, tree, seed):
    rng = np.random.default_rng(seed)
    past = past[:batch]
    # a tree's positions go by depth (repeat, never past the slot); a chain's are its slots
    positions = np.array([[p + (int(rng.integers(0, i + 1)) if tree else i) for i in range(rows)] for p in past])
    total = max(past) + rows
    bias = window_bias(positions, past, total, window, rng, masked)
    call = Call(rng, head_dim, past, rows, positions=positions, bias=bias)
    session = op_session(head_dim)
    out, present_k, present_v = call.run(session)
    for b in range(batch):
        for i in range(rows):
            slot = past[b] + i
            # alone: a call of one row at its slot, over the cache the big call left, batch of one
            one = Call(rng, head_dim, [slot], 1, positions=positions[b:b + 1, i:i + 1],
                       bias=bias[b:b + 1, :, i:i + 1, :slot + 1],
                       cache=(present_k[b:b + 1].copy(), present_v[b:b + 1].copy()))
            one.q, one.k, one.v = call.q[b:b + 1, i:i + 1], call.k[b:b + 1, i:i + 1], call.v[b:b + 1, i:i + 1]
            alone, alone_k, _ = one.run(session)
            assert np.array_equal(alone[0, 0], out[b, i]), f"row {i} of batch row {b} rounds otherwise alone"
            assert np.array_equal(alone_k[0, :, slot], present_k[b, :, slot])
            # compacted: only the slots the row sees, laid out from slot 0, as the branch's chain would be
            seen = np.flatnonzero(bias[b, 0, i, :slot] > -3e38)
            cache = np.zeros_like(present_k[b:b + 1]), np.zeros_like(present_v[b:b + 1])
            cache[0][0, :, :len(seen)], cache[1][0, :, :len(seen)] = present_k[b, :, seen].transpose(1, 0, 2), \
                present_v[b, :, seen].transpose(1, 0, 2)
            chain = Call(rng, head_dim, [len(seen)], 1, positions=positions[b:b + 1, i:i + 1], cache=cache)
            chain.q, chain.k, chain.v = one.q, one.k, one.v
            compact, _, _ = chain.run(session)
            assert np.array_equal(compact[0, 0], out[b, i]), f"row {i} of batch row {b} rounds otherwise compacted"


@pytest.mark.parametrize("head_dim", [64, 256, 24])
def test_vector_paths_give_the_portable_bits(head_dim):
    rng = np.random.default_rng(1)
    past, rows = [0, 90], 17
    call = Call(rng, head_dim, past, rows, bias=window_bias(
        np.array([[p + i for i in range(rows)] for p in past]), past, max(past) + rows, 40, rng, 0.2))
    fast = call.run(op_session(head_dim))
    portable = call.run(op_session(head_dim, isa="portable"))
    for a, b in zip(fast, portable, strict=True):
        assert np.array_equal(a, b)
    assert attention_op.isa() in ("avx512", "avx2", "portable")


def test_thread_count_does_not_change_bits():
    rng = np.random.default_rng(2)
    call = Call(rng, 64, [100, 5, 33], 9)
    one, two = call.run(op_session(64, threads=1)), call.run(op_session(64, threads=2))
    for a, b in zip(one, two, strict=True):
        assert np.array_equal(a, b)


def test_cache_bound_in_place():
    """The runtime binds one buffer as past and present: the op writes the new rows there and reads them back."""
    rng = np.random.default_rng(3)
    call = Call(rng, 64, [40], 6)
    want = call.run(op_session(64))
    session = op_session(64)
    binding = session.io_binding()
    k_cache, v_cache = call.k_cache.copy(), call.v_cache.copy()
    keys = ort.OrtValue.ortvalue_from_numpy(k_cache)
    vals = ort.OrtValue.ortvalue_from_numpy(v_cache)
    for name, value in call.feeds().items():
        if name == "past_key":
            binding.bind_ortvalue_input(name, keys)
        elif name == "past_value":
            binding.bind_ortvalue_input(name, vals)
        else:
            binding.bind_cpu_input(name, value)
    binding.bind_output("out")
    binding.bind_ortvalue_output("present_key", keys)
    binding.bind_ortvalue_output("present_value", vals)
    session.run_with_iobinding(binding)
    assert np.array_equal(binding.copy_outputs_to_cpu()[0], want[0])
    assert np.array_equal(k_cache, want[1]) and np.array_equal(v_cache, want[2])


def test_bad_shapes_refused_in_a_sentence():
    rng = np.random.default_rng(4)
    call = Call(rng, 64, [150], 20)  # slots 150..169 of a 160-slot cache
    with pytest.raises(Exception, match="outside the cache"):
        call.run(op_session(64))
