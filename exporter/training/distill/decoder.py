"""A batched decode loop for distillation: the target's weights in a few large GEMMs a step.

Training data needs the target's weights, not its bit-exact rows, so this loop trades the runtime's row
invariance for throughput: every step runs all live sequences as one batch through fused projections
(q|k|v in one matmul, gate|up in another), over a key/value cache preallocated for every slot, and a slot
whose sequence ends takes the next prompt (continuous batching), so the batch stays full while answers end
at different lengths. Python runs a handful of operations a layer, a step of 64 rows costs tens of GEMM
milliseconds, so the loop runs close to the machine's GEMM rate.

Besides the tokens it hands back, per position, what training reads: the residual states of the chosen
layers (the draft head's low, middle and high features; the adapter's early exit) as fp16, and the top-k
log-probabilities of the target's next-token distribution (the soft labels).

It reads the weights through `hf_weights.extract`, so every family the exporter builds (biases, q/k norms,
partial rotary, sliding windows, Gemma's sandwich norms and soft-capped logits) decodes here as it does there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn import functional as F

from ...hf_weights import LlamaWeights


@dataclass
class Job:
    """One sequence to continue: its prompt ids and how to sample its continuation."""

    key: int  # the caller's index; also seeds the job's sampling, so a draw never depends on its batch
    prompt: list[int]
    max_new: int
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0
    stop: frozenset[int] = frozenset()  # token ids that end the answer (kept as its last token)


@dataclass
class Done:
    """A finished job: the tokens it made and, per position of prompt + response, what training reads."""

    key: int
    prompt: list[int]
    response: list[int]
    features: np.ndarray | None = None  # [len(prompt) + len(response), F, hidden] fp16, the chosen layers
    top_ids: np.ndarray | None = None  # [len(response), k] int32: the next-token top-k at each predicting slot
    top_logp: np.ndarray | None = None  # [len(response), k] fp16 log-probabilities
    ended: bool = False  # the response ends with a stop token


class _Linear:
    """y = x Wᵀ + b in fp32. (FBGEMM's dynamic int8 GEMMs run twice as fast on these shapes, but their
    per-tensor activation scales break on this family's outlier channels: see docs/distillation.md.)"""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None) -> None:
        self.weight = torch.from_numpy(np.ascontiguousarray(weight, dtype=np.float32))
        self.bias = None if bias is None else torch.from_numpy(np.ascontiguousarray(bias, dtype=np.float32))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: _Linear  # [q + 2 kv, hidden]
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: _Linear
    post_norm: torch.Tensor
    gate_up: _Linear  # [2 intermediate, hidden]
    down: _Linear
    index: int
    window: int | None
    local_rope: bool
    pre_ff_norm: torch.Tensor | None = None
    post_ff_norm: torch.Tensor | None = None


@dataclass
class _Slot:
    job: Job
    length: int  # positions written to the cache
    response: list[int] = field(default_factory=list)
    features: list[np.ndarray] = field(default_factory=list)
    top_ids: list[np.ndarray] = field(default_factory=list)
    top_logp: list[np.ndarray] = field(default_factory=list)
    rng: np.random.Generator | None = None


class BatchedDecoder:
    """Decodes many jobs through one set of weights, `slots` sequences at a time, up to `context` positions
    each. `feature_layers` are hidden_states indices (0: the embeddings, i: the residual after i layers);
    `top_k` is how many soft labels a predicting position keeps (0: none)."""

    def __init__(self, weights: LlamaWeights, *, slots: int = 64, context: int = 1024,
                 feature_layers: tuple[int, ...] = (), top_k: int = 0, prefill_tokens: int = 2048) -> None:
        d = weights.dims
        self.dims, self.arch = d, weights.arch
        self.slots, self.context, self.top_k = slots, context, top_k
        self.feature_layers = tuple(feature_layers)
        self.prefill_tokens = prefill_tokens
        t = torch.from_numpy
        self.embed = t(np.ascontiguousarray(weights.embed))
        self.lm_head = _Linear(weights.lm_head, None)
        self.final_norm = t(weights.final_norm)
        self.eps = d.rms_eps
        self.layers: list[_Layer] = []
        for lw in weights.layers:
            a = lw.attn
            biases = [a.q_bias, a.k_bias, a.v_bias]
            bias = None
            if any(b is not None for b in biases):
                sizes = (a.q.shape[0], a.k.shape[0], a.v.shape[0])
                bias = (np.concatenate([b if b is not None else np.zeros(n, np.float32)
                                         for b, n in zip(biases, sizes, strict=True)]))
            opt = (lambda x: None if x is None else t(x))  # noqa: E731
            self.layers.append(_Layer(
                input_norm=t(lw.input_norm), qkv=_Linear(np.concatenate([a.q, a.k, a.v]), bias),
                q_norm=opt(a.q_norm), k_norm=opt(a.k_norm), o=_Linear(a.o, None),
                post_norm=t(lw.post_norm), gate_up=_Linear(np.concatenate([lw.gate, lw.up]), None),
                down=_Linear(lw.down, None), index=len(self.layers), window=a.window,
                local_rope=a.rope == "local",
                pre_ff_norm=opt(lw.pre_ff_norm), post_ff_norm=opt(lw.post_ff_norm)))
        rope = weights.rope
        if rope.cos.shape[0] < context:
            raise ValueError(f"the RoPE tables cover {rope.cos.shape[0]} positions, fewer than the context {context}")
        self.cos, self.sin = t(rope.cos[:context]), t(rope.sin[:context])
        self.local = None if rope.local is None else (t(rope.local.cos[:context]), t(rope.local.sin[:context]))
        self.scale = self.arch.attn_scale or d.head_dim ** -0.5
        shape = (slots, d.kv_heads, context, d.head_dim)
        self.keys = [torch.zeros(shape) for _ in self.layers]
        self.values = [torch.zeros(shape) for _ in self.layers]
        self.live: list[_Slot] = []  # slot i of the caches holds live[i]

    # -- the model -----------------------------------------------------------------------------------------

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE over the first rotary features; cos/sin broadcast [..., rotary / 2]."""
        half = cos.shape[-1]
        x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        out = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
        return torch.cat(out + ([rest] if rest.shape[-1] else []), -1)

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        gate, up = layer.gate_up(x).chunk(2, -1)
        act = F.silu(gate) if self.arch.activation == "silu" else F.gelu(gate, approximate="tanh")
        return layer.down(act * up)

    def _block(self, layer: _Layer, x: torch.Tensor, attend) -> torch.Tensor:
        """One decoder layer over x [..., hidden]; attend(q, k, v) -> [..., heads * head_dim]."""
        d = self.dims
        h = _rms(x, layer.input_norm, self.eps)
        qkv = layer.qkv(h)
        nq, nk = d.heads * d.head_dim, d.kv_heads * d.head_dim
        q = qkv[..., :nq].unflatten(-1, (d.heads, d.head_dim))
        k = qkv[..., nq:nq + nk].unflatten(-1, (d.kv_heads, d.head_dim))
        v = qkv[..., nq + nk:].unflatten(-1, (d.kv_heads, d.head_dim))
        if layer.q_norm is not None:
            q, k = _rms(q, layer.q_norm, self.eps), _rms(k, layer.k_norm, self.eps)
        attn = layer.o(attend(layer, q, k, v))
        if self.arch.sandwich_norms:
            attn = _rms(attn, layer.post_norm, self.eps)
            x = x + attn
            mlp = self._mlp(layer, _rms(x, layer.pre_ff_norm, self.eps))
            return x + _rms(mlp, layer.post_ff_norm, self.eps)
        x = x + attn
        return x + self._mlp(layer, _rms(x, layer.post_norm, self.eps))

    def _tables(self, layer: _Layer) -> tuple[torch.Tensor, torch.Tensor]:
        return self.local if layer.local_rope and self.local is not None else (self.cos, self.sin)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(_rms(x, self.final_norm, self.eps))
        cap = self.arch.final_softcap
        return cap * torch.tanh(logits / cap) if cap else logits

    def _forward(self, x: torch.Tensor, attend) -> tuple[torch.Tensor, list[torch.Tensor]]:
        feats = []
        for i, layer in enumerate(self.layers):
            if i in self.feature_layers:
                feats.append(x)
            x = self._block(layer, x, attend)
        if len(self.layers) in self.feature_layers:
            feats.append(x)
        return x, feats

    def _causal(self, sequences: list[list[int]], rows: torch.Tensor | None) -> tuple[torch.Tensor, list]:
        """A causal forward over whole sequences (padded on the right); their keys and values go to the cache
        slots `rows` unless rows is None."""
        d = self.dims
        width = max(len(s) for s in sequences)
        ids = torch.zeros(len(sequences), width, dtype=torch.long)
        for r, seq in enumerate(sequences):
            ids[r, :len(seq)] = torch.tensor(seq)
        pos = torch.arange(width)
        causal = pos[None, :] <= pos[:, None]
        masks: dict[int | None, torch.Tensor] = {}

        def attend(layer: _Layer, q, k, v):
            cos, sin = self._tables(layer)
            q = self._rope(q, cos[pos, None, :], sin[pos, None, :])  # [b, s, heads, hd]
            k = self._rope(k, cos[pos, None, :], sin[pos, None, :])
            if rows is not None:
                self.keys[layer.index][rows, :, :width] = k.transpose(1, 2)
                self.values[layer.index][rows, :, :width] = v.transpose(1, 2)
            if layer.window not in masks:
                m = causal if layer.window is None else causal & (pos[:, None] - pos[None, :] < layer.window)
                masks[layer.window] = m
            g = d.heads // d.kv_heads
            qh = q.transpose(1, 2).unflatten(1, (d.kv_heads, g))  # [b, kv, g, s, hd]
            kh, vh = k.transpose(1, 2)[:, :, None], v.transpose(1, 2)[:, :, None]
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=masks[layer.window], scale=self.scale)
            return out.flatten(1, 2).transpose(1, 2).flatten(-2)  # [b, s, heads * hd]

        return self._forward(self.embed[ids], attend)

    @torch.inference_mode()
    def teacher_forced(self, sequences: list[list[int]]) -> list[np.ndarray]:
        """The target's greedy choice after every prefix of each sequence (position i predicts token i + 1):
        what a decode at another precision is compared with."""
        x, _ = self._causal(sequences, None)
        best = self._logits(x).argmax(-1).numpy()
        return [best[r, :len(seq)] for r, seq in enumerate(sequences)]

    # -- prefill: new prompts into free slots --------------------------------------------------------------

    @torch.inference_mode()
    def _prefill(self, jobs: list[Job]) -> None:
        first = len(self.live)
        x, feats = self._causal([j.prompt for j in jobs], torch.arange(first, first + len(jobs)))
        last = torch.tensor([len(j.prompt) - 1 for j in jobs])
        logits = self._logits(x[torch.arange(len(jobs)), last])
        stacked = torch.stack(feats, 2).to(torch.float16).numpy() if feats else None
        for r, job in enumerate(jobs):
            slot = _Slot(job, len(job.prompt))
            if job.temperature > 0:
                slot.rng = np.random.default_rng([job.seed, job.key])
            if stacked is not None:
                slot.features.append(stacked[r, :len(job.prompt)])
            self.live.append(slot)
        self._emit(logits, list(range(first, first + len(jobs))))

    # -- one decode step over every live slot ---------------------------------------------------------------

    @torch.inference_mode()
    def _step(self) -> None:
        d = self.dims
        n = len(self.live)
        ids = torch.tensor([s.response[-1] for s in self.live])
        pos = torch.tensor([s.length for s in self.live])
        span = int(pos.max()) + 1
        slots = torch.arange(n)
        seen = torch.arange(span)[None, :]
        visible: dict[int | None, torch.Tensor] = {}

        def attend(layer: _Layer, q, k, v):
            cos, sin = self._tables(layer)
            q = self._rope(q, cos[pos, None, :], sin[pos, None, :])  # [n, heads, hd]
            k = self._rope(k, cos[pos, None, :], sin[pos, None, :])
            keys, values = self.keys[layer.index], self.values[layer.index]
            keys[slots, :, pos] = k
            values[slots, :, pos] = v
            if layer.window not in visible:
                ok = seen <= pos[:, None]
                if layer.window is not None:
                    ok &= pos[:, None] - seen < layer.window
                visible[layer.window] = torch.zeros(ok.shape).masked_fill_(~ok, -math.inf)[:, None, None, :]
            g = d.heads // d.kv_heads
            qh = q.unflatten(1, (d.kv_heads, g)).flatten(0, 1)  # [n kv, g, hd]
            scores = torch.bmm(qh, keys[:n, :, :span].flatten(0, 1).transpose(1, 2))  # [n kv, g, span]
            scores = scores.unflatten(0, (n, d.kv_heads)).mul_(self.scale).add_(visible[layer.window])
            probs = torch.softmax(scores, -1).flatten(0, 1)
            out = torch.bmm(probs, values[:n, :, :span].flatten(0, 1))  # [n kv, g, hd]
            return out.reshape(n, -1)  # [n, heads * hd]

        x, feats = self._forward(self.embed[ids], attend)
        logits = self._logits(x)
        if feats:
            stacked = torch.stack(feats, 1).to(torch.float16).numpy()
            for i, slot in enumerate(self.live):
                slot.features.append(stacked[i:i + 1])
        for slot in self.live:
            slot.length += 1
        self._emit(logits, list(range(n)))

    def _emit(self, logits: torch.Tensor, at: list[int]) -> None:
        """Choose each slot's next token from its row of logits, and keep its soft labels."""
        greedy = logits.argmax(-1).tolist()
        if self.top_k:
            logp = torch.log_softmax(logits.float(), -1)
            top = torch.topk(logp, self.top_k, -1)
            top_ids, top_logp = top.indices.to(torch.int32).numpy(), top.values.to(torch.float16).numpy()
        for r, i in enumerate(at):
            slot = self.live[i]
            job = slot.job
            if job.temperature > 0:
                token = _sample(logits[r], job.temperature, job.top_p, slot.rng)
            else:
                token = greedy[r]
            slot.response.append(token)
            if self.top_k:
                slot.top_ids.append(top_ids[r])
                slot.top_logp.append(top_logp[r])

    # -- the loop ---------------------------------------------------------------------------------------

    def _finished(self, slot: _Slot) -> bool:
        job = slot.job
        return (slot.response[-1] in job.stop or len(slot.response) >= job.max_new
                or slot.length + 1 >= self.context)

    def _retire(self, i: int) -> Done:
        """Take slot i's sequence out; the last live slot moves into its place so live slots stay 0..n-1."""
        slot = self.live[i]
        last = len(self.live) - 1
        if i != last:
            for cache in (*self.keys, *self.values):
                cache[i, :, :self.live[last].length + 1] = cache[last, :, :self.live[last].length + 1]
            self.live[i] = self.live[last]
        self.live.pop()
        done = Done(slot.job.key, slot.job.prompt, slot.response, ended=slot.response[-1] in slot.job.stop)
        if slot.features:
            # the last response token was never fed back, so it has no state of its own
            done.features = np.concatenate(slot.features)[:len(slot.job.prompt) + len(slot.response) - 1]
        if self.top_k:
            done.top_ids, done.top_logp = np.stack(slot.top_ids), np.stack(slot.top_logp)
        return done

    def run(self, jobs: Iterable[Job], progress=None) -> Iterator[Done]:
        """Decode every job, yielding each as it finishes (not in order). Jobs are admitted in the order
        given, so pass them sorted by prompt length to keep prefill padding small. `progress(tokens)` is
        called after every step with the response tokens it made."""
        queue = iter(jobs)
        pending: Job | None = next(queue, None)
        while pending is not None or self.live:
            free = self.slots - len(self.live)
            # refill once an eighth of the slots are free (or nothing is live): one prefill of several prompts
            # keeps its GEMMs large, and a full batch keeps the steps' GEMMs large
            if pending is not None and (free >= max(1, self.slots // 8) or not self.live):
                batch: list[Job] = []
                while pending is not None and len(batch) < free and \
                        (len(batch) + 1) * max([len(pending.prompt)] + [len(j.prompt) for j in batch]) \
                        <= max(self.prefill_tokens, len(pending.prompt)):
                    if len(pending.prompt) + 1 >= self.context:
                        raise ValueError(f"a prompt of {len(pending.prompt)} tokens leaves no room in a context of"
                                         f" {self.context}")
                    batch.append(pending)
                    pending = next(queue, None)
                self._prefill(batch)
                made = len(batch)
            else:
                self._step()
                made = len(self.live)
            if progress is not None:
                progress(made)
            for i in reversed(range(len(self.live))):
                if self._finished(self.live[i]):
                    yield self._retire(i)


def _sample(logits: torch.Tensor, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    probs = torch.softmax(logits.float() / temperature, -1)
    order = torch.argsort(probs, descending=True)
    sorted_p = probs[order].double().numpy()
    cum = np.cumsum(sorted_p)
    keep = int(np.searchsorted(cum, top_p * cum[-1])) + 1  # the smallest prefix holding top_p of the mass
    u = rng.random() * cum[keep - 1]
    return int(order[min(int(np.searchsorted(cum[:keep], u, side="right")), keep - 1)])
