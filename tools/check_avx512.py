"""The operators' AVX-512 paths, run on a machine without AVX-512 and checked against the portable path.

    .venv/bin/python tools/check_avx512.py [--cases 300] [--matmul-cases 80] [--seed 0] [--simde DIR]

The library's sources (setup.py's extension, its flags) are compiled a second time into build/check_avx512/ with
SPECEXPORT_SIMDE (native/row_attention.cc, native/row_matmul.cc): the AVX-512 intrinsics come from SIMDe and the
kernels take their AVX-512 paths (the attention's avx512, the matmul's avx512vnni) wherever AVX2 and FMA are.
That library then runs tests/test_attention_op.py and tests/test_matmul_op.py whole (their vector paths are now
the AVX-512 ones), and two sweeps of random calls, one an operator, whose outputs must carry the same bits on the
emulated AVX-512 path, the AVX2 path and the portable path, and on the installed library's paths where it is
built. Exit status 0 when all of them agree.

SIMDe's headers are Debian's libsimde-dev, fetched with `apt-get download` and unpacked with `dpkg-deb -x`
under build/simde (nothing of the system changes), or given with --simde (the directory holding simde/).
ONNX Runtime's headers are those the normal build fetched (SPECEXPORT_ORT_HEADERS, else build/).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "check_avx512"
SIMDE_CACHE = ROOT / "build" / "simde"
ORT_HEADERS = ROOT / "build" / "onnxruntime-headers" / "root" / "usr" / "include" / "onnxruntime"
# SIMDe splits a 512-bit multiply-add into two 256-bit ones; only with FMA enabled at compile time are those
# fused (its fallback rounds the product first), so the scratch build needs AVX2 + FMA on the command line
EMULATION_FLAGS = ["-mavx2", "-mfma", "-DSPECEXPORT_SIMDE", "-Wno-psabi", "-shared", "-fPIC"]
HEAD_DIMS = [16, 24, 64, 128, 256]  # 24: not a multiple of 16 lanes, the vector paths' portable fallback
# (K, N) of SmolLM2-135M's and -360M's projections (q and o, k and v, gate and up, down); the sweep draws ragged
# ones beside them
SMOLLM2 = [(576, 576), (576, 192), (576, 3072), (1536, 576), (960, 320), (960, 5120), (2560, 960)]
BLOCKS = [32, 64, 128, 256, 96]  # 96: no unrolled kernel, the vector paths' portable fallback


class Refused(Exception):
    pass


def extension_args() -> tuple[list[str], list[str]]:
    """setup.py's sources and compile flags for the library, read from its Extension(...) call."""
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg in ("sources", "extra_compile_args")}
            return kw["sources"], kw.get("extra_compile_args", [])
    raise Refused("setup.py has no Extension(...) call to read the library's sources from")


def simde_headers(given: str | None) -> Path:
    if given:
        if not (Path(given) / "simde" / "x86" / "avx512.h").is_file():
            raise Refused(f"{given} holds no simde/x86/avx512.h")
        return Path(given)
    include = SIMDE_CACHE / "root" / "usr" / "include"
    if (include / "simde" / "x86" / "avx512.h").is_file():
        return include
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        raise Refused("this machine has no apt-get and dpkg-deb to fetch libsimde-dev with; pass --simde DIR")
    SIMDE_CACHE.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["apt-get", "download", "libsimde-dev"], cwd=SIMDE_CACHE, check=True, capture_output=True)
        deb = next(SIMDE_CACHE.glob("libsimde-dev_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(SIMDE_CACHE / "root")], check=True, capture_output=True)
    except (subprocess.CalledProcessError, StopIteration) as exc:
        detail = exc.stderr.decode(errors="replace").strip() if isinstance(exc, subprocess.CalledProcessError) else ""
        raise Refused(f"apt-get could not fetch libsimde-dev ({detail.splitlines()[-1] if detail else 'no .deb'});"
                      " pass --simde DIR") from None
    return include


def build(simde: Path) -> Path:
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").is_file() else set()
    if not {"avx2", "fma"} <= flags:
        raise Refused("this CPU lacks AVX2 or FMA, which the emulated AVX-512 path is built on")
    ort = Path(os.environ.get("SPECEXPORT_ORT_HEADERS") or ORT_HEADERS)
    if not (ort / "onnxruntime_c_api.h").is_file():
        raise Refused(f"no onnxruntime_c_api.h in {ort}; build the library once first"
                      " (`.venv/bin/python setup.py build_ext --inplace` fetches the headers)")
    sources, compile_args = extension_args()
    BUILD.mkdir(parents=True, exist_ok=True)
    lib = BUILD / "_row_attention_simde.so"
    cmd = [os.environ.get("CXX", "g++"), *compile_args, *EMULATION_FLAGS, f"-I{simde}", f"-I{ort}",
           *(str(ROOT / s) for s in sources), "-o", str(lib)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise Refused(f"the emulated build failed:\n{done.stderr.strip()}")
    return lib


def use_library(attention_op, path: Path) -> None:
    """Points the runtime's loader (and so the tests' sessions) at `path`."""
    attention_op.library_path = lambda: path
    attention_op.load_error.cache_clear()


def cases(count: int, seed: int):
    """Random calls as test_attention_op's property test draws them (tests/attention_calls.py), widened: head
    sizes 16-256, softcap, packed inputs, caches filled up to the whole context."""
    from tests import attention_calls as t

    rng = np.random.default_rng(seed)
    for _ in range(count):
        batch, rows = int(rng.integers(1, 5)), int(rng.integers(1, 33))
        head_dim = int(rng.choice(HEAD_DIMS))
        past = [int(rng.integers(0, t.CONTEXT - rows + 1)) for _ in range(batch)]
        tree = bool(rng.integers(2))
        positions = np.array([[p + (int(rng.integers(0, i + 1)) if tree else i) for i in range(rows)] for p in past])
        window = [None, 7, 50][int(rng.integers(3))]
        masked = float(rng.choice([0.0, 0.3, 0.7]))
        bias = t.window_bias(positions, past, max(past) + rows, window, rng, masked)
        call = t.Call(rng, head_dim, past, rows, positions=positions, bias=bias)
        packed, softcap = bool(rng.integers(2)), float(rng.choice([0.0, 5.0]))
        desc = (f"batch {batch}, rows {rows}, head_dim {head_dim}, past {past}, {'tree' if tree else 'chain'},"
                f" window {window}, masked {masked}, softcap {softcap}, {'packed' if packed else 'q, k, v'}")
        yield call, desc, packed, softcap


def run_sweep(attention_op, lib: Path, isa: str, count: int, seed: int) -> list[tuple[np.ndarray, str]]:
    """Per case: its attention output and a digest of all three outputs, from `lib` on path `isa`."""
    from tests import attention_calls as t

    use_library(attention_op, lib)
    t.op_session.cache_clear()  # sessions hold the library they were opened with
    results = []
    for call, _, packed, softcap in cases(count, seed):
        outs = call.run(t.op_session(call.head_dim, packed, softcap=softcap, isa=isa), packed)
        results.append((outs[0], hashlib.sha256(b"".join(o.tobytes() for o in outs)).hexdigest()))
    t.op_session.cache_clear()
    return results


def matmul_cases(count: int, seed: int):
    """Random RowInvariantMatMulNBits calls: SmolLM2's shapes and ragged ones, int4 and int8, each block size,
    either zero-point form, 1-16 rows, gated (halves of whole tiles or sharing one) or not, 1 or 2 threads."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        if rng.integers(2):
            k, n = SMOLLM2[int(rng.integers(len(SMOLLM2)))]
        else:
            k, n = int(rng.integers(1, 700)), int(rng.integers(1, 300))
        bits, block = int(rng.choice([4, 8])), int(rng.choice(BLOCKS))
        symmetric, gated = bool(rng.integers(2)), bool(rng.integers(2))
        if gated:
            n += n % 2
        rows, threads = int(rng.integers(1, 17)), int(rng.integers(1, 3))
        spread = float(rng.choice([1.0, 3.0, 30.0]))  # 30: gates past the SiLU's exp clamps
        a = (rng.standard_normal((rows, k)) * spread).astype(np.float32)
        desc = (f"K {k}, N {n}, int{bits}, block {block}, {'symmetric' if symmetric else 'zero points'},"
                f" {'gated' if gated else 'plain'}, {rows} rows, {threads} thread{'s' if threads > 1 else ''}")
        yield (k, n, bits, block, symmetric, seed + i), gated, threads, a, desc


def run_matmul_sweep(attention_op, paths: dict[str, tuple[Path, str]], count: int, seed: int):
    """Per case, per named (library, path): the operator's output."""
    from tests import test_matmul_op as t

    results: dict[str, list[np.ndarray]] = {name: [] for name in paths}
    for shape, gated, threads, a, _ in matmul_cases(count, seed):
        model = t.rowwise((t.gated_model if gated else t.nbits_model)(*shape)[0])
        for name, (lib, isa) in paths.items():
            use_library(attention_op, lib)
            session = t.open_model(model, threads, isa=isa or None)
            results[name].append(session.run(None, {"A": a})[0])
    return results


def check_matmul(attention_op, lib: Path, installed: Path | None, count: int, seed: int) -> bool:
    """The matmul sweep; prints a line per path the emulated AVX-512 one is held against, True when all agree."""
    paths = {"avx512vnni": (lib, ""), "emulated library, avx2": (lib, "avx2"),
             "emulated library, portable": (lib, "portable")}
    if installed:
        paths[f"installed library ({installed.name}), its default path"] = (installed, "")
        paths[f"installed library ({installed.name}), portable"] = (installed, "portable")
    results = run_matmul_sweep(attention_op, paths, count, seed)
    descs = [desc for *_, desc in matmul_cases(count, seed)]
    wide = results.pop("avx512vnni")
    failed = False
    for name, outs in results.items():
        bad = [i for i, (got, want) in enumerate(zip(outs, wide, strict=True))
               if not np.array_equal(got.view(np.int32), want.view(np.int32))]  # the same model: the same shape
        print(f"matmul avx512vnni against {name}: {count - len(bad)}/{count} cases bit-identical")
        for i in bad[:5]:
            got, want = outs[i], wide[i]
            print(f"  case {i} ({descs[i]}): {int((got.view(np.int32) != want.view(np.int32)).sum())} of"
                  f" {want.size} output values differ, largest by {np.abs(got - want).max():.3g}")
        failed |= bool(bad)
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=300, help="random calls in the sweep")
    parser.add_argument("--matmul-cases", type=int, default=80, help="random calls in the matmul's sweep")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--simde", help="directory holding SIMDe's simde/ headers (default: fetch libsimde-dev)")
    args = parser.parse_args()
    if args.cases < 1 or args.matmul_cases < 1:
        raise Refused("--cases and --matmul-cases must be at least 1")
    sys.path.insert(0, str(ROOT))  # tests/ is a package of the checkout, not of the install
    import pytest
    from specexport.runtime import attention_op

    installed = attention_op.library_path() if attention_op.available() else None
    lib = build(simde_headers(args.simde))
    use_library(attention_op, lib)
    if (attention_op.isa(), attention_op.matmul_isa()) != ("avx512", "avx512vnni"):
        raise Refused(f"the emulated build reports the {attention_op.isa()} attention and {attention_op.matmul_isa()}"
                      " matmul paths, not avx512 and avx512vnni")
    print(f"built {lib.relative_to(ROOT)}: attention path {attention_op.isa()},"
          f" matmul path {attention_op.matmul_isa()}")

    failed = pytest.main(["-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "test_attention_op.py"),
                          str(ROOT / "tests" / "test_matmul_op.py")]) != 0

    wide = run_sweep(attention_op, lib, "", args.cases, args.seed)
    others = {"emulated library, avx2": (lib, "avx2"), "emulated library, portable": (lib, "portable")}
    if installed:
        others[f"installed library ({installed.name}), portable"] = (installed, "portable")
    descs = [desc for _, desc, _, _ in cases(args.cases, args.seed)]
    for name, (path, isa) in others.items():
        bad = [(i, got, want) for i, (got, want) in enumerate(zip(run_sweep(attention_op, path, isa, args.cases,
                                                                            args.seed), wide, strict=True))
               if got[1] != want[1]]
        print(f"attention avx512 against {name}: {args.cases - len(bad)}/{args.cases} cases bit-identical")
        for i, (out, _), (want, _) in bad[:5]:
            diff = np.flatnonzero(out.view(np.int32) != want.view(np.int32))
            where = (f"{diff.size} output values differ, largest by {np.abs(out - want).max():.3g}" if diff.size
                     else "the present caches differ")
            print(f"  case {i} ({descs[i]}): {where}")
        failed |= bool(bad)
    failed |= check_matmul(attention_op, lib, installed, args.matmul_cases, args.seed)
    print("FAIL" if failed else "OK: the emulated AVX-512 paths give the portable bits")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
