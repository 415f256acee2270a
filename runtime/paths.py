"""Where specexport keeps converted models, distillation data and other reusable artefacts."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$SPECEXPORT_CACHE``, else ``$XDG_CACHE_HOME/specexport``, else ``~/.cache/specexport``: one default for
    the CLI, the Makefile's targets and the tests alike (the Makefile only passes the variable on), so a bundle
    built by `make demo` finds its converted source checkpoint again when the CLI runs by hand."""
    given = os.environ.get("SPECEXPORT_CACHE")
    if given:
        return Path(given).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "specexport"


def cache_dir(*parts: str) -> Path:
    """A folder under `cache_root`, made if missing."""
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
