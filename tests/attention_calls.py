"""Calls of the row-invariant attention operator on a one-node graph, and their float64 reference: what
tests/test_attention_op.py checks and tools/check_avx512.py sweeps with a second build of the library."""

from __future__ import annotations

import functools
import os

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
from specexport.runtime import attention_op

HEADS, KV_HEADS = 4, 2
CONTEXT = 160
NEG = np.finfo(np.float32).min


def attention_model(head_dim: int, packed: bool, rotary_half: int, softcap: float = 0.0):
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
def op_session(head_dim: int, packed: bool = False, rotary_half: int | None = None, softcap: float = 0.0,
             isa: str = "", threads: int = 2) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    attention_op.register(opts)
    before = os.environ.get("SPECEXPORT_ATTENTION_ISA")
    os.environ["SPECEXPORT_ATTENTION_ISA"] = isa  # read when the kernel is created
    try:
        if isa == "portable":  # the library reads the variable as the kernel will: the forced path is taken
            assert attention_op.isa() == "portable"
        model = attention_model(head_dim, packed, rotary_half or head_dim // 2, softcap)
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    finally:
        if before is None:
            del os.environ["SPECEXPORT_ATTENTION_ISA"]
        else:
            os.environ["SPECEXPORT_ATTENTION_ISA"] = before


def rope_tables(half: int) -> tuple[np.ndarray, np.ndarray]:
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
        cos, sin = rope_tables(half)
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


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def reference(call: Call, softcap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(output, present_key) in float64: GroupQueryAttention's definition, written out."""
    hd, group = call.head_dim, HEADS // KV_HEADS
    cos, sin = (t.astype(np.float64) for t in rope_tables(hd // 2))
    keys = call.k_cache.astype(np.float64).copy()
    vals = call.v_cache.astype(np.float64).copy()
    out = np.zeros((len(call.past), call.rows, HEADS * hd))
    for b, p0 in enumerate(call.past):
        pos = call.positions[b]
        k = call.k[b].reshape(call.rows, KV_HEADS, hd).astype(np.float64)
        keys[b, :, p0:p0 + call.rows] = rotate(k, cos[pos][:, None], sin[pos][:, None]).transpose(1, 0, 2)
        vals[b, :, p0:p0 + call.rows] = call.v[b].reshape(call.rows, KV_HEADS, hd).transpose(1, 0, 2)
        q = rotate(call.q[b].reshape(call.rows, HEADS, hd).astype(np.float64), cos[pos][:, None], sin[pos][:, None])
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


def window_bias(positions: np.ndarray, past: list[int], total: int, window: int | None, rng,
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
