"""Token rows read from the LM head: where a model ties its embedding to its LM head, the pieces that embed tokens
(shallow, the drafter, the draft head) gather their rows from tensors laid out exactly as `deep`'s LM head stores
them, so that `shared_weights.share_identical` keeps one copy of the table per bundle.

- A float table ([hidden, vocab], the MatMul's weight): a Gather along the vocabulary axis and a Transpose back.
- A quantized table in the row-invariant matmul's layout (`exporter/row_matmul.py`: columns in tiles of 8, each
  tile's blocks of codes, then per (tile, block, column) one scale and one zero point): specexport's
  GatherRowsNBits (native/row_gather.cc) rebuilds each token's row as (code - zero point) * scale, the very
  values the LM head multiplies by, in one node (a subgraph of ONNX ops doing the same cost int4 AR about 4% in
  dispatch). A row is then rounded as the LM head is (int4 where the bundle is int4), not in 8 bits as a table
  of its own would be.

MatMulNBits' own layout (`--matmul mlas`) keeps the pieces' own 8-bit rows (`quantize._quantize_embedding`):
its packed weights are a 3-D tensor whose flat view would be a copy at load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..runtime import attention_op
from . import quantize, row_matmul

TABLE = quantize.EMBED  # the Gather's table in the pieces llama_graph builds
ROWS = "tied_rows"  # the float rows' tensor: named apart so the quantizer never takes it for a table of its own
OP_TYPE = attention_op.GATHER_ROWS_OP_TYPE


def _gather_node(graph: onnx.GraphProto, table: str) -> onnx.NodeProto | None:
    users = [n for n in graph.node if table in n.input]
    node = users[0] if len(users) == 1 else None
    if node is None or node.op_type != "Gather" or node.input[0] != table:
        return None
    return node if all(a.name != "axis" or a.i == 0 for a in node.attribute) else None


def _replace(graph: onnx.GraphProto, node: onnx.NodeProto, nodes: list, tensors: list, table: str) -> None:
    at = list(graph.node).index(node)
    graph.node.remove(node)
    for offset, new in enumerate(nodes):
        graph.node.insert(at + offset, new)
    kept = [t for t in graph.initializer if t.name != table]
    del graph.initializer[:]
    graph.initializer.extend([*kept, *tensors])


def read_rows_from_lm_head(model: onnx.ModelProto, table: str = TABLE) -> bool:
    """Rewrites the float Gather of rows of `table` ([vocab, hidden]) into a Gather along axis 1 of its
    transpose ([hidden, vocab], as the LM head's MatMul stores a tied table) followed by a Transpose back to
    [batch, seq, hidden]: the same values, from a tensor `share_identical` can then store once. False where the
    graph has no such Gather."""
    g = model.graph
    init = next((t for t in g.initializer if t.name == table), None)
    node = _gather_node(g, table)
    if init is None or node is None or init.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
        return False
    if len(init.dims) != 2:
        return False
    transposed = numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(init).T), ROWS)
    name = node.name or table
    gathered = node.output[0] + "_by_hidden"
    nodes = [helper.make_node("Gather", [ROWS, node.input[1]], [gathered], axis=1, name=name + "_by_hidden"),
             helper.make_node("Transpose", [gathered], [node.output[0]], perm=[1, 2, 0], name=name + "_rows")]
    _replace(g, node, nodes, [transposed], table)
    return True


@dataclass(frozen=True)
class RowwiseRows:
    """A tied table as `deep`'s LM head holds it in the row-invariant matmul's layout: the LM head weight
    ([hidden, vocab]) and the spec the bundle rounds it with."""

    lm_head: np.ndarray
    spec: quantize.QuantSpec

    @staticmethod
    def fits(hidden: int, spec: quantize.QuantSpec) -> bool:
        """Whether rows `hidden` wide cut into the LM head's whole blocks (the layout pads no row here)."""
        head = spec.for_lm_head()
        return spec.lm_head and hidden % head.block_size == 0 and head.block_size % row_matmul.CHUNK == 0

    def tensors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(codes, scales, zero points), flat, byte for byte what `row_matmul.use_rowwise` gives `deep`."""
        head = self.spec.for_lm_head()
        k, n = self.lm_head.shape
        pw = quantize.quantize_weight(self.lm_head, head)
        return row_matmul.repack(pw.packed, pw.scales, pw.zero_points, k, n, head.bits, head.block_size)

    def rounded(self) -> np.ndarray:
        """The rows [vocab, hidden] the rewritten graph yields, for the PyTorch reference."""
        return quantize.fake_quantize(self.lm_head, self.spec.for_lm_head()).T.copy()

    def apply(self, model: onnx.ModelProto, table: str = TABLE) -> bool:
        """Rewrites the Gather of `table` in `model` into specexport's GatherRowsNBits over the LM head's tensors
        (native/row_gather.cc); False where the graph has no such Gather."""
        node = _gather_node(model.graph, table)
        if node is None:
            return False
        head = self.spec.for_lm_head()
        k, n = self.lm_head.shape
        names = [f"{ROWS}_q{head.bits}", f"{ROWS}_scales", f"{ROWS}_zero_points"]
        tensors = [numpy_helper.from_array(a, name) for a, name in zip(self.tensors(), names, strict=True)]
        attrs = {"K": k, "N": n, "bits": head.bits, "block_size": head.block_size}
        if head.bits == 4:
            attrs["packing"] = row_matmul.PACKING
        gather = helper.make_node(OP_TYPE, [node.input[1], *names], list(node.output), domain=attention_op.DOMAIN,
                                  name=(node.name or table) + "_rows", **attrs)
        _replace(model.graph, node, [gather], tensors, table)
        if not any(o.domain == attention_op.DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(attention_op.DOMAIN, 1))
        return True


def rows_for(lm_head: np.ndarray | None, spec: quantize.QuantSpec | None, matmul: str) -> RowwiseRows | None:
    """The quantized reader of a tied table for a bundle whose `deep` rounds its LM head with `spec` through
    `matmul`, or None where the pieces keep rows of their own (MatMulNBits' layout, an fp32 LM head, rows that
    do not cut into its blocks); float bundles use `read_rows_from_lm_head`."""
    if lm_head is None or spec is None or matmul != "rowwise" or not RowwiseRows.fits(lm_head.shape[0], spec):
        return None
    return RowwiseRows(lm_head, spec)
