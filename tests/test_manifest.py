"""The bundle manifest as a typed contract: what the exporter writes reads back field for field; every way a
manifest can be wrong is one sentence naming the field; the digest pins a bundle; no build-machine paths."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specexport.exporter.bundle import write_manifest
from specexport.runtime import SpecExportError, load
from specexport.runtime.bundle import load_bundle, read_manifest
from specexport.runtime.manifest import SCHEMA_VERSION, Manifest, absolute_paths

from .test_cli import assert_one_sentence_error, cli


@pytest.fixture(scope="module")
def bundle(tiny_bundles) -> Path:
    return tiny_bundles("ort", 2, 64, adapter="untrained")


def _raw(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _with(tmp_path: Path, bundle: Path, data: dict) -> Path:
    """A copy of the bundle whose manifest is ``data`` (the pieces' files stay as they are)."""
    out = tmp_path / "b"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(bundle, out)
    (out / "manifest.json").write_text(json.dumps(data))
    return out


def _refused(tmp_path: Path, bundle: Path, data: dict) -> str:
    with pytest.raises(SpecExportError) as exc:
        load_bundle(_with(tmp_path, bundle, data))
    message = str(exc.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_what_the_exporter_writes_reads_back_field_for_field(bundle):
    raw = _raw(bundle)
    manifest = Manifest.from_dict(raw)
    assert manifest.to_dict() == raw  # nothing dropped, renamed or defaulted on the way
    assert manifest.schema_version == SCHEMA_VERSION
    assert manifest.pieces["deep"].kv.count == sum(1 for t in manifest.pieces["deep"].inputs
                                                   if t.name.startswith("past_key."))
    assert manifest.tokenizer.file in manifest.files
    assert set(manifest.files) >= {p.file for p in manifest.pieces.values()}


def test_no_absolute_path_of_the_build_machine(bundle, tiny_checkpoint):
    raw = _raw(bundle)
    assert absolute_paths(raw) == []
    assert str(tiny_checkpoint) not in (bundle / "manifest.json").read_text()
    prov = raw["provenance"]
    assert prov["source_name"] == tiny_checkpoint.name and re.fullmatch(r"[0-9a-f]{64}", prov["source_sha256"])
    assert prov["recipe_name"] == "smollm2-135m.toml" and re.fullmatch(r"[0-9a-f]{64}", prov["recipe_sha256"])
    # the bench finds the checkpoint again from the hash (the HF and ORT GenAI baselines start from it)
    from specexport.bench.runner import _checkpoint

    assert _checkpoint(read_manifest(bundle)) == tiny_checkpoint.resolve()


def test_the_exporter_refuses_to_write_a_machine_path(bundle, tmp_path):
    import dataclasses

    manifest = read_manifest(bundle)
    leaky = dataclasses.replace(manifest, provenance=dataclasses.replace(manifest.provenance,
                                                                         source_name="/home/me/model.gguf"))
    with pytest.raises(SpecExportError, match=r"absolute path of this machine in provenance\.source_name"):
        write_manifest(tmp_path, leaky)
    assert not (tmp_path / "manifest.json").exists()


@pytest.mark.parametrize("mutate, field", [
    # the faults the issue found, each now refused by name
    (lambda m: m["pieces"]["deep"].update(file="../outside/deep.onnx"), "pieces.deep.file"),
    (lambda m: m["pieces"]["deep"].update(file="/tmp/deep.onnx"), "pieces.deep.file"),
    (lambda m: m.update(files={}), "files table does not list"),
    (lambda m: m.pop("pieces"), "pieces is missing"),
    (lambda m: m["model"]["dims"].update(max_context=10**12), "model.dims.max_context"),
    # others of the same kinds
    (lambda m: m["model"]["dims"].update(hidden="64"), "model.dims.hidden"),
    (lambda m: m["model"]["dims"].update(heads=3), "model.dims.heads"),
    (lambda m: m["model"].update(exit_layer=99), "model.exit_layer"),
    (lambda m: m["generation"].update(top_p=2), "generation.top_p"),
    (lambda m: m["speculative"].update(gamma=0), "speculative.gamma"),
    (lambda m: m["pieces"]["deep"]["kv"].update(mode="both"), "pieces.deep.kv.mode"),
    (lambda m: m["pieces"]["deep"]["kv"].update(count=1), "pieces.deep.kv.count"),
    (lambda m: m["pieces"]["deep"]["inputs"][0].update(dtype="complex64"), "pieces.deep.inputs[0].dtype"),
    (lambda m: m["pieces"].update(lm={**m["pieces"]["deep"]}), "pieces.lm"),
    (lambda m: m["pieces"].pop("shallow"), "'shallow'"),
    (lambda m: m["tokenizer"].update(file="../tokenizer.json"), "tokenizer.file"),
    (lambda m: m["files"].update({"deep.onnx": "not-a-hash"}), "files.deep.onnx"),
    (lambda m: m["model"].update(colour="blue"), "model.colour"),
    (lambda m: m.update(model=[]), "model should be an object"),
])
def test_a_broken_manifest_is_one_sentence_naming_the_field(bundle, tmp_path, mutate, field):
    data = copy.deepcopy(_raw(bundle))
    mutate(data)
    assert field in _refused(tmp_path, bundle, data)


def test_another_schema_is_refused_with_how_to_rebuild(bundle, tmp_path):
    data = {**_raw(bundle), "schema_version": 1}
    message = _refused(tmp_path, bundle, data)
    assert "schema_version 1" in message and f"reads schema {SCHEMA_VERSION}" in message
    assert "specexport build" in message


def test_a_manifest_that_is_not_json_or_not_an_object(bundle, tmp_path):
    out = _with(tmp_path, bundle, {})
    (out / "manifest.json").write_text("{ not json")
    with pytest.raises(SpecExportError, match="not valid JSON"):
        load_bundle(out)
    (out / "manifest.json").write_text("[1, 2]")
    with pytest.raises(SpecExportError, match="not a JSON object"):
        load_bundle(out)


def test_the_digest_pins_one_bundle(bundle, tmp_path):
    digest = hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()
    report = json.loads(cli("inspect", str(bundle), "--json").stdout)
    assert report["digest"] == digest
    assert f"digest   sha256:{digest}" in cli("inspect", str(bundle)).stdout
    assert load(bundle, expect_digest=digest).bundle.digest == digest
    assert load(bundle, expect_digest="SHA256:" + digest.upper()).bundle.digest == digest
    with pytest.raises(SpecExportError, match="not the expected"):
        load(bundle, expect_digest="0" * 64)
    with pytest.raises(SpecExportError, match="is not a SHA-256"):
        load(bundle, expect_digest="abc")
    # a rebuilt (here: re-timestamped) bundle is another bundle
    other = copy.deepcopy(_raw(bundle))
    other["provenance"]["built_at"] = "2030-01-01T00:00:00+00:00"
    moved = _with(tmp_path, bundle, other)
    assert_one_sentence_error(cli("generate", "--bundle", str(moved), "--expect-digest", digest, "hi"),
                              "not the expected")
    ok = cli("generate", "--bundle", str(bundle), "--expect-digest", digest, "--max-new-tokens", "2", "--mode", "ar",
             "hi")
    assert ok.returncode == 0, ok.stderr


# -- any mutation: refused in one sentence naming the field, or loaded and run without another exception ----

def _leaves(value, path=()):
    """Every field's path in a JSON document (objects and lists alike)."""
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))


REPLACEMENTS = [None, 0, -1, 1, 10**15, 2.5, "", "x", "../x", "/etc/passwd", [], {}, True, ["a"]]


def _mutated(data: dict, path: tuple, kind: str, replacement) -> dict:
    data = copy.deepcopy(data)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if kind == "delete":
        if isinstance(parent, list):
            parent.pop(last)
        else:
            del parent[last]
    else:
        parent[last] = replacement
    return data


@pytest.fixture(scope="module")
def raw_and_paths(bundle):
    raw = _raw(bundle)
    # the long, uniform parts (per-layer attention lists, the chat template's text) would swamp the draws
    paths = [p for p in _leaves(raw) if p and not (len(p) > 3 and p[2] in ("attention", "parity", "training"))]
    return raw, paths


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_manifest_mutation_is_refused_by_name_or_runs(raw_and_paths, bundle, tmp_path, data):
    raw, paths = raw_and_paths
    path = data.draw(st.sampled_from(paths), label="field")
    kind = data.draw(st.sampled_from(["delete", "replace"]), label="kind")
    replacement = data.draw(st.sampled_from(REPLACEMENTS), label="value")
    mutated = _mutated(raw, path, kind, replacement)
    out = _with(tmp_path, bundle, mutated)
    try:
        session = load(out, threads=1)
    except SpecExportError as exc:
        message = str(exc)
        assert "\n" not in message and message.count(". ") == 0, message
        named = [str(k) for k in path if isinstance(k, str)]
        # a field's own name, or (for a files-table entry or a piece) what names it
        assert any(name in message for name in named[-2:]) or "files" in message or "pieces" in message, \
            (path, message)
        return
    except Exception as exc:  # anything else is a defect: a user would see a raw error
        pytest.fail(f"mutating {path} ({kind} {replacement!r}) gave {type(exc).__name__}: {exc}")
    try:
        session.generate("hash table", max_new_tokens=3, mode="ar")
    except SpecExportError as exc:
        assert "\n" not in str(exc)


def test_bench_takes_the_pin_too(bundle, tmp_path):
    from click.testing import CliRunner
    from specexport.cli.main import main

    result = CliRunner().invoke(main, ["bench", "--bundle", str(bundle), "--limit", "1", "--baselines", "none",
                                       "--modes", "ar", "--no-memory", "--out", str(tmp_path / "r"),
                                       "--expect-digest", "0" * 64])
    assert result.exit_code == 1 and "not the expected" in result.output
    assert not (tmp_path / "r").exists()
