"""Native part of the build: the row-invariant attention and int4/int8 matmul operators and their companions
(native/*.cc, and native/custom_op.h, which they all include), one ONNX Runtime
custom-op library shipped inside specexport.runtime. Everything else is declared in pyproject.toml.

The library is compiled with the system's C++ compiler against ONNX Runtime's C API headers, which the
onnxruntime wheel does not carry. They come from Debian's `libonnxruntime-dev` (trixie, 1.21.0: API 21),
fetched once with `apt-get download` against a sources list of the build's own (its own lists and cache under
build/onnxruntime-headers, the system's keyring; nothing of the system changes) and unpacked with `dpkg-deb -x`. Set
SPECEXPORT_ORT_HEADERS to a directory holding onnxruntime_c_api.h to use headers from elsewhere, or
SPECEXPORT_NO_NATIVE=1 to install without the operator (bundles are then built with `--attention gqa`).

The library never links libonnxruntime: the Python module carries its own copy, and the operator takes the
API from the runtime that loads it. It is built as a setuptools extension only to ride the backend's compiler
handling and install layout; it has no Python entry point.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HEADERS_PACKAGE = "libonnxruntime-dev"
HEADERS_VERSION = "1.21.0"  # ORT_API_VERSION 21; the operator asks the loading runtime for at most that
SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


class HeadersMissing(RuntimeError):
    pass


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def fetch_headers(cache: Path) -> Path:
    """The directory holding onnxruntime_c_api.h: SPECEXPORT_ORT_HEADERS, the `cache` (under the build's own
    build/, git-ignored), or a fresh download into it."""
    given = os.environ.get("SPECEXPORT_ORT_HEADERS")
    if given:
        if not (Path(given) / "onnxruntime_c_api.h").is_file():
            raise HeadersMissing(f"SPECEXPORT_ORT_HEADERS={given} holds no onnxruntime_c_api.h")
        return Path(given)
    cache = cache.resolve()  # apt-get download runs in a subdirectory: relative option paths would miss
    include = cache / "root" / "usr" / "include" / "onnxruntime"
    if (include / "onnxruntime_c_api.h").is_file():
        return include
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb") and Path(KEYRING).is_file()):
        raise HeadersMissing("this machine has no apt-get, dpkg-deb or Debian archive keyring to fetch them with")
    apt = cache / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "debs"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    sources = apt / "sources.list"
    sources.write_text(f"deb [signed-by={KEYRING}] {MIRROR} {SUITE} main\n")
    options = [f"-oDir::Etc::SourceList={sources}", "-oDir::Etc::SourceParts=/dev/null",
               f"-oDir::State::Lists={apt / 'lists'}", f"-oDir::Cache={apt / 'cache'}",
               "-oDebug::NoLocking=1"]
    try:
        _run(["apt-get", *options, "update"])
        subprocess.run(["apt-get", *options, "download", f"{HEADERS_PACKAGE}={HEADERS_VERSION}*"], check=True,
                       cwd=apt / "debs", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deb = next((apt / "debs").glob(f"{HEADERS_PACKAGE}_*.deb"))
        _run(["dpkg-deb", "-x", str(deb), str(cache / "root")])
    except (subprocess.CalledProcessError, StopIteration, OSError) as exc:
        detail = exc.stderr.decode(errors="replace").strip().splitlines()[-1:] if isinstance(
            exc, subprocess.CalledProcessError) and exc.stderr else [str(exc)]
        raise HeadersMissing(f"apt-get could not fetch {HEADERS_PACKAGE} from {MIRROR} {SUITE}"
                             f" ({' '.join(detail) or 'no detail'})") from None
    if not (include / "onnxruntime_c_api.h").is_file():
        raise HeadersMissing(f"{HEADERS_PACKAGE} unpacked without onnxruntime_c_api.h")
    return include


class BuildNative(build_ext):
    """build_ext that fetches ONNX Runtime's headers first and builds the operator as a plain shared library."""

    def run(self) -> None:
        if os.environ.get("SPECEXPORT_NO_NATIVE") == "1":
            self.extensions = []
            return
        try:
            include = fetch_headers(Path(self.get_finalized_command("build").build_base) / "onnxruntime-headers")
        except HeadersMissing as exc:
            raise SystemExit(
                f"error: the attention operator needs ONNX Runtime's C API headers, and {exc}; set"
                " SPECEXPORT_ORT_HEADERS to a directory with onnxruntime_c_api.h, or SPECEXPORT_NO_NATIVE=1 to"
                " install without the operator (bundles then need --attention gqa).") from None
        for ext in self.extensions:
            ext.include_dirs.append(str(include))
        super().run()

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []  # no PyInit_: the library is loaded by ONNX Runtime, never imported


setup(
    ext_modules=[Extension(
        "specexport.runtime._row_attention",
        sources=["native/row_attention.cc", "native/row_matmul.cc", "native/gated_silu.cc",
                 "native/row_gather.cc"],
        depends=["native/custom_op.h"],  # what the sources include: a change rebuilds them
        language="c++",
        # -ffp-contract=off: the compiler must not fuse a multiply and an add on its own, or the portable path
        # would round otherwise than the vector paths (which fuse exactly where the source says)
        extra_compile_args=["-std=c++17", "-O3", "-ffp-contract=off", "-fno-fast-math", "-fvisibility=hidden"],
    )],
    cmdclass={"build_ext": BuildNative},
)
