"""Which int4/int8 matmul the quantized `ort` pieces run: ONNX Runtime's MatMulNBits (`mlas`) or specexport's
row-invariant operator (`rowwise`, native/row_matmul.cc).

Where a CPU's MatMulNBits rounds a one-row call otherwise than a row of a many-row call (MLAS's int4 kernels on
AVX2 without VNNI), the runtime pads every one-token call to two rows (runtime/row_padding.py). The rowwise
operator computes each row alone in a fixed order, with the activations quantized to int8 per block as
MatMulNBits's accuracy level 4 does, so one-row calls need no padding. The pieces are quantized as for `mlas`
(exporter/quantize.py), then each MatMulNBits node is rewritten into the operator with its weights repacked into
the operator's own layout: columns in tiles of 8, one AVX2 register of accumulators (the layout is described at
the top of native/row_matmul.cc). A SiLU MLP's [gate; up] matmul then takes the Split, SiLU and Mul that follow it
into its epilogue (gated = "silu"): three fewer nodes per layer and no [.., 2 * intermediate] tensor between them.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..runtime import attention_op
from ..runtime.errors import SpecExportError
from . import gated_silu

MATMULS = ("mlas", "rowwise")
OP_TYPE = "RowInvariantMatMulNBits"
TILE = 8
CHUNK = 32
MAX_BLOCK = 256
PACKING = 2  # the int4 layout native/row_matmul.cc reads (its `packing` attribute)


def check_choice(matmul: str, flavour: str, precision: str, block_sizes: tuple[int, ...]) -> None:
    """Refuses, in one sentence, a matmul the build cannot honour (`block_sizes`: the layers' and LM head's)."""
    if matmul not in MATMULS:
        raise SpecExportError(f"unknown matmul {matmul!r}; use one of {', '.join(MATMULS)}")
    if matmul == "mlas":
        return
    if flavour != "ort" or precision not in ("int4", "int8"):
        raise SpecExportError(f"--matmul rowwise replaces the int4/int8 'ort' pieces' MatMulNBits; a {precision}"
                              f" {flavour!r} bundle has none: drop --matmul or build with --precision int4 or int8")
    odd = [b for b in block_sizes if b % CHUNK or b > MAX_BLOCK]
    if odd:
        raise SpecExportError(f"--matmul rowwise takes blocks of 32 to 256 values, and the recipe quantizes in blocks"
                              f" of {odd[0]}: change [export.quantize] or build with --matmul mlas")
    error = attention_op.load_error()
    if error is not None:
        raise SpecExportError(f"--matmul rowwise needs the operator to check the pieces, but {error}")


# The default per precision, from side-by-side measurements on x86 (BENCHMARKS.md): at int4 MLAS's AVX2 kernel
# rounds a one-row call otherwise than a row of many (so the session pads AR's calls) and the operator is faster
# than it even at one row; at int8 MLAS's one-row calls round alike, and the operator is faster at every row count.
DEFAULTS = {"int4": "rowwise", "int8": "rowwise"}


def choose(asked: str | None, flavour: str, precision: str, specs: tuple) -> tuple[str, str | None]:
    """The build's matmul: `asked` (checked), else DEFAULTS' for the `ort` flavour's quantized pieces where the
    recipe's quantization suits the operator and it loads, else `mlas`; and, where the default fell back for want
    of the library, one sentence why. `specs`: the pieces' QuantSpecs (None where a piece is float)."""
    blocks = tuple(b for s in specs if s is not None for b in (s.block_size, s.for_lm_head().block_size))
    if asked is not None:
        check_choice(asked, flavour, precision, blocks)
        return asked, None
    if flavour != "ort" or DEFAULTS.get(precision) != "rowwise":
        return "mlas", None
    if any(b % CHUNK or b > MAX_BLOCK for b in blocks) or any(s.accuracy_level != 4 for s in specs if s is not None):
        return "mlas", None  # a recipe's own quantization the operator does not take: MatMulNBits runs it
    error = attention_op.load_error()
    if error is None:
        return "rowwise", None
    return "mlas", f"building with ONNX Runtime's MatMulNBits (--matmul mlas): {error}"


def repack(packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, k: int, n: int, bits: int,
           block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits's weights (packed [N, blocks, block * bits / 8], scales [N * blocks], zero points packed
    like the codes or None for the mid-point) in the operator's layout: (B, scales, zero points), each flat."""
    blocks = -(-k // block)
    codes = packed.reshape(n, blocks, -1)
    if bits == 4:
        codes = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(n, blocks, -1)
    codes = codes[..., :block]
    if zero_points is None:
        zero = np.full((n, blocks), 1 << (bits - 1), dtype=np.uint8)
    elif bits == 4:
        zp = zero_points.reshape(n, -1)
        zero = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, :blocks]
    else:
        zero = zero_points.reshape(n, blocks)
    scale = scales.reshape(n, blocks).astype(np.float32)
    tiles = -(-n // TILE)
    pad = tiles * TILE - n  # padded columns: zero codes and scales, never written out
    codes = np.pad(codes, ((0, pad), (0, 0), (0, 0)))
    zero, scale = np.pad(zero, ((0, pad), (0, 0))), np.pad(scale, ((0, pad), (0, 0)))
    # [tiles, 8 columns, blocks, chunks, 32] -> [tiles, blocks, chunks, 8 columns, 32]
    chunks = codes.reshape(tiles, TILE, blocks, block // CHUNK, CHUNK).transpose(0, 2, 3, 1, 4)
    if bits == 4:
        # run p of a chunk: each column's values 8 p .. 8 p + 3 in low nibbles, 8 p + 4 .. 8 p + 7 in high ones
        by_run = chunks.reshape(*chunks.shape[:4], 4, 2, 4)
        nibbles = by_run[..., 0, :] | (by_run[..., 1, :] << 4)
        chunks = nibbles.transpose(0, 1, 2, 4, 3, 5)
    by_tile = (tiles, TILE, blocks)
    return (np.ascontiguousarray(chunks, dtype=np.uint8).reshape(-1),
            np.ascontiguousarray(scale.reshape(by_tile).transpose(0, 2, 1)).reshape(-1),
            np.ascontiguousarray(zero.reshape(by_tile).transpose(0, 2, 1), dtype=np.uint8).reshape(-1))


def use_rowwise(model: onnx.ModelProto) -> int:
    """Rewrites every MatMulNBits of `model` (its initializers in memory) in place into the rowwise operator,
    repacking its weights; returns how many."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    replaced: dict[str, onnx.TensorProto] = {}
    count = 0
    for node in graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weights = [inits.get(name) for name in node.input[1:]]
        if len(node.input) not in (3, 4) or any(w is None for w in weights) or attrs.get("bits") not in (4, 8):
            raise SpecExportError(f"MatMulNBits {node.name} has inputs or bits the rowwise matmul does not take;"
                                  " build with --matmul mlas")
        level = attrs.get("accuracy_level", 0)
        if level != 4:  # below 4, MatMulNBits keeps the activations in float
            raise SpecExportError(f"MatMulNBits {node.name} has accuracy_level {level}, and the"
                                  " rowwise matmul quantizes activations to int8 as level 4 does: set [export.quantize]"
                                  " accuracy_level = 4 or build with --matmul mlas")
        k, n, bits, block = (int(attrs[key]) for key in ("K", "N", "bits", "block_size"))
        arrays = [numpy_helper.to_array(w) for w in weights]
        b, scales, zero = repack(arrays[0], arrays[1], arrays[2] if len(arrays) == 3 else None, k, n, bits, block)
        base = node.input[1]
        names = [f"{base}_rowwise", f"{base}_rowwise_scales", f"{base}_rowwise_zero_points"]
        for name, value in zip(names, (b, scales, zero), strict=True):
            replaced[name] = numpy_helper.from_array(value, name)
        for old in node.input[1:]:
            replaced.setdefault(old, None)  # dropped, unless another node still reads it
        inputs = [node.input[0], *names]
        del node.input[:]
        node.input.extend(inputs)
        del node.attribute[:]
        fields = [("K", k), ("N", n), ("bits", bits), ("block_size", block)] + [("packing", PACKING)] * (bits == 4)
        node.attribute.extend([helper.make_attribute(key, value) for key, value in fields])
        node.op_type, node.domain = OP_TYPE, attention_op.DOMAIN
        count += 1
    if not count:
        return 0
    still_read = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if not (t.name in replaced and t.name not in still_read)]
    del graph.initializer[:]
    graph.initializer.extend(kept + [t for t in replaced.values() if t is not None])
    if not any(o.domain == attention_op.DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(attention_op.DOMAIN, 1))
    fuse_gated(model)
    return count


def fuse_gated(model: onnx.ModelProto) -> int:
    """Folds each gated MLP's Split, SiLU (Mul(g, Sigmoid(g))) and Mul with up into the rowwise operator that
    computes [gate; up] (its gated = "silu" epilogue); returns how many."""
    def width(node: onnx.NodeProto) -> int | None:
        if node.op_type != OP_TYPE or node.domain != attention_op.DOMAIN:
            return None
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return None if "gated" in attrs else int(attrs["N"])

    def fold(node: onnx.NodeProto, split: onnx.NodeProto, chain: list[onnx.NodeProto]) -> None:
        node.output[0] = chain[-1].output[0]
        node.attribute.append(helper.make_attribute("gated", "silu"))

    return gated_silu.fold_chains(model, width, fold)
