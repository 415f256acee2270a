"""`specexport train-head`: the feature-level draft head, trained on the target's own responses."""

from __future__ import annotations

from pathlib import Path

import click

from ..runtime.errors import SpecExportError
from .options import TRAIN_DEVICE, command_line


def register(main: click.Group) -> None:
    @main.command("train-head")
    @click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for the trained head.")
    @click.option("--recipe", default=None, help="Recipe whose [head.train] settings are the defaults.")
    @click.option("--model", default=None, help="Target checkpoint directory or .gguf (default: the recipe's"
                  " source).")
    @click.option("--exit-layer", type=int, default=None, help="The bundle's exit layer: the head's low feature"
                  " layer (default: the recipe's).")
    @click.option("--tokens", type=int, default=None, help="Response tokens of self-distilled data to train on"
                  " (made and cached first where missing, as `specexport distill` does). Default: the recipe's.")
    @click.option("--steps", type=int, default=None, help="Optimizer steps.")
    @click.option("--lr", type=float, default=None, help="Peak learning rate (AdamW, cosine decay).")
    @click.option("--tokens-per-batch", type=int, default=None, help="Tokens in one optimizer step's batch.")
    @click.option("--unroll", type=int, default=None, help="Training-time test: draft positions trained per slot"
                  " (default: 3).")
    @click.option("--draft-vocab", type=int, default=None, help="FR-Spec: the head's LM head keeps the N most"
                  " frequent response tokens (0 = the full vocabulary). Default: the recipe's.")
    @click.option("--batch-size", type=int, default=None, help="Sequences per generate call while distilling.")
    @click.option("--seed", type=int, default=None, help="Seed for data order and initialisation.")
    @TRAIN_DEVICE
    def train_head_cmd(out, recipe, model, exit_layer, tokens, steps, lr, tokens_per_batch, unroll, draft_vocab,
                       batch_size, seed, device) -> None:
        """Train the feature-level draft head (EAGLE-3's shape): the target's low, middle and high states and the
        next token's embedding through one decoder layer to the FR-Spec LM head, with training-time test.
        Held-out agreement per draft position is printed and saved; build it in with `specexport build --head`."""
        try:
            from ..exporter.training.commands import train_head_command
        except ImportError as exc:
            raise SpecExportError(f"training needs the exporter extra ({exc.name} is missing); install it with"
                                  " `pip install 'specexport[export]'`") from None
        meta = train_head_command(out, recipe=recipe, model=model, exit_layer=exit_layer, tokens=tokens, steps=steps,
                                  lr=lr, tokens_per_batch=tokens_per_batch, unroll=unroll, draft_vocab=draft_vocab,
                                  batch_size=batch_size, seed=seed, device=device, command=command_line())
        held = meta["heldout"]
        by = ", ".join(f"{a:.1%}" for a in held["agreement_by_position"])
        click.echo(f"wrote {out}: held-out agreement by draft position {by} (first draft before training"
                   f" {meta['heldout_before']['agreement']:.1%}); a chain of {len(held['chain_by_position'])}"
                   f" drafts would make {held['chain_tokens_per_step']:.2f} tokens a step", err=True)
