"""The manifest's TensorRT section is part of the checked contract: the paths `engines build` joins to the
bundle's root (each piece's ONNX file, engine and script, the builder's timing cache, the scripts' checksums)
are refused when they leave the bundle, by text (absolute, `..`) or on disk (a symbolic link out), in one
sentence with exit code 1 at load, `inspect`, `check` and `engines build`; and nothing is written outside."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from specexport.cli.main import main
from specexport.exporter.tensorrt.engines import build_engines, build_section, plan_bundle
from specexport.runtime import SpecExportError, load
from specexport.runtime.bundle import load_bundle, read_manifest
from specexport.runtime.inspect_bundle import inspect_bundle

from .test_tensorrt_build import _one_sentence_error
from .test_tensorrt_calls import CudaRuntimeDouble, TensorRTDouble
from .test_tensorrt_fp16 import make_tiny_bundle


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """The device-wide timing cache goes to a fresh folder per test, not the shared one."""
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def planned(tmp_path_factory, tiny_checkpoint) -> Path:
    out = make_tiny_bundle(tmp_path_factory.mktemp("planned") / "b", tiny_checkpoint)
    plan_bundle(out, "orin-nano")
    return out


def _outside_escape(bundle: Path, outside: Path) -> str:
    return "../" * len(bundle.relative_to(bundle.anchor).parts) + str(outside.relative_to(outside.anchor))


# (field the refusal names, how the manifest is changed; `out` is the folder outside the bundle)
CRAFTS = {
    "onnx-dotdot": ("tensorrt.plan.deep.onnx", lambda m, b, out: m["tensorrt"]["plan"]["deep"].update(
        onnx="../deep.onnx")),
    "engine-absolute": ("tensorrt.plan.deep.engine", lambda m, b, out: m["tensorrt"]["plan"]["deep"].update(
        engine=str(out / "deep.engine"))),
    "engine-dotdot-deep": ("tensorrt.plan.deep.engine", lambda m, b, out: m["tensorrt"]["plan"]["deep"].update(
        engine=_outside_escape(b, out) + "/deep.engine")),
    "script-dotdot": ("tensorrt.plan.shallow.script", lambda m, b, out: m["tensorrt"]["plan"]["shallow"].update(
        script="tensorrt/../../build.sh")),
    "timing-cache-absolute": ("tensorrt.builder.timing_cache", lambda m, b, out: m["tensorrt"]["builder"].update(
        timing_cache=str(out / "timing.cache"))),
    "files-dotdot": ("tensorrt.files.../x.sh", lambda m, b, out: m["tensorrt"]["files"].update(
        {"../x.sh": "0" * 64})),
    # through a symbolic link inside the bundle that points out of it: the text alone looks harmless
    "engine-symlink": ("tensorrt.plan.deep.engine", lambda m, b, out: (
        (b / "link").symlink_to(out, target_is_directory=True),
        m["tensorrt"]["plan"]["deep"].update(engine="link/deep.engine"))),
    "timing-cache-symlink": ("tensorrt.builder.timing_cache", lambda m, b, out: (
        (b / "tensorrt" / "cachelink").symlink_to(out, target_is_directory=True),
        m["tensorrt"]["builder"].update(timing_cache="tensorrt/cachelink/timing.cache"))),
    "builder-untyped": ("tensorrt.builder.workspace_mib", lambda m, b, out: m["tensorrt"]["builder"].update(
        workspace_mib="512")),
}


@pytest.fixture()
def crafted(planned, tmp_path, request):
    """A copy of the planned bundle whose manifest was changed by one CRAFTS entry, a folder outside it, and
    the field the refusal must name."""
    field, mutate = CRAFTS[request.param]
    bundle, outside = tmp_path / "b", tmp_path / "outside"
    shutil.copytree(planned, bundle)
    outside.mkdir()
    data = copy.deepcopy(json.loads((bundle / "manifest.json").read_text()))
    mutate(data, bundle, outside)
    (bundle / "manifest.json").write_text(json.dumps(data, indent=2))
    return bundle, outside, field


def _nothing_written(outside: Path, bundle: Path, before: dict[str, bytes]) -> None:
    assert list(outside.iterdir()) == []
    assert not (bundle.parent / "deep.onnx").exists() and not (bundle.parent / "build.sh").exists()
    after = {str(p.relative_to(bundle)): p.read_bytes() for p in sorted(bundle.rglob("*")) if p.is_file()}
    assert after == before  # no engine, cache or manifest rewritten inside either


def _snapshot(bundle: Path) -> dict[str, bytes]:
    return {str(p.relative_to(bundle)): p.read_bytes() for p in sorted(bundle.rglob("*")) if p.is_file()}


def test_the_planned_bundle_itself_passes(planned):
    """What the planner writes reads back: the checks refuse only what leaves the bundle."""
    manifest = load_bundle(planned).manifest
    assert manifest.tensorrt.builder.timing_cache == "tensorrt/timing.cache"
    assert {w for w, _ in manifest.paths()} >= {"tensorrt.plan.deep.engine", "tensorrt.builder.timing_cache"}


@pytest.mark.parametrize("crafted", list(CRAFTS), indirect=True)
def test_the_api_refuses_a_crafted_tensorrt_section(crafted):
    bundle, outside, field = crafted
    before = _snapshot(bundle)
    for read in (load_bundle, read_manifest, inspect_bundle, load):
        with pytest.raises(SpecExportError) as exc:
            read(bundle)
        message = str(exc.value)
        assert field in message and "\n" not in message and "Traceback" not in message, message
    with pytest.raises(SpecExportError, match=field.replace(".", r"\.")):
        build_engines(bundle, trt=TensorRTDouble(), cudart=CudaRuntimeDouble(), log=lambda m: None)
    _nothing_written(outside, bundle, before)


@pytest.mark.parametrize("crafted", ["engine-dotdot-deep", "engine-symlink", "timing-cache-absolute"],
                         indirect=True)
def test_each_command_refuses_a_crafted_tensorrt_section_in_one_sentence(crafted):
    bundle, outside, field = crafted
    before = _snapshot(bundle)
    runner = CliRunner()
    for args in (["inspect", str(bundle)], ["check", str(bundle), "--target", "orin-nano"],
                 ["engines", "build", str(bundle)], ["engines", "list", str(bundle)],
                 ["generate", "--bundle", str(bundle), "--raw", "--max-new-tokens", "2", "hi"]):
        line = _one_sentence_error(runner.invoke(main, args))
        assert field in line and ("leaves the bundle" in line or "out of the bundle" in line), (args, line)
    _nothing_written(outside, bundle, before)


def test_the_builder_checks_a_section_it_is_handed(planned, tmp_path):
    """`specexport build` hands `build_section` a plan of its own making; a section from elsewhere with a path
    out of the bundle is refused before TensorRT builds or writes anything."""
    bundle, outside = tmp_path / "b", tmp_path / "outside"
    shutil.copytree(planned, bundle)
    outside.mkdir()
    manifest = read_manifest(bundle)
    section = manifest.to_dict()["tensorrt"]
    section["plan"]["deep"]["engine"] = str(outside / "deep.engine")
    trt = TensorRTDouble()
    with pytest.raises(SpecExportError, match=r"tensorrt\.plan\.deep\.engine"):
        build_section(bundle, section, manifest.pieces, trt=trt, cudart=CudaRuntimeDouble(), log=lambda m: None)
    assert list(outside.iterdir()) == [] and not any(c[0] == "builder.build_serialized_network" for c in trt.calls)
