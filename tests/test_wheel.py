"""Only the product in the wheel (issue 19, point 6): the installable packages and the recipes' data, nothing of
tools/, tests/ or samples/, and the `specexport` console script. The wheel is built once, from the repository,
into a temporary directory; setuptools' build/ and egg-info go there too, so the repository is left as it was."""

from __future__ import annotations

import configparser
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]

# source directory -> where its modules land in the wheel
PRODUCT = ("runtime", "exporter", "bench", "doctor", "cli", "serve", "recipes")
# every package of the source tree, found rather than listed: a subpackage added and left out of pyproject.toml's
# packages (runtime/engine once was) fails here instead of at a user's import
PACKAGES = {str(init.parent.relative_to(REPO)): "specexport/" + str(init.parent.relative_to(REPO))
            for top in PRODUCT for init in sorted((REPO / top).rglob("__init__.py"))}
# pyproject.toml's [tool.setuptools.package-data] for specexport.recipes
RECIPE_DATA = ["*.toml", "targets/*.toml", "data/*", "adapters/*/*", "drafters/*/*"]
LITTER = ("build", "dist")  # and any *.egg-info: what a setuptools build may leave in the source tree


def _setuptools_missing() -> str | None:
    """Why this environment cannot build the wheel without build isolation, or None."""
    if importlib.util.find_spec("setuptools") is None:
        return "building the wheel needs setuptools (--no-build-isolation uses the installed one)"
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        return f"pyproject.toml needs setuptools >= 77, this environment has {setuptools.__version__}"
    # bdist_wheel comes with setuptools since 70.1; the `wheel` package is the older home
    if importlib.util.find_spec("setuptools.command.bdist_wheel") is None and importlib.util.find_spec("wheel") is None:
        return "building the wheel needs the wheel package or setuptools' own bdist_wheel"
    return None


class Wheel(NamedTuple):
    names: list[str]  # every file in the wheel
    entry_points: str  # its dist-info/entry_points.txt
    litter_before: dict[str, int]  # build leftovers in the repository before the build, and after it
    litter_after: dict[str, int]


def _litter() -> dict[str, int]:
    """Build leftovers in the repository's root, with their modification times."""
    return {p.name: p.stat().st_mtime_ns for p in REPO.iterdir() if p.name in LITTER or p.name.endswith(".egg-info")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Wheel:
    reason = _setuptools_missing()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("wheel")
    # setuptools reads this file after setup.cfg (DIST_EXTRA_CONFIG): its build tree and egg-info go to tmp
    extra = tmp / "setup-extra.cfg"
    extra.write_text(f"[build]\nbuild_base = {tmp / 'build'}\n\n[egg_info]\negg_base = {tmp}\n")
    before = _litter()
    env = {**os.environ, "DIST_EXTRA_CONFIG": str(extra), "PIP_NO_INPUT": "1"}
    headers = REPO / "build" / "onnxruntime-headers" / "root" / "usr" / "include" / "onnxruntime"
    if headers.is_dir():  # the headers an earlier install fetched (setup.py), rather than a download into tmp
        env.setdefault("SPECEXPORT_ORT_HEADERS", str(headers))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist")],
        cwd=REPO, env=env,
        capture_output=True, text=True, timeout=300,
    )
    after = _litter()
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    (built,) = (tmp / "dist").glob("specexport-*.whl")
    with zipfile.ZipFile(built) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    return Wheel(names, entry_points, before, after)


def test_every_package_and_module_is_in_the_wheel(wheel):
    names = set(wheel.names)
    for source, target in PACKAGES.items():
        assert f"{target}/__init__.py" in names, f"the wheel lacks the package {target.replace('/', '.')}"
        modules = sorted(p.name for p in (REPO / source).glob("*.py"))
        missing = [m for m in modules if f"{target}/{m}" not in names]
        assert not missing, f"{source}/ modules missing from the wheel: {missing}"
    # the GenAI worker runs in another interpreter from its file path: it must ship as a file
    assert "specexport/bench/ortgenai_worker.py" in names
    # the attention operator, compiled by the build (setup.py)
    assert [n for n in names if n.startswith("specexport/runtime/_row_attention") and n.endswith(".so")]


def test_the_recipes_data_is_in_the_wheel(wheel):
    names = set(wheel.names)
    recipes = REPO / "recipes"
    expected = sorted({p.relative_to(recipes).as_posix() for pattern in RECIPE_DATA for p in recipes.glob(pattern)
                       if p.is_file() and "__pycache__" not in p.parts})
    for kind in ("smollm2-135m.toml", "targets/", "data/", "adapters/", "drafters/"):
        assert any(e.startswith(kind) for e in expected), f"recipes/{kind} has nothing to ship: this check is empty"
    missing = [e for e in expected if f"specexport/recipes/{e}" not in names]
    assert not missing, f"recipes/ files missing from the wheel (pyproject.toml's package-data): {missing}"
    for name in ("targets/orin-nano.toml", "data/trt_ops.json", "data/train_prompts.jsonl"):
        assert f"specexport/recipes/{name}" in names


def test_nothing_but_the_product_is_in_the_wheel(wheel):
    names = wheel.names
    tops = {n.split("/", 1)[0] for n in names}
    assert tops <= {"specexport"} | {t for t in tops if t.endswith(".dist-info")}, f"unexpected top levels: {tops}"
    for part in ("tools", "experiments", "tests", "samples", "docs", "journal", "__pycache__"):
        stray = [n for n in names if part in n.split("/")[:-1]]
        assert not stray, f"{part}/ is not part of the product, yet the wheel carries {stray[:5]}"
    experiments = {p.name for p in (REPO / "tools" / "experiments").glob("*.py")}
    assert not [n for n in names if n.rsplit("/", 1)[-1] in experiments], "an experiment script is in the wheel"
    assert not [n for n in names if n.endswith((".pyc", ".onnx", ".onnx.data"))]


def test_the_console_script_is_specexport_cli_main_entry(wheel):
    parser = configparser.ConfigParser()
    parser.read_string(wheel.entry_points)
    assert dict(parser["console_scripts"]) == {"specexport": "specexport.cli.main:entry"}


def test_the_build_leaves_nothing_in_the_repository(wheel):
    before, after = wheel.litter_before, wheel.litter_after
    new = sorted(set(after) - set(before))
    assert not new, f"building the wheel left {new} in the repository"
    touched = sorted(name for name in before if after.get(name) != before[name])
    assert not touched, f"building the wheel rewrote {touched} in the repository"
