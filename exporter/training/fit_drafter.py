"""Distil a Spec-Drafter (exporter/spec_drafter.py) from the target on its own responses.

The data and the teacher are the adapter's (exporter/training/fit_adapter.py): the target's greedy responses to
the shipped training prompts, and its cached final normed states h_final, from which the teacher's
next-token distribution is one matmul with the LM head. The drafter is autoregressive and teacher-forced
on the target's own tokens; the loss is the soft-label cross-entropy against the teacher on response
tokens, over the drafter's pruned (FR-Spec) head. Held-out agreement compares the drafter's top-1 with
the target's top-1 over the full vocabulary: what a greedy draft hits.
"""

from __future__ import annotations

import contextlib
import json
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
from .device import Device, optimizer_step, resolve_device
from .fit_adapter import (
    Features,
    _batches,
    _seq_digest,
    cosine_lr,
    pruned_vocab,
    response_counts,
    response_tokens,
    split_holdout,
    with_extra,
)
from .spec_drafter import DrafterConfig, SpecDrafter, count_parameters

DRAFTER_FILE = "drafter.safetensors"
META_FILE = "drafter.json"
VOCAB_FILE = "drafter_vocab.npy"
KIND = "spec-drafter"


@dataclass
class DrafterTrainConfig:
    layers: int = 2
    hidden: int = 256
    head_dim: int = 64
    heads: int = 0  # 0: hidden // head_dim
    kv_heads: int = 0  # 0: half the heads
    intermediate: int = 0  # 0: 4 x hidden
    steps: int = 600
    tokens_per_batch: int = 4096
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.01
    holdout: float = 0.04
    seed: int = 0
    eval_every: int = 100
    threads: int = 1  # the dev machine's two cores are shared; 0 = all cores
    draft_vocab: int = 8192  # FR-Spec head: the N most frequent response tokens; 0 = the full vocabulary

    def drafter_config(self, target_config) -> DrafterConfig:
        return DrafterConfig.for_target(target_config, layers=self.layers, hidden=self.hidden,
                                        head_dim=self.head_dim, heads=self.heads or None,
                                        kv_heads=self.kv_heads or None, intermediate=self.intermediate or None)


@dataclass
class Batch:
    ids: torch.Tensor  # [batch, width] right-padded token ids
    target: torch.Tensor  # [batch, width] bool: positions whose next token is a response token
    teacher: torch.Tensor  # [n_target, target_hidden] the target's final normed states there


def make_batch(sequences: list[tuple[np.ndarray, int]], feats: Features, idx: list[int],
               device: torch.device | None = None) -> Batch:
    width = max(len(sequences[j][0]) for j in idx)
    ids = torch.zeros(len(idx), width, dtype=torch.long)
    target = torch.zeros(len(idx), width, dtype=torch.bool)
    rows = []
    for row, j in enumerate(idx):
        tokens, plen = sequences[j]
        n = len(tokens)
        ids[row, :n] = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
        lo = max(int(plen) - 1, 0)
        target[row, lo:n - 1] = True
        rows.append(feats.h_final[j][lo:n - 1])
    teacher = torch.from_numpy(np.concatenate(rows).astype(np.float32))
    if device is not None and device.type != "cpu":
        return Batch(ids.to(device), target.to(device), teacher.to(device, non_blocking=True))
    return Batch(ids, target, teacher)


class Teacher:
    """The target's LM head rows of the draft vocabulary (frozen) and the soft labels they give."""

    def __init__(self, lm_head: torch.Tensor, vocab: torch.Tensor | None) -> None:
        self.full = lm_head
        self.vocab = vocab
        self.rows = lm_head if vocab is None else lm_head[vocab]

    def real_ids(self, head_ids: torch.Tensor) -> torch.Tensor:
        return head_ids if self.vocab is None else self.vocab[head_ids]

    @torch.no_grad()
    def probs(self, states: torch.Tensor) -> torch.Tensor:
        # over a pruned head the teacher is renormalised on its ids: what a head that cannot name other
        # tokens should learn (as the adapter does)
        return F.softmax(states @ self.rows.T, dim=-1)

    @torch.no_grad()
    def best(self, states: torch.Tensor) -> torch.Tensor:
        """The target's greedy token over the full vocabulary."""
        return (states @ self.full.T).argmax(-1)


def soft_ce(drafter: SpecDrafter, embed: torch.Tensor, teacher: Teacher, batch: Batch,
            best: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and per-token top-1 agreement. With `best` (the target's full-vocabulary argmax) agreement is
    the real draft hit rate; without, it compares within the head (training steps skip the big matmul)."""
    h = drafter.hidden(embed, batch.ids)[batch.target]
    logits = h @ drafter.head(teacher.rows).T  # the head's rows are already the draft vocabulary's
    p = teacher.probs(batch.teacher)
    loss = -(p * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    guess = logits.argmax(-1)
    agree = (teacher.real_ids(guess) == best) if best is not None else (guess == p.argmax(-1))
    return loss, agree.float()


class HeldOut:
    """The held-out batches and the target's full-vocabulary top-1 on them, computed once."""

    def __init__(self, sequences, feats: Features, idx: list[int], tokens: int, teacher: Teacher,
                 device: Device | None = None) -> None:
        self.device = device
        at = teacher.full.device
        self.batches = [make_batch(sequences, feats, b, at) for b in _batches(feats, idx, tokens, None)]
        self.best = [teacher.best(b.teacher) for b in self.batches]
        self.in_head = None
        if teacher.vocab is not None:  # the agreement a pruned head can reach at most
            allowed = torch.zeros(len(teacher.full), dtype=torch.bool, device=at)
            allowed[teacher.vocab] = True
            self.in_head = float(torch.cat([allowed[b] for b in self.best]).float().mean())

    @torch.no_grad()
    def evaluate(self, drafter: SpecDrafter, embed: torch.Tensor, teacher: Teacher) -> dict:
        was_training = drafter.training
        drafter.eval()
        loss_sum, agrees = 0.0, []
        for batch, best in zip(self.batches, self.best, strict=True):
            with self.device.autocast() if self.device is not None else contextlib.nullcontext():
                loss, agree = soft_ce(drafter, embed, teacher, batch, best)
            loss_sum += float(loss) * len(agree)
            agrees.append(agree)
        drafter.train(was_training)
        agree = torch.cat(agrees)
        return {"loss": loss_sum / len(agree), "agreement": float(agree.mean()), "tokens": len(agree)}


def train_drafter(model, sequences: list[tuple[np.ndarray, int]], cfg: DrafterTrainConfig, out_dir: Path,
                  target_sha: str, command: str = "", feature_layer: int = 2, data: str = "",
                  extra: list[list[tuple[np.ndarray, int]]] = (), device: str | None = "auto") -> dict:
    """Trains and writes drafter.safetensors (fp16) + drafter.json (+ drafter_vocab.npy) to out_dir; returns the
    metadata. `feature_layer` only picks which cached feature file to reuse (the drafter reads h_final alone).
    Resumes from train_state.pt in out_dir when its config and data match. Held-out sequences are drawn from
    `sequences` alone; each list in `extra` only trains, and has its features cached on its own."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if len(sequences) < 2:  # held-out and training sequences both come from `sequences`
        raise SpecExportError(f"training a drafter needs at least two distilled sequences, got {len(sequences)}")
    dev = resolve_device(device)
    sequences, feats, pool = with_extra(model, sequences, extra, feature_layer, target_sha, device=dev)
    model.cpu()
    held, train_idx, rng = split_holdout(pool, cfg.holdout, cfg.seed)  # the adapter's split
    train_idx += range(pool, len(sequences))
    vocab_size = int(model.config.vocab_size)
    counts = response_counts(sequences, train_idx, vocab_size)
    vocab_ids = pruned_vocab(counts, cfg.draft_vocab)
    vocab = None if vocab_ids is None else torch.from_numpy(vocab_ids).to(dev.torch)

    embed = model.model.embed_tokens.weight.detach().float().to(dev.torch)
    teacher = Teacher(model.lm_head.weight.detach().float().to(dev.torch), vocab)
    torch.manual_seed(cfg.seed)
    drafter = SpecDrafter(cfg.drafter_config(model.config))
    drafter.init_projections(embed.cpu())
    drafter.to(dev.torch).train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    scaler = dev.scaler()
    heldout = HeldOut(sequences, feats, held, cfg.tokens_per_batch, teacher, dev)

    state_path = out_dir / "train_state.pt"
    step, history, elapsed = 0, [], 0.0
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False, map_location=dev.torch)
        if state["config"] == asdict(cfg) and state["data"] == _seq_digest(sequences):
            drafter.load_state_dict(state["drafter"])
            opt.load_state_dict(state["optimizer"])
            step, history, elapsed = state["step"], state["history"], state.get("seconds", 0.0)
            rng = np.random.default_rng(state["rng_seed"])

    if step == 0:
        history.append({"step": 0, "eval": heldout.evaluate(drafter, embed, teacher)})
    before = history[0]["eval"]
    bar = tqdm(total=cfg.steps, initial=step, desc="train drafter", unit="step", file=sys.stderr, disable=None)
    seen = history[-1].get("train_tokens", 0)
    t0 = time.time() - elapsed
    recent: list[tuple[float, float]] = []  # (loss, within-head agreement) of the steps since the last eval
    while step < cfg.steps:
        for idx in _batches(feats, train_idx, cfg.tokens_per_batch, rng):
            if step >= cfg.steps:
                break
            for group in opt.param_groups:
                group["lr"] = cosine_lr(step, cfg.lr, cfg.warmup, cfg.steps)
            with dev.autocast():
                loss, agree = soft_ce(drafter, embed, teacher, make_batch(sequences, feats, idx, dev.torch))
            optimizer_step(opt, scaler, loss, drafter)
            step += 1
            seen += response_tokens(sequences, idx)
            bar.update()
            recent.append((loss.item(), float(agree.mean())))
            bar.set_postfix(loss=f"{recent[-1][0]:.3f}", top1=f"{recent[-1][1]:.1%}")
            if step % cfg.eval_every == 0 or step == cfg.steps:
                ev = heldout.evaluate(drafter, embed, teacher)
                # the training side too, so overfitting shows: train loss far below held-out
                train = {"loss": float(np.mean([r[0] for r in recent])), "agreement_in_head":
                         float(np.mean([r[1] for r in recent]))}
                recent.clear()
                history.append({"step": step, "train_tokens": seen, "eval": ev, "train": train})
                bar.write(f"step {step}: held-out loss {ev['loss']:.3f}, top-1 agreement {ev['agreement']:.1%}"
                          f" (training batches: loss {train['loss']:.3f}, {train['agreement_in_head']:.1%})",
                          file=sys.stderr)
                torch.save({"config": asdict(cfg), "data": _seq_digest(sequences), "drafter": drafter.state_dict(),
                            "optimizer": opt.state_dict(), "step": step, "history": history,
                            "seconds": time.time() - t0, "rng_seed": int(rng.integers(1 << 31))}, state_path)
    bar.close()
    final = history[-1]["eval"] if history[-1]["step"] == step and step > 0 else \
        heldout.evaluate(drafter, embed, teacher)
    train_tokens = int(sum(len(sequences[j][0]) - sequences[j][1] for j in train_idx))
    meta = {
        "kind": KIND, "target_sha256": target_sha,
        "exit_free": True,  # reads token ids, not an early-exit state: usable with any --exit-layer
        "drafter": drafter.cfg.as_dict(), "config": asdict(cfg), "parameters": count_parameters(drafter),
        "vocab_size": vocab_size,
        "draft_vocab": None if vocab_ids is None else {
            "file": VOCAB_FILE, "size": len(vocab_ids),
            "response_token_coverage": float(counts[vocab_ids].sum() / max(counts.sum(), 1))},
        "data": data, "train_sequences": len(train_idx), "heldout_sequences": len(held), "train_tokens": train_tokens,
        "heldout_before": before, "heldout": final, "heldout_top1_in_head": heldout.in_head,
        "history": history, "train_seconds": round(time.time() - t0, 1), "command": command,
        "device": dev.describe(),
    }
    save_drafter(drafter.cpu(), out_dir, meta, vocab_ids)
    return meta


def save_drafter(drafter: SpecDrafter, out_dir: Path, meta: dict, vocab_ids: np.ndarray | None) -> None:
    # fp16 on disk: the shipped drafter is a few MB; drafting does not notice the rounding
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in drafter.trainable_state().items()}
    save_file(state, str(out_dir / DRAFTER_FILE), metadata={"specexport": json.dumps(
        {"kind": KIND, "target_sha256": meta["target_sha256"]})})
    if vocab_ids is not None:
        np.save(out_dir / VOCAB_FILE, vocab_ids.astype(np.int64))
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def is_trained_drafter(path: Path) -> bool:
    return (Path(path) / META_FILE).is_file()


def read_meta(directory: Path) -> dict:
    directory = Path(directory)
    if not (directory / DRAFTER_FILE).is_file() or not (directory / META_FILE).is_file():
        raise SpecExportError(f"{directory} holds no trained drafter ({DRAFTER_FILE} + {META_FILE}); train one with"
                              " `specexport train-drafter`")
    return json.loads((directory / META_FILE).read_text())


def load_drafter(directory: Path, model, target_sha: str | None = None) -> tuple[SpecDrafter, np.ndarray | None, dict]:
    """A trained drafter directory for `model`: (module, draft vocabulary or None, metadata). Refuses a
    drafter trained for another target."""
    directory = Path(directory)
    meta = read_meta(directory)
    if target_sha and meta["target_sha256"] != target_sha:
        raise SpecExportError(f"drafter {directory} was trained for another target model (sha256"
                              f" {meta['target_sha256'][:12]}…, this one is {target_sha[:12]}…); train one for it"
                              " with `specexport train-drafter`")
    drafter = SpecDrafter(DrafterConfig(**meta["drafter"]))
    state = {k: v.float() for k, v in load_file(str(directory / DRAFTER_FILE)).items()}
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("decoder.embed_tokens.") for k in missing):
        raise SpecExportError(f"{directory / DRAFTER_FILE} does not match its {META_FILE} (missing {missing},"
                              f" unexpected {unexpected}); retrain it with `specexport train-drafter`")
    vocab = None
    if meta.get("draft_vocab"):
        vocab = np.load(directory / meta["draft_vocab"]["file"], allow_pickle=False).astype(np.int64)
    return drafter.eval(), vocab, meta
