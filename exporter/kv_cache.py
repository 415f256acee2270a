"""An int8 KV cache for the `ort` pieces of the target: GroupQueryAttention's quantized cache, per channel.

ONNX Runtime's CPU GroupQueryAttention multiplies the probabilities by V with MLAS's one-row SGEMM kernel in
a one-token call (no FMA, terms summed four at a time) and with the FMA kernel in a call of many rows, so an
AR step's attention rounds otherwise than the same token's row of a verification call (exporter/multirow.py
pads one-token calls for that). With a quantized cache (`k_quant_type` / `v_quant_type` PER_CHANNEL,
`kv_cache_bit_width` 8) the kernel dequantizes K and V on the fly in kernels that give a row the same bits in a
call of one row as in a call of many (`tools/experiments/kv_rows.py`), so a one-token call needs no copied row,
and reads a quarter of the cache's bytes. Those kernels run a call row by row, though: a verification call
costs about a one-token call per row, and a long prompt's attention several times the float cache's. So
it is a recipe's choice (`[export.quantize] kv_cache = "int8"`), not a default: AR gains, the speculative
modes lose (BENCHMARKS.md, "Where AR's time goes beside GenAI").

The scales are static: one per channel of K and of V in each layer, calibrated here on the recipe's training
prompts (its [adapter.train] set, never Spec-Bench) through the source model. K is cached after RoPE, which
rotates channel i with channel i + rotary_dim / 2 by the position's angle, so both channels of a pair get the
scale of the pair's largest radius, which no position can exceed; V's channels take their largest magnitude.
Values past a scale saturate (measured: codes clamp to -128..127), and a margin above the calibrated maxima
keeps that rare.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..runtime.errors import SpecExportError
from .llama_graph import Dims, LayerWeights

KV_CACHES = ("float", "int8")
MARGIN = 1.25  # over the calibrated maxima: headroom for activations the prompts did not reach
CALIBRATION_PROMPTS = 96


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def layer_kv(h: np.ndarray, layer: LayerWeights, dims: Dims) -> tuple[np.ndarray, np.ndarray]:
    """A layer's keys (before RoPE, after any per-head norm) and values [tokens, kv_heads, head_dim] for its
    input states `h` [tokens, hidden], as the graph computes them."""
    x, a = _rms(h, layer.input_norm, dims.rms_eps), layer.attn
    k = x @ a.k.T + (a.k_bias if a.k_bias is not None else 0)
    v = x @ a.v.T + (a.v_bias if a.v_bias is not None else 0)
    k = k.reshape(len(h), dims.kv_heads, dims.head_dim)
    if a.k_norm is not None:
        k = _rms(k, a.k_norm, dims.rms_eps)
    return k, v.reshape(len(h), dims.kv_heads, dims.head_dim)


class ScaleRange:
    """The running per-channel bounds of one layer's cached keys and values."""

    def __init__(self, dims: Dims, rotary_half: int) -> None:
        self.half = rotary_half
        self.k = np.zeros((dims.kv_heads, dims.head_dim), np.float64)
        self.v = np.zeros((dims.kv_heads, dims.head_dim), np.float64)

    def add(self, k: np.ndarray, v: np.ndarray) -> None:
        bound = np.abs(k).astype(np.float64)
        h = self.half
        radius = np.sqrt(k[..., :h].astype(np.float64) ** 2 + k[..., h:2 * h] ** 2)  # what RoPE can turn either into
        bound[..., :h] = bound[..., h:2 * h] = radius
        self.k = np.maximum(self.k, bound.max(axis=0))
        self.v = np.maximum(self.v, np.abs(v).max(axis=0))

    def scales(self, margin: float = MARGIN) -> tuple[np.ndarray, np.ndarray]:
        """(k_scale, v_scale), flat [kv_heads * head_dim] float32: a channel's bound times the margin over 127."""
        def scale(bound: np.ndarray) -> np.ndarray:
            return (np.maximum(bound, 1e-6) * margin / 127.0).astype(np.float32).reshape(-1)

        return scale(self.k), scale(self.v)


def calibrate(torch_model, sequences: list[list[int]], layers: list[LayerWeights], dims: Dims,
              rotary_half: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each layer's (k_scale, v_scale) from the model's states over `sequences` of token ids."""
    import torch

    ranges = [ScaleRange(dims, rotary_half) for _ in layers]
    with torch.inference_mode():
        for ids in sequences:
            states = torch_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
            for i, layer in enumerate(layers):
                ranges[i].add(*layer_kv(states[i][0].float().numpy(), layer, dims))
    return [r.scales() for r in ranges]


def calibration_sequences(tokenizer, prompts: list[dict], context: int) -> list[list[int]]:
    """The chat-formatted token ids of the first CALIBRATION_PROMPTS prompts, each cut to the context."""
    from .training.distill_data import chat_text

    return [tokenizer(chat_text(tokenizer, p["prompt"]), add_special_tokens=False)["input_ids"][:context]
            for p in prompts[:CALIBRATION_PROMPTS]]


def quantize_kv_cache(model: onnx.ModelProto, scales: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Rewrite an `ort` piece in place so each GroupQueryAttention keeps its cache in int8 with the given
    per-channel scales (one pair per attention, in the graph's order); the cache inputs and outputs become
    int8."""
    graph = model.graph
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    if len(attention) != len(scales):
        raise SpecExportError(f"the piece has {len(attention)} GroupQueryAttention nodes but {len(scales)} layers"
                              " of KV-cache scales; this is a bug in the exporter")
    cache_names = set()
    for i, (node, (k_scale, v_scale)) in enumerate(zip(attention, scales, strict=True)):
        k_name, v_name = f"kv_k_scale.{i}", f"kv_v_scale.{i}"
        graph.initializer.extend([numpy_helper.from_array(k_scale, k_name), numpy_helper.from_array(v_scale, v_name)])
        inputs = list(node.input) + [""] * (12 - len(node.input))  # through head_sink (11), unused
        del node.input[:]
        node.input.extend([*inputs[:12], k_name, v_name])
        node.attribute.extend([helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                               helper.make_attribute("v_quant_type", "PER_CHANNEL"),
                               helper.make_attribute("kv_cache_bit_width", 8)])
        cache_names.update([inputs[3], inputs[4], node.output[1], node.output[2]])
    for value in [*graph.input, *graph.output]:
        if value.name in cache_names:
            value.type.tensor_type.elem_type = TensorProto.INT8


def check_choice(kv_cache: str, flavour: str, precision: str) -> None:
    """Refuses, in one sentence, a recipe's kv_cache that the build cannot honour."""
    if kv_cache not in KV_CACHES:
        raise SpecExportError(f"recipe [export.quantize] kv_cache = {kv_cache!r}; use one of {', '.join(KV_CACHES)}")
    if kv_cache != "float" and precision not in ("int8", "int4"):
        raise SpecExportError(f"recipe [export.quantize] kv_cache = {kv_cache!r} comes with int8 or int4 weights;"
                              f" this build is {precision}: add --precision int4 (or int8), or drop it")
    if kv_cache != "float" and flavour != "ort":
        raise SpecExportError(f"recipe [export.quantize] kv_cache = {kv_cache!r} needs the 'ort' graph flavour"
                              " (ONNX Runtime's GroupQueryAttention); drop it or build with --flavour ort")
