"""TensorRT's rules for a quantized graph's QuantizeLinear and DequantizeLinear nodes, checked per node.

The rules are data (`quantization` in recipes/data/trt_ops.json, from TensorRT's documentation): quantization is
symmetric, so a zero point must be a constant of zeros with the scale's shape and the quantized type; a scale is
a build-time constant, strictly positive, and a scalar (per tensor), a 1-D tensor as long as the axis (per
channel) or a tensor of the input's rank (per block); INT4 is weight-only (a DequantizeLinear of a constant) and
always per block, in blocks of 64 or 128 along one of the last two axes; INT4 initializers pack two values a byte.
"""

from __future__ import annotations

import numpy as np
import onnx

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _shape(g, name: str) -> list | None:
    """Known dims of a value (an initializer's, or inferred), None where unknown."""
    if name in g.initializers:
        return list(g.initializers[name].dims)
    value = g.value(name) if name in g.constant_nodes else None
    return list(np.shape(value)) if value is not None else g.shapes.get(name)


def packed_bytes_ok(tensor: onnx.TensorProto) -> bool:
    """An INT4 initializer holds ceil(n / 2) bytes (two values a byte, ONNX's packing)."""
    n = int(np.prod(tensor.dims, dtype=np.int64))
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        length = next((int(e.value) for e in tensor.external_data if e.key == "length"), None)
        return length is None or length == (n + 1) // 2
    return not tensor.raw_data or len(tensor.raw_data) == (n + 1) // 2


def qdq_failures(node: onnx.NodeProto, g, rules: dict, type_names: dict) -> list[tuple[str, str]]:
    """(severity, reason) for each rule the Q/DQ `node` breaks; `g` is the checker's view of its graph."""
    failures: list[tuple[str, str]] = []
    dq = node.op_type == "DequantizeLinear"
    x, scale = node.input[0], node.input[1] if len(node.input) > 1 else ""
    zero = node.input[2] if len(node.input) > 2 else ""
    quantized = x if dq else (zero or "")
    qtype = type_names.get(str(g.types.get(quantized or node.output[0], 0)))
    if scale not in g.foldable:
        failures.append(("error", f"its scale {scale!r} is computed at run time; TensorRT needs a build-time constant"))
    else:
        s = g.value(scale)
        if s is not None and not np.all(np.asarray(s, dtype=np.float64) > 0):
            failures.append(("error", f"its scale {scale!r} has values that are not strictly positive"))
    if zero:
        z = g.value(zero) if zero in g.foldable else None
        if z is None:
            failures.append(("error", f"its zero point {zero!r} is not a build-time constant"))
        elif np.any(np.asarray(z) != 0):
            failures.append(("error", f"its zero point {zero!r} is not all zeros (TensorRT quantizes symmetrically)"))
        elif _shape(g, zero) != _shape(g, scale):
            failures.append(("error", f"its zero point {zero!r} has another shape than its scale"))
    x_shape, s_shape = _shape(g, x), _shape(g, scale)
    block = _attr(node, "block_size", 0)
    axis = _attr(node, "axis", 1)
    rank = len(x_shape) if x_shape is not None else None
    blocked = block > 0 or (rank is not None and s_shape is not None and len(s_shape) == rank and rank > 1)
    if not dq and qtype in rules["weight_only_types"]:
        failures.append(("error", f"it quantizes to {qtype}, which TensorRT takes for weights only (a"
                                  " DequantizeLinear of a constant)"))
    if dq and qtype in rules["weight_only_types"] and x not in g.foldable:
        failures.append(("error", f"it dequantizes {qtype} activations; TensorRT takes {qtype} for weights only"))
    if qtype == "INT4" and not blocked:
        failures.append(("error", "its INT4 scales are per tensor or per channel; TensorRT's INT4 needs per-block"
                                  " scales"))
    if blocked and rank is not None:
        axis = axis % rank
        if qtype not in rules["block_types"]:
            failures.append(("error", f"it is block-quantized {qtype}; TensorRT blocks"
                                      f" {', '.join(rules['block_types'])}"))
        if rank - axis not in rules["block_axes_from_end"]:
            failures.append(("error", f"its blocks run along axis {axis} of {rank}; TensorRT blocks one of the last"
                                      " two"))
        if qtype == "INT4" and block not in rules["int4_block_sizes"]:
            failures.append(("error", f"its INT4 blocks are {block} values; TensorRT takes blocks of"
                                      f" {' or '.join(map(str, rules['int4_block_sizes']))}"))
        dim = x_shape[axis] if isinstance(x_shape[axis], int) else None
        if block > 0 and dim is not None and dim % block:
            failures.append(("error", f"its blocks of {block} do not divide axis {axis} ({dim} values)"))
        elif block > 0 and s_shape is not None and dim is not None and all(isinstance(d, int) for d in x_shape):
            want = [d // block if i == axis else d for i, d in enumerate(x_shape)]
            if list(s_shape) != want:
                failures.append(("error", f"its scale has shape {list(s_shape)}, not {want} for blocks of {block}"
                                          f" along axis {axis}"))
    elif s_shape is not None and len(s_shape) == 1 and rank is not None and isinstance(x_shape[axis % rank], int) \
            and s_shape[0] != x_shape[axis % rank]:
        failures.append(("error", f"its per-channel scale has {s_shape[0]} values for an axis of"
                                  f" {x_shape[axis % rank]}"))
    if qtype == "INT4" and x in g.initializers and not packed_bytes_ok(g.initializers[x]):
        failures.append(("error", f"its INT4 weights {x!r} are not packed two values a byte"))
    return failures
