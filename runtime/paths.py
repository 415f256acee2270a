"""Where specexport keeps converted models, distillation data and other reusable artefacts."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$SPECEXPORT_CACHE`` (the Makefile points it at the repository's git-ignored ``.cache``),
    else ``~/.cache/specexport``."""
    root = Path(os.environ.get("SPECEXPORT_CACHE") or Path.home() / ".cache" / "specexport")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
