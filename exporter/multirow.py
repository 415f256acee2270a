"""One-token calls of the output-path pieces made to round as rows of a verification call.

ONNX Runtime's CPU kernels may take another path for a one-row call than for a multi-row one: MLAS's GEMV
for the probabilities x V product inside GroupQueryAttention (everywhere measured), and on some CPUs
MatMulNBits' int4 kernels (an AVX2 x86 without VNNI; not an AVX-512 VNNI EPYC). The two paths round the
last bit differently, while calls of 2, 3, ... 40 rows agree bit for bit row by row (measured). In fp32
that stays ~1e-6 in the logits; int8 activations (accuracy_level 4) turn such a bit into a different
rounding step and, after 28 layers, into logit differences of ~1: verifying k drafts in one call would
disagree with k one-token AR calls, and a speculative mode would drift from AR (docs/journal/2026-11-23.md).

So a one-row call gets a copy of its row appended, and the copy is dropped from the outputs: in front of
each GroupQueryAttention only (`pad_one_row_attention`, the `ort` flavour: the runtime checks the rest of
the arithmetic on the machine that runs it, runtime/row_padding.py), or at the piece's input so every op
sees two rows (`pad_one_row_calls`, the standard flavour). In ONNX Runtime's graphs the copy takes the
next position and cache slot, which the next call writes before anything reads it (attention never reads
past a query's own position); with no free slot (the context is full) nothing is appended, and both AR
and speculative modes make that same one-row call. In the standard graphs it is the same row at the same
position and slot, and the LM head also reads at least two rows (`logits_to_keep` widened inside the
graph, the logits trimmed back).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..runtime.errors import SpecExportError

CONTROL = ("position_ids", "seqlens_k", "total_sequence_length", "attention_bias", "logits_to_keep")


class _Prelude:
    """Nodes and constants a rewrite puts in front of a graph's own nodes."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph, self.nodes = graph, []

    def const(self, name: str, value, dtype) -> str:
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(self, op: str, ins: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out


def _copied_rows(p: _Prelude, primary: str, needs_slot: bool) -> tuple[str, str, str, str]:
    """(axis 1, the call's rows, rows appended: 0 or 1, first copied row) as [1] int64 values: a one-row
    call gets a copy, unless `needs_slot` and the cache has no free slot after the call."""
    axis1 = p.const("mr_axis1", [1], np.int64)
    rows = p.node("Gather", [p.node("Shape", [primary], "mr_shape"), axis1], "mr_rows", axis=0)
    single = p.node("Cast", [p.node("Equal", [rows, p.const("mr_one64", [1], np.int64)], "mr_is_single")],
                    "mr_single", to=7)  # 1 for a one-row call
    extra64 = single
    if needs_slot:  # GQA writes the copy to the next slot: only when there is one
        used = p.node("Cast", [p.node("Reshape", ["total_sequence_length", axis1], "mr_total1")], "mr_used", to=7)
        cache = p.node("Gather", [p.node("Shape", ["past_key.0"], "mr_kv_shape"),
                                  p.const("mr_axis2", [2], np.int64)], "mr_cache", axis=0)
        room = p.node("Min", [p.node("Sub", [cache, used], "mr_room"), p.const("mr_one", [1], np.int64)],
                      "mr_room1")
        extra64 = p.node("Mul", [room, single], "mr_extra64")
    start = p.node("Sub", [rows, extra64], "mr_start")  # the copied rows: [start, rows), empty when none
    return axis1, rows, extra64, start


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

    p = _Prelude(graph)
    const, node, prelude = p.const, p.node, p.nodes
    axis1, rows, extra64, start = _copied_rows(p, primary, needs_slot=ort)

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


def pad_one_row_attention(model: onnx.ModelProto) -> bool:
    """Rewrite an `ort`-flavour shallow or deep piece in place so each GroupQueryAttention sees at least two
    query rows, leaving every other op at the call's own rows; False (unchanged) for a graph without GQA.

    Where the weight MatMul kernels round a one-row call as they round a row of a multi-row call (checked
    at load by runtime/row_padding.py), GQA's probabilities x V product (MLAS's GEMV) is the one place
    where a one-row call leaves verification's arithmetic, and padding only there keeps every weight MatMul
    and the LM head at one row in plain decoding. The copy is made as in pad_one_row_calls: it takes the
    next position and cache slot, or nothing when the cache is full."""
    graph = model.graph
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    inputs = {i.name for i in graph.input}
    if not attention or not {"past_key.0", "seqlens_k", "total_sequence_length"} <= inputs:
        return False
    primary = next(n for n in ("hidden_in", "input_ids") if n in inputs)
    p = _Prelude(graph)
    const, node, prelude = p.const, p.node, p.nodes
    axis1, rows, extra64, start = _copied_rows(p, primary, needs_slot=True)
    extra = node("Cast", [node("Reshape", [extra64, const("mr_scalar", [], np.int64)], "mr_extra_s")],
                 "mr_extra", to=6)
    seqlens = node("Add", ["seqlens_k", extra], "mr_seqlens")
    total = node("Add", ["total_sequence_length", extra], "mr_total")
    positions = node("Concat", ["position_ids", node("Add", [
        node("Slice", ["position_ids", start, rows, axis1], "mr_pos_last"), const("mr_step", 1, np.int64)],
        "mr_pos_next")], "mr_positions", axis=1)
    pads = node("Concat", [const("mr_pads0", [0] * 6, np.int64), extra64, extra64], "mr_pads", axis=0)
    zero = const("mr_zero", [0], np.int64)
    # the rows each GQA reads, [0, rows) and the copy when there is one: one Gather a layer rather than a
    # Slice and a Concat (every node costs a one-token call a few microseconds besides its work)
    last = node("Sub", [rows, const("mr_one_row", [1], np.int64)], "mr_last_row")
    gqa_rows = node("Reshape", [node("Add", [rows, extra64], "mr_gqa_rows"), "mr_scalar"], "mr_gqa_rows_s")
    wanted = node("Range", [const("mr_zero_s", 0, np.int64), gqa_rows, const("mr_one_s", 1, np.int64)],
                  "mr_gqa_range")
    gathered = node("Min", [wanted, last], "mr_gqa_index")
    biases: dict[str, str] = {}  # each distinct bias (a sliding window's is another), padded once
    rewritten: list[onnx.NodeProto] = []
    for i, gqa in enumerate(graph.node):
        if gqa.op_type != "GroupQueryAttention":
            rewritten.append(gqa)
            continue
        for j in range(3):  # packed qkv, or q, k and v apart (models with q/k norms)
            if j < len(gqa.input) and gqa.input[j]:
                rewritten.append(helper.make_node("Gather", [gqa.input[j], gathered], [f"mr_in_{i}_{j}"],
                                                  name=f"mr_in_{i}_{j}", axis=1))
                gqa.input[j] = f"mr_in_{i}_{j}"
        out = gqa.output[0]
        gqa.input[5], gqa.input[6], gqa.output[0] = seqlens, total, f"mr_attn_{i}"
        if len(gqa.input) > 9 and gqa.input[9]:
            gqa.input[9] = positions
        if len(gqa.input) > 10 and gqa.input[10]:
            # a zero row and column for the copy: its output is dropped, and GQA's causal mask hides its key
            bias = gqa.input[10]
            if bias not in biases:
                biases[bias] = f"mr_bias_{len(biases)}"
                rewritten.append(helper.make_node("Pad", [bias, pads], [biases[bias]], name=biases[bias],
                                                  mode="constant"))
            gqa.input[10] = biases[bias]
        rewritten.append(gqa)
        rewritten.append(helper.make_node("Slice", [f"mr_attn_{i}", zero, rows, axis1], [out],
                                          name=f"mr_trim_{i}"))
    del graph.node[:]
    graph.node.extend(prelude + rewritten)
    return True


PADDINGS = ("piece", "attention", "none")


def padding_for(precision: str, flavour: str, asked: str | None = None, kv_int8: bool = False) -> str:
    """Which one-row calls a build pads: `piece` (every op of shallow and deep, pad_one_row_calls) or
    `attention` (GroupQueryAttention alone, pad_one_row_attention). The `ort` flavour takes `attention`:
    whether its weight MatMuls round a one-row call as a row of many depends on the machine that runs it
    (MLAS's int4 kernels did not on one x86 CPU and do on another: docs/journal/2026-11-25.md), so the runtime checks
    that at load and pads one-row calls itself where they do not (runtime/row_padding.py), and plain
    decoding keeps one-row weight MatMuls wherever they are exact. The standard flavour (TensorRT engines,
    whose kernels cannot be probed before a GPU runs them) takes `piece`. A recipe's [export]
    one_row_padding overrides the choice; `none` leaves all of it to the runtime's check. Pieces whose caches
    are int8 (exporter/kv_cache.py) take `none`: their attention rounds a one-row call as a row of many."""
    if asked is not None:
        if asked not in PADDINGS:
            raise SpecExportError(f"recipe [export] one_row_padding is {asked!r}; use one of {', '.join(PADDINGS)}")
        if asked != "piece" and flavour != "ort":
            raise SpecExportError(f"recipe [export] one_row_padding = {asked!r} needs the 'ort' graph flavour,"
                                  " whose one-row calls the runtime checks at load; drop it or build with"
                                  " --flavour ort")
        return asked
    if flavour != "ort":
        return "piece"
    return "none" if kv_int8 else "attention"
