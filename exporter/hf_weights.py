"""Read a Llama-family PyTorch model's weights into the plain arrays the graph builder takes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.errors import SpecExportError
from .llama_graph import AttentionWeights, Dims, LayerWeights, Rope, rope_tables


@dataclass
class LlamaWeights:
    dims: Dims
    rope: Rope
    embed: np.ndarray
    layers: list[LayerWeights]
    final_norm: np.ndarray
    lm_head: np.ndarray


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _bias(linear) -> np.ndarray | None:
    return None if linear.bias is None else _np(linear.bias)


def attention_weights(attn) -> AttentionWeights:
    return AttentionWeights(q=_np(attn.q_proj.weight), k=_np(attn.k_proj.weight), v=_np(attn.v_proj.weight),
                            o=_np(attn.o_proj.weight), q_bias=_bias(attn.q_proj), k_bias=_bias(attn.k_proj),
                            v_bias=_bias(attn.v_proj))


def rope_of(model, max_context: int) -> Rope:
    """RoPE tables from the model's own rotary module, so every rope scaling type comes out right."""
    rotary = model.model.rotary_emb
    return rope_tables(_np(rotary.inv_freq), max_context, float(getattr(rotary, "attention_scaling", 1.0)))


def dims_of(config, max_context: int) -> Dims:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and window < max_context:
        raise SpecExportError(f"the model attends within a sliding window of {window} tokens; build with"
                              f" --context {window} or less")
    return Dims(hidden=config.hidden_size, layers=config.num_hidden_layers, heads=config.num_attention_heads,
                kv_heads=config.num_key_value_heads, head_dim=head_dim,
                intermediate=config.intermediate_size, vocab=config.vocab_size,
                rms_eps=float(config.rms_norm_eps), max_context=max_context)


def extract(model, max_context: int) -> LlamaWeights:
    inner = model.model
    layers = [
        LayerWeights(input_norm=_np(layer.input_layernorm.weight), attn=attention_weights(layer.self_attn),
                     post_norm=_np(layer.post_attention_layernorm.weight),
                     gate=_np(layer.mlp.gate_proj.weight), up=_np(layer.mlp.up_proj.weight),
                     down=_np(layer.mlp.down_proj.weight))
        for layer in inner.layers
    ]
    return LlamaWeights(dims=dims_of(model.config, max_context), rope=rope_of(model, max_context),
                        embed=_np(inner.embed_tokens.weight), layers=layers, final_norm=_np(inner.norm.weight),
                        lm_head=_np(model.lm_head.weight))
