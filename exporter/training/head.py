"""The feature-level draft head (EAGLE-3's shape) as a PyTorch module, and its conversion to graph weights.

The head drafts from what the target already computed. For a slot t it reads the target's states at a low,
a middle and a high layer for position t (the shallow piece's exit state and two of `deep`'s) together with
the embedding of the token at t + 1, and predicts the token at t + 2:

    features [3H] -> fc -> g;  embed(token) -> e
    [RMSNorm(e); RMSNorm(g)] -> proj -> one decoder layer of the target's shape -> s (the head's state)
    s -> the target's final norm (trained) -> the target's LM head over the FR-Spec vocabulary

The decoder layer is the block adapter's (adapter.py), started from the target's top layer. A later draft slot
has no target states: it reads the head's own state of the slot before in the high layer's place, [0, 0, s],
through the same fc. Training runs those later slots too (training-time test, `fit_head.py`), so what a draft
step sees is what the head was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ...runtime.errors import SpecExportError
from ..llama_graph import Dims, HeadWeights
from .adapter import Adapter, AdapterConfig, RMSNorm


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

    def layer_config(self) -> AdapterConfig:
        return AdapterConfig(self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate, self.rms_eps,
                             self.init_layer, "block")


class DraftHead(nn.Module):
    def __init__(self, cfg: HeadConfig, inv_freq: np.ndarray, rope_scaling: float = 1.0) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.embed_norm = RMSNorm(h, cfg.rms_eps)
        self.feature_norm = RMSNorm(h, cfg.rms_eps)
        self.proj = nn.Linear(2 * h, h, bias=False)
        self.layer = Adapter(cfg.layer_config(), inv_freq, rope_scaling)  # its output norm is the head's

    def init_from_target(self, model) -> None:
        """The decoder layer starts as the target's top layer and the output norm as its final norm; fc starts
        as the high layer's identity and proj as the feature's, so the untrained head begins near EAGLE-1's
        top-layer drafting rather than from noise."""
        self.layer.init_from_target(model)
        h = self.cfg.hidden
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, 2 * h:].copy_(torch.eye(h))
            self.proj.weight.normal_(std=0.02 / h**0.5)
            self.proj.weight[:, h:] += torch.eye(h)

    def inputs(self, features: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[b, s, 3H] states and [b, s, H] token embeddings -> the decoder layer's input [b, s, H]."""
        g = self.fc(features)
        return self.proj(torch.cat([self.embed_norm(embeds), self.feature_norm(g)], -1))

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.layer.qkv(x, positions)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The head's state: the layer's residual stream after attention `attn` and the MLP."""
        return self.layer.finish(x, attn)

    def output_norm(self, state: torch.Tensor) -> torch.Tensor:
        return self.layer.output_norm(state)

    def forward(self, features: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Causal over a whole sequence of target-fed slots: the head's states [b, s, H]."""
        x = self.inputs(features, embeds)
        q, k, v = self.qkv(x, torch.arange(x.shape[1], device=x.device))
        return self.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def graph_weights(self) -> HeadWeights:
        def np_(t):
            return t.detach().float().cpu().numpy()

        block, layer = self.layer.graph_weights()
        return HeadWeights(fc=np_(self.fc.weight), embed_norm=np_(self.embed_norm.weight),
                           feature_norm=np_(self.feature_norm.weight), proj=np_(self.proj.weight), layer=layer,
                           output_norm=block.output_norm)
