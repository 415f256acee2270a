"""What a benchmark figure depends on besides the code: the machine (on a Jetson its power mode and clocks),
its load, the package versions, the thread count; and the peak memory of one `specexport generate` run."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("specexport", "numpy", "onnxruntime", "tokenizers", "torch", "transformers", "onnxruntime-genai",
            "matplotlib")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """$OMP_NUM_THREADS when set (how one keeps a run off a busy machine's other cores), else every core.
    The bench gives this one number to every system, so none wins by using more cores than another."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        n = 0
    return n if n > 0 else usable_cores()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# A Jetson's power mode and clocks set its speed more than anything else; both tools live in /usr/sbin or /usr/bin,
# which a user's PATH may lack.
JETSON_TOOLS = (("nvpmodel", "-q"), ("jetson_clocks", "--show"))


def jetson_power(path: str | None = None) -> dict | None:
    """On a Jetson, what `nvpmodel -q` and `jetson_clocks --show` print (or why they failed: the clocks need
    root); None where neither tool exists. ``path``: where to look instead of $PATH, /usr/sbin and /usr/bin."""
    search = path or os.pathsep.join(filter(None, [os.environ.get("PATH"), "/usr/sbin", "/usr/bin"]))
    out = {}
    for tool, arg in JETSON_TOOLS:
        exe = shutil.which(tool, path=search)
        if exe is None:
            continue
        try:
            r = subprocess.run([exe, arg], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            out[tool] = f"failed: {exc}"
            continue
        text = (r.stdout.strip() or r.stderr.strip())[-4000:]
        out[tool] = text if r.returncode == 0 else f"exit {r.returncode}: {text}"
    return out or None


def machine_info() -> dict:
    info = {"cpu_model": cpu_model(), "cores": usable_cores(), "platform": platform.platform(),
            "python": platform.python_version()}
    power = jetson_power()
    if power is not None:
        info["jetson_power"] = power
    return info


def versions() -> dict:
    out: dict[str, str | None] = {}
    for dist in PACKAGES:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir()
               if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt", ".pth"))


# A small launcher whose only child is `specexport generate`. Linux keeps a process's peak RSS across exec,
# so a child forked straight from the bench (gigabytes of baselines loaded) would report the bench's own
# peak; getrusage(RUSAGE_CHILDREN) of this ~10 MB launcher is the generate process's alone.
_PROBE = (
    "import json, resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
    "err = r.stderr.decode(errors='replace').strip().splitlines()\n"
    "print(json.dumps({'exit_code': r.returncode, 'ru_maxrss': resource.getrusage(resource.RUSAGE_CHILDREN)"
    ".ru_maxrss, 'stderr_tail': err[-1] if err else ''}))\n"
)


def measure_memory(bundle: Path, prompt: str, max_new_tokens: int, checkpoint: Path | None,
                   threads: int | None = None, mode: str = "auto") -> dict:
    """Peak resident memory of one `specexport generate` run in a fresh process, against the fp32 weights
    on disk (the source checkpoint's weight files) and the bundle's files."""
    bundle = Path(bundle)
    args = ["generate", "--bundle", str(bundle), "--max-new-tokens", str(max_new_tokens), "--mode", mode,
            *(["--threads", str(threads)] if threads else []), "--json"]
    cmd = [sys.executable, "-m", "specexport.cli.main", *args, prompt]
    t0 = time.perf_counter()
    probe = subprocess.run([sys.executable, "-c", _PROBE, *cmd], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    try:
        got = json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        got = {"exit_code": probe.returncode, "ru_maxrss": 0, "stderr_tail": probe.stderr.strip()[-200:]}
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    bundle_bytes = sum(p.stat().st_size for p in bundle.iterdir() if p.is_file())
    weights = weights_bytes(checkpoint) if checkpoint and checkpoint.is_dir() else 0
    peak = got["ru_maxrss"] * scale if got["exit_code"] == 0 else None
    out = {
        "command": " ".join(["specexport", *args, json.dumps(prompt[:40] + "…")]),
        "mode": mode, "exit_code": got["exit_code"], "seconds": seconds, "peak_rss_bytes": peak,
        "weights_fp32_bytes": weights or None, "weights_source": str(checkpoint) if weights else None,
        "bundle_bytes": bundle_bytes,
        "ratio": peak / weights if peak and weights else None,
        "ratio_to_bundle": peak / bundle_bytes if peak and bundle_bytes else None,
    }
    if got["exit_code"] != 0:
        out["error"] = got["stderr_tail"] or f"exit {got['exit_code']}"
    return out
