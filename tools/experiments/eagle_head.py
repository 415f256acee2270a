"""Experiment (issue 7): would an EAGLE-style draft head beat the Spec-Drafter and the adapter here?

EAGLE drafts from features: one full-width decoder layer reads the target's final normed state of the
previous position with the embedding of the current token, predicts this position's final state, and the
target's (pruned) LM head turns it into a draft token. Later drafts feed the head its own prediction.
Trained here on the shipped drafter's data and cached features (the recipe's 2,400 responses plus the two
`--extra-data` directories; the same 96 held-out sequences), with a soft-label cross-entropy on the first
draft, a smooth-L1 pull of the predicted state towards the target's, and half the cross-entropy again on a
second pass that reads the head's own predictions (so second drafts are trained too). The decoder layer
starts as the target's last one.

Printed at every eval: held-out top-1 agreement with the target's greedy token for the first draft, for
the second draft, and for the second draft where the first was right (what a chain actually needs).

    .venv/bin/python tools/experiments/eagle_head.py --steps 400 \\
        --extra-data .cache/gen/rest/greedy --extra-data .cache/gen/magpie/greedy

Nothing here ships: it measures whether the head is worth a new piece (`deep` would have to emit its final
states and the runtime feed them back).
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np
import torch
from specexport.exporter import model_source
from specexport.exporter.recipe import load_recipe
from specexport.exporter.training.adapter_source import distilled_sequences, extra_sequences
from specexport.exporter.training.commands import _target, drafter_settings
from specexport.exporter.training.fit_adapter import (
    _batches,
    cosine_lr,
    pruned_vocab,
    response_counts,
    split_holdout,
    with_extra,
)
from specexport.exporter.training.fit_drafter import Teacher
from torch import nn
from torch.nn import functional as F


class EagleHead(nn.Module):
    def __init__(self, target, embed: torch.Tensor) -> None:
        super().__init__()
        from transformers import LlamaModel

        size = target.config.hidden_size
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = 1
        self.embed = embed
        self.fc = nn.Linear(2 * size, size, bias=True)
        self.dec = LlamaModel(config)
        self.dec.layers[0].load_state_dict(target.model.layers[-1].state_dict())
        self.dec.norm.load_state_dict(target.model.norm.state_dict())
        del self.dec.embed_tokens
        with torch.no_grad():  # starts as half the previous state plus the token: a sane residual stream
            self.fc.bias.zero_()
            self.fc.weight.zero_()
            self.fc.weight[:, size:].copy_(torch.eye(size))
            self.fc.weight[:, :size].copy_(torch.eye(size) * 0.5)

    def forward(self, prev: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = self.fc(torch.cat([prev, self.embed[ids]], -1))
        return self.dec(inputs_embeds=x, use_cache=False).last_hidden_state


def shifted(states: torch.Tensor) -> torch.Tensor:
    """The state of position t - 1 at position t (zeros at 0)."""
    return torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], 1)


def make_batch(seqs, feats, idx: list[int]):
    width = max(len(seqs[j][0]) for j in idx)
    size = feats.h_final[idx[0]].shape[1]
    ids = torch.zeros(len(idx), width, dtype=torch.long)
    final = torch.zeros(len(idx), width, size)
    target = torch.zeros(len(idx), width, dtype=torch.bool)
    for row, j in enumerate(idx):
        tokens, plen = seqs[j]
        n = len(tokens)
        ids[row, :n] = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        final[row, :n] = torch.from_numpy(feats.h_final[j].astype(np.float32))
        target[row, max(plen - 1, 1):n - 1] = True
    return ids, final, target


@torch.no_grad()
def evaluate(head: EagleHead, batches, teacher: Teacher) -> tuple[float, float, float]:
    head.eval()
    first, second, chained = [], [], []
    for ids, final, target in batches:
        best = (final @ teacher.full.T).argmax(-1)
        h1 = head(shifted(final), ids)
        hit1 = teacher.real_ids((h1 @ teacher.rows.T).argmax(-1)) == best
        h2 = head(shifted(h1), ids)
        hit2 = teacher.real_ids((h2 @ teacher.rows.T).argmax(-1)) == best
        first.append(hit1[target].float())
        second.append(hit2[target].float())
        chained.append(hit2[target & shifted(hit1.unsqueeze(-1)).squeeze(-1)].float())
    head.train()
    return tuple(float(torch.cat(x).mean()) for x in (first, second, chained))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--extra-data", action="append", type=Path, default=[])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    recipe = load_recipe(None)
    source = _target(recipe, None)
    settings, cfg = drafter_settings(recipe)
    target, _ = model_source.load_model(source.checkpoint)
    base = distilled_sequences(source.checkpoint, source.origin_sha256, settings)
    extra, _ = extra_sequences(args.extra_data, source.origin_sha256, settings, cfg)
    seqs, feats, pool = with_extra(target, base, extra, 2, source.origin_sha256)
    held, train_idx, rng = split_holdout(pool, cfg.holdout, cfg.seed)
    train_idx += range(pool, len(seqs))
    vocab = pruned_vocab(response_counts(seqs, train_idx, target.config.vocab_size), cfg.draft_vocab)
    teacher = Teacher(target.lm_head.weight.detach().float(), torch.from_numpy(vocab))

    head = EagleHead(target, target.model.embed_tokens.weight.detach().float())
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    heldout = [make_batch(seqs, feats, b) for b in _batches(feats, held, cfg.tokens_per_batch, None)]
    print("before", evaluate(head, heldout, teacher), flush=True)
    step, t0 = 0, time.time()
    while step < args.steps:
        for idx in _batches(feats, train_idx, cfg.tokens_per_batch, rng):
            if step >= args.steps:
                break
            for group in opt.param_groups:
                group["lr"] = cosine_lr(step, args.lr, 20, args.steps)
            ids, final, target_pos = make_batch(seqs, feats, idx)
            p = teacher.probs(final[target_pos])
            h1 = head(shifted(final), ids)
            ce = -(p * F.log_softmax(h1[target_pos] @ teacher.rows.T, -1)).sum(-1).mean()
            reg = F.smooth_l1_loss(h1[target_pos], final[target_pos])
            h2 = head(shifted(h1), ids)
            ce2 = -(p * F.log_softmax(h2[target_pos] @ teacher.rows.T, -1)).sum(-1).mean()
            loss = ce + reg + 0.5 * ce2
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 100 == 0 or step == args.steps:
                print(f"step {step} ({time.time() - t0:.0f} s): loss {float(ce):.3f} / {float(ce2):.3f},"
                      f" held-out first / second / second after a hit: {evaluate(head, heldout, teacher)}", flush=True)


if __name__ == "__main__":
    main()
