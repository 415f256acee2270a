"""Train the feature-level draft head on the target's own responses, with training-time test.

The target runs teacher-forced once over each sequence: its low, middle and high states are the head's input
and its final normed state gives the soft labels (one matmul with the LM head away). On the CPU those are
computed once and cached on disk; on a GPU they are recomputed per batch (5M tokens of them would not fit in
memory, and a GPU forward costs less than reading them back).

Training-time test: the head runs `unroll` times over each batch. Pass 0 reads the target's states at every
slot. Pass k reads, at slot t, the head's own state of slot t - 1 from pass k - 1 (in the high layer's
place), and attends to what a k-th draft step sees at run time: the target-fed slots up to t - k and the
slots its own earlier draft steps wrote (t - k + 1 .. t, from passes 1 .. k). So draft position k + 1 is
trained exactly as it is used. Held-out agreement is reported per draft position, with the chain's
expected tokens per step it implies.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch.nn import functional as F
from tqdm import tqdm

from ...runtime.errors import SpecExportError
from ...runtime.paths import cache_dir
from ..hf_weights import dims_of, embedding, rope_inv_freq
from .device import Device, optimizer_step, resolve_device
from .fit_adapter import (
    _seq_digest,
    cosine_lr,
    pruned_vocab,
    read_trained,
    response_counts,
    response_tokens,
    split_holdout,
)
from .head import DraftHead, HeadConfig

HEAD_FILE = "head.safetensors"
META_FILE = "head.json"
COUNTS_FILE = "token_counts.npy"


@dataclass
class HeadTrainConfig:
    exit_layer: int = 2
    steps: int = 600
    tokens_per_batch: int = 2048
    lr: float = 1e-3
    warmup: int = 30
    weight_decay: float = 0.0
    unroll: int = 3  # training-time test: draft positions trained per slot
    decay: float = 0.8  # the loss weight of draft position k + 1 is decay ** k
    holdout: float = 0.04
    seed: int = 0
    eval_every: int = 100
    threads: int = 0
    draft_vocab: int = 8192  # FR-Spec: the head's LM head keeps the N most frequent response tokens


class Teacher:
    """The target's states for a batch of sequences: features [b, T, 3H] (low, middle, high) and the final
    normed states [b, T, H], from a cache on the CPU or computed on the device."""

    def __init__(self, model, sequences: list[tuple[np.ndarray, int]], layers: tuple[int, int, int],
                 target_sha: str, device: Device) -> None:
        self.model, self.sequences, self.layers, self.device = model, sequences, layers, device
        self.cache: dict[str, np.ndarray] | None = None
        if not device.is_cuda:
            self.cache = self._cached(target_sha)

    def _forward(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(self.sequences[j][0]) for j in idx)
        at = next(self.model.parameters()).device
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros(len(idx), width, dtype=torch.long)
        for row, j in enumerate(idx):
            n = len(self.sequences[j][0])
            ids[row, :n] = torch.as_tensor(self.sequences[j][0])
            mask[row, :n] = 1
        with torch.inference_mode(), self.device.autocast():
            out = self.model.model(ids.to(at), attention_mask=mask.to(at), output_hidden_states=True)
            states = out.hidden_states
            feats = torch.cat([states[i] for i in self.layers], -1).float()
            return feats, states[-1].float()

    def _cached(self, target_sha: str) -> dict[str, np.ndarray]:
        """The states of every sequence, fp16 .npy files memory-mapped: a 5M-token corpus's (about 23 GB)
        need not fit in memory, and the pages a batch reads are the only ones loaded."""
        tag = "-".join(map(str, self.layers))
        path = cache_dir("features") / f"head-{target_sha[:16]}-{_seq_digest(self.sequences)}-f{tag}"
        names = ("features", "final", "offsets")
        if not all((path / f"{n}.npy").is_file() for n in names):
            self._compute(path)
        return {n: np.load(path / f"{n}.npy", mmap_mode="r") for n in names}

    def _compute(self, path: Path) -> None:
        lengths = [len(s[0]) for s in self.sequences]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        hidden = self.model.config.hidden_size
        tmp = path.with_name(path.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        np.save(tmp / "offsets.npy", offsets)
        feats = np.lib.format.open_memmap(tmp / "features.npy", "w+", np.float16, (int(offsets[-1]), 3 * hidden))
        final = np.lib.format.open_memmap(tmp / "final.npy", "w+", np.float16, (int(offsets[-1]), hidden))
        order = sorted(range(len(self.sequences)), key=lambda j: lengths[j])
        bar = tqdm(total=int(offsets[-1]), desc="target states", unit="tok", unit_scale=True, file=sys.stderr,
                   disable=None)
        i = 0
        while i < len(order):
            batch = [order[i]]
            while i + len(batch) < len(order) and (len(batch) + 1) * lengths[order[i + len(batch)]] <= 4096:
                batch.append(order[i + len(batch)])
            i += len(batch)
            f, h = self._forward(batch)
            for row, j in enumerate(batch):
                n = lengths[j]
                feats[offsets[j]:offsets[j] + n] = f[row, :n].cpu().numpy()
                final[offsets[j]:offsets[j] + n] = h[row, :n].cpu().numpy()
                bar.update(n)
        bar.close()
        feats.flush()
        final.flush()
        del feats, final
        if path.exists():  # a stale half of an earlier layout
            shutil.rmtree(path)
        tmp.rename(path)  # complete or absent: a stopped run leaves only the .tmp directory, recomputed next time

    def batch(self, idx: list[int]) -> tuple[torch.Tensor, ...]:
        """(ids [b, T], features [b, T, 3H], final states [b, T, H], labelled [b, T]) on the device:
        labelled[t] marks positions whose next token is a response token."""
        width = max(len(self.sequences[j][0]) for j in idx)
        dev = self.device.torch
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        labelled = torch.zeros(len(idx), width, dtype=torch.bool)
        for row, j in enumerate(idx):
            tokens, plen = self.sequences[j]
            ids[row, :len(tokens)] = torch.as_tensor(tokens)
            labelled[row, max(plen - 1, 0):len(tokens) - 1] = True
        if self.cache is None:
            feats, final = self._forward(idx)
        else:
            h = self.model.config.hidden_size
            feats = torch.zeros(len(idx), width, 3 * h)
            final = torch.zeros(len(idx), width, h)
            off = self.cache["offsets"]
            for row, j in enumerate(idx):
                n = len(self.sequences[j][0])
                feats[row, :n] = torch.from_numpy(self.cache["features"][off[j]:off[j] + n].astype(np.float32))
                final[row, :n] = torch.from_numpy(self.cache["final"][off[j]:off[j] + n].astype(np.float32))
        return ids.to(dev), feats.to(dev), final.to(dev), labelled.to(dev)


def _shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """x [b, ..., s, d] moved `by` slots later along the sequence axis (-2): slot t holds x[t - by]."""
    if by == 0:
        return x
    pad = torch.zeros_like(x[..., :by, :])
    return torch.cat([pad, x[..., :-by, :]], -2)


def unrolled_states(head: DraftHead, feats: torch.Tensor, embeds: torch.Tensor, unroll: int) -> list[torch.Tensor]:
    """The head's states [b, s, H] for draft positions 1 .. unroll at every slot (see the module docstring)."""
    s = feats.shape[1]
    positions = torch.arange(s, device=feats.device)
    x = head.inputs(feats, embeds)
    q, k0, v0 = head.qkv(x, positions)
    states = [head.finish(x, F.scaled_dot_product_attention(q, k0, v0, is_causal=True))]
    keys, vals = [k0], [v0]
    scale = head.cfg.head_dim ** -0.5
    slot = positions[:, None]
    for k in range(1, unroll):
        own = _shift(states[-1], 1)
        x = head.inputs(torch.cat([torch.zeros_like(own), torch.zeros_like(own), own], -1), embeds)
        q, kk, vk = head.qkv(x, positions)
        # target-fed keys at slots <= t - k, then one key per earlier draft step on the diagonal
        scores = (q @ k0.transpose(-1, -2)) * scale
        scores = scores.masked_fill(positions[None, :] > slot - k, float("-inf"))
        diag_k = [_shift(keys[j], k - j) for j in range(1, k)] + [kk]
        diag_v = [_shift(vals[j], k - j) for j in range(1, k)] + [vk]
        diag = torch.stack([(q * key).sum(-1) * scale for key in diag_k], -1)  # [b, heads, s, k]
        probs = torch.softmax(torch.cat([scores, diag], -1), -1)
        out = probs[..., :s] @ v0 + sum(probs[..., s + j, None] * diag_v[j] for j in range(k))
        states.append(head.finish(x, out))
        keys.append(kk)
        vals.append(vk)
    return states


def ttt_loss(head: DraftHead, embed: torch.Tensor, lm_head: torch.Tensor, vocab: torch.Tensor | None,
             batch: tuple[torch.Tensor, ...], unroll: int, decay: float, exact: bool = False):
    """(loss, hits) where hits[k] is a [b, s] bool of draft position k + 1's top-1 agreeing with the target
    (against its full-vocabulary argmax when `exact`), and valid[k] the slots that count."""
    ids, feats, final, labelled = batch
    # slot t reads the features of t and the token at t + 1, and predicts the token at t + 2: the target's
    # distribution there is the LM head over its final state at t + 1
    embeds = embed[ids[:, 1:]]
    states = unrolled_states(head, feats[:, :-1], embeds, unroll)
    teacher_h = final[:, 1:]
    head_w = lm_head if vocab is None else lm_head[vocab]
    slots = torch.arange(embeds.shape[1], device=ids.device)
    loss, hits, valid = 0.0, [], []
    for k, s in enumerate(states):
        ok = labelled[:, 1:] & (slots >= k)[None, :]
        with torch.no_grad():
            th = teacher_h[ok]
            p = F.softmax(th @ head_w.T, -1)
            best = (th @ lm_head.T).argmax(-1) if exact and vocab is not None else p.argmax(-1)
            if vocab is not None and not exact:
                best = vocab[best]
        logits = head.output_norm(s[ok]) @ head_w.T
        loss = loss + decay**k * -(p * F.log_softmax(logits.float(), -1)).sum(-1).mean()
        guess = logits.argmax(-1) if vocab is None else vocab[logits.argmax(-1)]
        hit = torch.zeros_like(ok)
        hit[ok] = guess == best
        hits.append(hit)
        valid.append(ok)
    return loss / sum(decay**k for k in range(unroll)), hits, valid


def _batches(lengths: list[int], idx: list[int], tokens: int, rng: np.random.Generator | None):
    order = list(idx) if rng is None else [idx[i] for i in rng.permutation(len(idx))]
    batch, width = [], 0
    for j in order:
        if batch and max(width, lengths[j]) * (len(batch) + 1) > tokens:
            yield batch
            batch, width = [], 0
        batch.append(j)
        width = max(width, lengths[j])
    if batch:
        yield batch


@torch.no_grad()
def evaluate(head: DraftHead, teacher: Teacher, embed, lm_head, vocab, idx: list[int], cfg: HeadTrainConfig) -> dict:
    """Held-out agreement per draft position (teacher-forced tokens), and of a chain: position k + 1 counts
    only where positions 1 .. k of the same chain were right, so 1 + their sum is the expected tokens per
    step of a chain of `unroll` drafts (greedy, no stopping rule)."""
    lengths = [len(s[0]) for s in teacher.sequences]
    losses, n = 0.0, 0
    agree = np.zeros(cfg.unroll)
    chain = np.zeros(cfg.unroll)
    counted = np.zeros(cfg.unroll)
    for batch in _batches(lengths, idx, cfg.tokens_per_batch, None):
        with teacher.device.autocast():
            loss, hits, valid = ttt_loss(head, embed, lm_head, vocab, teacher.batch(batch), cfg.unroll, cfg.decay,
                                         exact=True)
        first = int(valid[0].sum())
        losses += float(loss) * first
        n += first
        run = torch.ones_like(hits[0])
        for k in range(cfg.unroll):
            # the chain that reaches slot t at position k + 1 started at slot t - k
            run = hits[0] if k == 0 else run[:, :-1] & hits[k][:, k:]  # aligned to slots k ..
            agree[k] += float(hits[k][valid[k]].sum())
            counted[k] += float(valid[k].sum())
            chain[k] += float(run[valid[k][:, k:]].sum())
    agree_k = (agree / np.maximum(counted, 1)).tolist()
    chain_k = (chain / np.maximum(counted, 1)).tolist()
    return {"loss": losses / max(n, 1), "agreement": agree_k[0], "agreement_by_position": agree_k,
            "chain_by_position": chain_k, "chain_tokens_per_step": 1.0 + sum(chain_k), "tokens": n}


def train_head(model, sequences: list[tuple[np.ndarray, int]], cfg: HeadTrainConfig, out_dir: Path, target_sha: str,
               command: str = "", data: str = "", device: str | Device | None = "auto") -> dict:
    """Trains, writes head.safetensors + head.json (+ the FR-Spec token counts) to `out_dir`, returns the
    metadata. Held-out sequences are drawn as the adapter's and the drafter's are (same seed, same split)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.unroll < 1:
        raise SpecExportError(f"--unroll is {cfg.unroll}; training-time test needs at least 1 draft position")
    dev = resolve_device(device)
    dims = dims_of(model.config, 16)
    head_cfg = HeadConfig.for_target(dims, cfg.exit_layer)
    held, train_idx, rng = split_holdout(len(sequences), cfg.holdout, cfg.seed)
    counts = response_counts(sequences, train_idx, dims.vocab)
    vocab_ids = pruned_vocab(counts, cfg.draft_vocab)
    vocab = None if vocab_ids is None else torch.from_numpy(vocab_ids).to(dev.torch)

    torch.manual_seed(cfg.seed)
    model.cpu()
    head = DraftHead(head_cfg, *rope_inv_freq(model))
    head.init_from_target(model)
    embed = torch.from_numpy(embedding(model)).to(dev.torch)
    lm_head = model.lm_head.weight.detach().to(dev.torch)
    model.to(dev.torch)
    teacher = Teacher(model, sequences, head_cfg.features, target_sha, dev)
    head.to(dev.torch)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    scaler = dev.scaler()
    lengths = [len(s[0]) for s in sequences]
    step, seen, history = 0, 0, []
    before = evaluate(head, teacher, embed, lm_head, vocab, held, cfg)
    history.append({"step": 0, "train_tokens": 0, "eval": before})
    bar = tqdm(total=cfg.steps, desc="train head", unit="step", file=sys.stderr, disable=None)
    t0 = time.time()
    while step < cfg.steps:
        for batch in _batches(lengths, train_idx, cfg.tokens_per_batch, rng):
            if step >= cfg.steps:
                break
            for group in opt.param_groups:
                group["lr"] = cosine_lr(step, cfg.lr, cfg.warmup, cfg.steps)
            tensors = teacher.batch(batch)
            with dev.autocast():
                loss, hits, valid = ttt_loss(head, embed, lm_head, vocab, tensors, cfg.unroll, cfg.decay)
            optimizer_step(opt, scaler, loss, head)
            step += 1
            seen += response_tokens(sequences, batch)
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}", top1=f"{float(hits[0][valid[0]].float().mean()):.1%}")
            if step % cfg.eval_every == 0 or step == cfg.steps:
                ev = evaluate(head, teacher, embed, lm_head, vocab, held, cfg)
                history.append({"step": step, "train_tokens": seen, "eval": ev})
                by = ", ".join(f"{a:.1%}" for a in ev["agreement_by_position"])
                bar.write(f"step {step} ({seen} tokens): held-out agreement by draft position {by}; chain"
                          f" {ev['chain_tokens_per_step']:.2f} tokens/step", file=sys.stderr)
    bar.close()
    elapsed = time.time() - t0
    final = history[-1]["eval"]
    meta = {
        "target_sha256": target_sha, "exit_layer": cfg.exit_layer, "features": list(head_cfg.features),
        "config": asdict(cfg), "train_sequences": len(train_idx), "heldout_sequences": len(held),
        "train_tokens": int(sum(lengths[j] - sequences[j][1] for j in train_idx)), "tokens_seen": seen,
        "heldout_before": before, "heldout": final, "history": history, "train_seconds": round(elapsed, 1),
        "steps_per_second": round(step / max(elapsed, 1e-9), 3), "command": command, "data": data,
        "device": dev.describe(), "draft_vocab": cfg.draft_vocab or None,
    }
    model.cpu()
    save_head(head.cpu(), out_dir, meta)
    np.save(out_dir / COUNTS_FILE, counts)
    return meta


def save_head(head: DraftHead, out_dir: Path, meta: dict) -> None:
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(out_dir / HEAD_FILE), metadata={"specexport": json.dumps(
        {k: meta[k] for k in ("target_sha256", "exit_layer")})})
    cfg = asdict(head.cfg)
    (out_dir / META_FILE).write_text(json.dumps({**meta, "config_head": cfg}, indent=2) + "\n")


def load_head(path: Path, model, target_sha: str | None = None) -> tuple[DraftHead, dict]:
    """A trained head directory for `model`; refuses one trained for another target."""
    meta, state = read_trained(Path(path), HEAD_FILE, META_FILE, "draft head", "specexport train-head", target_sha)
    raw = meta["config_head"]
    head = DraftHead(HeadConfig(**{**raw, "features": tuple(raw["features"])}), *rope_inv_freq(model))
    head.load_state_dict(state)
    return head.eval(), meta
