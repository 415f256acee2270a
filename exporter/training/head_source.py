"""Find the draft head a build exports: an explicit directory, the one the recipe ships for this target, an
untrained one (tests), or none. A build never trains a head on its own: that takes millions of distilled
tokens (`specexport train-head`, on a GPU where there is one)."""

from __future__ import annotations

from pathlib import Path

from ...runtime.errors import SpecExportError
from ..recipe import recipes_dir

HEAD_CHOICES = ("auto", "none", "untrained")


def resolve_head(choice: str | None, model, target_sha: str, recipe: dict, exit_layer: int):
    """(DraftHead, metadata) or (None, None)."""
    from .fit_head import META_FILE, load_head
    from .head import DraftHead, HeadConfig

    choice = choice or "auto"
    if choice == "none":
        return None, None
    if choice == "untrained":
        from ..hf_weights import dims_of, rope_inv_freq

        head = DraftHead(HeadConfig.for_target(dims_of(model.config, 16), exit_layer), *rope_inv_freq(model))
        head.init_from_target(model)
        return head.eval(), {"source": "untrained (initialised from the target's top layer)"}
    if choice != "auto":
        head, meta = load_head(Path(choice), model, target_sha)
        return _check_layer(head, meta, exit_layer, Path(choice).name)
    shipped = recipe.get("head", {}).get("path")
    if not shipped or not (recipes_dir() / shipped / META_FILE).is_file():
        return None, None
    head, meta = load_head(recipes_dir() / shipped, model)
    if meta["target_sha256"] != target_sha or meta["exit_layer"] != exit_layer:
        return None, None  # trained for another model or split: a bundle without a head, as for any other model
    return head, {**meta, "source": Path(shipped).name}


def _check_layer(head, meta: dict, exit_layer: int, name: str):
    if meta["exit_layer"] != exit_layer:
        raise SpecExportError(f"draft head {name} was trained at exit layer {meta['exit_layer']} but the build uses"
                              f" {exit_layer}; pass --exit-layer {meta['exit_layer']}")
    return head, {**meta, "source": name}
