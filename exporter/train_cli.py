"""`specexport train-adapter`: resolve the target and settings, then self-distil an adapter."""

from __future__ import annotations

from pathlib import Path

from . import model_source
from .adapter_source import train_for_target, train_settings
from .recipe import load_recipe


def train_adapter_command(out: Path, recipe: str | None = None, model: str | None = None, command: str = "",
                          **overrides) -> dict:
    import json

    from .train_adapter import META_FILE

    cfg = load_recipe(recipe)
    if model is None:
        src = cfg["source"]
        source = model_source.resolve(model_source.default_model_file(src["package"], src["version"], src["file"]))
    else:
        source = model_source.resolve(model)
    settings = train_settings(cfg)
    settings.update({k: v for k, v in overrides.items() if v is not None and k != "exit_layer"})
    exit_layer = overrides.get("exit_layer") or int(cfg["export"].get("exit_layer", 2))
    torch_model, _ = model_source.load_model(source.checkpoint)
    train_for_target(torch_model, source.checkpoint, source.origin_sha256, exit_layer, settings, Path(out),
                     command=command)
    return json.loads((Path(out) / META_FILE).read_text())
