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

Model families differ from Llama in a few places, all optional (``Arch``, and per layer in
``AttentionWeights`` / ``LayerWeights``): per-head q/k RMSNorm (Qwen3, Gemma 3), biases (Qwen2),
partial rotary dimensions (Phi-4-mini), sliding-window layers (Mistral, Qwen2/3, Gemma 3) and a second,
local RoPE table (Gemma 3), Gemma's sandwich norms, GELU-tanh MLP, attention scale and logit soft-capping.

A sliding-window layer of window W sees the keys at positions p - W + 1 .. p for a query at position p
(transformers' ``kv_idx > q_idx - sliding_window``). Both flavours fold that into the layer's attention
bias: a column (cache slot) whose key sits at a position at or below ``p - W`` gets -inf. A committed key's
position is its slot; the call's own tokens take the slots from position_ids[0] on, at their position_ids
(a token tree's go by depth), so one rule serves chains and trees of any depth. The cache stays full length.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..runtime.errors import SpecExportError
from ..runtime.manifest import Dims  # the manifest's record is the graphs' too
from .onnx_builder import MS_DOMAIN, GraphBuilder

FLAVOURS = ("ort", "standard")


@dataclass(frozen=True)
class Arch:
    """What sets a model family's decoder apart from Llama's; the defaults are Llama's."""

    activation: str = "silu"  # the gated MLP's activation: "silu" or "gelu_tanh" (Gemma)
    attn_scale: float | None = None  # None: head_dim ** -0.5 (Gemma 3: query_pre_attn_scalar ** -0.5)
    sandwich_norms: bool = False  # Gemma 3: RMSNorm after attention, before and after the MLP
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap)

    def as_dict(self) -> dict:
        return asdict(self)


LLAMA = Arch()
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass
class AttentionWeights:
    q: np.ndarray  # [out, in] as in torch.nn.Linear
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None  # [head_dim]: RMSNorm of each head before RoPE (Qwen3, Gemma 3)
    k_norm: np.ndarray | None = None
    window: int | None = None  # sliding window W: the query at p sees positions p - W + 1 .. p
    rope: str = "global"  # which RoPE table: "global", or "local" (Gemma 3's sliding layers)


@dataclass
class LayerWeights:
    input_norm: np.ndarray
    attn: AttentionWeights
    post_norm: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    pre_ff_norm: np.ndarray | None = None  # Gemma 3's sandwich norms (Arch.sandwich_norms): post_norm is
    post_ff_norm: np.ndarray | None = None  # then the norm of the attention output


@dataclass
class AdapterWeights:
    """Kangaroo's adapter: RMSNorm -> attention -> +residual -> RMSNorm -> the target's LM head."""

    input_norm: np.ndarray
    attn: AttentionWeights
    output_norm: np.ndarray


@dataclass
class HeadWeights:
    """The feature-level draft head: fc fuses three target states, proj joins them with the token's embedding,
    then one decoder layer and the final norm."""

    fc: np.ndarray  # [H, 3H]
    embed_norm: np.ndarray
    feature_norm: np.ndarray
    proj: np.ndarray  # [H, 2H]
    layer: LayerWeights
    output_norm: np.ndarray


@dataclass
class Rope:
    cos: np.ndarray  # [max_context, rotary_dim // 2], attention scaling folded in; rotary_dim <= head_dim
    sin: np.ndarray
    local: Rope | None = None  # Gemma 3: the sliding layers' own table (rope_local_base_freq)


def rope_tables(inv_freq: np.ndarray, max_context: int, scaling: float = 1.0) -> Rope:
    angles = np.outer(np.arange(max_context, dtype=np.float64), inv_freq.astype(np.float64))
    return Rope(cos=(np.cos(angles) * scaling).astype(np.float32),
                sin=(np.sin(angles) * scaling).astype(np.float32))


class PieceGraph:
    """Builds one piece: declares the control inputs, then layers are appended on a hidden value."""

    def __init__(self, name: str, dims: Dims, rope: Rope, flavour: str, float_dtype=np.float32,
                 arch: Arch = LLAMA) -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"unknown graph flavour {flavour!r}; use one of {', '.join(FLAVOURS)}")
        if arch.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {arch.activation!r}; use one of {', '.join(ACTIVATIONS)}")
        self.b = GraphBuilder(name, np.dtype(float_dtype))
        self.dims, self.flavour, self.arch, self.rope = dims, flavour, arch, rope
        self.kv_index = 0
        self.windows: list[int | None] = []  # each attention block's window, in cache order
        self._tables: dict[str, tuple] = {}
        self._window_bias: dict[int, str] = {}
        half = rope.cos.shape[1]
        if flavour == "ort" and (half % 8 or 2 * half > dims.head_dim):
            raise SpecExportError(f"ONNX Runtime's GroupQueryAttention cannot rotate {2 * half} of each head's"
                                  f" {dims.head_dim} features (half of them must be a multiple of 8); build this"
                                  " model with --flavour standard")
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
        self.cos, self.sin, self.cos_pos, self.sin_pos = self.rope_table("global")

    def rope_table(self, which: str) -> tuple:
        """(cos, sin) initializers and, in the standard flavour, their rows at position_ids as
        [batch, seq, 1, half] (broadcast over q/k laid out as [batch, seq, heads, half]); made once."""
        if which not in self._tables:
            b = self.b
            rope = self.rope if which == "global" else self.rope.local
            if rope is None:
                raise ValueError(f"this model has no {which!r} RoPE table")
            suffix = "" if which == "global" else f"_{which}"
            cos, sin = b.weight(f"rope_cos{suffix}", rope.cos), b.weight(f"rope_sin{suffix}", rope.sin)
            cos_pos = sin_pos = None
            if self.flavour != "ort":
                pos = self.position_ids
                cos_pos = b.op("Unsqueeze", [b.op("Gather", [cos, pos], axis=0), b.const([2])])
                sin_pos = b.op("Unsqueeze", [b.op("Gather", [sin, pos], axis=0), b.const([2])])
            self._tables[which] = (cos, sin, cos_pos, sin_pos)
        return self._tables[which]

    def bias_for(self, window: int | None) -> str:
        """The attention bias of a layer: the input itself, or for a sliding window W the input with every key
        whose position is at or below the query's position - W set to the most negative float (made once per
        W). A key's position is its slot for what the cache held before this call, and for the slots this
        call's tokens take (consecutive from position_ids[0]) their position_ids: a token tree's positions go
        by depth, so a tree deeper than W drops its own far ancestors exactly as their chain would."""
        if window is None or window >= self.dims.max_context:
            return self.attention_bias
        if window not in self._window_bias:
            b = self.b
            pos = self.position_ids  # [b, s]
            width = b.op("Gather", [b.op("Shape", [self.attention_bias]), b.const(3)], axis=0)
            slot = b.op("Range", [b.const(0), width, b.const(1)])  # [T]
            offset = b.op("Sub", [slot, b.op("Slice", [pos, b.const([0]), b.const([1]), b.const([1])])])  # [b, T]
            last = b.op("Sub", [b.op("Gather", [b.op("Shape", [pos]), b.const(1)], axis=0), b.const(np.int64(1))])
            index = b.op("Min", [b.op("Max", [offset, b.const(np.int64(0))]), last])
            key_pos = b.op("Where", [b.op("Less", [offset, b.const(np.int64(0))]), slot,
                                     b.op("GatherElements", [pos, index], axis=1)])  # [b, T]
            key_pos = b.op("Unsqueeze", [key_pos, b.const([1, 2])])  # [b, 1, 1, T]
            query = b.op("Unsqueeze", [pos, b.const([1, 3])])  # [b, 1, s, 1]
            seen = b.op("Greater", [key_pos, b.op("Sub", [query, b.const(np.int64(window))])])  # [b, 1, s, T]
            neg = b.const(np.asarray(np.finfo(self.kv_dtype).min, dtype=self.kv_dtype), dtype=self.kv_dtype)
            self._window_bias[window] = b.op("Where", [seen, self.attention_bias, neg])
        return self._window_bias[window]

    @property
    def attn_scale(self) -> float:
        return float(self.arch.attn_scale if self.arch.attn_scale is not None else self.dims.head_dim**-0.5)

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

    def _rotate(self, x: str, heads: int, which: str = "global") -> str:
        """RoPE on [batch, seq, heads, head_dim] (rotate-half layout over the first rotary_dim features; the
        rest pass through, as in Phi-4-mini's partial rotary)."""
        b, hd = self.b, self.dims.head_dim
        _, _, cos, sin = self.rope_table(which)
        half = (self.rope if which == "global" else self.rope.local).cos.shape[1]
        rest = None
        if 2 * half < hd:
            x, rest = b.op("Split", [x, b.const([2 * half, hd - 2 * half])], n_out=2, axis=-1)
        x1, x2 = b.op("Split", [x, b.const([half, half])], n_out=2, axis=-1)
        if self.kv_dtype == np.float16:
            cos, sin = b.op("Cast", [cos], to=10), b.op("Cast", [sin], to=10)
        r1 = b.op("Sub", [b.op("Mul", [x1, cos]), b.op("Mul", [x2, sin])])
        r2 = b.op("Add", [b.op("Mul", [x2, cos]), b.op("Mul", [x1, sin])])
        return b.op("Concat", [r1, r2] if rest is None else [r1, r2, rest], axis=-1)

    def _heads(self, x: str, heads: int) -> str:
        return self.b.op("Reshape", [x, self.b.const([0, 0, heads, self.dims.head_dim])])

    def _projected(self, x: str, w: AttentionWeights, which: str, heads: int) -> str:
        """q or k as [batch, seq, heads, head_dim], RMS-normed per head when the model does (before RoPE)."""
        y = self._heads(self.linear(x, getattr(w, which), getattr(w, f"{which}_bias")), heads)
        norm = getattr(w, f"{which}_norm")
        return y if norm is None else self.rms_norm(y, norm)

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
        self.windows.append(w.window)
        kv_shape = ["batch", d.kv_heads, "cache_len", d.head_dim]
        if self.flavour == "ort":
            if w.q_norm is None:
                packed = np.concatenate([w.q, w.k, w.v], axis=0)
                bias = None
                if w.q_bias is not None:
                    bias = np.concatenate([w.q_bias, w.k_bias, w.v_bias])
                qkv = [self.linear(x, packed, bias), "", ""]
            else:
                # per-head q/k norms come before RoPE, which GroupQueryAttention applies inside: q, k and v go
                # in as three inputs, normed, and GQA still rotates them (do_rotary=1) with its own kernel
                flat = b.const([0, 0, -1])
                qkv = [b.op("Reshape", [self._projected(x, w, "q", d.heads), flat]),
                       b.op("Reshape", [self._projected(x, w, "k", d.kv_heads), flat]),
                       self.linear(x, w.v, w.v_bias)]
            cos, sin, _, _ = self.rope_table(w.rope)
            # a sliding window is in the bias (see the module docstring), not GQA's local_window_size: that
            # counts cache slots from the query's slot, which a token tree's slots are not
            attn, _, _ = b.op(
                "GroupQueryAttention",
                [*qkv, past_k, past_v, self.seqlens_k, self.total_len, cos, sin,
                 self.position_ids, self.bias_for(w.window)],
                n_out=3, domain=MS_DOMAIN, num_heads=d.heads, kv_num_heads=d.kv_heads, do_rotary=1,
                rotary_interleaved=0, scale=self.attn_scale)
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
        q = self._rotate(self._projected(x, w, "q", d.heads), d.heads, w.rope)  # [b, s, H, hd]
        k = self._rotate(self._projected(x, w, "k", d.kv_heads), d.kv_heads, w.rope)  # [b, s, Hkv, hd]
        v = self._heads(self.linear(x, w.v, w.v_bias), d.kv_heads)
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
        scale = b.const(np.asarray(self.attn_scale, dtype=self.kv_dtype), dtype=self.kv_dtype)
        q = b.op("Mul", [q, scale])
        keys = b.op("Unsqueeze", [present_k, b.const([2])])
        vals = b.op("Unsqueeze", [present_v, b.const([2])])
        scores = b.op("MatMul", [q, b.op("Transpose", [keys], perm=[0, 1, 2, 4, 3])])
        # causal mask by slot: the key in slot j is visible to the query in slot i iff j <= i (so stale
        # slots past a rollback are never read); the bias then cuts a tree's other branches and, in a
        # sliding-window layer, what lies behind the window
        scores = b.op("Add", [scores, b.op("Unsqueeze", [self.bias_for(w.window), b.const([2])])])
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
        if self.arch.activation == "silu":
            act = b.op("Mul", [gate, b.op("Sigmoid", [gate])])  # SiLU, as two ops every runtime knows
        else:  # GELU, tanh approximation (opset 17 has no Gelu): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
            def c(v: float) -> str:
                return b.const(np.asarray(v, dtype=self.kv_dtype), dtype=self.kv_dtype)

            cube = b.op("Mul", [b.op("Mul", [gate, gate]), gate])
            inner = b.op("Mul", [b.op("Add", [gate, b.op("Mul", [cube, c(0.044715)])]), c(np.sqrt(2 / np.pi))])
            act = b.op("Mul", [b.op("Mul", [gate, c(0.5)]), b.op("Add", [b.op("Tanh", [inner]), c(1.0)])])
        return self.linear(b.op("Mul", [act, up]), layer.down)

    def decoder_layer(self, x: str, layer: LayerWeights, delta: str | None = None) -> tuple[str, str]:
        """One decoder layer on the residual stream `x` + `delta` (the previous layer's MLP output, not yet
        added, so the add fuses with this layer's first norm); returns the new (residual, delta)."""
        normed, x = self.add_norm(x, delta, layer.input_norm)
        if self.arch.sandwich_norms:  # Gemma 3: x += norm(attn(norm(x))); x += norm(mlp(norm(x)))
            attn = self.rms_norm(self.attention(normed, layer.attn), layer.post_norm)
            normed, h = self.add_norm(x, attn, layer.pre_ff_norm)
            return h, self.rms_norm(self.mlp(normed, layer), layer.post_ff_norm)
        normed, h = self.add_norm(x, self.attention(normed, layer.attn), layer.post_norm)
        return h, self.mlp(normed, layer)

    def decoder_layers(self, x: str, layers: list[LayerWeights]) -> tuple[str, str | None]:
        delta = None
        for layer in layers:
            x, delta = self.decoder_layer(x, layer, delta)
        return x, delta

    def lm_head(self, x: str, lm_head: np.ndarray, keep_last: bool, softcap: float | None = None) -> str:
        """Logits for the last ``logits_to_keep`` positions: a prefill needs one row, not thousands.
        `softcap`: cap * tanh(logits / cap), in fp32 (Gemma's final_logit_softcapping)."""
        b = self.b
        if keep_last:
            keep = b.input("logits_to_keep", np.int64, [1])
            x = b.op("Slice", [x, b.op("Neg", [keep]), b.const([np.iinfo(np.int64).max]), b.const([1])])
        logits = b.op("MatMul", [x, b.weight("lm_head", lm_head.T)])
        if self.kv_dtype == np.float16:
            logits = b.op("Cast", [logits], to=1)
        if softcap is not None:
            cap = b.const(np.float32(softcap), dtype=np.float32)
            logits = b.op("Mul", [b.op("Tanh", [b.op("Div", [logits, cap])]), cap])
        return logits


def _hidden_input(pg: PieceGraph) -> str:
    return pg.b.input("hidden_in", pg.kv_dtype, ["batch", "seq", pg.dims.hidden])


def build_shallow(dims: Dims, rope: Rope, embed: np.ndarray, layers: list[LayerWeights], flavour: str,
                  float_dtype=np.float32, arch: Arch = LLAMA):
    """Embeddings + decoder layers [0, l) -> the early-exit hidden state h_l. (A scaled embedding, Gemma's,
    comes scaled in `embed`.)"""
    pg = PieceGraph("shallow", dims, rope, flavour, float_dtype, arch)
    b = pg.b
    ids = b.input("input_ids", np.int64, ["batch", "seq"])
    x = b.op("Gather", [b.weight("embed_tokens", embed), ids], axis=0)
    b.output(pg.residual(*pg.decoder_layers(x, layers)), "hidden", pg.kv_dtype, ["batch", "seq", dims.hidden])
    return b.model()


def build_deep(dims: Dims, rope: Rope, layers: list[LayerWeights], final_norm: np.ndarray,
               lm_head: np.ndarray, flavour: str, float_dtype=np.float32, arch: Arch = LLAMA,
               features: tuple[int, int, int] | None = None):
    """Decoder layers [l, L) + final norm + LM head; takes the stacked early-exit hidden states.

    With `features` (a draft head's low, middle and high layers as hidden_states indices, the low one being
    l) it also emits `features`: those three residual states of every row of the call, concatenated, which
    the head drafts from. They are read off the residual stream beside the computation, so the logits are
    the same arithmetic either way."""
    pg = PieceGraph("deep", dims, rope, flavour, float_dtype, arch)
    h_in = _hidden_input(pg)
    first = dims.layers - len(layers)
    taps = {} if features is None else {k: None for k in features[1:]}
    x, delta = h_in, None
    for g, layer in enumerate(layers, start=first):
        x, delta = pg.decoder_layer(x, layer, delta)
        if g + 1 in taps:  # hidden_states[g + 1]: the residual stream after layer g
            taps[g + 1] = pg.residual(x, delta)
    if features is not None:
        if features[0] != first or None in taps.values():
            raise ValueError(f"draft head features {features} do not fit deep's layers [{first}, {dims.layers})")
        joined = pg.b.op("Concat", [h_in, *(taps[k] for k in features[1:])], axis=-1)
        pg.b.output(joined, "features", pg.kv_dtype, ["batch", "seq", 3 * dims.hidden])
    logits = pg.lm_head(pg.add_norm(x, delta, final_norm)[0], lm_head, keep_last=True, softcap=arch.final_softcap)
    pg.b.output(logits, "logits", np.float32, ["batch", "kept", dims.vocab])
    return pg.b.model()


def _draft_head(pg: PieceGraph, normed: str, lm_head: np.ndarray, vocab_map: np.ndarray | None,
                keep_last: bool = True) -> None:
    """A drafting piece's outputs: `logits` (over `vocab_map`'s ids in that order when pruned), the greedy
    `top_token` as a real id and its probability `top_prob`, so a greedy draft step reads two numbers.
    `keep_last` False: `normed` holds the kept rows already."""
    b = pg.b
    head = lm_head if vocab_map is None else lm_head[vocab_map]
    logits = pg.lm_head(normed, head, keep_last=keep_last, softcap=pg.arch.final_softcap)
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
                  lm_head: np.ndarray, flavour: str, float_dtype=np.float32, vocab_map: np.ndarray | None = None,
                  arch: Arch = LLAMA, in_proj: np.ndarray | None = None):
    """An independent small causal LM as one piece with its own KV cache (SpS / SpecDec drafting).

    `dims` and `rope` are the drafter's own (its hidden size and heads may differ from the target's; the
    tokenizer may not). Outputs are the adapter's: `logits` over the full vocabulary or, with `vocab_map`
    (FR-Spec), over those ids in that order; `top_token` is always a real token id and `top_prob` its
    probability under the (pruned) head, so a greedy draft step reads two numbers. With `in_proj` ([hidden,
    target hidden], a Spec-Drafter's P_in) `embed` is the target's table and a token's row is projected in the
    graph, so the piece can read the target's rows instead of holding a folded table of its own."""
    pg = PieceGraph("drafter", dims, rope, flavour, float_dtype, arch)
    b = pg.b
    ids = b.input("input_ids", np.int64, ["batch", "seq"])
    x = b.op("Gather", [b.weight("embed_tokens", embed), ids], axis=0)
    x, delta = pg.decoder_layers(x if in_proj is None else pg.linear(x, in_proj), layers)
    _draft_head(pg, pg.add_norm(x, delta, final_norm)[0], lm_head, vocab_map)
    return b.model()


def build_head(dims: Dims, rope: Rope, head: HeadWeights, embed: np.ndarray, lm_head: np.ndarray, flavour: str,
               float_dtype=np.float32, vocab_map: np.ndarray | None = None):
    """The feature-level draft head (exporter/training/head.py) as one piece with its own KV cache.

    Inputs: `input_ids` (the token each slot reads) and `features` [batch, seq, 3H] (the target's low, middle
    and high states as `deep` emits them, or [0, 0, state] for a draft slot). Outputs: the drafting pieces'
    `logits`, `top_token` and `top_prob`, and `state`, the head's own state of the kept rows, which the
    next draft step reads in place of the target's features."""
    pg = PieceGraph("head", dims, rope, flavour, float_dtype)
    b = pg.b
    ids = b.input("input_ids", np.int64, ["batch", "seq"])
    feats = b.input("features", pg.kv_dtype, ["batch", "seq", 3 * dims.hidden])
    e = pg.rms_norm(b.op("Gather", [b.weight("embed_tokens", embed), ids], axis=0), head.embed_norm)
    g = pg.rms_norm(pg.linear(feats, head.fc), head.feature_norm)
    x = pg.linear(b.op("Concat", [e, g], axis=-1), head.proj)
    state = pg.residual(*pg.decoder_layer(x, head.layer))
    keep = b.input("logits_to_keep", np.int64, [1])
    state = b.op("Slice", [state, b.op("Neg", [keep]), b.const([np.iinfo(np.int64).max]), b.const([1])])
    b.output(state, "state", pg.kv_dtype, ["batch", "kept", dims.hidden])
    _draft_head(pg, pg.rms_norm(state, head.output_norm), lm_head, vocab_map, keep_last=False)
    return b.model()
