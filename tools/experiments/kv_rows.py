"""Ways a one-token GroupQueryAttention call might round as a row of a verification call without a copied row.

    # float cache, int8 cache (PER_CHANNEL, kv_cache_bit_width 8), a one-token call padded with
    # `query_seqlens` (ONNX Runtime 1.32's right-padded chunks), the node in float16, and the float node
    # without its attention bias (1.32's flash path, which a bias turns off), and the ONNX `Attention` op
    # (opset 23, past keys and values as inputs, a causal mask) over the same shapes: how often a
    # one-row call equals the same row of a call of 2, 3, 5 and 8 rows, bit for bit; then microseconds a
    # call by rows (one thread)
    taskset -c 0 .venv/bin/python tools/experiments/kv_rows.py

SmolLM2-135M's attention shape (9 heads over 3 KV heads of 64), random inputs, one GQA node as
exporter/llama_graph.py writes it (rotary inside, an attention bias). BENCHMARKS.md ("Where AR's time goes
beside GenAI") has what it printed and what it means for a bundle.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

HEADS, KV_HEADS, HEAD = 9, 3, 64


def gqa(cache: str, query_seqlens: bool = False, bias: bool = True) -> ort.InferenceSession:
    """`cache`: float, int8 (fp32 activations), or float16 (the whole node in fp16, as an fp16 graph has it).
    Without `bias` the node takes ONNX Runtime's flash path (a bias, which the bundles' graphs always have for
    token trees, selects the other one)."""
    f = TensorProto.FLOAT16 if cache == "float16" else TensorProto.FLOAT
    cache_type = TensorProto.INT8 if cache == "int8" else f
    io = [("query", f, [1, None, HEADS * HEAD]), ("key", f, [1, None, KV_HEADS * HEAD]),
          ("value", f, [1, None, KV_HEADS * HEAD]), ("past_key", cache_type, [1, KV_HEADS, None, HEAD]),
          ("past_value", cache_type, [1, KV_HEADS, None, HEAD]), ("seqlens_k", TensorProto.INT32, [1]),
          ("total_sequence_length", TensorProto.INT32, []), ("cos", f, [None, HEAD // 2]),
          ("sin", f, [None, HEAD // 2]), ("position_ids", TensorProto.INT64, [1, None])]
    if bias:
        io.append(("attention_bias", f, [1, 1, None, None]))
    names = [name for name, _, _ in io] + ([] if bias else [""])
    attrs = {}
    if cache == "int8":
        io += [("k_scale", f, [KV_HEADS * HEAD]), ("v_scale", f, [KV_HEADS * HEAD])]
        names += ["", "k_scale", "v_scale"]
        attrs = {"k_quant_type": "PER_CHANNEL", "v_quant_type": "PER_CHANNEL", "kv_cache_bit_width": 8}
    if query_seqlens:
        io.append(("query_seqlens", TensorProto.INT32, [1]))
        names += [""] * (16 - len(names)) + ["query_seqlens"]
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1,
                            scale=HEAD ** -0.5, **attrs)
    outputs = [helper.make_tensor_value_info("out", f, None),
               *(helper.make_tensor_value_info(n, cache_type, None) for n in node.output[1:])]
    graph = helper.make_graph([node], "gqa", [helper.make_tensor_value_info(*spec) for spec in io], outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class Calls:
    """Calls of any rows at any start over `context` random positions, each into a fresh cache buffer that
    holds the positions before it (as a bundle's shared buffer does)."""

    def __init__(self, cache: str, context: int, query_seqlens: bool = False, seed: int = 0,
                 bias: bool = True) -> None:
        rng = np.random.default_rng(seed)
        self.float = np.float16 if cache == "float16" else np.float32
        self.q = (rng.standard_normal((1, context, HEADS * HEAD)) * 2).astype(self.float)
        self.k = (rng.standard_normal((1, context, KV_HEADS * HEAD)) * 2).astype(self.float)
        self.v = rng.standard_normal((1, context, KV_HEADS * HEAD)).astype(self.float)
        angles = np.outer(np.arange(context + 8), 1e-4 ** (np.arange(HEAD // 2) / (HEAD // 2)))
        self.cos, self.sin = np.cos(angles).astype(self.float), np.sin(angles).astype(self.float)
        self.session, self.padded, self.bias = gqa(cache, query_seqlens, bias), query_seqlens, bias
        self.dtype = np.int8 if cache == "int8" else self.float
        self.scales = {}
        if cache == "int8":  # each channel's largest magnitude over 127 (keys: their RoPE pair's radius)
            k = self.k.reshape(context, KV_HEADS, HEAD)
            radius = np.sqrt(k[..., :HEAD // 2] ** 2 + k[..., HEAD // 2:] ** 2).max(axis=0)
            self.scales = {"k_scale": (np.concatenate([radius, radius], axis=-1) / 127).reshape(-1),
                           "v_scale": (np.abs(self.v).max(axis=1) / 127).reshape(-1)}
        self.slots = context + 8
        whole = self.buffer(0)
        self.cache = self.call(0, context, whole, whole.copy())[1:]

    def buffer(self, filled: int, which: int = 0) -> np.ndarray:
        out = np.zeros((1, KV_HEADS, self.slots, HEAD), self.dtype)
        if filled:
            out[:, :, :filled] = self.cache[which][:, :, :filled]
        return out

    def call(self, start: int, rows: int, past_k=None, past_v=None, valid: int | None = None) -> list[np.ndarray]:
        return self.session.run(None, self.feeds(start, rows, past_k, past_v, valid))

    def feeds(self, start: int, rows: int, past_k=None, past_v=None, valid: int | None = None) -> dict:
        valid = rows if valid is None else valid
        past_k = self.buffer(start, 0) if past_k is None else past_k
        past_v = self.buffer(start, 1) if past_v is None else past_v
        index = [start + min(r, valid - 1) for r in range(rows)]  # rows past `valid` repeat the last
        feeds = {"query": self.q[:, index], "key": self.k[:, index], "value": self.v[:, index], "past_key": past_k,
                 "past_value": past_v, "seqlens_k": np.array([start + valid - 1], np.int32),
                 "total_sequence_length": np.array(start + rows, np.int32), "cos": self.cos, "sin": self.sin,
                 "position_ids": np.arange(start, start + rows)[None],
                 **self.scales}
        if self.bias:
            feeds["attention_bias"] = np.zeros((1, 1, rows, start + rows), self.float)
        if self.padded:
            feeds["query_seqlens"] = np.array([valid], np.int32)
        return feeds


def onnx_attention_first_row(context: int, seed: int = 0) -> Callable[..., np.ndarray]:
    """`first_row(start, rows)` for `agreement`, through the ONNX Attention op: 4-D heads, the past as inputs,
    the causal part of the call as an additive mask."""
    f = TensorProto.FLOAT
    io = [("q", f, [1, HEADS, None, HEAD]), ("k", f, [1, KV_HEADS, None, HEAD]), ("v", f, [1, KV_HEADS, None, HEAD]),
          ("mask", f, [None, None]), ("past_k", f, [1, KV_HEADS, None, HEAD]), ("past_v", f, [1, KV_HEADS, None, HEAD])]
    node = helper.make_node("Attention", [name for name, _, _ in io], ["y", "present_k", "present_v"])
    graph = helper.make_graph([node], "attention", [helper.make_tensor_value_info(*spec) for spec in io],
                              [helper.make_tensor_value_info(n, f, None) for n in node.output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, HEADS, context, HEAD)).astype(np.float32)
    k, v = (rng.standard_normal((1, KV_HEADS, context, HEAD)).astype(np.float32) for _ in range(2))

    def first_row(start: int, rows: int, valid: int | None = None) -> np.ndarray:
        mask = np.triu(np.full((rows, start + rows), -np.inf, np.float32), k=start + 1)
        new = slice(start, start + rows)
        return session.run(["y"], {"q": q[:, :, new], "k": k[:, :, new], "v": v[:, :, new], "mask": mask,
                                   "past_k": k[:, :, :start], "past_v": v[:, :, :start]})[0][0, :, 0]

    return first_row


def first_row_of(calls: Calls) -> Callable[..., np.ndarray]:
    """`first_row(start, rows, valid)` for `agreement`, through a GroupQueryAttention node."""
    return lambda start, rows, valid=None: calls.call(start, rows, valid=valid)[0][0, 0]


def agreement(first_row: Callable[..., np.ndarray], context: int, one_rows: int = 1) -> tuple[int, int]:
    """(equal, compared): a one-token call (`one_rows` 2: padded with query_seqlens) against the same row of
    calls of 2, 3, 5 and 8 rows, at starts across the context."""
    equal = compared = 0
    for start in range(16, context - 8, 9):
        one = first_row(start, one_rows, valid=1)
        for rows in (2, 3, 5, 8):
            equal += int(np.array_equal(first_row(start, rows), one))
            compared += 1
    return equal, compared


def microseconds(calls: Calls, start: int, rows: int, repeats: int) -> float:
    """A call's median time with its cache bound in place (past and present one buffer), as a bundle binds it."""
    binding = calls.session.io_binding()
    for name, value in calls.feeds(start, rows).items():
        if not name.startswith("past_"):
            binding.bind_cpu_input(name, value)
    for which, name in enumerate(("key", "value")):
        cache = ort.OrtValue.ortvalue_from_numpy(calls.buffer(start, which))
        binding.bind_ortvalue_input(f"past_{name}", cache)
        binding.bind_ortvalue_output(f"present_{name}", cache)
    binding.bind_output("out")
    for _ in range(5):
        calls.session.run_with_iobinding(binding)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        calls.session.run_with_iobinding(binding)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    float_calls, int8_calls = Calls("float", args.context), Calls("int8", args.context)
    padded = Calls("float", args.context, query_seqlens=True)
    for label, calls, one_rows in (("float cache", float_calls, 1), ("int8 cache", int8_calls, 1),
                                   ("float cache, one token padded by query_seqlens", padded, 2),
                                   ("float16 node and cache", Calls("float16", args.context), 1),
                                   ("float cache, no attention bias (flash path)",
                                    Calls("float", args.context, bias=False), 1)):
        equal, compared = agreement(first_row_of(calls), args.context, one_rows)
        print(f"{label}: a one-token call equals the row of a many-row call {equal}/{compared}")
    equal, compared = agreement(onnx_attention_first_row(args.context), args.context)
    print(f"ONNX Attention (opset 23), float: a one-token call equals the row of a many-row call {equal}/{compared}")
    print(f"microseconds a call at position {args.context - 16}, cache bound in place, median of {args.repeats}"
          " (one thread):")
    for rows in (1, 2, 4, 8, 16):
        start = args.context - 16
        print(f"  {rows:2d} rows: float cache {microseconds(float_calls, start, rows, args.repeats):6.0f},"
              f" int8 cache {microseconds(int8_calls, start, rows, args.repeats):6.0f}")


if __name__ == "__main__":
    main()
