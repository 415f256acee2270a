"""Kangaroo's self-draft adapter as a PyTorch module, and its conversion to graph weights.

The adapter reads the early-exit hidden state h_l and predicts the target's next token through the
target's own (frozen) final LM head:

    h_l -> RMSNorm -> self-attention (target's head layout, RoPE) -> + h_l -> RMSNorm -> LM head

``arch="block"`` adds the post-attention RMSNorm + SwiGLU MLP of a full decoder layer: more capacity, which
the default recipe takes because it agrees with the target more often than attention alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..llama_graph import AdapterWeights, AttentionWeights, Dims, LayerWeights

ARCHS = ("attention", "block")


@dataclass(frozen=True)
class AdapterConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    exit_layer: int
    arch: str = "attention"

    @classmethod
    def for_target(cls, dims: Dims, exit_layer: int, arch: str = "attention") -> AdapterConfig:
        return cls(dims.hidden, dims.heads, dims.kv_heads, dims.head_dim, dims.intermediate, dims.rms_eps,
                   exit_layer, arch)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on [batch, heads, seq, head_dim] with cos/sin [seq, rotary_dim // 2]: the first
    rotary_dim features rotate, the rest pass (partial rotary, Phi-4-mini)."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


class Adapter(nn.Module):
    def __init__(self, cfg: AdapterConfig, inv_freq: np.ndarray, rope_scaling: float = 1.0) -> None:
        super().__init__()
        if cfg.arch not in ARCHS:
            raise ValueError(f"unknown adapter arch {cfg.arch!r}; use one of {ARCHS}")
        self.cfg = cfg
        h, hd = cfg.hidden, cfg.head_dim
        self.input_norm = RMSNorm(h, cfg.rms_eps)
        self.q_proj = nn.Linear(h, cfg.heads * hd, bias=False)
        self.k_proj = nn.Linear(h, cfg.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, cfg.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.heads * hd, h, bias=False)
        if cfg.arch == "block":
            self.post_norm = RMSNorm(h, cfg.rms_eps)
            self.gate_proj = nn.Linear(h, cfg.intermediate, bias=False)
            self.up_proj = nn.Linear(h, cfg.intermediate, bias=False)
            self.down_proj = nn.Linear(cfg.intermediate, h, bias=False)
        self.output_norm = RMSNorm(h, cfg.rms_eps)
        self.register_buffer("inv_freq", torch.tensor(inv_freq, dtype=torch.float32), persistent=False)
        self.rope_scaling = rope_scaling

    def init_from_target(self, model) -> None:
        """Start from the target's own layer l (and final norm): a far better start than random. Read through
        hf_weights, so fused projections (Phi-3) come split and (1 + w) norms (Gemma) as the multiplier."""
        from ..hf_weights import final_norm, layer_weights

        layer = layer_weights(model, self.cfg.exit_layer)

        def put(param, array) -> None:
            param.copy_(torch.from_numpy(np.ascontiguousarray(array)))

        with torch.no_grad():
            put(self.input_norm.weight, layer.input_norm)
            for name in ("q", "k", "v", "o"):
                put(getattr(self, f"{name}_proj").weight, getattr(layer.attn, name))
            if self.cfg.arch == "block":
                put(self.post_norm.weight, layer.post_norm)
                for name in ("gate", "up", "down"):
                    put(getattr(self, f"{name}_proj").weight, getattr(layer, name))
            put(self.output_norm.weight, final_norm(model))

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q and k, v (KV heads repeated) as [batch, heads, seq, head_dim] of the residual stream x, rotated at
        `positions` [seq]."""
        cfg = self.cfg
        b, s, _ = x.shape
        y = self.input_norm(x)
        q = self.q_proj(y).view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(y).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(y).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos() * self.rope_scaling, angles.sin() * self.rope_scaling
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        group = cfg.heads // cfg.kv_heads
        return q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual stream x after attention's output `attn` [batch, heads, seq, head_dim] (and the MLP of
        a block), before the output norm."""
        b, _, s, _ = attn.shape
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, self.cfg.heads * self.cfg.head_dim))
        if self.cfg.arch == "block":
            y = self.post_norm(x)
            x = x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        return x

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        """[batch, seq, hidden] early-exit states -> the adapter's final normed states (causal)."""
        q, k, v = self.qkv(h, torch.arange(h.shape[1], device=h.device))
        return self.output_norm(self.finish(h, F.scaled_dot_product_attention(q, k, v, is_causal=True)))

    def graph_weights(self) -> tuple[AdapterWeights, LayerWeights | None]:
        def np_(t):
            return t.detach().float().cpu().numpy()

        attn = AttentionWeights(q=np_(self.q_proj.weight), k=np_(self.k_proj.weight), v=np_(self.v_proj.weight),
                                o=np_(self.o_proj.weight))
        weights = AdapterWeights(input_norm=np_(self.input_norm.weight), attn=attn,
                                 output_norm=np_(self.output_norm.weight))
        mlp = None
        if self.cfg.arch == "block":
            mlp = LayerWeights(input_norm=weights.input_norm, attn=attn, post_norm=np_(self.post_norm.weight),
                               gate=np_(self.gate_proj.weight), up=np_(self.up_proj.weight),
                               down=np_(self.down_proj.weight))
        return weights, mlp
