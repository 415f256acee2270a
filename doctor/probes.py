"""Version probes: each reports what it found and a verdict (ok, missing, too old, incompatible; warning for
what runs but measures badly; n/a where the thing does not apply), with the sentence why.

A `System` reads the machine (commands, files, installed distributions, the tensorrt / cuda-python /
onnxruntime modules); the verdicts are computed from what it returns, so a test double of `System` shows
the verdicts of machines this project does not have (TensorRT 8.6, cuda-python 13 on JetPack 6, both
ONNX Runtime packages). The facts behind the rules (which versions each device ships, what each needs) are in
docs/tensorrt-jetson.md.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field

OK, MISSING, TOO_OLD, INCOMPATIBLE, WARNING, NA = "ok", "missing", "too old", "incompatible", "warning", "n/a"
VERDICTS = (OK, MISSING, TOO_OLD, INCOMPATIBLE, WARNING, NA)
BAD = (MISSING, TOO_OLD, INCOMPATIBLE)

TENSORRT_MIN = (10, 3)  # JetPack 6.1's; 8.6 (JetPack 6.0) lacks strongly typed networks and the v3 API
CUDA_PYTHON_MIN = (12, 9, 2)  # 12.9.1 releases the GIL in stream syncs, 12.9.2 sets up its symbols thread-safely
CUDA13_DRIVER_MIN = 580  # cuda-python 13 (CUDA 13) needs this driver; JetPack 6 ships 540
# what the tensorrt and jetson-jp6 / jetson-jp7 extras pin (pyproject.toml)
CUDA_PYTHON_PIN = {6: "cuda-python>=12.9.2,<13", 7: "cuda-python>=13.0.1,<14"}

# L4T (Jetson Linux) release -> JetPack: (major, minor, first revision) -> JetPack, newest first per line
L4T_JETPACK = [
    ((38, 4, 0), "7.1"), ((38, 2, 0), "7.0"),
    ((36, 4, 4), "6.2.1"), ((36, 4, 3), "6.2"), ((36, 4, 0), "6.1"), ((36, 3, 0), "6.0"), ((36, 2, 0), "6.0 DP"),
    ((35, 6, 0), "5.1.4"), ((35, 5, 0), "5.1.3"), ((35, 4, 1), "5.1.2"), ((35, 3, 1), "5.1.1"), ((35, 2, 1), "5.1"),
    ((35, 1, 0), "5.0.2"),
]


def version_key(text: str | None) -> tuple[int, ...]:
    """'10.3.0.30' -> (10, 3, 0, 30); '12.9.2.post1' -> (12, 9, 2); None or '' -> ()."""
    parts = []
    for p in str(text or "").split("."):
        digits = re.match(r"\d+", p)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


@dataclass
class Probe:
    name: str
    version: str | None
    verdict: str
    why: str
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class System:
    """The machine as the probes see it. Every method returns None (or an error string) for what is absent;
    none raises."""

    def run(self, args: list[str], timeout: float = 20.0) -> tuple[int, str] | None:
        """(exit code, stdout + stderr) of a command, None when it is not installed."""
        if shutil.which(args[0]) is None:
            return None
        try:
            r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 1, str(exc)
        return r.returncode, (r.stdout + r.stderr).strip()

    def read(self, path: str) -> str | None:
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def dist_version(self, name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    def tensorrt(self) -> dict:
        """{'version': ...} or {'error': sentence}; {'placeholder': True} for PyPI's stub package."""
        try:
            import tensorrt as trt
        except Exception as exc:  # an ImportError, or a broken install's OSError from its libraries
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"version": str(getattr(trt, "__version__", "")),
                "placeholder": not (hasattr(trt, "Builder") and hasattr(trt, "Runtime"))}

    def cuda(self) -> dict:
        """cuda-python's view: {'runtime': int, 'driver': int, 'device': {...}} with 'error' for what failed."""
        from ..runtime.backends.tensorrt import cuda_runtime, device_info
        from ..runtime.errors import SpecExportError

        try:
            cudart = cuda_runtime()
        except SpecExportError as exc:
            return {"import_error": str(exc)}
        out: dict = {}
        for key, call in (("runtime", "cudaRuntimeGetVersion"), ("driver", "cudaDriverGetVersion")):
            try:
                err, value = getattr(cudart, call)()
                if int(err) == 0:
                    out[key] = int(value)
                else:
                    out[f"{key}_error"] = str(err)
            except Exception as exc:
                out[f"{key}_error"] = f"{type(exc).__name__}: {exc}"
        try:
            out["device"] = device_info(cudart)
        except SpecExportError as exc:
            out["device_error"] = str(exc)
        except Exception as exc:
            out["device_error"] = f"{type(exc).__name__}: {exc}"
        return out

    def onnxruntime(self) -> dict:
        try:
            import onnxruntime as ort
        except Exception as exc:  # Jetson AI Lab's jp6 wheel fails this way under numpy 2
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"version": ort.__version__, "providers": list(ort.get_available_providers()),
                "device": ort.get_device()}


def _cuda_text(v: int | None) -> str | None:
    return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"


def probe_driver(system: System) -> Probe:
    smi = system.run(["nvidia-smi", "--query-gpu=driver_version,name,compute_cap", "--format=csv,noheader"])
    first = [p.strip() for p in smi[1].splitlines()[0].split(",")] if smi is not None and smi[0] == 0 and smi[1] else []
    # Jetson's nvidia-smi may answer N/A for these fields: then /proc has the driver's version
    if first and re.fullmatch(r"\d+(\.\d+)+", first[0]):
        version, details = first[0], {"source": "nvidia-smi", "gpu": first[1] if len(first) > 1 else None,
                                      "compute_capability": first[2] if len(first) > 2 else None}
        return Probe("driver", version, OK, f"NVIDIA driver {version} ({details['gpu']})", details)
    text = system.read("/proc/driver/nvidia/version")
    if text:
        m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", text)
        if m:
            return Probe("driver", m.group(1), OK, f"NVIDIA driver {m.group(1)} (/proc/driver/nvidia/version)",
                         {"source": "/proc/driver/nvidia/version"})
    why = ("no NVIDIA driver found (no nvidia-smi, no /proc/driver/nvidia/version), so no GPU check can run here"
           if smi is None else f"nvidia-smi found no GPU ({(smi[1] or 'exit ' + str(smi[0])).splitlines()[0]})"
           " and there is no /proc/driver/nvidia/version")
    return Probe("driver", None, MISSING, why)


def jetpack_of(l4t: tuple[int, ...]) -> str | None:
    for key, jetpack in L4T_JETPACK:
        if l4t[:2] == key[:2] and l4t[2:3] >= key[2:3]:
            return jetpack
    return None


def probe_jetpack(system: System) -> Probe:
    text = system.read("/etc/nv_tegra_release")
    if not text:
        return Probe("jetpack", None, NA, "not a Jetson (no /etc/nv_tegra_release)")
    m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)(?:\.(\d+))?", text)
    if not m:
        return Probe("jetpack", None, WARNING, "/etc/nv_tegra_release is not in the expected form:"
                     f" {text.strip()[:80]}")
    l4t = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    l4t_text = ".".join(map(str, l4t))
    jetpack = jetpack_of(l4t)
    details = {"l4t": l4t_text, "jetpack": jetpack}
    if jetpack is None:
        return Probe("jetpack", None, WARNING, f"L4T {l4t_text} is not in doctor's table of JetPack releases; the"
                     " other verdicts still hold", details)
    label = f"JetPack {jetpack} (L4T {l4t_text})"
    if l4t[0] < 36 or l4t[:2] <= (36, 3):
        return Probe("jetpack", jetpack, TOO_OLD, f"{label} ships TensorRT 8.x; specexport's engines need TensorRT"
                     " 10.3 or later: upgrade to JetPack 6.1 or later (Orin) or 7 (Thor)", details)
    return Probe("jetpack", jetpack, OK, label, details)


def jetpack_major(jetpack: Probe) -> int | None:
    key = version_key(jetpack.version)
    return key[0] if key else None


def probe_cuda(system: System, info: dict) -> Probe:
    if "import_error" in info:
        return Probe("cuda", None, MISSING, "cuda-python is not importable, so the CUDA runtime cannot be queried"
                     " (install cuda-python: see its row)")
    runtime, driver = info.get("runtime"), info.get("driver")
    details = {"runtime": _cuda_text(runtime), "driver_supports": _cuda_text(driver), "device": info.get("device")}
    if runtime is None:
        return Probe("cuda", None, INCOMPATIBLE, f"cudaRuntimeGetVersion failed ({info.get('runtime_error')});"
                     " the CUDA runtime that cuda-python loads does not work here", details)
    text = _cuda_text(runtime)
    if runtime < 12000:
        return Probe("cuda", text, TOO_OLD, f"CUDA {text} is older than 12, which TensorRT 10.3 and cuda-python"
                     " 12.9 need", details)
    if driver is not None and driver < runtime and driver // 1000 != runtime // 1000:
        return Probe("cuda", text, INCOMPATIBLE, f"the driver supports CUDA {_cuda_text(driver)}, a major version"
                     f" older than the CUDA {text} runtime cuda-python brings; install the cuda-python of the"
                     f" driver's CUDA ({_cuda_text(driver)})", details)
    if "device_error" in info:
        return Probe("cuda", text, MISSING, f"CUDA {text}, but {info['device_error'].split(';')[0]}", details)
    dev = info["device"]
    return Probe("cuda", text, OK, f"CUDA {text} runtime, driver supports {_cuda_text(driver) or '?'};"
                 f" {dev['name']} (compute capability {dev['compute_capability']})", details)


def probe_tensorrt(system: System) -> Probe:
    got = system.tensorrt()
    if "error" in got:
        return Probe("tensorrt", None, MISSING, "TensorRT's Python bindings are not importable (on Jetson: sudo apt"
                     " install python3-libnvinfer and a venv with --system-site-packages; on a desktop: NVIDIA's"
                     f" tensorrt wheels) [{got['error']}]")
    version = got["version"]
    if got.get("placeholder"):
        return Probe("tensorrt", version, INCOMPATIBLE, "the installed tensorrt package is PyPI's placeholder"
                     " without TensorRT's libraries; install the real bindings")
    key = version_key(version)
    if key[:2] == (8, 6):
        return Probe("tensorrt", version, TOO_OLD, f"TensorRT {version} (JetPack 6.0) is refused: specexport builds"
                     " strongly typed networks and gives the execution contexts memory it owns"
                     " (STRONGLY_TYPED, ExecutionContextAllocationStrategy), which 8.6 does not have; it needs"
                     " TensorRT 10.3 or later: upgrade to JetPack 6.1 or later")
    if key[:2] < TENSORRT_MIN:
        return Probe("tensorrt", version, TOO_OLD, f"TensorRT {version} is older than 10.3, the oldest specexport"
                     " builds for (JetPack 6.1)")
    kv = "in place (TensorScatter)" if key[:2] >= (10, 15) else "two buffers per cache (swap)"
    return Probe("tensorrt", version, OK, f"TensorRT {version}; KV caches updated {kv}")


def probe_cuda_python(system: System, driver: Probe, jetpack: Probe) -> Probe:
    version = system.dist_version("cuda-python") or system.dist_version("cuda-bindings")
    jp = jetpack_major(jetpack)
    driver_major = (version_key(driver.version)[:1] or (None,))[0]
    new_driver = driver_major is not None and driver_major >= CUDA13_DRIVER_MIN
    pin = CUDA_PYTHON_PIN.get(jp or 0, CUDA_PYTHON_PIN[7] if new_driver else CUDA_PYTHON_PIN[6])
    if version is None:
        return Probe("cuda-python", None, MISSING, f"cuda-python is not installed; the TensorRT backend talks to the"
                     f" GPU through it: pip install '{pin}'")
    key = version_key(version)
    if key[:1] >= (13,):
        if jp == 6 or (driver_major is not None and driver_major < CUDA13_DRIVER_MIN):
            on = "JetPack 6" if jp == 6 else f"driver {driver.version}"
            return Probe("cuda-python", version, INCOMPATIBLE, f"cuda-python {version} is for CUDA 13, which needs"
                         f" NVIDIA driver {CUDA13_DRIVER_MIN} or newer, and this is {on} (driver"
                         f" {driver.version or 'unknown'}): pip install '{CUDA_PYTHON_PIN[6]}'")
        return Probe("cuda-python", version, OK, f"cuda-python {version} (CUDA 13)")
    if jp is not None and jp >= 7:
        return Probe("cuda-python", version, INCOMPATIBLE, f"cuda-python {version} is for CUDA 12, and JetPack 7 has"
                     f" CUDA 13: pip install '{CUDA_PYTHON_PIN[7]}'")
    if key < CUDA_PYTHON_MIN:
        return Probe("cuda-python", version, TOO_OLD, f"cuda-python {version} is older than 12.9.2: PEARL's two CUDA"
                     " streams need cudaStreamSynchronize to release the GIL (12.9.1) and thread-safe symbol setup"
                     f" (12.9.2): pip install '{pin}'")
    return Probe("cuda-python", version, OK, f"cuda-python {version} (CUDA 12)")


def probe_onnxruntime(system: System, gpu_expected: bool) -> Probe:
    cpu, gpu = system.dist_version("onnxruntime"), system.dist_version("onnxruntime-gpu")
    got = system.onnxruntime()
    details = {"onnxruntime": cpu, "onnxruntime-gpu": gpu, "providers": got.get("providers")}
    if cpu and gpu:
        return Probe("onnxruntime", got.get("version"), INCOMPATIBLE, f"both onnxruntime {cpu} and onnxruntime-gpu"
                     f" {gpu} are installed; they share the `onnxruntime` module, so the one installed last wins and"
                     " the CUDA execution provider can vanish: pip uninstall -y onnxruntime onnxruntime-gpu, then"
                     " install onnxruntime-gpu alone", details)
    if "error" in got:
        hint = (" (a numpy 2 ABI error: Jetson AI Lab's jp6 onnxruntime-gpu wheel needs numpy<2)"
                if "numpy" in got["error"].lower() else "")
        return Probe("onnxruntime", cpu or gpu, INCOMPATIBLE if (cpu or gpu) else MISSING,
                     f"onnxruntime does not import: {got['error']}{hint}", details)
    providers = got["providers"]
    listed = ", ".join(p.removesuffix("ExecutionProvider") for p in providers)
    if "CUDAExecutionProvider" in providers:
        return Probe("onnxruntime", got["version"], OK, f"ONNX Runtime {got['version']} with {listed}", details)
    if gpu_expected:
        where = ("on Jetson from the Jetson AI Lab index for your JetPack" if gpu is None else
                 "its CUDA libraries (cuDNN, cuBLAS) must be loadable")
        return Probe("onnxruntime", got["version"], MISSING, f"ONNX Runtime {got['version']} has no CUDA execution"
                     f" provider ({listed}); for --provider CUDAExecutionProvider install onnxruntime-gpu alone"
                     f" ({where})", details)
    return Probe("onnxruntime", got["version"], OK, f"ONNX Runtime {got['version']} with {listed} (no GPU here, so"
                 " the CPU provider is all it needs)", details)


def probe_power(system: System, jetpack: Probe) -> Probe:
    if jetpack.verdict == NA:
        return Probe("power", None, NA, "not a Jetson: no nvpmodel power modes")
    q = system.run(["nvpmodel", "-q"])
    if q is None:
        return Probe("power", None, MISSING, "nvpmodel is not installed, so the power mode is unknown; timings on a"
                     " Jetson mean little without it (sudo apt install nvidia-l4t-nvpmodel)")
    m = re.search(r"NV Power Mode:\s*(.+)", q[1])
    mode = m.group(1).strip() if m else None
    clocks = system.run(["jetson_clocks", "--show"])
    pinned = None
    if clocks is not None and clocks[0] == 0:
        g = re.search(r"^GPU MinFreq=(\d+) MaxFreq=(\d+)", clocks[1], re.M)
        pinned = bool(g) and g.group(1) == g.group(2)
    details = {"nvpmodel": mode, "clocks_pinned": pinned,
               "jetson_clocks": None if clocks is None else clocks[1].splitlines()[:1]}
    notes = []
    if mode is None:
        notes.append(f"`nvpmodel -q` said {q[1].splitlines()[0] if q[1] else 'nothing'}")
    elif "MAXN" not in mode.upper():
        notes.append(f"power mode {mode} is not MAXN (list the modes in /etc/nvpmodel.conf, pick MAXN with"
                     " sudo nvpmodel -m N)")
    if pinned is None:
        notes.append("clocks unknown: `jetson_clocks --show` needs root (sudo specexport doctor, or run it yourself)")
    elif not pinned:
        notes.append("clocks are not pinned: sudo jetson_clocks")
    if notes:
        return Probe("power", mode, WARNING, "; ".join(notes) + "; timings will not show what the device can do",
                     details)
    return Probe("power", mode, OK, f"power mode {mode}, clocks pinned (jetson_clocks)", details)


def probe_all(system: System | None = None) -> list[Probe]:
    """Every probe, in the order doctor.md lists them."""
    system = system or System()
    driver = probe_driver(system)
    jetpack = probe_jetpack(system)
    cuda_info = system.cuda()
    cuda = probe_cuda(system, cuda_info)
    gpu_expected = driver.verdict == OK or jetpack.verdict != NA or "device" in cuda_info
    return [driver, cuda, probe_tensorrt(system), probe_cuda_python(system, driver, jetpack),
            probe_onnxruntime(system, gpu_expected), jetpack, probe_power(system, jetpack)]
