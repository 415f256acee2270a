"""Experiment (issue 3): does an EAGLE-style input lift the self-draft adapter's agreement?

The adapter drafting the token after position t reads h_l(t). EAGLE-style, it may also read the
target's final normed state of the last verified token: when drafting at depth d of a step (d = 0
for the first draft), that is position t - 1 - d, which the last `deep` call produced. Both variants
are trained here side by side on the same cached self-distillation features (recipes' 1,024
responses, 101k response tokens), same steps, same seed; held-out top-1 agreement with the target
(full vocabulary) is printed per draft depth.

    .venv/bin/python tools/experiments/eagle_input.py --steps 150

Nothing here ships: it measures whether the variant is worth a graph change (`deep` would have to
output its final state and the adapter take it as a second input).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import torch
from specexport.exporter import model_source
from specexport.exporter.hf_weights import dims_of
from specexport.exporter.recipe import load_recipe
from specexport.exporter.training.adapter import Adapter, AdapterConfig
from specexport.exporter.training.adapter_source import train_settings
from specexport.exporter.training.distill_data import load_sequences
from specexport.exporter.training.fit_adapter import (
    _batches,
    compute_features,
    pruned_vocab,
    response_counts,
    split_holdout,
)
from specexport.runtime.paths import cache_dir
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

DEPTHS = (0, 1, 2)


class EagleInput(nn.Module):
    """h_l(t) and the target's final state of the last verified token, fused into the adapter's input."""

    def __init__(self, base: Adapter, hidden: int) -> None:
        super().__init__()
        self.base = base
        self.fuse = nn.Linear(hidden, hidden, bias=False)
        nn.init.zeros_(self.fuse.weight)  # starts as the plain adapter

    def hidden(self, h: torch.Tensor, hf_prev: torch.Tensor) -> torch.Tensor:
        return self.base.hidden(h + self.fuse(hf_prev))


def batch(feats, idx: list[int], depth: int):
    width = max(len(feats.h_exit[j]) for j in idx)
    size = feats.h_exit[idx[0]].shape[1]
    h, hf, prev = (torch.zeros(len(idx), width, size) for _ in range(3))
    target = torch.zeros(len(idx), width, dtype=torch.bool)
    for row, j in enumerate(idx):
        n = len(feats.h_exit[j])
        h[row, :n] = torch.from_numpy(feats.h_exit[j].astype(np.float32))
        hf[row, :n] = torch.from_numpy(feats.h_final[j].astype(np.float32))
        shift = depth + 1  # the last verified token is `shift` positions back
        prev[row, shift:n] = hf[row, : n - shift]
        target[row, max(int(feats.prompt_lens[j]) - 1, shift):n - 1] = True
    return h, hf, prev, target


def run_model(model, h, prev):
    return model.hidden(h, prev) if isinstance(model, EagleInput) else model.hidden(h)


@torch.no_grad()
def agreement(model, lm_head, head, vocab, feats, idx, depth: int) -> float:
    hits = total = 0
    for b in _batches(feats, idx, 4096, None):
        h, hf, prev, target = batch(feats, b, depth)
        guess = vocab[(run_model(model, h, prev)[target] @ head.T).argmax(-1)]
        hits += int((guess == (hf[target] @ lm_head.T).argmax(-1)).sum())
        total += int(target.sum())
    return hits / max(total, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="plain,eagle")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_recipe(None)
    src = cfg["source"]
    source = model_source.resolve(model_source.default_model_file(src["package"], src["version"], src["file"]))
    model, _ = model_source.load_model(source.checkpoint)
    settings = train_settings(cfg)
    n = int(settings["prompt_limit"])
    data = cache_dir("distill", f"{source.origin_sha256[:16]}-n{n}-t{settings['max_new_tokens']}")
    sequences = load_sequences(data)
    feats = compute_features(model, sequences, 2, source.origin_sha256)
    held, train_idx, _ = split_holdout(len(sequences), 0.04, 0)
    dims = dims_of(model.config, 16)
    counts = response_counts(sequences, train_idx, dims.vocab)
    vocab = torch.from_numpy(pruned_vocab(counts, int(settings["draft_vocab"])))
    lm_head = model.lm_head.weight.detach()
    head = lm_head[vocab]
    rotary = model.model.rotary_emb
    for variant in args.variants.split(","):
        torch.manual_seed(0)
        base = Adapter(AdapterConfig.for_target(dims, 2, "block"), rotary.inv_freq.numpy(),
                       float(getattr(rotary, "attention_scaling", 1.0)))
        base.init_from_target(model)
        net = EagleInput(base, dims.hidden) if variant == "eagle" else base
        opt = torch.optim.AdamW(net.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        order = np.random.default_rng(1)
        bar = tqdm(total=args.steps, desc=f"train {variant}", unit="step", file=sys.stderr, disable=None)
        step, t0 = 0, time.time()
        while step < args.steps:
            for b in _batches(feats, train_idx, 4096, order):
                if step >= args.steps:
                    break
                warm = 20
                lr = args.lr * ((step + 1) / warm if step < warm else
                                0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm))))
                for g in opt.param_groups:
                    g["lr"] = lr
                h, hf, prev, target = batch(feats, b, int(order.choice(DEPTHS)))
                with torch.no_grad():
                    p = F.softmax(hf[target] @ head.T, dim=-1)
                logits = run_model(net, h, prev)[target] @ head.T
                loss = -(p * F.log_softmax(logits, dim=-1)).sum(-1).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                opt.step()
                step += 1
                bar.update()
                bar.set_postfix(loss=f"{loss.item():.3f}")
        bar.close()
        agree = {d: agreement(net, lm_head, head, vocab, feats, held, d) for d in DEPTHS}
        print(f"{variant}: {args.steps} steps, {time.time() - t0:.0f} s; held-out agreement by draft depth: "
              + ", ".join(f"d={d} {a:.1%}" for d, a in agree.items()), flush=True)


if __name__ == "__main__":
    main()
