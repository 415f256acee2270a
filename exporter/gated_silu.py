"""The gated MLP's SiLU(gate) * up as one node where specexport's operator library is in use.

A SiLU MLP exported with one [gate; up] matmul reads: matmul -> Split into halves -> Mul(gate, Sigmoid(gate)),
then Mul with up. ONNX Runtime runs that as three small nodes (Split, QuickGelu, Mul) per layer, and in a
one-token decode step their dispatch costs more than their arithmetic. `fold_chains` finds the chain behind a
matmul; the rowwise matmul takes it into its epilogue (exporter/row_matmul.py), and `use_gated_silu` puts any
other matmul's chain (float MatMul, MatMulNBits) into one `specexport.GatedSiLU` node (native/gated_silu.cc).
Only graphs that need the library already get it, so a bundle's needs do not change. GELU's chain stays.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import helper, numpy_helper

from ..runtime import attention_op

Fold = Callable[[onnx.NodeProto, onnx.NodeProto, list[onnx.NodeProto]], onnx.NodeProto | None]


def _split_halves(node: onnx.NodeProto, graph: onnx.GraphProto, n: int | None) -> bool:
    """Whether `node` splits its input's last axis (of `n` values) into two equal halves."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if len(node.output) != 2 or attrs.get("axis", 0) != -1 or n is None or n % 2:
        return False
    if len(node.input) < 2 or not node.input[1]:
        return attrs.get("num_outputs", 2) == 2  # no sizes: equal parts
    sizes = next((t for t in graph.initializer if t.name == node.input[1]), None)
    return sizes is not None and numpy_helper.to_array(sizes).tolist() == [n // 2, n // 2]


def _only(readers: dict[str, list[onnx.NodeProto]], name: str, node: onnx.NodeProto) -> bool:
    return [id(n) for n in readers.get(name, [])] == [id(node)]


def _silu_mul(split: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]]) -> list[onnx.NodeProto]:
    """The nodes Sigmoid(gate), Mul(gate, Sigmoid), Mul(that, up) when `split`'s outputs feed exactly them and
    nothing else reads gate, up or the products; else []."""
    gate, up = split.output
    gate_readers, up_readers = readers.get(gate, []), readers.get(up, [])
    sigmoid = next((n for n in gate_readers if n.op_type == "Sigmoid"), None)
    act = next((n for n in gate_readers if n.op_type == "Mul"), None)
    if len(gate_readers) != 2 or sigmoid is None or act is None or len(up_readers) != 1:
        return []
    out = up_readers[0]
    if sorted(act.input) != sorted([gate, sigmoid.output[0]]) or not _only(readers, sigmoid.output[0], act):
        return []
    if out.op_type != "Mul" or sorted(out.input) != sorted([act.output[0], up]):
        return []
    if not _only(readers, act.output[0], out):
        return []
    return [sigmoid, act, out]


def fold_chains(model: onnx.ModelProto, width: Callable[[onnx.NodeProto], int | None], fold: Fold) -> int:
    """For each node whose output (`width(node)` values wide; None: not a source) feeds only a Split into halves
    and the SiLU chain, and nothing else reads the intermediate values: `fold(node, split, chain)` rewires the
    graph to compute the chain's output and returns a node to stand in the Split's place (or None), and the
    Split and the chain go, with what only they read. Returns how many were folded."""
    graph = model.graph
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in set(node.input):
            readers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    dropped: set[int] = set()
    standing: dict[int, onnx.NodeProto] = {}
    gone: set[str] = set()
    count = 0
    for node in list(graph.node):
        n = width(node)
        if n is None or node.output[0] in graph_outputs:
            continue
        after = readers.get(node.output[0], [])
        if len(after) != 1 or after[0].op_type != "Split" or not _split_halves(after[0], graph, n):
            continue
        split = after[0]
        chain = _silu_mul(split, readers)
        if not chain or any(o in graph_outputs for n in (split, *chain[:2]) for o in n.output):
            continue
        stand_in = fold(node, split, chain)
        if stand_in is None:
            dropped.add(id(split))
        else:
            standing[id(split)] = stand_in
        dropped.update(id(n) for n in chain)
        gone.update(o for n in (split, *chain[:2]) for o in n.output)
        gone.update(split.input)  # the matmul's old output and the split sizes, unless still read
        count += 1
    if not count:
        return 0
    kept = [standing.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    gone -= {name for node in graph.node for name in (*node.input, *node.output)} | graph_outputs
    inits = [t for t in graph.initializer if t.name not in gone]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    info = [v for v in graph.value_info if v.name not in gone]
    del graph.value_info[:]
    graph.value_info.extend(info)
    return count


def _matmul_width(graph: onnx.GraphProto) -> Callable[[onnx.NodeProto], int | None]:
    shapes = {t.name: list(t.dims) for t in graph.initializer}

    def width(node: onnx.NodeProto) -> int | None:
        if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(shapes.get(node.input[1], [])) == 2:
            return shapes[node.input[1]][1]
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            return next((a.i for a in node.attribute if a.name == "N"), None)
        return None

    return width


def use_gated_silu(model: onnx.ModelProto) -> int:
    """Replaces each float MatMul's or MatMulNBits's SiLU chain with a GatedSiLU node; returns how many."""
    def fold(node: onnx.NodeProto, split: onnx.NodeProto, chain: list[onnx.NodeProto]) -> onnx.NodeProto:
        return helper.make_node(attention_op.GATED_OP_TYPE, [node.output[0]], [chain[-1].output[0]],
                                name=f"{split.name}_gated_silu", domain=attention_op.DOMAIN)

    count = fold_chains(model, _matmul_width(model.graph), fold)
    if count and not any(o.domain == attention_op.DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(attention_op.DOMAIN, 1))
    return count
