"""Options more than one command takes."""

from __future__ import annotations

import sys

import click

EXPECT_DIGEST = click.option(
    "--expect-digest", default=None, metavar="SHA256",
    help="Refuse the bundle unless its digest (SHA-256 of manifest.json, as `specexport inspect` prints it) is"
         " this one: pins the exact bundle a deployment tested.")


TRAIN_DEVICE = click.option(
    "--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
    help="Where distillation and training run: auto takes a CUDA GPU when PyTorch sees one (bf16 or fp16"
         " autocast, fp32 weights), else the CPU (fp32).")


def command_line() -> str:
    """The command as the user typed it, for the records a build or a training run writes."""
    return " ".join(["specexport", *sys.argv[1:]])
