"""The device memory a TensorRT plan needs, per piece, against the target's memory.

Each engine holds its own weights in device memory, so a tensor the bundle stores once on disk (a tied table
read by two pieces, exporter/shared_weights.py) counts once per engine that reads it. The KV caches are
preallocated at the planned context (two buffers each where the binding swaps them), and the largest output
of a call, the logits of `verify_max` rows, is bound once per piece. What is left out, and said so: the
activations TensorRT allocates per profile (a long prefill's attention scores) and the builder's workspace,
which only the build takes. A unified-memory Jetson shares its memory with the system: the target's
`[memory] system_gib` is what the OS and its programs keep.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.external_data_helper import ExternalDataInfo

from ...runtime.errors import SpecExportError
from ...runtime.manifest import Piece

GIB = 2**30


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """A weight's size, read from its external-data record or its dims (its bytes need not be loaded)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        length = ExternalDataInfo(tensor).length
        if length:
            return int(length)
    if tensor.raw_data:
        return len(tensor.raw_data)
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of every initializer and constant a piece's graph holds (an engine holds them all)."""
    total = sum(tensor_bytes(t) for t in model.graph.initializer)
    for node in model.graph.node:
        total += sum(tensor_bytes(a.t) for a in node.attribute if a.type == onnx.AttributeProto.TENSOR)
    return total


def cache_bytes(spec: Piece, context: int, batch: int, swap: bool) -> int:
    """The piece's KV caches at `context` positions and `batch` rows, two buffers each when they swap."""
    total = 0
    for t in spec.inputs:
        if t.name.startswith(("past_key", "past_value")):
            _, heads, _, head_dim = t.shape
            total += batch * int(heads) * context * int(head_dim) * np.dtype(t.dtype).itemsize
    return total * (2 if swap else 1)


def logits_bytes(spec: Piece, rows: int, batch: int) -> int:
    out = next((t for t in spec.outputs if t.name == "logits"), None)
    return 0 if out is None else batch * rows * int(out.shape[-1]) * np.dtype(out.dtype).itemsize


def plan_memory(models: dict[str, onnx.ModelProto], pieces: dict[str, Piece], plan: dict, target: dict,
                context: int) -> dict:
    """Per piece (`models`: its graph, loaded without its weights) its weights, caches and logits buffer, the total,
    and the device memory left for it; refuses, in one sentence, a plan whose total does not fit."""
    build, memory = target["build"], target["memory"]
    batch, rows = build["max_batch"], build["verify_max"]
    per_piece = {}
    for name, spec in pieces.items():
        swap = plan[name]["kv"]["mode"] == "swap"
        per_piece[name] = {"weights": weight_bytes(models[name]), "kv_caches": cache_bytes(spec, context, batch, swap),
                           "logits": logits_bytes(spec, rows, batch)}
    total = sum(sum(p.values()) for p in per_piece.values())
    device = float(memory.get("total_gib", 0)) * GIB
    system = float(memory.get("system_gib", 0)) * GIB
    report = {"pieces": per_piece, "total": total, "context": context, "device": int(device),
              "system": int(system), "left": int(device - system - total) if device else None,
              "not_counted": "activations per profile (a long prefill's attention scores) and the build's workspace"}
    if device and total > device - system:
        raise SpecExportError(
            f"the engines of this bundle need {total / GIB:.2f} GiB at {context} tokens (weights and KV caches),"
            f" more than the {(device - system) / GIB:.2f} GiB target {target['name']} has beside its system;"
            " build a smaller context (--context) or fewer drafting pieces")
    return report


def describe_memory(report: dict) -> list[str]:
    """The plan's memory as lines a user reads (MB of 10^6 bytes, as `du` and the engine list print)."""
    lines = []
    for name, p in report["pieces"].items():
        lines.append(f"  {name}: weights {p['weights'] / 1e6:.1f} MB, KV caches {p['kv_caches'] / 1e6:.1f} MB,"
                     f" logits {p['logits'] / 1e6:.1f} MB")
    total = f"  total {report['total'] / 1e6:.1f} MB at {report['context']} tokens"
    if report["device"]:
        total += (f", of {report['device'] / GIB:.1f} GiB ({report['system'] / GIB:.1f} kept by the system):"
                  f" {report['left'] / GIB:.2f} GiB left for activations")
    return [*lines, total + f" (not counted: {report['not_counted']})"]
