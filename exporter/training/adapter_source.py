"""Find or make the adapter a build exports: an explicit path, the one shipped for the default model,
one trained earlier for this target (cache), or a fresh self-distillation run."""

from __future__ import annotations

import sys
from pathlib import Path

from ...runtime.errors import SpecExportError
from ...runtime.paths import cache_dir
from ..recipe import recipes_dir
from .fit_adapter import META_FILE, TrainConfig, load_adapter, train

ADAPTER_CHOICES = ("auto", "none", "untrained")


def distilled_sequences(checkpoint: Path, target_sha: str, settings: dict) -> list:
    """The target's own responses to the shipped training prompts (never Spec-Bench), generated once and
    cached by (target, prompt count, response length); the adapter and the drafter learn from the same."""
    from .distill_data import generate_responses, load_sequences

    prompts = training_prompts(settings)
    data_dir = _data_dir(target_sha, len(prompts), settings)
    generate_responses(checkpoint, prompts, data_dir, max_new_tokens=int(settings.get("max_new_tokens", 192)),
                       batch_size=int(settings.get("batch_size", 16)), device=settings.get("device", "auto"))
    return load_sequences(data_dir)


def training_prompts(settings: dict) -> list[dict]:
    """The prompts a recipe's [adapter.train] `settings` train on (never Spec-Bench): its `prompts` file or the
    shipped set, up to `prompt_limit`."""
    from .distill_data import read_prompts

    prompts_file = Path(settings.get("prompts") or recipes_dir() / "data" / "train_prompts.jsonl")
    return read_prompts(prompts_file)[: settings.get("prompt_limit")]


def _data_dir(target_sha: str, n_prompts: int, settings: dict) -> Path:
    return cache_dir("distill", f"{target_sha[:16]}-n{n_prompts}-t{settings.get('max_new_tokens', 192)}")


def distilled_data_dir(target_sha: str, settings: dict) -> Path:
    """Where distilled_sequences keeps the responses for these settings."""
    return _data_dir(target_sha, len(training_prompts(settings)), settings)


def train_for_target(model, checkpoint: Path, target_sha: str, exit_layer: int, settings: dict, out_dir: Path,
                     command: str = "", extra_data: tuple[Path, ...] | list[Path] = ()) -> Path:
    """Self-distillation end to end: the target answers the shipped prompt set, then the adapter trains
    (on the shards in `extra_data` too, for training only)."""
    sequences = distilled_sequences(checkpoint, target_sha, settings)
    fields = TrainConfig.__dataclass_fields__
    cfg = TrainConfig(exit_layer=exit_layer, **{k: v for k, v in settings.items() if k in fields and k != "exit_layer"})
    extra, note = extra_sequences(extra_data, target_sha, settings, cfg)  # the base responses exist by now
    train(model, sequences, cfg, out_dir, target_sha, command=command, data=describe_data(sequences, settings) + note,
          extra=extra, device=settings.get("device", "auto"))
    return out_dir


def extra_sequences(dirs: tuple[Path, ...] | list[Path], target_sha: str, settings: dict,
                    train_cfg) -> tuple[list[list], str]:
    """Training-only sequences from more shard directories (tools/experiments/genai_distill.py), without
    any response to a held-out prompt, so held-out agreement stays comparable and unseen. Call it after
    distilled_sequences: the held-out prompts are read from the base responses."""
    from .distill_data import load_prompt_ids, load_records
    from .fit_adapter import split_holdout

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


def describe_data(sequences: list, settings: dict) -> str:
    """What the distilled sequences are, for the trained head's metadata."""
    return (f"{len(sequences)} distilled responses ({settings.get('prompt_limit')} prompts of"
            f" {settings.get('prompts') or 'recipes/data/train_prompts.jsonl'},"
            f" {settings.get('max_new_tokens', 192)} new tokens)")


def train_settings(recipe: dict) -> dict:
    """[adapter.train] plus the head's shape from [adapter] (arch, draft_vocab), which training fixes."""
    adapter = recipe.get("adapter", {})
    return {**adapter.get("train", {}), "arch": adapter.get("arch", "attention"),
            "draft_vocab": int(adapter.get("draft_vocab", 0) or 0)}


def resolve_adapter(choice: str | None, model, checkpoint: Path, target_sha: str, recipe: dict, exit_layer: int):
    """(Adapter module, metadata) or (None, None) for choice 'none'."""
    choice = choice or "auto"
    if choice == "none":
        return None, None
    if choice == "untrained":  # for tests and experiments: initialised from layer l, never trained
        from ..hf_weights import dims_of, rope_inv_freq
        from .adapter import Adapter, AdapterConfig

        adapter = Adapter(AdapterConfig.for_target(dims_of(model.config, 16), exit_layer), *rope_inv_freq(model))
        adapter.init_from_target(model)
        return adapter.eval(), {"source": "untrained (initialised from layer l)", "exit_layer": exit_layer}
    if choice != "auto":
        adapter, meta = load_adapter(Path(choice), model, target_sha)
        return _check_layer(adapter, meta, exit_layer, choice)
    settings = recipe.get("adapter", {})
    candidates = []
    if settings.get("path"):
        candidates.append(recipes_dir() / settings["path"])
    arch = settings.get("arch", "attention")
    trained = cache_dir("adapters") / f"{target_sha[:16]}-l{exit_layer}-{arch}"
    candidates.append(trained)
    for directory in candidates:
        if (directory / META_FILE).is_file():
            adapter, meta = load_adapter(directory, model)
            if meta["target_sha256"] == target_sha and meta["exit_layer"] == exit_layer:
                return adapter, {**meta, "source": directory.name}
    if not settings.get("train_if_missing", True):
        raise SpecExportError(f"no trained adapter for this model at exit layer {exit_layer}; pass --adapter PATH,"
                              " --adapter none, or train one with `specexport train-adapter`")
    print(f"no adapter for this model at exit layer {exit_layer}: training one by self-distillation"
          " (this takes a while; pass --adapter none to skip)", file=sys.stderr)
    train_for_target(model, checkpoint, target_sha, exit_layer, train_settings(recipe), trained)
    adapter, meta = load_adapter(trained, model, target_sha)
    return adapter, {**meta, "source": trained.name}


def _check_layer(adapter, meta: dict, exit_layer: int, where: str):
    if meta["exit_layer"] != exit_layer:
        raise SpecExportError(f"adapter {where} was trained at exit layer {meta['exit_layer']} but the build uses"
                              f" {exit_layer}; pass --exit-layer {meta['exit_layer']}")
    return adapter, {**meta, "source": Path(where).name}  # the manifest names no path of this machine
