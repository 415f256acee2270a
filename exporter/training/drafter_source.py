"""Find, check and load the independent drafter a build exports: one distilled by `specexport
train-drafter` (a Spec-Drafter, tied to one target by its sha256) or any Hugging Face Llama-family
checkpoint that uses the target's tokenizer.

`locate_drafter` does every check that can refuse (path, kind, architecture, tokenizer, target, vocabulary)
from files alone, before the build writes anything; `load_drafter_model` then materialises the drafter as
a plain PyTorch Llama, the reference its piece is checked against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...runtime.errors import SpecExportError
from ...runtime.manifest import sha256_file
from .. import model_source
from ..model_source import ModelSource
from ..recipe import recipes_dir
from ..tokenizer_match import load_tokenizer, require_same_tokenizer
from .fit_drafter import DRAFTER_FILE, KIND, is_trained_drafter, load_drafter, read_meta

DRAFTER_CHOICES = ("auto", "none")
CHECKPOINT = "checkpoint"
WHAT_TO_PASS = ("pass --drafter none, auto, a directory written by `specexport train-drafter`, or a Hugging Face"
                " Llama-family checkpoint directory that uses the target's tokenizer")


@dataclass
class DrafterChoice:
    kind: str  # KIND (a trained Spec-Drafter) or CHECKPOINT
    path: Path  # what the option or the recipe named
    sha256: str  # of the drafter's weights
    description: str
    checkpoint: Path | None = None  # the Hugging Face checkpoint (converted, for a GGUF)
    meta: dict | None = None  # drafter.json of a trained drafter
    vocab_map: np.ndarray | None = None  # a checkpoint whose vocabulary is not the target's: its shared ids


@dataclass
class LoadedDrafter:
    model: object  # a transformers LlamaForCausalLM over the full vocabulary
    vocab_map: np.ndarray | None  # the ids its exported head keeps (ascending), None for all
    manifest: dict  # the piece's manifest fields besides the I/O: source, training
    # a Spec-Drafter's P_in [hidden, target hidden]: its folded embedding is the target's table times P_in^T
    in_proj: np.ndarray | None = None


def _trained(directory: Path, target: ModelSource, where: str) -> DrafterChoice:
    meta = read_meta(directory)
    if meta.get("target_sha256") != target.origin_sha256:
        raise SpecExportError(f"drafter {where} was trained for another target model (sha256"
                              f" {str(meta.get('target_sha256'))[:12]}…, this one is {target.origin_sha256[:12]}…);"
                              " distil one for this model with `specexport train-drafter`, or pass --drafter none")
    return DrafterChoice(KIND, directory, sha256_file(directory / DRAFTER_FILE), f"trained drafter {directory.name}",
                         meta=meta)


def _vocab_map(checkpoint: Path, target: ModelSource, where: str) -> np.ndarray | None:
    """Same tokenizer, but the embedding matrices may be padded differently: keep the ids both have."""
    vd = int(json.loads((checkpoint / "config.json").read_text())["vocab_size"])
    vt = int(json.loads((target.checkpoint / "config.json").read_text())["vocab_size"])
    if vd == vt:
        return None
    tokens = len(load_tokenizer(target.checkpoint))
    if min(vd, vt) < tokens:
        raise SpecExportError(f"drafter {where} has {vd} embedding rows but the tokenizer has {tokens} tokens;"
                              " it cannot read every token the target may emit")
    return np.arange(min(vd, vt), dtype=np.int64)


def locate_drafter(choice: str | None, recipe: dict, target: ModelSource) -> DrafterChoice | None:
    """The drafter a build should export, or None. 'auto': the recipe's `[drafter] path` if it was trained
    for this exact target, else none (a build never trains a drafter). Refuses anything unusable."""
    choice = choice or "auto"
    if choice == "none":
        return None
    if choice == "auto":
        rel = recipe.get("drafter", {}).get("path")
        directory = recipes_dir() / rel if rel else None
        if directory is None or not is_trained_drafter(directory) or not (directory / DRAFTER_FILE).is_file():
            return None
        if read_meta(directory).get("target_sha256") != target.origin_sha256:
            return None  # shipped for the recipe's default model, not this one
        return _trained(directory, target, rel)
    path = Path(choice).expanduser()
    if not path.exists():
        raise SpecExportError(f"drafter {path} does not exist; {WHAT_TO_PASS}")
    if path.is_dir() and is_trained_drafter(path):
        return _trained(path, target, str(path))
    if path.is_dir() and not (path / "config.json").is_file():
        raise SpecExportError(f"drafter {path} is neither a directory written by `specexport train-drafter` (no"
                              f" drafter.json) nor a Hugging Face checkpoint (no config.json); {WHAT_TO_PASS}")
    source = model_source.resolve(path)  # refuses other architectures and weightless directories
    require_same_tokenizer(source.checkpoint, target.checkpoint, f"drafter {path}")
    return DrafterChoice(CHECKPOINT, path, source.origin_sha256, source.description, checkpoint=source.checkpoint,
                         vocab_map=_vocab_map(source.checkpoint, target, str(path)))


def load_drafter_model(choice: DrafterChoice, target_model) -> LoadedDrafter:
    # by name and hash: the manifest names no path of the build machine
    source = {"kind": choice.kind, "name": Path(choice.path).name, "description": choice.description,
              "sha256": choice.sha256}
    if choice.kind == CHECKPOINT:
        model, _ = model_source.load_model(choice.checkpoint)
        return LoadedDrafter(model, choice.vocab_map, {"source": source, "training": None})
    drafter, vocab, meta = load_drafter(choice.path, target_model)  # its target was checked by locate_drafter
    model = drafter.to_llama(target_model.model.embed_tokens.weight.detach(), target_model.lm_head.weight.detach())
    training = {k: meta.get(k) for k in ("heldout", "heldout_before", "heldout_top1_in_head", "train_tokens",
                                         "train_sequences", "heldout_sequences", "parameters", "config", "data",
                                         "train_seconds", "command")}
    source["target_sha256"] = meta["target_sha256"]
    in_proj = drafter.in_proj.weight.detach().float().numpy()
    return LoadedDrafter(model, vocab, {"source": source, "training": training}, in_proj)
