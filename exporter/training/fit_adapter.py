"""Train a Kangaroo adapter by self-distillation on the target's own responses.

Everything frozen is computed once and cached: the early-exit states h_l and the target's final
normed states (its next-token distribution is one matmul with the LM head away, so the soft labels
are exact without storing 49,152 probabilities per token). The loss is the soft-label cross-entropy
between the target's and the adapter's distributions on response tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F
from tqdm import tqdm

from ...runtime.errors import SpecExportError
from ...runtime.paths import cache_dir
from ..hf_weights import dims_of, rope_inv_freq
from .adapter import Adapter, AdapterConfig
from .device import Device, optimizer_step, resolve_device

ADAPTER_FILE = "adapter.safetensors"
META_FILE = "adapter.json"
COUNTS_FILE = "token_counts.npy"


@dataclass
class TrainConfig:
    exit_layer: int = 2
    arch: str = "attention"
    steps: int = 600
    tokens_per_batch: int = 4096
    lr: float = 5e-4
    warmup: int = 30
    weight_decay: float = 0.0
    holdout: float = 0.04
    seed: int = 0
    eval_every: int = 100
    threads: int = 0  # 0 = all cores
    draft_vocab: int = 0  # FR-Spec: train (and later export) the head over the N most frequent tokens; 0 = all


@dataclass
class Features:
    h_exit: list[np.ndarray]  # fp16 [len, hidden] per sequence
    h_final: list[np.ndarray]  # fp16 [len, hidden], after the final norm
    prompt_lens: np.ndarray


def _seq_digest(sequences: list[tuple[np.ndarray, int]]) -> str:
    d = hashlib.sha256()
    for tokens, plen in sequences:
        d.update(np.asarray(tokens, dtype=np.int32).tobytes() + int(plen).to_bytes(4, "little"))
    return d.hexdigest()[:16]


def compute_features(model, sequences: list[tuple[np.ndarray, int]], exit_layer: int, target_sha: str,
                     batch_tokens: int = 4096, device: Device | None = None) -> Features:
    """h_l and the final normed state for every token, cached by (target, data, l); the forward passes run on
    `device` (the model's own when None)."""
    path = cache_dir("features") / f"{target_sha[:16]}-{_seq_digest(sequences)}-l{exit_layer}.npz"
    if path.is_file():
        z = np.load(path)
        offsets = z["offsets"]
        split = lambda a: [a[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]  # noqa: E731
        return Features(split(z["h_exit"]), split(z["h_final"]), z["prompt_lens"])
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    h_exit: list = [None] * len(sequences)
    h_final: list = [None] * len(sequences)
    bar = tqdm(total=sum(len(s[0]) for s in sequences), desc=f"features (l={exit_layer})", unit="tok",
               unit_scale=True, file=sys.stderr, disable=None)
    i = 0
    if device is not None:
        model.to(device.torch)
    at = next(model.parameters()).device
    autocast = device.autocast() if device is not None else contextlib.nullcontext()
    with torch.inference_mode(), autocast:
        while i < len(order):
            batch = [order[i]]
            while i + len(batch) < len(order) and \
                    (len(batch) + 1) * len(sequences[order[i + len(batch)]][0]) <= batch_tokens:
                batch.append(order[i + len(batch)])
            i += len(batch)
            width = max(len(sequences[j][0]) for j in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for row, j in enumerate(batch):
                n = len(sequences[j][0])
                ids[row, :n] = torch.as_tensor(sequences[j][0])
                mask[row, :n] = 1
            # the decoder alone: the LM head's logits are not needed, and cost a fifth of the forward
            out = model.model(ids.to(at), attention_mask=mask.to(at), output_hidden_states=True)
            exits, finals = out.hidden_states[exit_layer].float().cpu(), out.hidden_states[-1].float().cpu()
            for row, j in enumerate(batch):
                n = len(sequences[j][0])
                h_exit[j] = exits[row, :n].numpy().astype(np.float16)
                h_final[j] = finals[row, :n].numpy().astype(np.float16)
                bar.update(n)
    bar.close()
    offsets = np.cumsum([0] + [len(h) for h in h_exit])
    prompt_lens = np.array([p for _, p in sequences], dtype=np.int64)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, h_exit=np.concatenate(h_exit), h_final=np.concatenate(h_final), offsets=offsets,
             prompt_lens=prompt_lens)
    tmp.rename(path)
    return Features(h_exit, h_final, prompt_lens)


def with_extra(model, sequences: list[tuple[np.ndarray, int]], extra: list[list[tuple[np.ndarray, int]]],
               exit_layer: int, target_sha: str,
               device: Device | None = None) -> tuple[list[tuple[np.ndarray, int]], Features, int]:
    """`sequences` followed by every training-only part of `extra`, their features (each part cached on its
    own, so adding a part never recomputes the others) and how many lead: held-out sequences are drawn
    from those alone."""
    feats = compute_features(model, sequences, exit_layer, target_sha, device=device)
    pool = len(sequences)
    for part in extra:
        more = compute_features(model, part, exit_layer, target_sha, device=device)
        feats = Features(feats.h_exit + more.h_exit, feats.h_final + more.h_final,
                         np.concatenate([feats.prompt_lens, more.prompt_lens]))
        sequences = sequences + part
    return sequences, feats, pool


def split_holdout(n: int, holdout: float, seed: int) -> tuple[list[int], list[int], np.random.Generator]:
    """(held-out, training) sequence indices and the generator that then orders the training batches. The
    adapter and the drafter call it with the same seed, so they hold out the same sequences."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    n_hold = max(1, int(n * holdout))
    return sorted(perm[:n_hold].tolist()), perm[n_hold:].tolist(), rng


def response_counts(sequences: list[tuple[np.ndarray, int]], idx: list[int], vocab: int) -> np.ndarray:
    """How often the target emits each token in the responses of `idx` (FR-Spec's pruned draft head)."""
    counts = np.zeros(vocab, dtype=np.int64)
    for j in idx:
        tokens, plen = sequences[j]
        counts += np.bincount(np.asarray(tokens[plen:]), minlength=vocab)[:vocab]
    return counts


def response_tokens(sequences: list[tuple[np.ndarray, int]], idx: list[int]) -> int:
    """The response tokens of the sequences `idx`: what a training step learns from, for curves over tokens."""
    return int(sum(len(sequences[j][0]) - sequences[j][1] for j in idx))


def cosine_lr(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 0 at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))


def _batch(feats: Features, idx: list[int], device: torch.device | None = None):
    """Right-padded tensors and the positions whose next token is a response token, on `device`."""
    width = max(len(feats.h_exit[j]) for j in idx)
    hidden = feats.h_exit[idx[0]].shape[1]
    h = torch.zeros(len(idx), width, hidden)
    hf = torch.zeros(len(idx), width, hidden)
    target = torch.zeros(len(idx), width, dtype=torch.bool)
    for row, j in enumerate(idx):
        n = len(feats.h_exit[j])
        h[row, :n] = torch.from_numpy(feats.h_exit[j].astype(np.float32))
        hf[row, :n] = torch.from_numpy(feats.h_final[j].astype(np.float32))
        target[row, max(int(feats.prompt_lens[j]) - 1, 0):n - 1] = True
    if device is not None and device.type != "cpu":
        return h.to(device, non_blocking=True), hf.to(device, non_blocking=True), target.to(device)
    return h, hf, target


def _batches(feats: Features, idx: list[int], tokens: int, rng: np.random.Generator | None):
    order = list(idx) if rng is None else [idx[i] for i in rng.permutation(len(idx))]
    batch, width = [], 0
    for j in order:
        n = len(feats.h_exit[j])
        if batch and max(width, n) * (len(batch) + 1) > tokens:
            yield batch
            batch, width = [], 0
        batch.append(j)
        width = max(width, n)
    if batch:
        yield batch


def soft_ce(adapter: Adapter, lm_head: torch.Tensor, h, hf, target, vocab: torch.Tensor | None = None,
            exact: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and per-token top-1 agreement with the target on the selected positions.

    With `vocab` (a pruned draft head) both distributions live on those ids: the teacher's is
    renormalised over them, which is what a head that cannot name other tokens should learn. `exact`
    agreement compares with the target's argmax over the full vocabulary (the real draft hit rate, for
    evaluation); training steps skip that full-vocabulary matmul and compare within the head."""
    y = adapter.hidden(h)[target]
    head = lm_head if vocab is None else lm_head[vocab]
    with torch.no_grad():
        hf_t = hf[target]
        p = F.softmax(hf_t @ head.T, dim=-1)
        best = (hf_t @ lm_head.T).argmax(-1) if vocab is not None and exact else p.argmax(-1)
        if vocab is not None and not exact:
            best = vocab[best]
    logits = y @ head.T
    loss = -(p * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    guess = logits.argmax(-1) if vocab is None else vocab[logits.argmax(-1)]
    agree = (guess == best).float()
    return loss, agree


@torch.no_grad()
def evaluate(adapter: Adapter, lm_head, feats: Features, idx: list[int], tokens: int,
             vocab: torch.Tensor | None = None, device: Device | None = None) -> dict:
    losses, agrees = [], []
    for batch in _batches(feats, idx, tokens, None):
        h, hf, target = _batch(feats, batch, lm_head.device)
        with device.autocast() if device is not None else contextlib.nullcontext():
            loss, agree = soft_ce(adapter, lm_head, h, hf, target, vocab)
        losses.append(float(loss) * len(agree))
        agrees.append(agree)
    agree = torch.cat(agrees)
    return {"loss": sum(losses) / len(agree), "agreement": float(agree.mean()), "tokens": len(agree)}


@torch.no_grad()
def raw_exit_agreement(model, lm_head, feats: Features, idx: list[int], tokens: int) -> float:
    """h_l straight into the final norm and LM head: the no-training baseline."""
    hits, total = 0, 0
    for batch in _batches(feats, idx, tokens, None):
        h, hf, target = _batch(feats, batch, lm_head.device)
        raw = model.model.norm(h[target]) @ lm_head.T
        hits += int((raw.argmax(-1) == (hf[target] @ lm_head.T).argmax(-1)).sum())
        total += int(target.sum())
    return hits / max(total, 1)


def train(model, sequences: list[tuple[np.ndarray, int]], cfg: TrainConfig, out_dir: Path, target_sha: str,
          command: str = "", data: str = "", extra: list[list[tuple[np.ndarray, int]]] = (),
          device: str | None = "auto") -> dict:
    """Trains, writes ``adapter.safetensors`` + ``adapter.json`` to out_dir, returns the metadata.
    Resumes from ``train_state.pt`` in out_dir when its config and data match. Held-out sequences are
    drawn from `sequences` alone; each list in `extra` only trains. `device`: auto | cpu | cuda."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dims = dims_of(model.config, 16)
    if not 1 <= cfg.exit_layer <= dims.layers - 1:
        raise SpecExportError(f"exit layer {cfg.exit_layer} is outside 1..{dims.layers - 1} for this model")
    dev = resolve_device(device)
    sequences, feats, pool = with_extra(model, sequences, extra, cfg.exit_layer, target_sha, device=dev)
    held, train_idx, rng = split_holdout(pool, cfg.holdout, cfg.seed)
    train_idx += range(pool, len(sequences))
    counts = response_counts(sequences, train_idx, dims.vocab)  # training responses only
    vocab_ids = pruned_vocab(counts, cfg.draft_vocab)
    vocab = None if vocab_ids is None else torch.from_numpy(vocab_ids).to(dev.torch)

    torch.manual_seed(cfg.seed)
    model.cpu()  # the adapter starts from the target's weights on the host, then both move to the device
    adapter = Adapter(AdapterConfig.for_target(dims, cfg.exit_layer, cfg.arch), *rope_inv_freq(model))
    adapter.init_from_target(model)
    adapter.to(dev.torch)
    model.to(dev.torch)  # raw_exit_agreement runs its final norm
    lm_head = model.lm_head.weight.detach()
    opt = torch.optim.AdamW(adapter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    scaler = dev.scaler()
    state_path = out_dir / "train_state.pt"
    step, history = 0, []
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False, map_location=dev.torch)
        if state["config"] == asdict(cfg) and state["data"] == _seq_digest(sequences):
            adapter.load_state_dict(state["adapter"])
            opt.load_state_dict(state["optimizer"])
            step, history = state["step"], state["history"]
            rng = np.random.default_rng(state["rng_seed"])

    before = history[0]["eval"] if step else evaluate(adapter, lm_head, feats, held, cfg.tokens_per_batch, vocab, dev)
    if step == 0:
        history.append({"step": 0, "eval": before})
    bar = tqdm(total=cfg.steps, initial=step, desc="train adapter", unit="step", file=sys.stderr, disable=None)
    seen = history[-1].get("train_tokens", 0)
    t0 = time.time()
    while step < cfg.steps:
        for batch in _batches(feats, train_idx, cfg.tokens_per_batch, rng):
            if step >= cfg.steps:
                break
            for group in opt.param_groups:
                group["lr"] = cosine_lr(step, cfg.lr, cfg.warmup, cfg.steps)
            h, hf, target = _batch(feats, batch, dev.torch)
            with dev.autocast():
                loss, agree = soft_ce(adapter, lm_head, h, hf, target, vocab, exact=False)
            optimizer_step(opt, scaler, loss, adapter)
            step += 1
            seen += response_tokens(sequences, batch)
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}", top1=f"{float(agree.mean()):.1%}")
            if step % cfg.eval_every == 0 or step == cfg.steps:
                ev = evaluate(adapter, lm_head, feats, held, cfg.tokens_per_batch, vocab, dev)
                history.append({"step": step, "train_tokens": seen, "eval": ev})
                bar.write(f"step {step}: held-out loss {ev['loss']:.3f}, top-1 agreement {ev['agreement']:.1%}",
                          file=sys.stderr)
                torch.save({"config": asdict(cfg), "data": _seq_digest(sequences), "adapter": adapter.state_dict(),
                            "optimizer": opt.state_dict(), "step": step, "history": history,
                            "rng_seed": int(rng.integers(1 << 31))}, state_path)
    bar.close()
    final = evaluate(adapter, lm_head, feats, held, cfg.tokens_per_batch, vocab, dev)
    meta = {
        "target_sha256": target_sha, "exit_layer": cfg.exit_layer, "arch": cfg.arch, "config": asdict(cfg),
        "train_sequences": len(train_idx), "heldout_sequences": len(held),
        "train_tokens": int(sum(len(feats.h_exit[j]) - feats.prompt_lens[j] for j in train_idx)),
        "heldout_before": before, "heldout": final,
        "raw_exit_agreement": raw_exit_agreement(model, lm_head, feats, held, cfg.tokens_per_batch),
        "history": history, "train_seconds": round(time.time() - t0, 1), "command": command,
        "draft_vocab": cfg.draft_vocab or None, "data": data, "device": dev.describe(),
    }
    model.cpu()
    save_adapter(adapter.cpu(), out_dir, meta)
    np.save(out_dir / COUNTS_FILE, counts)
    return meta


def pruned_vocab(counts: np.ndarray | None, size: int | None) -> np.ndarray | None:
    """The `size` most frequent token ids (ties by id) in id order, or None for the full vocabulary.
    Training and export both call this on the same counts, so they agree on the head's rows."""
    if counts is None or not size or size >= len(counts):
        return None
    return np.sort(np.argsort(-counts, kind="stable")[:size]).astype(np.int64)


def save_adapter(adapter: Adapter, out_dir: Path, meta: dict) -> None:
    # fp16 on disk halves what ships in the repository; drafting quality does not notice the rounding
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in adapter.state_dict().items()}
    save_file(state, str(out_dir / ADAPTER_FILE), metadata={"specexport": json.dumps(
        {k: meta[k] for k in ("target_sha256", "exit_layer", "arch")})})
    (out_dir / META_FILE).write_text(json.dumps({**meta, "config_adapter": asdict(adapter.cfg)}, indent=2) + "\n")


def read_trained(directory: Path, weights: str, meta_name: str, what: str, command: str,
                 target_sha: str | None) -> tuple[dict, dict]:
    """(metadata, fp32 weights) of a trained drafting module's directory, with its FR-Spec token counts as
    `token_counts` (None without); refuses a missing one, or one trained for another target, in one sentence."""
    meta_file = directory / meta_name
    if not (directory / weights).is_file() or not meta_file.is_file():
        raise SpecExportError(f"{directory} holds no trained {what} ({weights} + {meta_name}); train one with"
                              f" `{command}`")
    meta = json.loads(meta_file.read_text())
    if target_sha and meta["target_sha256"] != target_sha:
        raise SpecExportError(f"{what} {directory} was trained for another target model (sha256"
                              f" {meta['target_sha256'][:12]}…, this one is {target_sha[:12]}…); train one for it")
    counts = directory / COUNTS_FILE
    meta["token_counts"] = np.load(counts) if counts.is_file() else None
    return meta, {k: v.float() for k, v in load_file(str(directory / weights)).items()}


def load_adapter(path: Path, model, target_sha: str | None = None) -> tuple[Adapter, dict]:
    """Load a trained adapter directory (or its .safetensors) for `model`; refuses a mismatched target."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    meta, state = read_trained(directory, ADAPTER_FILE, META_FILE, "adapter", "specexport train-adapter", target_sha)
    adapter = Adapter(AdapterConfig(**meta["config_adapter"]), *rope_inv_freq(model))
    adapter.load_state_dict(state)
    return adapter.eval(), meta
