"""Every call of an output-path piece runs at least two rows, so verification is AR's arithmetic to the bit.

ONNX Runtime's CPU kernels take another path for a one-row call than for a multi-row one: MLAS's GEMV for
the probabilities x V product inside GroupQueryAttention, and (ORT 1.32, AVX2) MatMulNBits' int4 kernels at
every accuracy level. The two paths round the last bit differently, while calls of 2, 3, ... 40 rows agree
bit for bit row by row (measured). In fp32 that stays ~1e-6 in the logits; int8 activations
(accuracy_level 4) turn such a bit into a different rounding step and, after 28 layers, into logit
differences of ~1: verifying k drafts in one call would disagree with k one-token AR calls, and a
speculative mode would drift from AR within a few dozen tokens at int8 (BENCHMARKS.md).

So a one-row call gets a copy of its row appended at the piece's input and every op sees two rows; the
copy is dropped from the outputs. In ONNX Runtime's graphs it takes the next position and cache slot,
which the next call writes before anything reads it (attention never reads past a query's own position);
with no free slot (the context is full) nothing is appended, and both AR and speculative modes make that
same one-row call. In the standard graphs it is the same row at the same position and slot. The LM head
likewise always reads at least two rows: `logits_to_keep` is widened inside the graph and the logits
trimmed back.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

CONTROL = ("position_ids", "seqlens_k", "total_sequence_length", "attention_bias", "logits_to_keep")


def pad_one_row_calls(model: onnx.ModelProto) -> bool:
    """Rewrite a shallow or deep piece (either graph flavour) in place so no call runs one row; False
    (unchanged) for a graph without caches."""
    graph = model.graph
    inputs = {i.name for i in graph.input}
    primary = next((n for n in ("hidden_in", "input_ids") if n in inputs), None)
    if primary is None or not {"past_key.0", "position_ids"} <= inputs:
        return False
    ort = "seqlens_k" in inputs  # GroupQueryAttention; else the standard graphs (whole-cache attention)
    # In the standard graphs (TensorRT) the copy keeps the row's position and its one-row control inputs,
    # which broadcast over both rows: it computes the very same keys and values and scatters them to the
    # same slot. Nothing then depends on an input's values, which TensorRT would have to treat as shape
    # tensors, and no free slot is needed.
    padded = (primary, *CONTROL) if ort else (primary, "logits_to_keep")
    renamed = {name: f"mr_{name}" for name in padded if name in inputs}
    for node in graph.node:  # every consumer reads the padded value
        for k, name in enumerate(node.input):
            if name in renamed:
                node.input[k] = renamed[name]

    prelude: list[onnx.NodeProto] = []

    def const(name: str, value, dtype) -> str:
        graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(op: str, ins: list[str], out: str, **attrs) -> str:
        prelude.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    axis1 = const("mr_axis1", [1], np.int64)
    rows = node("Gather", [node("Shape", [primary], "mr_shape"), axis1], "mr_rows", axis=0)  # [1] int64
    single = node("Cast", [node("Equal", [rows, const("mr_one64", [1], np.int64)], "mr_is_single")],
                  "mr_single", to=7)  # [1] int64: 1 for a one-row call
    if ort:  # GQA writes the copy to the next slot: only when there is one
        used = node("Cast", [node("Reshape", ["total_sequence_length", axis1], "mr_total1")], "mr_used", to=7)
        cache = node("Gather", [node("Shape", ["past_key.0"], "mr_kv_shape"), const("mr_axis2", [2], np.int64)],
                     "mr_cache", axis=0)  # [1] int64
        room = node("Min", [node("Sub", [cache, used], "mr_room"), const("mr_one", [1], np.int64)], "mr_room1")
        extra64 = node("Mul", [room, single], "mr_extra64")  # [1] int64: rows appended (0 or 1)
    else:
        extra64 = single
    start = node("Sub", [rows, extra64], "mr_start")  # the copied rows: [start, rows), empty when extra is 0

    def append_copy(name: str, plus: str | None = None) -> None:
        copy = node("Slice", [name, start, rows, axis1], f"mr_{name}_last")
        if plus:
            copy = node("Add", [copy, plus], f"mr_{name}_next")
        node("Concat", [name, copy], renamed[name], axis=1)

    append_copy(primary)
    if ort:
        append_copy("position_ids", const("mr_step", 1, np.int64))  # the copy takes the next position
        extra = node("Cast", [node("Reshape", [extra64, const("mr_scalar", [], np.int64)], "mr_extra_s")],
                     "mr_extra", to=6)  # int32 scalar
        node("Add", ["seqlens_k", extra], renamed["seqlens_k"])
        node("Add", ["total_sequence_length", extra], renamed["total_sequence_length"])
        if "attention_bias" in renamed:  # a zero row and column for the copy (the causal mask hides its key)
            pads = node("Concat", [const("mr_pads0", [0] * 6, np.int64), extra64, extra64], "mr_pads", axis=0)
            node("Pad", ["attention_bias", pads], renamed["attention_bias"], mode="constant")
    total_rows = node("Add", [rows, extra64], "mr_total_rows")
    head_rows = None
    if "logits_to_keep" in renamed:  # the LM head reads the kept rows, the copy, and at least two rows
        wanted = node("Max", [node("Add", ["logits_to_keep", extra64], "mr_keep_copy"),
                              const("mr_two", [2], np.int64)], "mr_keep2")
        head_rows = node("Min", [wanted, total_rows], renamed["logits_to_keep"])

    trims: list[onnx.NodeProto] = []
    for out in graph.output:
        if out.name.startswith("present_"):
            continue
        inner = f"mr_{out.name}_padded"
        for n in graph.node:
            for k, name in enumerate(n.output):
                if name == out.name:
                    n.output[k] = inner
        if out.name == "logits" and head_rows is not None:
            # the kept rows sit just before the copy: [head_rows - extra - keep, head_rows - extra)
            end = f"mr_{out.name}_end"
            trims.append(helper.make_node("Sub", [head_rows, extra64], [end], name=end))
            begin = f"mr_{out.name}_begin"
            trims.append(helper.make_node("Sub", [end, "logits_to_keep"], [begin], name=begin))
            trims.append(helper.make_node("Slice", [inner, begin, end, axis1], [out.name], name=f"mr_{out.name}"))
        else:  # one row per input row: drop the copy
            trims.append(helper.make_node("Slice", [inner, const(f"mr_{out.name}_zero", [0], np.int64), rows,
                                                    axis1], [out.name], name=f"mr_{out.name}"))
    nodes = [*prelude, *graph.node, *trims]
    del graph.node[:]
    graph.node.extend(nodes)
    return True
