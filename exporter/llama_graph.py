"""Llama-family decoder pieces as ONNX graphs (shallow, deep, adapter, drafter).

Two attention flavours share everything but the attention block:

* ``ort``: ONNX Runtime's GroupQueryAttention contrib op. The KV cache is one preallocated buffer
  per layer of shape [batch, kv_heads, max_context, head_dim], bound as both ``past_*`` and
  ``present_*`` (ORT's shared-buffer mode), so new keys are written in place at the positions the
  runtime names and rolling back is moving a length counter.
* ``standard``: only standard ONNX ops (opset 17) so TensorRT 10.3 parses it. The cache buffer goes
  in as ``past_*``, new keys are scattered at ``position_ids`` and the whole buffer comes out as
  ``present_*`` (the runtime swaps two buffers; TensorRT must never bind one buffer to both).
  Attention masks every key whose position is past the query's, so stale entries after a
  rollback are never read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .onnx_builder import MS_DOMAIN, GraphBuilder

FLAVOURS = ("ort", "standard")


@dataclass(frozen=True)
class Dims:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_eps: float
    max_context: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class AttentionWeights:
    q: np.ndarray  # [out, in] as in torch.nn.Linear
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None


@dataclass
class LayerWeights:
    input_norm: np.ndarray
    attn: AttentionWeights
    post_norm: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray


@dataclass
class AdapterWeights:
    """Kangaroo's adapter: RMSNorm -> attention -> +residual -> RMSNorm -> the target's LM head."""

    input_norm: np.ndarray
    attn: AttentionWeights
    output_norm: np.ndarray


@dataclass
class Rope:
    cos: np.ndarray  # [max_context, head_dim // 2], attention scaling folded in
    sin: np.ndarray


def rope_tables(inv_freq: np.ndarray, max_context: int, scaling: float = 1.0) -> Rope:
    angles = np.outer(np.arange(max_context, dtype=np.float64), inv_freq.astype(np.float64))
    return Rope(cos=(np.cos(angles) * scaling).astype(np.float32),
                sin=(np.sin(angles) * scaling).astype(np.float32))


class PieceGraph:
    """Builds one piece: declares the control inputs, then layers are appended on a hidden value."""

    def __init__(self, name: str, dims: Dims, rope: Rope, flavour: str, float_dtype=np.float32) -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"unknown graph flavour {flavour!r}; use one of {', '.join(FLAVOURS)}")
        self.b = GraphBuilder(name, np.dtype(float_dtype))
        self.dims, self.flavour = dims, flavour
        self.kv_index = 0
        self.kv_dtype = np.dtype(float_dtype)
        b = self.b
        self.position_ids = b.input("position_ids", np.int64, ["batch", "seq"])
        # added to the attention scores before softmax: zeros for a chain of tokens, -inf between the
        # branches of a token tree (a tree's tokens take consecutive cache slots but positions by depth)
        width = "total_len" if flavour == "ort" else "cache_len"
        self.attention_bias = b.input("attention_bias", self.kv_dtype, ["batch", 1, "seq", width])
        if flavour == "ort":
            self.seqlens_k = b.input("seqlens_k", np.int32, ["batch"])
            self.total_len = b.input("total_sequence_length", np.int32, [])
            self.cos = b.weight("rope_cos", rope.cos)
            self.sin = b.weight("rope_sin", rope.sin)
        else:
            self.cos = b.weight("rope_cos", rope.cos)
            self.sin = b.weight("rope_sin", rope.sin)
            # [batch, seq, 1, half]: broadcasts over q/k laid out as [batch, seq, heads, half]
            pos = self.position_ids
            self.cos_pos = b.op("Unsqueeze", [b.op("Gather", [self.cos, pos], axis=0), b.const([2])])
            self.sin_pos = b.op("Unsqueeze", [b.op("Gather", [self.sin, pos], axis=0), b.const([2])])

    # -- building blocks -------------------------------------------------------------------------

    def rms_norm(self, x: str, weight: np.ndarray) -> str:
        b = self.b
        w = b.weight(b.fresh("norm_weight"), weight)
        if self.flavour == "ort":
            return b.op("SimplifiedLayerNormalization", [x, w], axis=-1, epsilon=self.dims.rms_eps,
                        stash_type=1)
        # fp16 graphs normalise in fp32: the mean of squares overflows fp16 on real activations
        xf = b.op("Cast", [x], to=1) if self.kv_dtype == np.float16 else x
        var = b.op("ReduceMean", [b.op("Mul", [xf, xf])], axes=[-1], keepdims=1)
        eps = b.const(np.float32(self.dims.rms_eps), dtype=np.float32)
        normed = b.op("Div", [xf, b.op("Sqrt", [b.op("Add", [var, eps])])])
        if self.kv_dtype == np.float16:
            normed = b.op("Cast", [normed], to=10)
        return b.op("Mul", [normed, w])

    def add_norm(self, x: str, delta: str | None, weight: np.ndarray) -> tuple[str, str]:
        """(RMSNorm(x + delta), x + delta): a residual add and the norm that reads it. The `ort` flavour fuses
        them into one SkipSimplifiedLayerNormalization, as ONNX Runtime GenAI's graphs do (one node instead of
        two, 56 fewer a call in `deep`); the sum it hands on is the same fp32 add. `delta` None: no add."""
        b = self.b
        if delta is None:
            return self.rms_norm(x, weight), x
        if self.flavour != "ort":
            h = b.op("Add", [x, delta])
            return self.rms_norm(h, weight), h
        w = b.weight(b.fresh("norm_weight"), weight)
        normed, _, _, h = b.op("SkipSimplifiedLayerNormalization", [delta, x, w], n_out=4, domain=MS_DOMAIN,
                               epsilon=self.dims.rms_eps)
        node = b.nodes[-1]
        node.output[1], node.output[2] = "", ""  # mean and inverse std-dev: not needed
        return normed, h

    def residual(self, x: str, delta: str | None) -> str:
        return x if delta is None else self.b.op("Add", [x, delta])

    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray | None = None) -> str:
        b = self.b
        y = b.op("MatMul", [x, b.weight(b.fresh("w"), weight.T)])
        return b.op("Add", [y, b.weight(b.fresh("bias"), bias)]) if bias is not None else y

    def _rotate(self, x: str, heads: int) -> str:
        """RoPE on [batch, seq, heads*head_dim] -> [batch, seq, heads, head_dim] (rotate-half layout)."""
        b, hd = self.b, self.dims.head_dim
        x = b.op("Reshape", [x, b.const([0, 0, heads, hd])])
        x1, x2 = b.op("Split", [x, b.const([hd // 2, hd // 2])], n_out=2, axis=-1)
        cos, sin = self.cos_pos, self.sin_pos
        if self.kv_dtype == np.float16:
            cos, sin = b.op("Cast", [cos], to=10), b.op("Cast", [sin], to=10)
        r1 = b.op("Sub", [b.op("Mul", [x1, cos]), b.op("Mul", [x2, sin])])
        r2 = b.op("Add", [b.op("Mul", [x2, cos]), b.op("Mul", [x1, sin])])
        return b.op("Concat", [r1, r2], axis=-1)

    def _kv_io(self) -> tuple[str, str, str, str]:
        b, d, i = self.b, self.dims, self.kv_index
        self.kv_index += 1
        shape = ["batch", d.kv_heads, "cache_len", d.head_dim]
        past_k = b.input(f"past_key.{i}", self.kv_dtype, shape)
        past_v = b.input(f"past_value.{i}", self.kv_dtype, shape)
        return past_k, past_v, f"present_key.{i}", f"present_value.{i}"

    def attention(self, x: str, w: AttentionWeights) -> str:
        b, d = self.b, self.dims
        past_k, past_v, present_k, present_v = self._kv_io()
        kv_shape = ["batch", d.kv_heads, "cache_len", d.head_dim]
        if self.flavour == "ort":
            packed = np.concatenate([w.q, w.k, w.v], axis=0)
            bias = None
            if w.q_bias is not None:
                bias = np.concatenate([w.q_bias, w.k_bias, w.v_bias])
            qkv = self.linear(x, packed, bias)
            attn, _, _ = b.op(
                "GroupQueryAttention",
                [qkv, "", "", past_k, past_v, self.seqlens_k, self.total_len, self.cos, self.sin,
                 self.position_ids, self.attention_bias],
                n_out=3, domain=MS_DOMAIN, num_heads=d.heads, kv_num_heads=d.kv_heads, do_rotary=1,
                rotary_interleaved=0, scale=float(d.head_dim**-0.5))
            # GQA names its outputs itself; rename the cache outputs to the contract's names
            node = b.nodes[-1]
            node.output[1], node.output[2] = present_k, present_v
        else:
            attn = self._standard_attention(x, w, past_k, past_v, present_k, present_v)
        b.output(present_k, present_k, self.kv_dtype, kv_shape)
        b.output(present_v, present_v, self.kv_dtype, kv_shape)
        return self.linear(attn, w.o)

    def _standard_attention(self, x, w, past_k, past_v, present_k, present_v) -> str:
        b, d = self.b, self.dims
        group = d.heads // d.kv_heads
        q = self._rotate(self.linear(x, w.q, w.q_bias), d.heads)  # [b, s, H, hd]
        k = self._rotate(self.linear(x, w.k, w.k_bias), d.kv_heads)  # [b, s, Hkv, hd]
        v = b.op("Reshape", [self.linear(x, w.v, w.v_bias), b.const([0, 0, d.kv_heads, d.head_dim])])
        k = b.op("Transpose", [k], perm=[0, 2, 1, 3])  # [b, Hkv, s, hd]
        v = b.op("Transpose", [v], perm=[0, 2, 1, 3])
        # the new keys/values take consecutive cache slots from the first token's position (a chain's
        # positions, or a token tree's, whose positions repeat by depth)
        first = b.op("Slice", [self.position_ids, b.const([0]), b.const([1]), b.const([1])])  # [b, 1]
        seq = b.op("Gather", [b.op("Shape", [self.position_ids]), b.const(1)], axis=0)
        slots = b.op("Add", [first, b.op("Range", [b.const(0), seq, b.const(1)])])
        idx = b.op("Unsqueeze", [slots, b.const([1, 3])])  # [b, 1, s, 1]
        idx = b.op("Expand", [idx, b.op("Shape", [k])])
        b.op("ScatterElements", [past_k, idx, k], name=present_k, axis=2)
        b.op("ScatterElements", [past_v, idx, v], name=present_v, axis=2)
        # scores: q [b, Hkv, g, s, hd] x K^T [b, Hkv, 1, hd, T]
        q = b.op("Reshape", [q, b.const([0, 0, d.kv_heads, group, d.head_dim])])
        q = b.op("Transpose", [q], perm=[0, 2, 3, 1, 4])
        scale = b.const(np.asarray(d.head_dim**-0.5, dtype=self.kv_dtype), dtype=self.kv_dtype)
        q = b.op("Mul", [q, scale])
        keys = b.op("Unsqueeze", [present_k, b.const([2])])
        vals = b.op("Unsqueeze", [present_v, b.const([2])])
        scores = b.op("MatMul", [q, b.op("Transpose", [keys], perm=[0, 1, 2, 4, 3])])
        # causal mask by slot: the key in slot j is visible to the query in slot i iff j <= i (so stale
        # slots past a rollback are never read); the bias then cuts a tree's other branches
        scores = b.op("Add", [scores, b.op("Unsqueeze", [self.attention_bias, b.const([2])])])
        total = b.op("Gather", [b.op("Shape", [present_k]), b.const(2)], axis=0)
        key_slot = b.op("Range", [b.const(0), total, b.const(1)])
        qslot = b.op("Unsqueeze", [slots, b.const([1, 2, 4])])  # [b,1,1,s,1]
        visible = b.op("LessOrEqual", [key_slot, qslot])  # [b,1,1,s,T]
        neg = b.const(np.asarray(np.finfo(self.kv_dtype).min, dtype=self.kv_dtype), dtype=self.kv_dtype)
        scores = b.op("Where", [visible, scores, neg])
        if self.kv_dtype == np.float16:
            probs = b.op("Cast", [b.op("Softmax", [b.op("Cast", [scores], to=1)], axis=-1)], to=10)
        else:
            probs = b.op("Softmax", [scores], axis=-1)
        ctx = b.op("MatMul", [probs, vals])  # [b, Hkv, g, s, hd]
        ctx = b.op("Transpose", [ctx], perm=[0, 3, 1, 2, 4])  # [b, s, Hkv, g, hd]
        return b.op("Reshape", [ctx, b.const([0, 0, d.heads * d.head_dim])])

    def mlp(self, x: str, layer: LayerWeights) -> str:
        b = self.b
        gate_up = self.linear(x, np.concatenate([layer.gate, layer.up], axis=0))
        gate, up = b.op("Split", [gate_up, b.const([layer.gate.shape[0], layer.up.shape[0]])], n_out=2,
                        axis=-1)
        act = b.op("Mul", [gate, b.op("Sigmoid", [gate])])  # SiLU, as two ops every runtime knows
        return self.linear(b.op("Mul", [act, up]), layer.down)

    def decoder_layer(self, x: str, layer: LayerWeights, delta: str | None = None) -> tuple[str, str]:
        """One decoder layer on the residual stream `x` + `delta` (the previous layer's MLP output, not yet
        added, so the add fuses with this layer's first norm); returns the new (residual, delta)."""
        normed, x = self.add_norm(x, delta, layer.input_norm)
        normed, h = self.add_norm(x, self.attention(normed, layer.attn), layer.post_norm)
        return h, self.mlp(normed, layer)

    def decoder_layers(self, x: str, layers: list[LayerWeights]) -> tuple[str, str | None]:
        delta = None
        for layer in layers:
            x, delta = self.decoder_layer(x, layer, delta)
        return x, delta

    def lm_head(self, x: str, lm_head: np.ndarray, keep_last: bool) -> str:
        """Logits for the last ``logits_to_keep`` positions: a prefill needs one row, not thousands."""
        b = self.b
        if keep_last:
            keep = b.input("logits_to_keep", np.int64, [1])
            x = b.op("Slice", [x, b.op("Neg", [keep]), b.const([np.iinfo(np.int64).max]), b.const([1])])
        logits = b.op("MatMul", [x, b.weight("lm_head", lm_head.T)])
        if self.kv_dtype == np.float16:
            logits = b.op("Cast", [logits], to=1)
        return logits


def _hidden_input(pg: PieceGraph) -> str:
    return pg.b.input("hidden_in", pg.kv_dtype, ["batch", "seq", pg.dims.hidden])


def build_shallow(dims: Dims, rope: Rope, embed: np.ndarray, layers: list[LayerWeights], flavour: str,
                  float_dtype=np.float32):
    """Embeddings + decoder layers [0, l) -> the early-exit hidden state h_l."""
    pg = PieceGraph("shallow", dims, rope, flavour, float_dtype)
    b = pg.b
    ids = b.input("input_ids", np.int64, ["batch", "seq"])
    x = b.op("Gather", [b.weight("embed_tokens", embed), ids], axis=0)
    b.output(pg.residual(*pg.decoder_layers(x, layers)), "hidden", pg.kv_dtype, ["batch", "seq", dims.hidden])
    return b.model()


def build_deep(dims: Dims, rope: Rope, layers: list[LayerWeights], final_norm: np.ndarray,
               lm_head: np.ndarray, flavour: str, float_dtype=np.float32):
    """Decoder layers [l, L) + final norm + LM head; takes the stacked early-exit hidden states."""
    pg = PieceGraph("deep", dims, rope, flavour, float_dtype)
    x, delta = pg.decoder_layers(_hidden_input(pg), layers)
    logits = pg.lm_head(pg.add_norm(x, delta, final_norm)[0], lm_head, keep_last=True)
    pg.b.output(logits, "logits", np.float32, ["batch", "kept", dims.vocab])
    return pg.b.model()


def _draft_head(pg: PieceGraph, normed: str, lm_head: np.ndarray, vocab_map: np.ndarray | None) -> None:
    """A drafting piece's outputs: `logits` (over `vocab_map`'s ids in that order when pruned), the greedy
    `top_token` as a real id and its probability `top_prob`, so a greedy draft step reads two numbers."""
    b = pg.b
    head = lm_head if vocab_map is None else lm_head[vocab_map]
    logits = pg.lm_head(normed, head, keep_last=True)
    b.output(logits, "logits", np.float32, ["batch", "kept", head.shape[0]])
    probs = b.op("Softmax", [logits], axis=-1)
    top = b.op("ArgMax", [logits], axis=-1, keepdims=0)
    if vocab_map is not None:
        top = b.op("Gather", [b.weight("vocab_map", vocab_map.astype(np.int64), dtype=np.int64), top], axis=0)
    b.output(top, "top_token", np.int64, ["batch", "kept"])
    b.output(b.op("ReduceMax", [probs], axes=[-1], keepdims=0), "top_prob", np.float32, ["batch", "kept"])


def build_adapter(dims: Dims, rope: Rope, adapter: AdapterWeights, lm_head: np.ndarray, flavour: str,
                  float_dtype=np.float32, mlp: LayerWeights | None = None, vocab_map: np.ndarray | None = None):
    """Kangaroo's adapter (plus an optional MLP: a full decoder block).

    Besides logits it emits the greedy draft token and its probability, so a greedy draft step reads
    two numbers instead of a vocabulary-sized row. With `vocab_map` (FR-Spec) the head keeps only
    those token ids: `logits` are over the map's order and `top_token` is mapped back to a real id.
    Verification keeps the full vocabulary, so the output does not change."""
    pg = PieceGraph("adapter", dims, rope, flavour, float_dtype)
    b = pg.b
    h = _hidden_input(pg)
    x, delta = h, pg.attention(pg.rms_norm(h, adapter.input_norm), adapter.attn)
    if mlp is not None:
        normed, x = pg.add_norm(x, delta, mlp.post_norm)
        delta = pg.mlp(normed, mlp)
    _draft_head(pg, pg.add_norm(x, delta, adapter.output_norm)[0], lm_head, vocab_map)
    return b.model()


def build_drafter(dims: Dims, rope: Rope, embed: np.ndarray, layers: list[LayerWeights], final_norm: np.ndarray,
                  lm_head: np.ndarray, flavour: str, float_dtype=np.float32, vocab_map: np.ndarray | None = None):
    """An independent small causal LM as one piece with its own KV cache (SpS / SpecDec drafting).

    `dims` and `rope` are the drafter's own (its hidden size and heads may differ from the target's; the
    tokenizer may not). Outputs are the adapter's: `logits` over the full vocabulary or, with `vocab_map`
    (FR-Spec), over those ids in that order; `top_token` is always a real token id and `top_prob` its
    probability under the (pruned) head, so a greedy draft step reads two numbers."""
    pg = PieceGraph("drafter", dims, rope, flavour, float_dtype)
    b = pg.b
    ids = b.input("input_ids", np.int64, ["batch", "seq"])
    x, delta = pg.decoder_layers(b.op("Gather", [b.weight("embed_tokens", embed), ids], axis=0), layers)
    _draft_head(pg, pg.add_norm(x, delta, final_norm)[0], lm_head, vocab_map)
    return b.model()
