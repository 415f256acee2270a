"""`specexport train-adapter` / `train-drafter`: resolve the target and settings, then self-distil."""

from __future__ import annotations

from pathlib import Path

from ...runtime.errors import SpecExportError
from .. import model_source
from ..recipe import load_recipe
from .adapter_source import train_for_target, train_settings
from .device import resolve_device


def _target(cfg: dict, model: str | None) -> model_source.ModelSource:
    if model is None:
        src = cfg["source"]
        return model_source.resolve(model_source.recipe_model_file(src))
    return model_source.resolve(model)


def _check_extra_data(dirs: tuple[Path, ...]) -> None:
    """Refuses a directory without shards before any distillation or training time is spent."""
    for d in dirs:
        if not Path(d).is_dir() or not any(Path(d).glob("shard_*.npz")):
            raise SpecExportError(f"--extra-data {d} holds no distillation shards (shard_*.npz); make them with"
                                  " tools/experiments/genai_distill.py")


def train_adapter_command(out: Path, recipe: str | None = None, model: str | None = None, command: str = "",
                          extra_data: tuple[Path, ...] = (), **overrides) -> dict:
    import json

    from .fit_adapter import META_FILE

    _check_extra_data(extra_data)
    resolve_device(overrides.get("device"))  # a GPU asked for and missing: refused before any work
    cfg = load_recipe(recipe)
    source = _target(cfg, model)
    settings = train_settings(cfg)
    settings.update({k: v for k, v in overrides.items() if v is not None and k != "exit_layer"})
    exit_layer = overrides.get("exit_layer") or int(cfg["export"].get("exit_layer", 2))
    torch_model, _ = model_source.load_model(source.checkpoint)
    train_for_target(torch_model, source.checkpoint, source.origin_sha256, exit_layer, settings, Path(out),
                     command=command, extra_data=extra_data)
    return json.loads((Path(out) / META_FILE).read_text())


def drafter_settings(recipe: dict, overrides: dict | None = None):
    """(settings, DrafterTrainConfig): [drafter.train] over the adapter's data settings, then `overrides`. The
    drafter learns from the adapter's distilled responses: same prompts, same length, same cache."""
    from .fit_drafter import DrafterTrainConfig

    data_keys = ("prompts", "prompt_limit", "max_new_tokens", "batch_size")
    adapter_data = {k: v for k, v in recipe.get("adapter", {}).get("train", {}).items() if k in data_keys}
    settings = {**adapter_data, **recipe.get("drafter", {}).get("train", {})}
    settings.update({k: v for k, v in (overrides or {}).items() if v is not None})
    fields = DrafterTrainConfig.__dataclass_fields__
    return settings, DrafterTrainConfig(**{k: v for k, v in settings.items() if k in fields})


def train_drafter_command(out: Path, recipe: str | None = None, model: str | None = None, command: str = "",
                          extra_data: tuple[Path, ...] = (), **overrides) -> dict:
    """Distils a Spec-Drafter on the adapter's data; settings: [drafter.train], then the options given."""
    from .adapter_source import describe_data, distilled_sequences, extra_sequences
    from .fit_drafter import train_drafter

    _check_extra_data(extra_data)
    resolve_device(overrides.get("device"))
    cfg = load_recipe(recipe)
    source = _target(cfg, model)
    settings, train_cfg = drafter_settings(cfg, overrides)
    torch_model, _ = model_source.load_model(source.checkpoint)
    sequences = distilled_sequences(source.checkpoint, source.origin_sha256, settings)
    data = describe_data(sequences, settings)
    extra, note = extra_sequences(extra_data, source.origin_sha256, settings, train_cfg)
    return train_drafter(torch_model, sequences, train_cfg, Path(out), source.origin_sha256,
                         command=command, feature_layer=int(cfg["export"].get("exit_layer", 2)),
                         data=data + note, extra=extra, device=settings.get("device", "auto"))



def head_settings(recipe: dict, overrides: dict | None = None):
    """(settings, HeadTrainConfig): [head.train] with the recipe's exit layer and FR-Spec size, then `overrides`."""
    from .fit_head import HeadTrainConfig

    settings = {"exit_layer": int(recipe["export"].get("exit_layer", 2)),
                "draft_vocab": int(recipe.get("head", {}).get("draft_vocab", 8192)),
                "tokens": 5_000_000, **recipe.get("head", {}).get("train", {})}
    settings.update({k: v for k, v in (overrides or {}).items() if v is not None})
    fields = HeadTrainConfig.__dataclass_fields__
    return settings, HeadTrainConfig(**{k: v for k, v in settings.items() if k in fields})


def train_head_command(out: Path, recipe: str | None = None, model: str | None = None, command: str = "",
                       **overrides) -> dict:
    """Self-distils a corpus of `tokens` response tokens (cached; `specexport distill` makes the same one) and
    trains the draft head on it; settings: [head.train], then the options given."""
    from .corpus import CorpusSettings, corpus_sequences, recipe_corpus
    from .fit_head import train_head

    cfg = load_recipe(recipe)
    settings, train_cfg = head_settings(cfg, overrides)
    tokens = settings["tokens"]
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
        raise SpecExportError(f"--tokens must be a positive number of response tokens, not {tokens}")
    for name in ("steps", "unroll", "tokens_per_batch"):
        if getattr(train_cfg, name) < 1:
            raise SpecExportError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(train_cfg, name)}")
    device = resolve_device(settings.get("device"))
    source = _target(cfg, model)
    data = CorpusSettings(max_new_tokens=int(cfg.get("adapter", {}).get("train", {}).get("max_new_tokens", 128)))
    packed = recipe_corpus(cfg, Path(cfg["path"]).parent) if model is None else None
    sequences = corpus_sequences(source.checkpoint, source.origin_sha256, tokens, data, device=device,
                                 batch_size=settings.get("batch_size"), packed=packed)
    torch_model, _ = model_source.load_model(source.checkpoint)
    described = (f"{len(sequences)} distilled responses ({sum(len(s) - p for s, p in sequences)} response tokens:"
                 " the shipped training prompts, then requests the target wrote itself)")
    return train_head(torch_model, sequences, train_cfg, Path(out), source.origin_sha256, command=command,
                      data=described, device=device)
