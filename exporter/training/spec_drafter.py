"""SpecDec's Spec-Drafter, made small: a few Llama decoder layers that borrow the target's frozen token
embeddings and LM head through two learned projections.

    ids -> E_target[ids] @ P_in -> decoder layers -> RMSNorm -> @ P_out -> @ E_head[draft vocab]^T

Only the layers, the norms and the two projections train and ship (a few MB in fp16): the target's
embedding matrix is most of a small model's parameters, and the drafter gets its token geometry for free.
At export the projections are folded into a plain Llama (embed = E_target @ P_in, head = E_head @ P_out),
so the drafter piece is the same graph as any Hugging Face drafter checkpoint.

The decoder is transformers' own LlamaModel fed `inputs_embeds`, so training, the materialised model and
the parity reference run one implementation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


def rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


def default_intermediate(hidden: int) -> int:
    # 4x hidden, as the SpecDec drafter's FFN, on a multiple of 64 for friendly matmul shapes
    return max(64, round(4 * hidden / 64) * 64)


@dataclass(frozen=True)
class DrafterConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    rope_theta: float
    target_hidden: int
    vocab: int  # the target's vocabulary: the drafter reads and names real ids

    @classmethod
    def for_target(cls, target_config, layers: int = 2, hidden: int = 256, head_dim: int = 64,
                   heads: int | None = None, kv_heads: int | None = None,
                   intermediate: int | None = None) -> DrafterConfig:
        heads = heads or max(1, hidden // head_dim)
        kv_heads = kv_heads or max(1, heads // 2)
        if heads % kv_heads:
            raise ValueError(f"{heads} attention heads cannot share {kv_heads} key/value heads evenly")
        return cls(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                   intermediate=intermediate or default_intermediate(hidden),
                   rms_eps=float(target_config.rms_norm_eps), rope_theta=rope_theta(target_config),
                   target_hidden=int(target_config.hidden_size), vocab=int(target_config.vocab_size))

    def as_dict(self) -> dict:
        return asdict(self)

    def llama_config(self, vocab: int = 1):
        """The decoder's Hugging Face config; `vocab` 1 while training (the embedding is the target's)."""
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_eps,
                           rope_theta=self.rope_theta, max_position_embeddings=8192, tie_word_embeddings=False,
                           pad_token_id=None, bos_token_id=None, eos_token_id=None, attention_bias=False,
                           mlp_bias=False)


class SpecDrafter(nn.Module):
    """The trainable part; the target's embedding and head are passed in, never stored."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        from transformers import LlamaModel

        self.cfg = cfg
        self.in_proj = nn.Linear(cfg.target_hidden, cfg.hidden, bias=False)  # P_in
        self.decoder = LlamaModel(cfg.llama_config())
        self.out_proj = nn.Linear(cfg.hidden, cfg.target_hidden, bias=False)  # P_out

    def init_projections(self, embed: torch.Tensor) -> None:
        """P_in / P_out from the embedding's top principal directions: the head starts as the best
        rank-`hidden` approximation of the target's, instead of noise."""
        with torch.no_grad():
            _, _, vh = torch.linalg.svd(embed.float(), full_matrices=False)
            basis = vh[: self.cfg.hidden]  # [hidden, target_hidden], orthonormal rows
            self.in_proj.weight.copy_(basis)
            self.out_proj.weight.copy_(basis.T)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        # the decoder's 1-row placeholder embedding is never used: inputs come through in_proj
        return {k: v for k, v in self.state_dict().items() if not k.startswith("decoder.embed_tokens.")}

    def hidden(self, embed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[batch, seq] ids -> the drafter's final normed states [batch, seq, hidden]. Causal, right padding
        is harmless (no earlier position attends to it), so no mask is needed."""
        x = self.in_proj(embed[ids])
        return self.decoder(inputs_embeds=x, use_cache=False).last_hidden_state

    def head(self, lm_head: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
        """The materialised head E_head[vocab] @ P_out: [V_d, hidden]; cheaper than projecting every token."""
        rows = lm_head if vocab is None else lm_head[vocab]
        return rows @ self.out_proj.weight

    @torch.no_grad()
    def to_llama(self, embed: torch.Tensor, lm_head: torch.Tensor):
        """A plain LlamaForCausalLM over the full vocabulary: embed = E @ P_in, head = E_head @ P_out."""
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM(self.cfg.llama_config(self.cfg.vocab))
        model.model.embed_tokens.weight.copy_(embed.float() @ self.in_proj.weight.float().T)
        model.lm_head.weight.copy_(self.head(lm_head.float()))
        state = {k: v for k, v in self.decoder.state_dict().items() if k != "embed_tokens.weight"}
        missing, unexpected = model.model.load_state_dict(state, strict=False)
        if unexpected or set(missing) != {"embed_tokens.weight"}:
            raise RuntimeError(f"materialising the drafter lost weights: missing {missing}, unexpected {unexpected}")
        return model.eval()


def count_parameters(drafter: SpecDrafter) -> int:
    return int(sum(v.numel() for v in drafter.trainable_state().values()))
