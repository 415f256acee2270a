"""The in-place KV-cache form of the standard-flavour pieces, for TensorRT versions that parse TensorScatter.

The standard flavour writes new keys/values with ScatterElements and returns the whole cache as a new tensor,
so TensorRT needs two buffers per cache whose roles swap after every call (binding one buffer as both input
and output gives wrong results in TensorRT). ONNX's TensorScatter (opset 24) is the same update
written so that TensorRT 10.15+ imports it as its KV-cache update layer, whose output must share the input
cache's memory: one buffer per cache, updated in place.

The rewrite works on a finished standard-flavour graph: convert it to opset 24, replace each cache write by
``TensorScatter(past, new, write_index)`` (``write_index`` = each sequence's first position id: the runtime
always calls a piece on consecutive positions), drop what only fed the old index computation, and fix the
cache length (TensorRT needs a static sequence dimension on an in-place cache). ONNX Runtime runs the result
too (its TensorScatter copies when it cannot work in place), so the usual parity check covers it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from ...runtime.errors import SpecExportError

INPLACE_OPSET = 24  # TensorScatter's opset
WRITE_INDEX = "kv_write_index"


def _cache_writes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    return [n for n in graph.node if n.op_type == "ScatterElements" and n.input[0].startswith("past_")]


def is_inplace(model: onnx.ModelProto) -> bool:
    """True when the graph writes its caches with TensorScatter (the in-place form)."""
    return any(n.op_type == "TensorScatter" for n in model.graph.node)


def _prune(graph: onnx.GraphProto) -> None:
    """Drop nodes whose outputs nothing reads, then initializers nothing reads (repeat until stable)."""
    outputs = {o.name for o in graph.output}
    while True:
        used = outputs | {i for n in graph.node for i in n.input if i}
        dead = [n for n in graph.node if not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    used = {i for n in graph.node for i in n.input if i}
    for t in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(t)


def _fix_cache_len(values, context: int) -> None:
    for v in values:
        if v.name.startswith(("past_", "present_")):
            dim = v.type.tensor_type.shape.dim[2]
            dim.Clear()
            dim.dim_value = context


def inplace_kv(model: onnx.ModelProto, context: int) -> onnx.ModelProto:
    """The TensorScatter (in-place) form of a standard-flavour piece whose caches hold ``context`` positions."""
    if is_inplace(model):
        return model
    if not _cache_writes(model.graph):
        raise SpecExportError(f"graph {model.graph.name!r} has no standard-flavour cache writes (ScatterElements on"
                              " past_*) to turn into in-place updates; export it with --flavour standard")
    if "position_ids" not in {i.name for i in model.graph.input}:
        raise SpecExportError(f"graph {model.graph.name!r} has no position_ids input to take write positions from")
    out = version_converter.convert_version(model, INPLACE_OPSET)
    graph = out.graph
    zero = "kv_write_axis_pos"
    graph.initializer.append(numpy_helper.from_array(np.asarray(0, dtype=np.int64), zero))
    # each sequence's first position: TensorScatter writes the update at write_index .. write_index + seq - 1
    index = helper.make_node("Gather", ["position_ids", zero], [WRITE_INDEX], name="kv_write_index", axis=1)
    rewritten = [index]
    for node in graph.node:
        if node.op_type == "ScatterElements" and node.input[0].startswith("past_"):
            node = helper.make_node("TensorScatter", [node.input[0], node.input[2], WRITE_INDEX], list(node.output),
                                    name=f"kv_update.{node.output[0]}", axis=-2, mode="linear")
        rewritten.append(node)
    del graph.node[:]
    graph.node.extend(rewritten)
    _prune(graph)
    _fix_cache_len(graph.input, context)
    _fix_cache_len(graph.output, context)
    del graph.value_info[:]  # stale after the rewrite; shape inference recomputes what it needs
    out.ir_version = max(out.ir_version, helper.find_min_ir_version_for(list(out.opset_import)))
    return out
