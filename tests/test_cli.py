"""The CLI's contract: exit codes, one-sentence errors, no partial bundles, checksums."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specexport.cli.main", *args], capture_output=True,
                          text=True, env=ENV, input=input, timeout=600)


def assert_one_sentence_error(proc: subprocess.CompletedProcess, *fragments: str, code: int = 1) -> None:
    """The rule for bad input: the documented exit code, and on stderr one line holding one sentence."""
    assert proc.returncode == code, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    message = lines[0].removeprefix("error: ")
    assert not re.search(r"[.!?]\s+[A-Z]", message), f"more than one sentence: {message}"
    for fragment in fragments:
        assert fragment in message, message


def no_partial_dirs(parent: Path) -> bool:
    return not any(p.name.startswith(".") and ".partial-" in p.name for p in parent.iterdir())


def test_help_explains_every_command():
    proc = cli("--help")
    assert proc.returncode == 0
    for command in ("build", "generate", "inspect"):
        assert command in proc.stdout
    build_help = cli("build", "--help").stdout
    for option in ("--out", "--model", "--exit-layer", "--recipe", "--context", "--force", "--json"):
        assert option in build_help


def test_bad_usage_exits_2():
    assert cli("generate").returncode == 2
    assert cli("build", "--exit-layer", "two", "--out", "x").returncode == 2


def test_build_generate_inspect_json(tiny_checkpoint, tmp_path):
    out = tmp_path / "b"
    proc = cli("build", "--model", str(tiny_checkpoint), "--exit-layer", "1", "--context", "128", "--out",
               str(out), "--adapter", "none", "--json")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)
    assert manifest["model"]["exit_layer"] == 1
    assert (out / "manifest.json").is_file() and no_partial_dirs(tmp_path)

    report = json.loads(cli("inspect", str(out), "--json").stdout)
    assert report["checksums_ok"] is True
    assert report["pieces"]["deep"]["layers"] == [1, 4]

    gen = cli("generate", "--bundle", str(out), "--max-new-tokens", "8", "--json", "hash table")
    assert gen.returncode == 0, gen.stderr
    result = json.loads(gen.stdout)
    assert result["stats"]["new_tokens"] == len(result["tokens"]) <= 8
    # no adapter or drafter: the default mode (auto) has only prompt lookup and plain steps
    assert result["stats"]["mode"] == "auto" and result["stats"]["mean_accepted_tokens"] >= 1.0

    # streaming mode: text on stdout, stats on stderr
    stream = cli("generate", "--bundle", str(out), "--max-new-tokens", "8", "--stats", "hash table")
    assert stream.returncode == 0 and "tokens/s" in stream.stderr and "tokens/s" not in stream.stdout


def test_existing_bundle_needs_force(tiny_checkpoint, tiny_bundles, tmp_path):
    out = tmp_path / "b"
    shutil.copytree(tiny_bundles(), out)  # any bundle already there (the session's, not a third build here)
    args = ("build", "--model", str(tiny_checkpoint), "--context", "64", "--adapter", "none", "--out", str(out))
    assert_one_sentence_error(cli(*args), "already exists", "--force")
    assert json.loads((out / "manifest.json").read_text())["model"]["dims"]["max_context"] != 64  # left as it was
    assert cli(*args, "--force").returncode == 0 and no_partial_dirs(tmp_path)
    assert json.loads((out / "manifest.json").read_text())["model"]["dims"]["max_context"] == 64  # replaced


def test_missing_model_path(tmp_path):
    proc = cli("build", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "b"))
    assert_one_sentence_error(proc, "does not exist")
    assert not (tmp_path / "b").exists() and no_partial_dirs(tmp_path)


def test_unknown_architecture(tiny_checkpoint, tmp_path):
    other = tmp_path / "gpt2ish"
    shutil.copytree(tiny_checkpoint, other)
    config = json.loads((other / "config.json").read_text())
    config["model_type"] = "gpt2"
    (other / "config.json").write_text(json.dumps(config))
    proc = cli("build", "--model", str(other), "--out", str(tmp_path / "b"))
    assert_one_sentence_error(proc, "'gpt2'", "Llama")
    assert not (tmp_path / "b").exists() and no_partial_dirs(tmp_path)


def test_exit_layer_out_of_range(tiny_checkpoint, tmp_path):
    proc = cli("build", "--model", str(tiny_checkpoint), "--exit-layer", "4", "--out", str(tmp_path / "b"))
    assert_one_sentence_error(proc, "exit layer 4", "1..3")
    assert not (tmp_path / "b").exists() and no_partial_dirs(tmp_path)


def test_unreadable_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf at all")
    proc = cli("build", "--model", str(bad), "--out", str(tmp_path / "b"))
    assert_one_sentence_error(proc, "model.gguf")
    assert not (tmp_path / "b").exists() and no_partial_dirs(tmp_path)


def test_prompt_longer_than_context(tiny_bundles):
    bundle = tiny_bundles("ort", 2, 64)
    proc = cli("generate", "--bundle", str(bundle), "fox " * 200)
    assert_one_sentence_error(proc, "context is 64")


def test_corrupt_bundle_is_refused(tiny_bundles, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundles("ort", 2, 64), bundle)
    with open(bundle / "deep.onnx.data", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02\x03")
    assert_one_sentence_error(cli("generate", "--bundle", str(bundle), "hi"), "checksum", "deep.onnx.data")
    proc = cli("inspect", str(bundle))
    assert_one_sentence_error(proc, "checksum", "deep.onnx.data")
    assert "checksums FAILED" in proc.stdout


def test_missing_bundle(tmp_path):
    assert_one_sentence_error(cli("generate", "--bundle", str(tmp_path / "nope"), "hi"), "does not exist")
    assert_one_sentence_error(cli("inspect", str(tmp_path)), "not a specexport bundle")
