"""`full`: the output path's two pieces, shallow and deep, joined into one graph.

Plain decoding and verification call the target model as a whole: through shallow and deep that is two
session calls a step, each with its own one-row prelude (exporter/multirow.py), and at int4 and int8 the
second call costs 4-6% of a token on a 2-core CPU (BENCHMARKS.md, 2026-11-26). `full` is the same nodes in one
graph: shallow's, then deep's fed shallow's `hidden`, which stays an output (the early exit drafting reads).
Its caches are shallow's followed by deep's, renumbered; the control inputs are shared.

The graph stores no weights of its own: its initializers keep their places in shallow.onnx.data and
deep.onnx.data, so the bundle does not grow on disk. The runtime opens `full` instead of `deep` and opens
shallow only when a drafter needs the early exit, so the weights are held once (runtime/session.py).
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper

CACHE_PREFIXES = ("past_key.", "past_value.", "present_key.", "present_value.")
SHARED = {"position_ids", "attention_bias", "seqlens_k", "total_sequence_length", "logits_to_keep", "logits"}


def shifted(name: str, by: int) -> str | None:
    """A cache tensor's name with its layer index moved by `by`; None for any other name."""
    for prefix in CACHE_PREFIXES:
        if name.startswith(prefix):
            return f"{prefix}{int(name[len(prefix):]) + by}"
    return None


def join_target(shallow: onnx.ModelProto, deep: onnx.ModelProto, exit_layer: int) -> onnx.ModelProto:
    """One graph of shallow's nodes and then deep's: deep's caches numbered after shallow's `exit_layer`,
    its `hidden_in` fed by shallow's `hidden`, its other tensors and nodes prefixed `deep/` (both pieces
    have their own prelude constants), the control inputs and `logits` shared."""

    def rename(name: str) -> str:
        if not name or name in SHARED:
            return name
        if name == "hidden_in":
            return "hidden"
        return shifted(name, exit_layer) or f"deep/{name}"

    for node in deep.graph.node:
        node.name = f"deep/{node.name}"
        node.input[:] = [rename(x) for x in node.input]
        node.output[:] = [rename(x) for x in node.output]
    for tensor in [*deep.graph.initializer, *deep.graph.value_info, *deep.graph.input, *deep.graph.output]:
        tensor.name = rename(tensor.name)
    names = {i.name for i in shallow.graph.input}
    inputs = [*shallow.graph.input, *(i for i in deep.graph.input if i.name not in names and i.name != "hidden")]
    outputs = [*(o for o in shallow.graph.output if o.name != "hidden"), *deep.graph.output,
               *(o for o in shallow.graph.output if o.name == "hidden")]
    graph = helper.make_graph([*shallow.graph.node, *deep.graph.node], "full", inputs, outputs,
                              [*shallow.graph.initializer, *deep.graph.initializer])
    opsets = {o.domain: o for o in [*deep.opset_import, *shallow.opset_import]}
    return helper.make_model(graph, opset_imports=list(opsets.values()), ir_version=shallow.ir_version)


def full_model(root: Path, exit_layer: int) -> onnx.ModelProto:
    """`full` from ROOT's shallow.onnx and deep.onnx, its weights left where their data files hold them (save
    it beside them without external-data conversion)."""
    shallow, deep = (onnx.load(str(root / name), load_external_data=False) for name in ("shallow.onnx", "deep.onnx"))
    return join_target(shallow, deep, exit_layer)
