"""Packaging for GPUs and Jetsons: the extras' pins (pyproject.toml), samples/jetson/install.sh (run with
DRY_RUN=1 against made-up L4T release files: it prints the commands it would run), and the power mode the
bench records on a Jetson (bench/machine.py, with stand-in `nvpmodel` and `jetson_clocks` scripts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "samples" / "jetson" / "install.sh"


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements(specs: list[str]) -> dict[str, Requirement]:
    reqs = [Requirement(s) for s in specs]
    return {canonicalize_name(r.name): r for r in reqs if r.marker is None or r.marker.evaluate()}


def _admits(req: Requirement, version: str) -> bool:
    return req.specifier.contains(version, prereleases=False)


@pytest.mark.parametrize("extra", ["tensorrt", "jetson-jp6"])
def test_cuda_12_routes_pin_a_thread_safe_cuda_python_below_13(extra):
    """PEARL's two streams need the GIL released in stream sync (12.9.1) and a thread-safe symbol table
    (12.9.2); cuda-python 13 needs driver 580, which JetPack 6 lacks."""
    cuda = _requirements(_project()["optional-dependencies"][extra])["cuda-python"]
    assert [v for v in ("12.9.2", "12.9.7") if not _admits(cuda, v)] == []
    assert [v for v in ("12.6.2", "12.9.0", "12.9.1", "13.0.0", "13.0.1", "13.4.4") if _admits(cuda, v)] == []


def test_jetpack_6_pins_numpy_1_and_jetpack_7_cuda_python_13():
    extras = _project()["optional-dependencies"]
    numpy = _requirements(extras["jetson-jp6"])["numpy"]
    assert _admits(numpy, "1.26.4") and not _admits(numpy, "2.0.0")
    cuda = _requirements(extras["jetson-jp7"])["cuda-python"]
    assert _admits(cuda, "13.0.1") and _admits(cuda, "13.4.4")
    assert not any(_admits(cuda, v) for v in ("12.9.7", "13.0.0", "14.0.0"))
    assert "tensorrt" not in _requirements(extras["jetson-jp6"]) | _requirements(extras["jetson-jp7"])  # JetPack's


def test_no_extra_installs_both_onnxruntime_packages():
    """onnxruntime and onnxruntime-gpu both install the `onnxruntime` module; side by side, the CUDA provider
    is hidden. The base dependency is onnxruntime, so no extra may add onnxruntime-gpu."""
    project = _project()
    base = _requirements(project["dependencies"])
    assert "onnxruntime" in base
    both = {"onnxruntime", "onnxruntime-gpu"}
    for extra, specs in project["optional-dependencies"].items():
        assert not both <= set(base) | set(_requirements(specs)), extra


def _install(tmp_path, release: str | None, *args, **env) -> subprocess.CompletedProcess:
    l4t = tmp_path / "nv_tegra_release"
    if release is not None:
        l4t.write_text(f"# {release}, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 2025\n")
    environ = {k: v for k, v in os.environ.items() if k != "ORT_INDEX"}
    environ.update(DRY_RUN="1", L4T_RELEASE=str(l4t), VENV=str(tmp_path / "venv"), **env)
    return subprocess.run(["bash", str(INSTALL), *args, str(ROOT)], capture_output=True, text=True, env=environ)


def _commands(result) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [line[2:] for line in result.stdout.splitlines() if line.startswith("+ ")]


def test_install_on_jetpack_6_replaces_onnxruntime_with_the_jetson_gpu_wheel(tmp_path):
    commands = _commands(_install(tmp_path, "R36 (release), REVISION: 4.3", "--ort-gpu"))
    pip = str(tmp_path / "venv" / "bin" / "pip")
    assert commands[0].startswith("python3 -m venv --system-site-packages")
    assert f"{pip} install {ROOT}[jetson-jp6]" in commands
    uninstall = commands.index(f"{pip} uninstall -y onnxruntime")
    gpu = next(i for i, c in enumerate(commands) if c.startswith(f"{pip} install") and "onnxruntime-gpu" in c)
    assert uninstall < gpu
    assert "--index-url https://pypi.jetson-ai-lab.io/jp6/cu126" in commands[gpu] and "numpy<2" in commands[gpu]
    assert "CUDAExecutionProvider" in commands[gpu + 1]  # and checked that the provider is there


def test_install_on_jetpack_7_and_without_the_gpu_runtime(tmp_path):
    commands = _commands(_install(tmp_path, "R38 (release), REVISION: 2.0"))
    assert any(c.endswith("[jetson-jp7]") for c in commands) and not any("onnxruntime" in c for c in commands)
    commands = _commands(_install(tmp_path, "R38 (release), REVISION: 2.0", "--ort-gpu", ORT_INDEX="https://idx"))
    assert any("--index-url https://idx onnxruntime-gpu" in c and "numpy" not in c for c in commands)


@pytest.mark.parametrize(("release", "args", "words"), [
    ("R36 (release), REVISION: 3.0", (), "JetPack 6.0 or older, whose TensorRT (8.6 or older)"),
    ("R35 (release), REVISION: 5.0", (), "upgrade to JetPack 6.1 or later"),
    (None, (), "is missing, so this is not a Jetson with JetPack"),
    ("R38 (release), REVISION: 2.0", ("--ort-gpu",), "set ORT_INDEX"),
])
def test_install_refuses_in_one_sentence_before_installing_anything(tmp_path, release, args, words):
    result = _install(tmp_path, release, *args)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 1 and len(errors) == 1 and words in errors[0], result.stderr
    assert "+ " not in result.stdout


def _tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_bench_records_the_jetson_power_mode_and_clocks(tmp_path):
    from specexport.bench.machine import jetson_power

    _tool(tmp_path, "nvpmodel", '[ "$1" = -q ] && printf "NV Power Mode: MAXN_SUPER\\n2\\n"')
    _tool(tmp_path, "jetson_clocks", 'echo "jetson_clocks: must be run as root" >&2; exit 1')
    power = jetson_power(str(tmp_path))
    assert power == {"nvpmodel": "NV Power Mode: MAXN_SUPER\n2",
                     "jetson_clocks": "exit 1: jetson_clocks: must be run as root"}
    empty = tmp_path / "none"
    empty.mkdir()
    assert jetson_power(str(empty)) is None
