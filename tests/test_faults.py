"""Faults: a build killed at a random moment, a write that fails, a bundle file removed under a Session."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from specexport.exporter import bundle as bundle_writer
from specexport.exporter.build import build_bundle
from specexport.runtime import SpecExportError, load

from .test_cli import ENV, cli


def _leftovers(parent: Path, name: str) -> list[Path]:
    return sorted(parent.glob(f".{name}.*"))


def test_a_build_killed_at_random_moments_leaves_no_bundle_and_the_next_build_succeeds(tiny_checkpoint, tmp_path):
    out = tmp_path / "b"
    args = [sys.executable, "-m", "specexport.cli.main", "build", "--model", str(tiny_checkpoint), "--out", str(out),
            "--adapter", "none", "--context", "128"]
    rng = random.Random(7)
    killed = 0
    for _ in range(4):
        proc = subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, 6.0))  # from the imports to the last piece's parity check
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait()
        if out.exists():  # the build finished before the kill: a whole bundle, or none
            assert (out / "manifest.json").is_file()
            break
        assert not out.exists()
    assert killed, "every build finished before its kill: the test did not kill one"
    done = cli("build", "--model", str(tiny_checkpoint), "--out", str(out), "--adapter", "none", "--context", "128",
               "--force")
    assert done.returncode == 0, done.stderr
    assert (out / "manifest.json").is_file()
    assert _leftovers(tmp_path, "b") == []  # the killed builds' partial directories were removed
    assert load(out, threads=1).generate("hi", max_new_tokens=4, mode="ar").tokens


def test_a_live_build_s_partial_directory_is_not_touched(tmp_path):
    mine = tmp_path / ".b.partial-live"
    mine.mkdir()
    (mine / bundle_writer.OWNER).write_text(str(os.getpid()))
    dead = tmp_path / ".b.partial-dead"
    dead.mkdir()
    (dead / bundle_writer.OWNER).write_text("999999999")
    assert bundle_writer.remove_leftovers(tmp_path / "b") == [dead]
    assert mine.exists() and not dead.exists()


def test_a_write_that_fails_is_one_sentence_and_leaves_nothing(tiny_checkpoint, tmp_path, monkeypatch):
    real = bundle_writer.save_model
    calls = {"n": 0}

    def disk_full(model, path):
        calls["n"] += 1
        if calls["n"] == 2:  # the second piece
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(model, path)

    monkeypatch.setattr(bundle_writer, "save_model", disk_full)
    with pytest.raises(SpecExportError, match=r"writing the bundle failed: No space left on device .*nothing was"):
        build_bundle(tmp_path / "b", model=str(tiny_checkpoint), context=128, adapter="none")
    assert not (tmp_path / "b").exists() and _leftovers(tmp_path, "b") == []


def test_a_file_removed_from_a_loaded_bundle_leaves_the_session_running(tiny_bundles, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(tiny_bundles(), copy)
    session = load(copy, threads=1)
    before = session.generate("hash table", max_new_tokens=12, mode="ar").tokens
    (copy / "deep.onnx").unlink()
    assert session.generate("hash table", max_new_tokens=12, mode="ar").tokens == before
    with pytest.raises(SpecExportError, match=r"deep\.onnx"):
        load(copy, threads=1)


@pytest.mark.slow
def test_ctrl_c_during_generate_exits_130_with_the_text_so_far(default_bundle):
    # the real model: the tiny one can write its 200 tokens before the signal lands; this answer runs for seconds.
    # SIGINT as a terminal's foreground process has it: a suite started in the background (`make test &`) passes
    # its children SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all
    proc = subprocess.Popen([sys.executable, "-m", "specexport.cli.main", "generate", "--bundle", str(default_bundle),
                             "--max-new-tokens", "256", "--mode", "ar",
                             "Count from 1 to 300, one number per line."], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = proc.stdout.read(1)  # text is streaming: interrupt now
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert (first + rest).strip(), "the text streamed before the interrupt was lost"
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted"
