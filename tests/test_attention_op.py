"""The row-invariant attention operator (native/row_attention.cc, runtime/attention_op.py) on tiny graphs: it
computes attention as a NumPy reference does, and every output row carries the same bits as the same row
computed alone: in a call of one row, in a batch of one, or with the masked slots among its visible ones
taken out of the cache (a token tree's branch laid out as a chain)."""

from __future__ import annotations

import functools
import os

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from specexport.runtime import attention_op

pytestmark = pytest.mark.skipif(not attention_op.available(), reason="the attention operator is not built")

HEADS, KV_HEADS = 4, 2
CONTEXT = 160
NEG = np.finfo(np.float32).min


def _model(head_dim: int, packed: bool, rotary_half: int, softcap: float = 0.0):
    f = TensorProto.FLOAT
    features = (HEADS + 2 * KV_HEADS) * head_dim if packed else HEADS * head_dim
    io = [("query", f, ["b", "s", features])]
    if not packed:
        io += [("key", f, ["b", "s", KV_HEADS * head_dim]), ("value", f, ["b", "s", KV_HEADS * head_dim])]
    io += [("past_key", f, ["b", KV_HEADS, "c", head_dim]), ("past_value", f, ["b", KV_HEADS, "c", head_dim]),
           ("seqlens_k", TensorProto.INT32, ["b"]), ("total_sequence_length", TensorProto.INT32, []),
           ("cos", f, [CONTEXT, rotary_half]), ("sin", f, [CONTEXT, rotary_half]),
           ("position_ids", TensorProto.INT64, ["b", "s"]), ("attention_bias", f, ["bb", 1, "s", "t"])]
    names = [name for name, _, _ in io]
    if packed:
        names[1:1] = ["", ""]
    node = helper.make_node(attention_op.OP_TYPE, names, ["out", "present_key", "present_value"],
                            domain=attention_op.DOMAIN, num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1,
                            scale=0.3, softcap=softcap)
    outputs = [helper.make_tensor_value_info("out", f, ["b", "s", HEADS * head_dim]),
               *(helper.make_tensor_value_info(n, f, ["b", KV_HEADS, "c", head_dim]) for n in node.output[1:])]
    graph = helper.make_graph([node], "row_attention", [helper.make_tensor_value_info(*spec) for spec in io], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(attention_op.DOMAIN, 1)])
    model.ir_version = 8
    return model


@functools.cache
def _session(head_dim: int, packed: bool = False, rotary_half: int | None = None, softcap: float = 0.0,
             isa: str = "", threads: int = 2) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    attention_op.register(opts)
    before = os.environ.get("SPECEXPORT_ATTENTION_ISA")
    os.environ["SPECEXPORT_ATTENTION_ISA"] = isa  # read when the kernel is created
    try:
        if isa == "portable":  # the library reads the variable as the kernel will: the forced path is taken
            assert attention_op.isa() == "portable"
        model = _model(head_dim, packed, rotary_half or head_dim // 2, softcap)
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    finally:
        if before is None:
            del os.environ["SPECEXPORT_ATTENTION_ISA"]
        else:
            os.environ["SPECEXPORT_ATTENTION_ISA"] = before


def _tables(half: int) -> tuple[np.ndarray, np.ndarray]:
    angles = np.outer(np.arange(CONTEXT), 1e-2 ** (np.arange(half) / half))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class Call:
    """One call's inputs: `rows` new tokens per batch row b at slots past[b] .. past[b] + rows - 1."""

    def __init__(self, rng, head_dim: int, past: list[int], rows: int, positions=None, bias=None, cache=None):
        b = len(past)
        self.head_dim, self.past, self.rows = head_dim, list(past), rows
        self.q = rng.standard_normal((b, rows, HEADS * head_dim)).astype(np.float32)
        self.k = rng.standard_normal((b, rows, KV_HEADS * head_dim)).astype(np.float32)
        self.v = rng.standard_normal((b, rows, KV_HEADS * head_dim)).astype(np.float32)
        shape = (b, KV_HEADS, CONTEXT, head_dim)
        self.k_cache = rng.standard_normal(shape).astype(np.float32) if cache is None else cache[0]
        self.v_cache = rng.standard_normal(shape).astype(np.float32) if cache is None else cache[1]
        total = max(past) + rows
        self.positions = (np.array([[p + i for i in range(rows)] for p in past], dtype=np.int64)
                          if positions is None else positions)
        self.bias = np.zeros((b, 1, rows, total), np.float32) if bias is None else bias

    def feeds(self, packed: bool = False) -> dict:
        seqlens = np.array([p + self.rows - 1 for p in self.past], dtype=np.int32)
        half = self.head_dim // 2
        cos, sin = _tables(half)
        feeds = {"past_key": self.k_cache, "past_value": self.v_cache, "seqlens_k": seqlens,
                 "total_sequence_length": np.array(self.bias.shape[-1], np.int32), "cos": cos, "sin": sin,
                 "position_ids": self.positions, "attention_bias": self.bias}
        if packed:
            feeds["query"] = np.concatenate([self.q, self.k, self.v], axis=-1)
        else:
            feeds.update(query=self.q, key=self.k, value=self.v)
        return feeds

    def run(self, session: ort.InferenceSession, packed: bool = False) -> tuple[np.ndarray, ...]:
        return tuple(session.run(None, self.feeds(packed)))


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def reference(call: Call, softcap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(output, present_key) in float64: GroupQueryAttention's definition, written out."""
    hd, group = call.head_dim, HEADS // KV_HEADS
    cos, sin = (t.astype(np.float64) for t in _tables(hd // 2))
    keys = call.k_cache.astype(np.float64).copy()
    vals = call.v_cache.astype(np.float64).copy()
    out = np.zeros((len(call.past), call.rows, HEADS * hd))
    for b, p0 in enumerate(call.past):
        pos = call.positions[b]
        k = call.k[b].reshape(call.rows, KV_HEADS, hd).astype(np.float64)
        keys[b, :, p0:p0 + call.rows] = _rotate(k, cos[pos][:, None], sin[pos][:, None]).transpose(1, 0, 2)
        vals[b, :, p0:p0 + call.rows] = call.v[b].reshape(call.rows, KV_HEADS, hd).transpose(1, 0, 2)
        q = _rotate(call.q[b].reshape(call.rows, HEADS, hd).astype(np.float64), cos[pos][:, None], sin[pos][:, None])
        for i in range(call.rows):
            last = p0 + i
            bias = call.bias[min(b, len(call.bias) - 1), 0, i, :last + 1].astype(np.float64)
            seen = bias > -3e38
            for h in range(HEADS):
                s = keys[b, h // group, :last + 1] @ q[i, h] * 0.3
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                s = (s + bias)[seen]
                w = np.exp(s - s.max())
                out[b, i, h * hd:(h + 1) * hd] = (w / w.sum()) @ vals[b, h // group, :last + 1][seen]
    return out, keys


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
    out, present_key, _ = call.run(_session(head_dim, packed, softcap=softcap), packed)
    want, want_keys = reference(call, softcap)
    np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(present_key, want_keys, rtol=1e-5, atol=1e-6)
    # slots the call does not write keep the past's bits
    untouched = np.ones(CONTEXT, bool)
    untouched[70:75] = False
    np.testing.assert_array_equal(present_key[0][:, untouched], call.k_cache[0][:, untouched])


def _window_bias(positions: np.ndarray, past: list[int], total: int, window: int | None, rng,
                 masked: float) -> np.ndarray:
    """A bias [b, 1, rows, total]: random masked slots among each row's visible ones (never its own slot) and,
    with a window, every slot whose key sits at or below the row's position - window (keys' positions are
    their slots before the call and the call's positions after, as llama_graph's bias_for says)."""
    b, rows = positions.shape
    bias = np.zeros((b, 1, rows, total), np.float32)
    for r in range(b):
        key_pos = np.arange(total)
        key_pos[past[r]:past[r] + rows] = positions[r]
        for i in range(rows):
            own = past[r] + i
            drop = rng.random(own) < masked
            bias[r, 0, i, :own][drop] = NEG
            if window is not None:
                bias[r, 0, i, key_pos <= positions[r, i] - window] = NEG
    return bias


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
    bias = _window_bias(positions, past, total, window, rng, masked)
    call = Call(rng, head_dim, past, rows, positions=positions, bias=bias)
    session = _session(head_dim)
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
    call = Call(rng, head_dim, past, rows, bias=_window_bias(
        np.array([[p + i for i in range(rows)] for p in past]), past, max(past) + rows, 40, rng, 0.2))
    fast = call.run(_session(head_dim))
    portable = call.run(_session(head_dim, isa="portable"))
    for a, b in zip(fast, portable, strict=True):
        assert np.array_equal(a, b)
    assert attention_op.isa() in ("avx512", "avx2", "portable")


def test_thread_count_does_not_change_bits():
    rng = np.random.default_rng(2)
    call = Call(rng, 64, [100, 5, 33], 9)
    one, two = call.run(_session(64, threads=1)), call.run(_session(64, threads=2))
    for a, b in zip(one, two, strict=True):
        assert np.array_equal(a, b)


def test_cache_bound_in_place():
    """The runtime binds one buffer as past and present: the op writes the new rows there and reads them back."""
    rng = np.random.default_rng(3)
    call = Call(rng, 64, [40], 6)
    want = call.run(_session(64))
    session = _session(64)
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
        call.run(_session(64))
