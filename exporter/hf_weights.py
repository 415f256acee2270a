"""Read a Llama-family PyTorch model's weights into the plain arrays the graph builder takes.

transformers' own modules are the reference for every family: RoPE tables come from the model's rotary
module (every rope_type: llama3, longrope, linear, ...), and each family's differences are read off its
modules and config (fused projections split, Gemma's (1 + w) norms and scaled embedding folded into the
weights) into llama_graph's Arch and per-layer fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..runtime.errors import SpecExportError
from .llama_graph import LLAMA, Arch, AttentionWeights, Dims, LayerWeights, Rope, rope_tables


@dataclass
class LlamaWeights:
    dims: Dims
    rope: Rope
    embed: np.ndarray  # scaled already where the model scales it (Gemma: x sqrt(hidden))
    layers: list[LayerWeights]
    final_norm: np.ndarray
    lm_head: np.ndarray
    arch: Arch = LLAMA
    rope_info: dict = field(default_factory=dict)  # what the RoPE tables assume (the manifest records it)

    def attention_fields(self, layers: range | list[int]) -> dict:
        """The piece spec's record of its layers' attention: window per layer (None: full), RoPE table per
        layer, what the tables assume, and the family's differences from Llama."""
        chosen = [self.layers[i] for i in layers]
        return {"attention": {"windows": [w.attn.window for w in chosen], "rope_tables": [w.attn.rope for w in chosen],
                              "rope": self.rope_info, "arch": self.arch.as_dict()}}


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _bias(linear) -> np.ndarray | None:
    return None if linear.bias is None else _np(linear.bias)


def _gemma(config) -> bool:
    return config.model_type in ("gemma3_text",)


def _norm(module, config) -> np.ndarray:
    """An RMSNorm's weight as the graph multiplies by it: Gemma's norms multiply by (1 + w)."""
    w = _np(module.weight)
    return (w + np.float32(1.0)).astype(np.float32) if _gemma(config) else w


def layer_windows(config) -> list[int | None]:
    """Each layer's sliding window (None: full attention), as transformers' masks decide it: the layers
    config.layer_types calls sliding_attention, or every layer when a config without layer_types (Mistral,
    Phi-3) has a sliding_window."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise SpecExportError(f"the model has {', '.join(unknown)} layers; specexport exports full and"
                                  " sliding-window attention only")
        return [int(window) if t == "sliding_attention" and window else None for t in types]
    return [int(window) if window else None] * config.num_hidden_layers


def attention_weights(attn, config=None, window: int | None = None, rope: str = "global") -> AttentionWeights:
    if hasattr(attn, "qkv_proj"):  # Phi-3: one fused projection, rows q | k | v
        w = _np(attn.qkv_proj.weight)
        q_rows = config.num_attention_heads * attn.head_dim
        kv_rows = config.num_key_value_heads * attn.head_dim
        q, k, v = np.split(w, [q_rows, q_rows + kv_rows])
        b = _bias(attn.qkv_proj)
        qb = kb = vb = None
        if b is not None:
            qb, kb, vb = np.split(b, [q_rows, q_rows + kv_rows])
        return AttentionWeights(q=q, k=k, v=v, o=_np(attn.o_proj.weight), q_bias=qb, k_bias=kb, v_bias=vb,
                                window=window, rope=rope)
    q_norm = k_norm = None
    if hasattr(attn, "q_norm"):  # Qwen3, Gemma 3: RMSNorm over each head's features, before RoPE
        q_norm, k_norm = _norm(attn.q_norm, config), _norm(attn.k_norm, config)
    return AttentionWeights(q=_np(attn.q_proj.weight), k=_np(attn.k_proj.weight), v=_np(attn.v_proj.weight),
                            o=_np(attn.o_proj.weight), q_bias=_bias(attn.q_proj), k_bias=_bias(attn.k_proj),
                            v_bias=_bias(attn.v_proj), q_norm=q_norm, k_norm=k_norm, window=window, rope=rope)


def layer_weights(model, index: int) -> LayerWeights:
    config = model.config
    layer = model.model.layers[index]
    window = layer_windows(config)[index]
    rope = "local" if _gemma(config) and config.layer_types[index] == "sliding_attention" else "global"
    mlp = layer.mlp
    if hasattr(mlp, "gate_up_proj"):  # Phi-3: one fused projection, rows gate | up
        gate, up = np.split(_np(mlp.gate_up_proj.weight), 2)
    else:
        gate, up = _np(mlp.gate_proj.weight), _np(mlp.up_proj.weight)
    extra = {}
    if _gemma(config):
        extra = {"pre_ff_norm": _norm(layer.pre_feedforward_layernorm, config),
                 "post_ff_norm": _norm(layer.post_feedforward_layernorm, config)}
    return LayerWeights(input_norm=_norm(layer.input_layernorm, config),
                        attn=attention_weights(layer.self_attn, config, window, rope),
                        post_norm=_norm(layer.post_attention_layernorm, config), gate=gate, up=up,
                        down=_np(mlp.down_proj.weight), **extra)


def final_norm(model) -> np.ndarray:
    return _norm(model.model.norm, model.config)


def _rope_params(config) -> dict:
    params = getattr(config, "rope_parameters", None) or {}
    if _gemma(config):
        params = params.get("full_attention") or {}
    return dict(params)


def pin_rope(model, max_context: int) -> dict:
    """What the RoPE tables assume, recorded in the manifest. LongRoPE (Phi-3.5, Phi-4-mini) switches from
    its short to its long factors once a sequence passes original_max_position_embeddings, deciding per
    forward call; the graphs' tables are fixed, so they take what transformers computes for a sequence of
    the exported context: the long factors when the context passes the original window, else the short
    ones. The model is pinned to the same choice, so the parity check compares like with like."""
    params = _rope_params(model.config)
    kind = params.get("rope_type", "default")
    info = {"rope_type": kind, "rope_theta": params.get("rope_theta")}
    rotary = model.model.rotary_emb
    if kind == "longrope":
        import torch
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        original = int(params["original_max_position_embeddings"])
        long = max_context > original
        if long:
            inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](model.config, None, seq_len=original + 1)
            with torch.no_grad():
                rotary.inv_freq.copy_(inv_freq)
                rotary.original_inv_freq.copy_(inv_freq)  # transformers switches back to it below `original`
        info.update(factors="long" if long else "short", original_max_position_embeddings=original,
                    attention_factor=float(rotary.attention_scaling),
                    note="the tables use the long factors at every position when the context passes the original"
                         " window, else the short ones; transformers chooses per sequence length")
    elif kind == "llama3":
        info.update({k: params.get(k) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                "original_max_position_embeddings")})
    elif kind in ("linear", "dynamic", "yarn"):
        info.update(factor=params.get("factor"))
    if _gemma(model.config):
        info["local_rope_theta"] = (model.config.rope_parameters.get("sliding_attention") or {}).get("rope_theta")
    info["rotary_dim"] = 2 * len(rope_inv_freq(model)[0])
    return info


def rope_inv_freq(model, which: str = "global") -> tuple[np.ndarray, float]:
    """(inv_freq, attention scaling) of the model's rotary module: its one table, or Gemma 3's global
    (full_attention) or local (sliding_attention) one."""
    rotary = model.model.rotary_emb
    if hasattr(rotary, "inv_freq"):
        return _np(rotary.inv_freq), float(getattr(rotary, "attention_scaling", 1.0))
    kind = "full_attention" if which == "global" else "sliding_attention"
    return _np(getattr(rotary, f"{kind}_inv_freq")), float(getattr(rotary, f"{kind}_attention_scaling", 1.0))


def rope_of(model, max_context: int) -> Rope:
    """RoPE tables from the model's own rotary module, so every rope scaling type comes out right."""
    rope = rope_tables(*_table_args(model, "global", max_context))
    if _gemma(model.config) and "sliding_attention" in model.config.layer_types:
        rope.local = rope_tables(*_table_args(model, "local", max_context))
    return rope


def _table_args(model, which: str, max_context: int) -> tuple:
    inv_freq, scaling = rope_inv_freq(model, which)
    return inv_freq, max_context, scaling


def arch_of(config) -> Arch:
    """The family's differences from Llama's decoder, refusing the ones the graphs do not build."""
    if getattr(config, "attn_logit_softcapping", None):
        raise SpecExportError("the model soft-caps its attention scores (attn_logit_softcapping), which specexport"
                              " does not export")
    if getattr(config, "use_bidirectional_attention", False):
        raise SpecExportError("the model attends bidirectionally, which a causal decoder export cannot do")
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    activations = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
    if act not in activations:
        raise SpecExportError(f"the model's MLP uses the {act!r} activation; specexport exports silu and"
                              " gelu_pytorch_tanh")
    if not _gemma(config):
        return Arch(activation=activations[act])
    return Arch(activation=activations[act], attn_scale=float(config.query_pre_attn_scalar) ** -0.5,
                sandwich_norms=True, final_softcap=getattr(config, "final_logit_softcapping", None) or None)


def dims_of(config, max_context: int) -> Dims:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return Dims(hidden=config.hidden_size, layers=config.num_hidden_layers, heads=config.num_attention_heads,
                kv_heads=config.num_key_value_heads, head_dim=head_dim,
                intermediate=config.intermediate_size, vocab=config.vocab_size,
                rms_eps=float(config.rms_norm_eps), max_context=max_context)


def embedding(model) -> np.ndarray:
    """The embedding table as the first layer sees it: Gemma scales it by sqrt(hidden), rounded to the
    embedding's dtype as transformers does; scaling the table is the same multiply, row by row."""
    embed = model.model.embed_tokens
    scale = getattr(embed, "embed_scale", None)
    if scale is None:
        return _np(embed.weight)
    return _np(embed.weight * scale.to(embed.weight.dtype))


def extract(model, max_context: int) -> LlamaWeights:
    config = model.config
    arch = arch_of(config)
    rope_info = pin_rope(model, max_context)
    return LlamaWeights(dims=dims_of(config, max_context), rope=rope_of(model, max_context), embed=embedding(model),
                        layers=[layer_weights(model, i) for i in range(config.num_hidden_layers)],
                        final_norm=final_norm(model), lm_head=_np(model.lm_head.weight), arch=arch,
                        rope_info=rope_info)
