"""Recipes: a model's build settings as data (TOML), picked by name or path; CLI options override."""

from __future__ import annotations

import copy
from pathlib import Path

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10 (JetPack 6)
    import tomli as tomllib

from ..runtime.errors import SpecExportError

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
DEFAULT_RECIPE = "smollm2-135m"


def recipes_dir() -> Path:
    # editable installs see the repository folder; wheels ship the recipes as package data
    try:
        from importlib.resources import files

        return Path(str(files("specexport.recipes")))
    except ModuleNotFoundError:
        return RECIPES_DIR


def available() -> list[str]:
    return sorted(p.stem for p in recipes_dir().glob("*.toml"))


def load_recipe(name_or_path: str | None = None) -> dict:
    ref = name_or_path or DEFAULT_RECIPE
    path = Path(ref)
    if not path.is_file():
        path = recipes_dir() / f"{ref}.toml"
    if not path.is_file():
        raise SpecExportError(f"recipe {ref!r} not found; pass a .toml file or one of: {', '.join(available())}")
    try:
        recipe = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SpecExportError(f"recipe {path} is not valid TOML ({exc})") from None
    recipe.setdefault("export", {})
    recipe.setdefault("generation", {})
    recipe.setdefault("speculative", {})
    recipe["path"] = str(path)
    return recipe


def with_overrides(recipe: dict, **export_overrides) -> dict:
    out = copy.deepcopy(recipe)
    out["export"].update({k: v for k, v in export_overrides.items() if v is not None})
    return out
