"""Weight-only int4/int8 quantization of the ORT-flavoured pieces (ONNX Runtime's MatMulNBits).

Every MatMul whose right-hand side is a weight initializer becomes a ``com.microsoft.MatMulNBits``
node: the weight is cut into blocks of ``block_size`` values along K (the reduction axis), each block
gets its own scale (and, when asymmetric, a zero point), and the codes are packed low bits first into
uint8 blobs of shape [N, k_blocks, block_size * bits / 8], as the contrib op's spec lays them out.
Activations stay fp32; ``accuracy_level=4`` lets ONNX Runtime's CPU kernel quantize them to int8 per
block and use integer dot products, which is where the speed comes from on CPUs with VNNI.

The token embedding's Gather becomes ``com.microsoft.GatherBlockQuantized`` over the same codes, rows of the
table cut into blocks along the hidden axis, 8-bit codes at either precision (`QuantSpec.for_embedding`): a
token reads one row, so an fp32 table costs little time but is the largest tensor a small model has, stored by
every piece that embeds tokens (shallow, the drafter, the draft head); in 8 bits it takes a quarter of the disk
and of a GPU's memory.

The packing is ours (onnxruntime's own `matmul_nbits_quantizer` needs `onnx_ir`, which the exporter does not
otherwise depend on). `fake_quantize` gives the rounded weights from the codes before they are
packed, so the parity check compares ONNX Runtime decoding our bytes against PyTorch running those
weights: a packing error cannot hide on both sides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..runtime.errors import SpecExportError
from .onnx_builder import MS_DOMAIN

BITS = {"int4": 4, "int8": 8}
# Chosen by teacher-forced agreement with fp32 and AR speed on SmolLM2-135M (BENCHMARKS.md, "Quantization
# and agreement with fp32"): at int4 zero points buy agreement at no
# speed cost, and blocks of 64 lose more agreement than they gain speed, so blocks of 32. At 8 bits a one-token
# call costs markedly less in blocks of 64 (fewer per-block scale steps) and zero points keep the agreement that
# the bigger blocks would lose. Blocks of 64 are the largest where MLAS still rounds an 8-bit one-row call as a
# row of a many-row call (int4: 32); beyond them a session would have to run every AR step at two rows.
# At int4, GPTQ's rounding (exporter/gptq.py) agrees with fp32 far more than each block rounded on its own, for
# the same graph and speed (BENCHMARKS.md, "Quantization and agreement with fp32").
DEFAULTS = {"int4": {"symmetric": False, "rounding": "gptq"}, "int8": {"symmetric": False, "block_size": 64}}
ROUNDINGS = ("least_squares", "gptq")
LM_HEAD = "lm_head"  # the initializer name llama_graph gives the LM head of `deep` and `adapter`
EMBED = "embed_tokens"  # ... and the token embedding of shallow, the drafter and the draft head


@dataclass(frozen=True)
class QuantSpec:
    """How a precision quantizes; `spec_for` fills in the measured defaults of each precision."""

    bits: int
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int = 4  # 4: int8 activations and integer dot products in ORT's CPU kernel
    # the LM head is a large share of the weights read per token: an fp32 head cost much of int4's AR speed for
    # the agreement that the error-minimising scales below also buy, at no cost
    lm_head: bool = True
    search: bool = True  # per block, the scale of least squared error rather than plain min-max
    # The LM head is a large share of a one-token call's MatMulNBits time, and its cost falls with the block
    # size far more than a decoder layer's does (fewer per-block scale steps across a vocabulary of outputs)
    lm_head_bits: int | None = None  # None: as the decoder layers
    lm_head_block_size: int | None = None
    kv_cache: str = "float"  # "int8": shallow's and deep's caches in int8 per channel (exporter/kv_cache.py)
    # "gptq": the target's weights rounded with error compensation over a calibration set before export
    # (exporter/gptq.py); "least_squares": each block rounded on its own
    rounding: str = "least_squares"

    def as_dict(self) -> dict:
        return {"op": "com.microsoft.MatMulNBits", **asdict(self)}

    def for_embedding(self) -> QuantSpec:
        """The token embedding's rows: 8-bit codes at either precision, in blocks of 64 with zero points (the
        int8 layers' measured defaults). A row feeds every layer, so it is rounded finely: 8-bit rows cost an
        int4 bundle a few MB over 4-bit ones, where 4-bit rows cost a random tiny model's int4 drafter a third
        of its agreement with fp32."""
        return replace(self, bits=8, block_size=64, symmetric=False, lm_head_bits=None, lm_head_block_size=None)

    def for_lm_head(self) -> QuantSpec:
        """The quantization of the LM head: the layers' own unless the recipe gives the head its own bits
        or block size (symmetric then, as 8-bit codes need no zero point to keep agreement)."""
        bits = self.lm_head_bits or self.bits
        block = self.lm_head_block_size or self.block_size
        if (bits, block) == (self.bits, self.block_size):
            return self
        symmetric = self.symmetric if bits == self.bits else bits == 8
        return replace(self, bits=bits, block_size=block, symmetric=symmetric, lm_head_bits=None,
                       lm_head_block_size=None)


def spec_for(precision: str, **overrides) -> QuantSpec | None:
    """The quantization of a precision name, None for float precisions."""
    if precision not in BITS:
        return None
    known = set(QuantSpec.__dataclass_fields__) - {"bits"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise SpecExportError(f"unknown quantization setting {', '.join(unknown)} in the recipe's [export.quantize];"
                              f" use {', '.join(sorted(known))}")
    spec = QuantSpec(bits=BITS[precision], **{**DEFAULTS[precision], **overrides})
    for key, block in (("block_size", spec.block_size), ("lm_head_block_size", spec.lm_head_block_size)):
        if block is not None and (not isinstance(block, int) or block < 16 or block & (block - 1)):
            raise SpecExportError(f"recipe [export.quantize] {key} = {block!r} is not a power of two >= 16;"
                                  " use 16, 32, 64, 128 or 256")
    if spec.rounding not in ROUNDINGS:
        raise SpecExportError(f"recipe [export.quantize] rounding = {spec.rounding!r}; use {' or '.join(ROUNDINGS)}")
    if spec.lm_head_bits not in (None, 4, 8):
        raise SpecExportError(f"recipe [export.quantize] lm_head_bits = {spec.lm_head_bits!r}; use 4 or 8")
    return spec


def drafting_precision(table: object, precision: str, flavour: str, override: str | None = None) -> str:
    """The precision of the drafting pieces (adapter, drafter): `override` (a build's int8, int4, or 'bundle' for
    the bundle's own), else the recipe's [export.drafting_precision] entry for the bundle's precision, else the
    bundle's own. Drafts only propose and verification decides, so this is a speed choice that never changes a
    bundle's output. MatMulNBits is ONNX Runtime's, so only the 'ort' flavour takes it; the others keep the
    bundle's precision."""
    if override is not None:
        if override not in ("bundle", *BITS):
            raise SpecExportError(f"drafting precision {override!r} is unknown; use bundle, int8 or int4")
        table = {} if override == "bundle" else {precision: override}
    if table is None:
        return precision
    if not isinstance(table, dict):
        raise SpecExportError("recipe [export.drafting_precision] is not a table; write it as bundle precision ="
                              ' drafting precision, such as fp32 = "int8"')
    unknown = sorted(set(table) - {"fp32", "fp16", *BITS})
    if unknown:
        raise SpecExportError(f"recipe [export.drafting_precision] names {', '.join(map(repr, unknown))}, not a"
                              " bundle precision; use fp32, fp16, int8 or int4 as keys")
    for key, value in table.items():
        if value not in BITS:
            raise SpecExportError(f'recipe [export.drafting_precision] {key} = {value!r}; use "int8" or "int4"')
    return table.get(precision, precision) if flavour == "ort" else precision

@dataclass
class PackedWeight:
    """One weight in MatMulNBits form (K, N as the MatMul B input [K, N] had them)."""

    k: int
    n: int
    packed: np.ndarray  # uint8 [N, k_blocks, blob]
    scales: np.ndarray  # float32 [N * k_blocks]
    zero_points: np.ndarray | None  # uint8, packed like the codes; None = the op's default mid-point


def quantize_weight(w: np.ndarray, spec: QuantSpec) -> PackedWeight:
    """Quantize a MatMul weight `w` of shape [K, N] block-wise along K."""
    codes, scale, zero = _quantize_blocks(w, spec)
    zero_points = None if spec.symmetric else _pack(zero[..., 0].astype(np.uint8), spec.bits).reshape(-1)
    return PackedWeight(k=w.shape[0], n=w.shape[1], packed=_pack(codes, spec.bits), scales=scale.reshape(-1),
                        zero_points=zero_points)


def _quantize_blocks(w: np.ndarray, spec: QuantSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes [N, k_blocks, block] (uint8), scales and zero points [N, k_blocks, 1] (float32) of `w` [K, N]."""
    k, n = w.shape
    bits, block = spec.bits, spec.block_size
    blocks = -(-k // block)
    wt = np.zeros((n, blocks * block), dtype=np.float32)
    wt[:, :k] = w.T  # zero padding: 0 is always a code (the zero point is an integer)
    wt = wt.reshape(n, blocks, block)
    qmax = (1 << bits) - 1
    best_scale = best_zero = best_err = None
    for scale, zero in _candidates(wt, spec):
        scale = np.where(scale == 0, np.float32(1.0), scale).astype(np.float32)  # an all-zero block
        err = np.square((np.clip(np.round(wt / scale) + zero, 0, qmax) - zero) * scale - wt).sum(-1, keepdims=True)
        if best_err is None:
            best_scale, best_zero, best_err = scale, np.broadcast_to(zero, scale.shape), err
        else:  # per block, keep the candidate with the smallest squared error
            better = err < best_err
            best_scale = np.where(better, scale, best_scale)
            best_zero = np.where(better, zero, best_zero)
            best_err = np.minimum(err, best_err)
    codes = np.clip(np.round(wt / best_scale) + best_zero, 0, qmax).astype(np.uint8)
    return codes, best_scale, best_zero.astype(np.float32)


def _candidates(wt: np.ndarray, spec: QuantSpec):
    """(scale, zero point) per block to try. Plain min-max rounding wastes range on one outlier per
    block; trying narrower (and, symmetric, slightly wider) ranges and keeping the one with the least
    squared error cuts the weight error noticeably (BENCHMARKS.md, "Measurements behind constants in the code")."""
    qmax = (1 << spec.bits) - 1
    mid = 1 << (spec.bits - 1)
    shrink = np.linspace(0.75, 1.1, 15) if spec.search else [1.0]
    if spec.symmetric:
        # the signed extreme of a block maps to -mid (code 0), so all 2^bits codes are used; the other
        # side clips at mid - 1, costing at most one step on a single value
        extreme = np.take_along_axis(wt, np.abs(wt).argmax(axis=-1)[..., None], axis=-1)
        for f in shrink:
            yield extreme / -mid * np.float32(f), np.float32(mid)
        if spec.rounding == "gptq":  # weights already on a grid: the extreme at each code, so one is the grid's
            for m in range(1, mid + 1):
                yield extreme / np.float32(-m), np.float32(mid)
                if m < mid:
                    yield extreme / np.float32(m), np.float32(mid)
        return
    ranges = [(np.minimum(wt.min(-1, keepdims=True), 0), np.maximum(wt.max(-1, keepdims=True), 0))]
    if spec.search:  # the tight range wins for blocks that do not straddle 0
        ranges.append((wt.min(-1, keepdims=True), wt.max(-1, keepdims=True)))
    # weights already on a grid (GPTQ's): a block spanning m codes is the grid's at scale (hi - lo) / m
    spans = [qmax / m for m in range(1, qmax)] if spec.rounding == "gptq" else []
    for lo, hi in ranges:
        for f in [*shrink, *spans]:
            if f > 1 and f not in spans:
                continue  # asymmetric ranges already cover every value
            scale = (hi - lo) / qmax * np.float32(f)
            safe = np.where(scale == 0, np.float32(1.0), scale)
            # centre the narrowed range on the block's, so both ends clip alike
            yield scale, np.clip(np.round(qmax / 2 - (lo + hi) / 2 / safe), 0, qmax).astype(np.float32)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack codes along the last axis, the first value in the low bits (the MatMulNBits order)."""
    if bits == 8:
        return codes
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), dtype=np.uint8)], axis=-1)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    if bits == 8:
        return packed[..., :count]
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    return codes[..., :count]


def dequantize(pw: PackedWeight, bits: int, block_size: int) -> np.ndarray:
    """The fp32 [K, N] weight MatMulNBits computes with: (code - zero point) * scale."""
    blocks = pw.packed.shape[1]
    codes = _unpack(pw.packed, bits, block_size).astype(np.float32)  # [N, blocks, block]
    if pw.zero_points is None:
        zero = np.full((pw.n, blocks), 1 << (bits - 1), dtype=np.float32)
    else:
        zero = _unpack(pw.zero_points.reshape(pw.n, -1), bits, blocks).astype(np.float32)
    w = (codes - zero[..., None]) * pw.scales.reshape(pw.n, blocks, 1)
    return w.reshape(pw.n, -1)[:, :pw.k].T.copy()


def fake_quantize(w: np.ndarray, spec: QuantSpec) -> np.ndarray:
    """`w` [K, N] rounded as the quantized graph means to store it, back in fp32. Computed from the codes
    before packing, so a packing error shows up as a parity failure instead of hiding in both sides."""
    codes, scale, zero = _quantize_blocks(w, spec)
    return ((codes - zero) * scale).reshape(w.shape[1], -1)[:, :w.shape[0]].T.copy()


def quantize_model(model: onnx.ModelProto, spec: QuantSpec) -> tuple[onnx.ModelProto, dict]:
    """Replace the weight MatMuls of an in-memory piece with MatMulNBits; returns the model and a
    summary for the manifest. The model must hold its initializers in memory (as llama_graph builds)."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    nodes: list[onnx.NodeProto] = []
    dropped: set[str] = set()
    quantized: list[str] = []
    kept: list[str] = []
    for node in graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is None or len(weight.dims) != 2 or weight.data_type != onnx.TensorProto.FLOAT:
            nodes.append(node)
            continue
        if weight.name == LM_HEAD and not spec.lm_head:
            kept.append(weight.name)
            nodes.append(node)
            continue
        if uses[weight.name] != 1:  # a shared weight would need both users rewritten; ours are not shared
            raise SpecExportError(f"weight {weight.name!r} feeds {uses[weight.name]} nodes; the quantizer expects"
                                  " one MatMul per weight, please report this model")
        wspec = spec.for_lm_head() if weight.name == LM_HEAD else spec
        pw = quantize_weight(numpy_helper.to_array(weight), wspec)
        base = weight.name
        inputs = [node.input[0], f"{base}_q{wspec.bits}", f"{base}_scales"]
        graph.initializer.append(numpy_helper.from_array(pw.packed, inputs[1]))
        graph.initializer.append(numpy_helper.from_array(pw.scales, inputs[2]))
        if pw.zero_points is not None:
            inputs.append(f"{base}_zero_points")
            graph.initializer.append(numpy_helper.from_array(pw.zero_points, inputs[3]))
        name = f"{node.name or node.output[0]}_nbits"
        nodes.append(helper.make_node("MatMulNBits", inputs, list(node.output), name=name, domain=MS_DOMAIN,
                                      K=pw.k, N=pw.n, bits=wspec.bits, block_size=wspec.block_size,
                                      accuracy_level=wspec.accuracy_level))
        dropped.add(weight.name)
        quantized.append(weight.name)
    del graph.node[:]
    graph.node.extend(nodes)
    remaining = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(remaining)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    embedded = _quantize_embedding(graph, spec) if EMBED in inits else None
    gathers = [n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in inits  # tables, not
               and inits[n.input[0]].data_type == onnx.TensorProto.FLOAT and len(inits[n.input[0]].dims) == 2]  # scales
    summary = {k: v for k, v in spec.as_dict().items() if k != "lm_head"}
    summary["matmuls_quantized"] = len(quantized)
    if LM_HEAD in inits:  # only deep and adapter carry an LM head
        summary["lm_head_quantized"] = LM_HEAD in quantized
    if embedded is not None:
        summary["embedding_quantized"] = embedded
    summary["float_weights"] = sorted(set(kept) | set(gathers))
    summary["note"] = "weight MatMuls and the token embedding; norms and RoPE tables stay fp32"
    return model, summary


def embedding_quantizable(hidden: int, spec: QuantSpec) -> bool:
    """Whether a table of rows `hidden` wide is quantized (GatherBlockQuantized takes whole blocks only)."""
    return hidden % spec.for_embedding().block_size == 0


def _quantize_embedding(graph: onnx.GraphProto, spec: QuantSpec) -> bool:
    """The token embedding's Gather as GatherBlockQuantized over the table's rows at `spec`; False where the
    rows do not cut into whole blocks (the table then stays fp32)."""
    inits = {t.name: t for t in graph.initializer}
    table = numpy_helper.to_array(inits[EMBED])
    users = [n for n in graph.node if EMBED in n.input]
    if (table.ndim != 2 or not embedding_quantizable(table.shape[1], spec) or len(users) != 1
            or users[0].op_type != "Gather" or users[0].input[0] != EMBED):
        return False
    node = users[0]
    rows, hidden = table.shape
    spec = spec.for_embedding()
    pw = quantize_weight(table.T, spec)  # rows of the table are MatMulNBits' N: blocks run along the hidden axis
    blocks = hidden // spec.block_size
    tensors = [numpy_helper.from_array(pw.packed.reshape(rows, -1), f"{EMBED}_q{spec.bits}"),
               numpy_helper.from_array(pw.scales.reshape(rows, blocks), f"{EMBED}_scales")]
    if pw.zero_points is not None:
        tensors.append(numpy_helper.from_array(pw.zero_points.reshape(rows, -1), f"{EMBED}_zero_points"))
    inputs = [tensors[0].name, node.input[1], *(t.name for t in tensors[1:])]
    quantized = helper.make_node("GatherBlockQuantized", inputs, list(node.output), domain=MS_DOMAIN,
                                 name=f"{node.name or node.output[0]}_q", gather_axis=0, quantize_axis=1,
                                 block_size=spec.block_size, bits=spec.bits)
    at = list(graph.node).index(node)
    graph.node.remove(node)
    graph.node.insert(at, quantized)
    kept = [t for t in graph.initializer if t.name != EMBED]
    del graph.initializer[:]
    graph.initializer.extend([*kept, *tensors])
    return True


def fake_quantize_embedding(embedding, spec: QuantSpec) -> None:
    """Round an nn.Embedding's rows in place as GatherBlockQuantized holds them (where the graph quantizes it)."""
    import torch

    w = embedding.weight.detach().float().cpu().numpy()
    if embedding_quantizable(w.shape[1], spec):
        rows = fake_quantize(w.T, spec.for_embedding()).T.copy()
        embedding.weight = torch.nn.Parameter(torch.from_numpy(rows), requires_grad=False)


def fake_quantize_torch(module, spec: QuantSpec, lm_head=None) -> None:
    """Round every nn.Linear weight under `module` exactly as the graph does, in place; `lm_head` (one of
    them) as the spec rounds the LM head, or not at all when it keeps the head in fp32. Quantizing per
    output row makes packing q/k/v or gate/up together in the graph give the same numbers as rounding each
    Linear on its own."""
    import torch

    if lm_head is not None and spec.lm_head:
        fake_quantize_torch(lm_head, spec.for_lm_head())
    for sub in module.modules():
        if isinstance(sub, torch.nn.Linear) and sub is not lm_head:
            w = sub.weight.detach().float().cpu().numpy()
            sub.weight = torch.nn.Parameter(torch.from_numpy(fake_quantize(w.T, spec).T.copy()),
                                            requires_grad=False)
