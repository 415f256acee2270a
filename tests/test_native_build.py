"""The attention operator is built where the package is installed: the build backend declares it, `make setup`
runs that backend, and the installed package carries a library built from today's source that ONNX Runtime
can load without a libonnxruntime of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import onnxruntime as ort
from specexport.runtime import attention_op

REPO = Path(__file__).resolve().parents[1]
# every operator source, found rather than listed: one left out (gated_silu.cc once was) would let a stale
# library pass the operator tests
SOURCES = sorted((REPO / "native").glob("*.cc"))
HEADER = REPO / "native" / "custom_op.h"  # what both sources include


def _extensions(keyword: str = "sources") -> list[tuple[str, list[str]]]:
    """(name, that keyword's list) of every Extension(...) call in setup.py, read without running it."""
    found = []
    for node in ast.walk(ast.parse((REPO / "setup.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            name = ast.literal_eval(node.args[0])
            values = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == keyword), [])
            found.append((name, values))
    return found


def test_the_build_backend_declares_the_operator():
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^build-backend = "setuptools.build_meta"$', pyproject, re.M), \
        "setup.py's extension is built only by setuptools' backend"
    sources = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "native").glob("*.cc"))
    assert len(sources) >= 3  # the attention, the matmul and GatedSiLU
    declared = dict(_extensions())
    assert sorted(declared.get(f"specexport.runtime.{attention_op.LIBRARY}", [])) == sources  # every source built
    assert "build_ext" in (REPO / "setup.py").read_text()  # the command that fetches the headers first
    manifest = (REPO / "MANIFEST.in").read_text()
    assert "include native/*.cc" in manifest and "include native/*.h" in manifest  # an sdist can build it too
    # setuptools rebuilds the library when a source changes, and when the shared header does only if told
    assert (f"specexport.runtime.{attention_op.LIBRARY}", ["native/custom_op.h"]) in _extensions("depends")
    assert all(f'#include "{HEADER.name}"' in source.read_text() for source in SOURCES)


def test_make_setup_installs_through_the_backend_and_rebuilds_on_change():
    makefile = (REPO / "Makefile").read_text()
    rule = re.search(r"^\$\(BIN\)/specexport:(.*)$\n((?:\t.*\n)+)", makefile, re.M)
    assert rule, "the Makefile has no $(BIN)/specexport rule"
    prerequisites, recipe = rule.group(1).split(), rule.group(2)
    sources = {p.relative_to(REPO).as_posix() for p in SOURCES}
    assert {"pyproject.toml", "setup.py", "native/custom_op.h", *sources} <= set(prerequisites), \
        "an operator source missing from make setup's prerequisites: editing it would not rebuild the library"
    assert re.search(r"pip install .*-e '\.\[", recipe), "make setup no longer installs the package itself"
    assert "SPECEXPORT_NO_NATIVE" not in makefile


def test_the_installed_package_carries_a_current_library():
    path = attention_op.library_path()
    assert path is not None, f"the installed package has no attention operator: {attention_op.load_error()}"
    for source in [*SOURCES, HEADER]:
        assert path.stat().st_mtime >= source.stat().st_mtime, f"{path.name} is older than {source.name}: make setup"
    assert attention_op.load_error() is None
    # the Python module's own runtime serves it: the library must not pull in a second one
    assert b"libonnxruntime.so" not in path.read_bytes()


def test_onnx_runtime_registers_it():
    opts = ort.SessionOptions()
    attention_op.register(opts)  # raises where ONNX Runtime cannot load it
    assert attention_op.isa() in ("avx512", "avx2", "portable")


def test_the_header_fetch_gives_apt_absolute_paths(tmp_path, monkeypatch):
    # setuptools hands the build a relative build/ directory, and `apt-get download` runs in a subdirectory of
    # it: a relative list or cache path there points at nothing, and a fresh clone's set-up fails
    namespace: dict = {}
    exec(compile((REPO / "setup.py").read_text().split("class BuildNative")[0], "setup.py", "exec"), namespace)
    calls = []

    def record(cmd, **kwargs):
        calls.append(cmd)
        raise namespace["subprocess"].CalledProcessError(1, cmd, stderr=b"stopped by the test")

    monkeypatch.setattr(namespace["subprocess"], "run", record)
    monkeypatch.setattr(namespace["shutil"], "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setitem(namespace, "KEYRING", str(REPO / "setup.py"))  # any file that exists
    monkeypatch.delenv("SPECEXPORT_ORT_HEADERS", raising=False)
    monkeypatch.chdir(tmp_path)
    try:
        namespace["fetch_headers"](Path("build") / "onnxruntime-headers")
    except namespace["HeadersMissing"]:
        pass
    paths = [arg.split("=", 1)[1] for arg in calls[0] if arg.startswith("-oDir::")]
    assert paths and all(Path(p).is_absolute() for p in paths if p != "/dev/null"), calls[0]
