"""One cache for the Makefile's targets and the CLI run by hand: a bundle `make demo` built finds its converted
source checkpoint again when `specexport bench` runs by hand; and when the checkpoint is not found, the bench
says which one (its hash) and where it looked, not `None`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from specexport.bench import hf as hf_baseline
from specexport.bench import systems as bench_systems
from specexport.bench.ortgenai import OrtGenAISystem
from specexport.bench.systems import Skip
from specexport.exporter.model_source import find_checkpoint

REPO = Path(__file__).resolve().parents[1]
PRINT_ROOT = "from specexport.runtime.paths import cache_dir; print(cache_dir())"


def _user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment: no cache variable of this test session's, a home of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPECEXPORT_CACHE", "XDG_CACHE_HOME", "MAKEFLAGS",
                                                             "MAKELEVEL", "MFLAGS")}
    return {**env, "HOME": str(home), **extra}


def _by_hand(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", PRINT_ROOT], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def _in_make(env: dict[str, str]) -> str:
    """The cache a Makefile target's command sees: a throwaway target evaluated after the Makefile is read."""
    rule = f"print-cache-root: ; @\"{sys.executable}\" -c \"{PRINT_ROOT}\""
    proc = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO), "--eval", rule, "print-cache-root"],
                          env=env, capture_output=True, text=True, check=True)
    return proc.stdout.strip()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
@pytest.mark.parametrize("extra", [{}, {"XDG_CACHE_HOME": "xdg"}, {"SPECEXPORT_CACHE": "mine"}])
def test_make_targets_and_the_cli_by_hand_use_one_cache(tmp_path, extra):
    extra = {k: str(tmp_path / v) for k, v in extra.items()}
    env = _user_env(tmp_path / "home", **extra)
    by_hand = _by_hand(env)
    assert _in_make(env) == by_hand
    expected = {"XDG_CACHE_HOME": tmp_path / "xdg" / "specexport", "SPECEXPORT_CACHE": tmp_path / "mine"}
    assert by_hand == str(next(iter(expected[k] for k in extra), tmp_path / "home" / ".cache" / "specexport"))


def test_a_missing_checkpoint_is_named_by_its_hash_and_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bench_systems, "missing", lambda module: False)
    digest = "cd" * 32
    assert find_checkpoint(digest) is None
    for system in (OrtGenAISystem(None, {2}, "fp32", source_key=digest, log=lambda m: None),
                   hf_baseline.HFSystem(None, {2}, source_sha256=digest)):
        with pytest.raises(Skip) as exc:
            system.setup()
        message = str(exc.value)
        assert digest in message and "None" not in message, message
        assert str(tmp_path / "cache" / "models" / digest[:16]) in message  # where a converted GGUF would be
        assert str(tmp_path / "cache" / "models" / "checkpoints.json") in message  # where a build notes a checkpoint
        assert "SPECEXPORT_CACHE" in message and "\n" not in message
