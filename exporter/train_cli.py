"""`specexport train-adapter` / `train-drafter`: resolve the target and settings, then self-distil."""

from __future__ import annotations

from pathlib import Path

from ..runtime.errors import SpecExportError
from . import model_source
from .adapter_source import train_for_target, train_settings
from .recipe import load_recipe


def _target(cfg: dict, model: str | None) -> model_source.ModelSource:
    if model is None:
        src = cfg["source"]
        return model_source.resolve(model_source.default_model_file(src["package"], src["version"], src["file"]))
    return model_source.resolve(model)


def _check_extra_data(dirs: tuple[Path, ...]) -> None:
    """Refuses a directory without shards before any distillation or training time is spent."""
    for d in dirs:
        if not Path(d).is_dir() or not any(Path(d).glob("shard_*.npz")):
            raise SpecExportError(f"--extra-data {d} holds no distillation shards (shard_*.npz); make them with"
                                  " recipes/experiments/genai_distill.py")


def train_adapter_command(out: Path, recipe: str | None = None, model: str | None = None, command: str = "",
                          extra_data: tuple[Path, ...] = (), **overrides) -> dict:
    import json

    from .train_adapter import META_FILE, TrainConfig

    _check_extra_data(extra_data)
    cfg = load_recipe(recipe)
    source = _target(cfg, model)
    settings = train_settings(cfg)
    settings.update({k: v for k, v in overrides.items() if v is not None and k != "exit_layer"})
    exit_layer = overrides.get("exit_layer") or int(cfg["export"].get("exit_layer", 2))
    split = TrainConfig(**{k: v for k, v in settings.items() if k in TrainConfig.__dataclass_fields__})  # holdout, seed
    extra, note = extra_sequences(extra_data, source.origin_sha256, settings, split)
    torch_model, _ = model_source.load_model(source.checkpoint)
    train_for_target(torch_model, source.checkpoint, source.origin_sha256, exit_layer, settings, Path(out),
                     command=command, extra=extra, note=note)
    return json.loads((Path(out) / META_FILE).read_text())


def train_drafter_command(out: Path, recipe: str | None = None, model: str | None = None, command: str = "",
                          extra_data: tuple[Path, ...] = (), **overrides) -> dict:
    """Distils a Spec-Drafter on the adapter's data; settings: [drafter.train], then the options given."""
    from .adapter_source import describe_data, distilled_sequences
    from .train_drafter import DrafterTrainConfig, train_drafter

    _check_extra_data(extra_data)
    cfg = load_recipe(recipe)
    source = _target(cfg, model)
    # the drafter learns from the adapter's distilled responses: same prompts, same length, same cache
    data_keys = ("prompts", "prompt_limit", "max_new_tokens", "batch_size")
    adapter_data = {k: v for k, v in cfg.get("adapter", {}).get("train", {}).items() if k in data_keys}
    settings = {**adapter_data, **cfg.get("drafter", {}).get("train", {})}
    settings.update({k: v for k, v in overrides.items() if v is not None})
    fields = DrafterTrainConfig.__dataclass_fields__
    train_cfg = DrafterTrainConfig(**{k: v for k, v in settings.items() if k in fields})
    torch_model, _ = model_source.load_model(source.checkpoint)
    sequences = distilled_sequences(source.checkpoint, source.origin_sha256, settings)
    data = describe_data(sequences, settings)
    extra, note = extra_sequences(extra_data, source.origin_sha256, settings, train_cfg)
    return train_drafter(torch_model, sequences, train_cfg, Path(out), source.origin_sha256,
                         command=command, feature_layer=int(cfg["export"].get("exit_layer", 2)),
                         data=data + note, extra=extra)


def extra_sequences(dirs: tuple[Path, ...] | list[Path], target_sha: str, settings: dict,
                    train_cfg) -> tuple[list[list], str]:
    """Training-only sequences from more shard directories (recipes/experiments/genai_distill.py), without
    any response to a held-out prompt, so held-out agreement stays comparable and unseen."""
    from .adapter_source import distilled_data_dir
    from .distill_data import load_prompt_ids, load_records
    from .train_adapter import split_holdout

    if not dirs:
        return [], ""
    base_ids = load_prompt_ids(distilled_data_dir(target_sha, settings))
    held, _, _ = split_holdout(len(base_ids), train_cfg.holdout, train_cfg.seed)
    held_ids = {base_ids[i] for i in held}
    extra, dropped = [], 0
    for d in dirs:
        records = load_records(d)
        extra.append([(tokens, plen) for pid, tokens, plen in records if pid not in held_ids])
        dropped += len(records) - len(extra[-1])
    tokens = sum(len(s) - p for part in extra for s, p in part)
    return extra, (f"; plus {sum(map(len, extra))} responses ({tokens} tokens) from {', '.join(map(str, dirs))}"
                   f" for training only ({dropped} to held-out prompts left out)")
