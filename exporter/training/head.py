"""The feature-level draft head (EAGLE-3's shape) as a PyTorch module, and its conversion to graph weights.

The head drafts from what the target already computed. For a slot t it reads the target's states at a low,
a middle and a high layer for position t (the shallow piece's exit state and two of `deep`'s) together with
the embedding of the token at t + 1, and predicts the token at t + 2:

    features [3H] -> fc -> g;  embed(token) -> e
    [RMSNorm(e); RMSNorm(g)] -> proj -> one decoder layer of the target's shape -> s (the head's state)
    s -> the target's final norm (trained) -> the target's LM head over the FR-Spec vocabulary

A later draft slot has no target states: it reads the head's own state of the slot before in the high
layer's place, [0, 0, s], through the same fc. Training runs those later slots too (training-time test,
`fit_head.py`), so what a draft step sees is what the head was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ...runtime.errors import SpecExportError
from ..llama_graph import AttentionWeights, Dims, LayerWeights
from .adapter import RMSNorm, rope


def feature_layers(layers: int, exit_layer: int) -> tuple[int, int, int]:
    """The states the head fuses, as indices of transformers' hidden_states (0: the embeddings, i: the
    output of layer i - 1): the exit state, the middle of the stack and two layers below the top, as
    EAGLE-3 picks low, middle and high."""
    mid = max(exit_layer + 1, layers // 2)
    high = max(mid + 1, layers - 2)  # hidden_states[layers] is after the final norm: not a residual state
    if not exit_layer < mid < high <= layers - 1:
        raise SpecExportError(f"a {layers}-layer model with exit layer {exit_layer} leaves no distinct middle and"
                              " high layers for a draft head; use a lower --exit-layer")
    return exit_layer, mid, high


@dataclass(frozen=True)
class HeadConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    features: tuple[int, int, int]  # hidden_states indices: low (the exit layer), middle, high
    init_layer: int  # the target layer the decoder layer started from

    @classmethod
    def for_target(cls, dims: Dims, exit_layer: int) -> HeadConfig:
        features = feature_layers(dims.layers, exit_layer)
        return cls(dims.hidden, dims.heads, dims.kv_heads, dims.head_dim, dims.intermediate, dims.rms_eps,
                   features, dims.layers - 1)


class DraftHead(nn.Module):
    def __init__(self, cfg: HeadConfig, inv_freq: np.ndarray, rope_scaling: float = 1.0) -> None:
        super().__init__()
        self.cfg = cfg
        h, hd = cfg.hidden, cfg.head_dim
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.embed_norm = RMSNorm(h, cfg.rms_eps)
        self.feature_norm = RMSNorm(h, cfg.rms_eps)
        self.proj = nn.Linear(2 * h, h, bias=False)
        self.input_norm = RMSNorm(h, cfg.rms_eps)
        self.q_proj = nn.Linear(h, cfg.heads * hd, bias=False)
        self.k_proj = nn.Linear(h, cfg.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, cfg.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.heads * hd, h, bias=False)
        self.post_norm = RMSNorm(h, cfg.rms_eps)
        self.gate_proj = nn.Linear(h, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, h, bias=False)
        self.output_norm = RMSNorm(h, cfg.rms_eps)
        self.register_buffer("inv_freq", torch.tensor(inv_freq, dtype=torch.float32), persistent=False)
        self.rope_scaling = rope_scaling

    def init_from_target(self, model) -> None:
        """The decoder layer starts as the target's top layer and the output norm as its final norm; fc starts
        as the high layer's identity and proj as the feature's, so the untrained head begins near EAGLE-1's
        top-layer drafting rather than from noise."""
        from ..hf_weights import final_norm, layer_weights

        layer = layer_weights(model, self.cfg.init_layer)

        def put(param, array) -> None:
            param.copy_(torch.from_numpy(np.ascontiguousarray(array)))

        h = self.cfg.hidden
        with torch.no_grad():
            put(self.input_norm.weight, layer.input_norm)
            for name in ("q", "k", "v", "o"):
                put(getattr(self, f"{name}_proj").weight, getattr(layer.attn, name))
            put(self.post_norm.weight, layer.post_norm)
            for name in ("gate", "up", "down"):
                put(getattr(self, f"{name}_proj").weight, getattr(layer, name))
            put(self.output_norm.weight, final_norm(model))
            self.fc.weight.zero_()
            self.fc.weight[:, 2 * h:].copy_(torch.eye(h))
            self.proj.weight.normal_(std=0.02 / h**0.5)
            self.proj.weight[:, h:] += torch.eye(h)

    def inputs(self, features: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[b, s, 3H] states and [b, s, H] token embeddings -> the decoder layer's input [b, s, H]."""
        g = self.fc(features)
        return self.proj(torch.cat([self.embed_norm(embeds), self.feature_norm(g)], -1))

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q [b, heads, s, hd] and k, v [b, heads, s, hd] (KV heads repeated), rotated at `positions` [s]."""
        cfg = self.cfg
        b, s, _ = x.shape
        y = self.input_norm(x)
        q = self.q_proj(y).view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(y).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(y).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos() * self.rope_scaling, angles.sin() * self.rope_scaling
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        group = cfg.heads // cfg.kv_heads
        return q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The layer's residual stream after attention `attn` [b, heads, s, hd] and the MLP: the head's state."""
        b, _, s, _ = attn.shape
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        y = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))

    def forward(self, features: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Causal over a whole sequence of target-fed slots: the head's states [b, s, H]."""
        x = self.inputs(features, embeds)
        q, k, v = self.qkv(x, torch.arange(x.shape[1], device=x.device))
        return self.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def graph_weights(self) -> HeadWeights:
        def np_(t):
            return t.detach().float().cpu().numpy()

        attn = AttentionWeights(q=np_(self.q_proj.weight), k=np_(self.k_proj.weight), v=np_(self.v_proj.weight),
                                o=np_(self.o_proj.weight))
        layer = LayerWeights(input_norm=np_(self.input_norm.weight), attn=attn, post_norm=np_(self.post_norm.weight),
                             gate=np_(self.gate_proj.weight), up=np_(self.up_proj.weight),
                             down=np_(self.down_proj.weight))
        return HeadWeights(fc=np_(self.fc.weight), embed_norm=np_(self.embed_norm.weight),
                           feature_norm=np_(self.feature_norm.weight), proj=np_(self.proj.weight), layer=layer,
                           output_norm=np_(self.output_norm.weight))


@dataclass
class HeadWeights:
    fc: np.ndarray  # [H, 3H]
    embed_norm: np.ndarray
    feature_norm: np.ndarray
    proj: np.ndarray  # [H, 2H]
    layer: LayerWeights
    output_norm: np.ndarray
