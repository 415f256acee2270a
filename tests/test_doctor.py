"""`specexport doctor` on this machine (no GPU: the CPU checks pass, every GPU check is skipped with its reason,
exit 3), a check that fails (exit 1), and the version verdicts of machines this project does not have, shown
through a test double of the machine (`SystemDouble`): TensorRT 8.6, cuda-python 13 on JetPack 6, both ONNX
Runtime packages. None of this is GPU verification: the doubles only say what the verdicts would be."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from specexport.cli.main import main
from specexport.doctor import checks, probes
from specexport.doctor.report import EXIT_FAILED, EXIT_SKIPPED, exit_code
from specexport.doctor.run import FAIL, RUN, SKIP, gpu_paths, run_doctor


def _no_gpu_here() -> None:
    by = {p.name: p for p in probes.probe_all()}
    if by["driver"].verdict == probes.OK or by["jetpack"].verdict != probes.NA:
        pytest.skip("this machine has an NVIDIA GPU: the no-GPU exit code does not apply (tests/test_tensorrt_gpu.py)")


@pytest.fixture(scope="module")
def doctor_run(tmp_path_factory, tiny_bundles):
    """`specexport doctor` with the tiny model and a tiny ort-flavour bundle (no adapter, no drafter)."""
    _no_gpu_here()
    out = tmp_path_factory.mktemp("doctor")
    bundle = tiny_bundles("ort", 2, 256, "none")
    result = CliRunner().invoke(main, ["doctor", "--out", str(out), "--bundle", str(bundle), "--max-new-tokens", "16"])
    return result, out


def test_doctor_without_a_gpu_exits_3_with_the_gpu_checks_skipped(doctor_run):
    result, out = doctor_run
    assert result.exit_code == EXIT_SKIPPED, result.output
    report = json.loads((out / "doctor.json").read_text())
    assert report["exit_code"] == EXIT_SKIPPED
    by = {c["name"]: c for c in report["checks"]}
    for status in {c["status"] for c in report["checks"]}:
        assert status in (checks.PASSED, checks.SKIPPED)
    # the CPU checks ran and passed: the tiny model's export and every mode against AR, the bundle's modes
    for name in ["tiny/cpu/export", *(f"tiny/cpu/{m}" for m in checks.MODES), "bundle/cpu/ar", "bundle/cpu/lookup"]:
        assert by[name]["status"] == checks.PASSED, by[name]
        assert by[name]["seconds"] >= 0
    assert by["tiny/cpu/self"]["details"]["new_tokens"] == 3 * 16
    # every GPU check is named, skipped, and says why
    gpu = [c for c in report["checks"] if c["gpu"]]
    assert {f"tiny/{b}/{m}" for b in ("tensorrt", "ort-cuda") for m in checks.MODES} <= {c["name"] for c in gpu}
    assert "tiny/tensorrt/engines" in by
    for c in gpu:
        assert c["status"] == checks.SKIPPED and c["reason"], c
    assert by["tiny/tensorrt/self"]["reason"].startswith("no NVIDIA GPU here")
    assert "no TensorRT plan" in by["bundle/tensorrt/ar"]["reason"]
    # modes the bundle lacks pieces for are not checks, but are named
    assert set(report["subjects"]["bundle"]["modes_not_applicable"]) == {"self", "model", "tree", "pearl"}
    assert report["summary"]["gpu_checks_run"] == 0
    assert {p["name"] for p in report["versions"]} == {"driver", "cuda", "tensorrt", "cuda-python", "onnxruntime",
                                                       "jetpack", "power", "attention operator"}
    # the operator built with the package registers here and names its vector path
    op = next(p for p in report["versions"] if p["name"] == "attention operator")
    assert op["verdict"] == "ok" and op["version"] in ("avx512", "avx2", "portable"), op
    md = (out / "doctor.md").read_text()
    assert "**Exit 3:" in md and "| tiny/tensorrt/tree | skipped |" in md


def test_doctor_checks_a_tensorrt_bundle_without_a_gpu(doctor_run, tmp_path):
    """--bundle with a TensorRT plan (the tiny bundle the first run wrote): the operator check runs on the CPU, the
    engines and the TensorRT modes are skipped, named."""
    _, first = doctor_run
    bundle = first / "work" / "tiny-bundle"
    result = CliRunner().invoke(main, ["doctor", "--no-tiny", "--bundle", str(bundle), "--out", str(tmp_path),
                                       "--max-new-tokens", "8", "--json"])
    assert result.exit_code == EXIT_SKIPPED, result.output
    report = json.loads(result.stdout)
    by = {c["name"]: c for c in report["checks"]}
    assert by["bundle/manifest"]["details"]["tensorrt_target"] == "orin-nano"
    assert by["bundle/cpu/opcheck"]["status"] == checks.PASSED
    assert by["bundle/cpu/opcheck"]["details"]["ok"] is True
    assert all(by[f"bundle/cpu/{m}"]["status"] == checks.PASSED for m in checks.MODES)
    assert by["bundle/tensorrt/engines"]["status"] == checks.SKIPPED
    assert by["bundle/tensorrt/engines"]["reason"].startswith("no NVIDIA GPU here")
    assert not list((bundle / "tensorrt").glob("*.engine"))


def test_doctor_help_documents_the_exit_codes():
    result = CliRunner().invoke(main, ["doctor", "--help"])
    assert result.exit_code == 0
    for line in ("0  every check ran and passed", "1  a check failed", "2  usage error", "3  every check that ran"):
        assert line in result.output


@pytest.mark.parametrize("args, sentence", [
    (["--bundle", "."], "is not a bundle"),
    (["--no-tiny"], "leaves nothing to check"),
    (["--max-new-tokens", "0"], "0 is not in the range"),
    (["--out", "/proc/doctor"], "cannot be made"),
])
def test_doctor_usage_errors_exit_2(args, sentence, tmp_path):
    result = CliRunner().invoke(main, ["doctor", "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2
    assert sentence in result.output and "Traceback" not in result.output


def test_a_mode_that_parts_from_the_reference_fails(tiny_bundles, tmp_path, monkeypatch):
    """The identity check can fail: a decode that differs from AR in one token is a failed check, exit 1."""
    _no_gpu_here()
    real = checks.generations

    def one_token_off(session, mode, prompts, max_new_tokens):
        gens = real(session, mode, prompts, max_new_tokens)
        if mode == "lookup":
            gens[1].tokens[3] += 1
        return gens

    monkeypatch.setattr(checks, "generations", one_token_off)
    report = run_doctor(tmp_path, bundle=tiny_bundles("ort", 2, 256, "none"), tiny=False, max_new_tokens=8)
    by = {c["name"]: c for c in report["checks"]}
    assert by["bundle/cpu/ar"]["status"] == checks.PASSED
    assert by["bundle/cpu/lookup"]["status"] == checks.FAILED
    assert "prompt 2 parts at new token 3" in by["bundle/cpu/lookup"]["reason"]
    assert report["exit_code"] == EXIT_FAILED


def test_first_difference():
    assert checks.first_difference([[1, 2, 3]], [[1, 2, 3]]) is None
    assert "new token 1: 5 where the reference has 2" in checks.first_difference([[1, 5, 3]], [[1, 2, 3]])
    assert "new token 2: the end where the reference has 3" in checks.first_difference([[1, 2]], [[1, 2, 3]])


def test_exit_code():
    def c(status):
        return checks.Check("x", "x", status, "", 0.0, False)

    assert exit_code([c("passed")]) == 0
    assert exit_code([c("passed"), c("skipped")]) == 3
    assert exit_code([c("skipped"), c("failed")]) == 1


# -- the verdicts, through a test double of the machine -------------------------------------------------------

TEGRA = "# R{} (release), REVISION: {}, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 2025"
JETPACK_62, JETPACK_60, JETPACK_70 = TEGRA.format(36, "4.3"), TEGRA.format(36, "3.0"), TEGRA.format(38, "2.0")
PROC_540 = ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  540.4.0  Release Build  (buildbrain@mobile)"
            "  Wed Jan  8 01:44:20 PST 2025\nGCC version:  collected from gcc (Ubuntu 11.4.0) 11.4.0\n")
CLOCKS_PINNED = ("SOC family:tegra234  Machine:NVIDIA Jetson Orin Nano\n"
                 "GPU MinFreq=1020000000 MaxFreq=1020000000 CurrentFreq=1020000000")


class SystemDouble(probes.System):
    """A pretend machine for the probes (a test double: nothing here touches a GPU). Defaults: a Jetson Orin Nano
    on JetPack 6.2 with everything right."""

    def __init__(self, *, tegra=JETPACK_62, proc=PROC_540, smi=None, trt="10.3.0.30", cuda_python="12.9.2",
                 cuda_runtime=12060, cuda_driver=12060, ort_gpu="1.20.0", ort_cpu=None,
                 providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
                 nvpmodel="NV Power Mode: MAXN_SUPER\n2", clocks=CLOCKS_PINNED):
        self.files = {"/etc/nv_tegra_release": tegra, "/proc/driver/nvidia/version": proc}
        self.commands = {"nvidia-smi": smi, "nvpmodel": nvpmodel, "jetson_clocks": clocks}
        self.trt, self.cuda_python, self.cuda_versions = trt, cuda_python, (cuda_runtime, cuda_driver)
        self.ort_dists, self.providers = {"onnxruntime-gpu": ort_gpu, "onnxruntime": ort_cpu}, providers

    def run(self, args, timeout=20.0):
        out = self.commands.get(args[0])
        return None if out is None else (0, out)

    def read(self, path):
        return self.files.get(path)

    def dist_version(self, name):
        return {"cuda-python": self.cuda_python, **self.ort_dists}.get(name)

    def tensorrt(self):
        return {"error": "ModuleNotFoundError: No module named 'tensorrt'"} if self.trt is None else \
            {"version": self.trt, "placeholder": False}

    def cuda(self):
        if self.cuda_python is None:
            return {"import_error": "cuda-python is not importable"}
        runtime, driver = self.cuda_versions
        return {"runtime": runtime, "driver": driver, "device": {"name": "Orin", "compute_capability": "8.7"}}

    def onnxruntime(self):
        return {"version": "1.20.0", "providers": list(self.providers), "device": "GPU"}


def verdicts(system) -> dict[str, probes.Probe]:
    return {p.name: p for p in probes.probe_all(system)}


def test_a_well_set_up_jetpack_6_machine_is_ok():
    got = verdicts(SystemDouble(smi="[N/A], Orin (nvgpu), [N/A]"))  # Jetson's nvidia-smi: the driver is in /proc
    assert {n: p.verdict for n, p in got.items()} == dict.fromkeys(got, probes.OK)
    assert got["jetpack"].version == "6.2" and got["driver"].version == "540.4.0"
    assert got["cuda"].version == "12.6"
    assert all(p.state == RUN for p in gpu_paths(list(got.values())).values())


def test_tensorrt_8_6_is_refused():
    got = verdicts(SystemDouble(trt="8.6.2.3", tegra=JETPACK_60))
    assert got["tensorrt"].verdict == probes.TOO_OLD and "refused" in got["tensorrt"].why
    assert "10.3" in got["tensorrt"].why
    assert got["jetpack"].verdict == probes.TOO_OLD and got["jetpack"].version == "6.0"
    path = gpu_paths(list(got.values()))["tensorrt"]
    assert path.state == FAIL and "JetPack 6.0" in path.reason  # a GPU is there: a failure to fix, not a skip


def test_cuda_python_13_on_jetpack_6_is_incompatible():
    got = verdicts(SystemDouble(cuda_python="13.0.1", cuda_runtime=13000))
    p = got["cuda-python"]
    assert p.verdict == probes.INCOMPATIBLE
    assert "580" in p.why and "540.4.0" in p.why and "cuda-python>=12.9.2,<13" in p.why
    assert got["cuda"].verdict == probes.INCOMPATIBLE  # the driver's CUDA 12.6 is older than the runtime's 13.0
    assert gpu_paths(list(got.values()))["tensorrt"].state == FAIL


def test_cuda_python_before_12_9_2_is_too_old_and_12_on_jetpack_7_incompatible():
    assert verdicts(SystemDouble(cuda_python="12.6.0"))["cuda-python"].verdict == probes.TOO_OLD
    got = verdicts(SystemDouble(tegra=JETPACK_70, proc=PROC_540.replace("540.4.0", "580.00")))
    assert got["jetpack"].version == "7.0"
    assert got["cuda-python"].verdict == probes.INCOMPATIBLE and "cuda-python>=13.0.1,<14" in got["cuda-python"].why


def test_cuda_python_13_with_driver_580_on_a_desktop_is_ok():
    smi = "580.65.06, NVIDIA GeForce RTX 4090, 8.9"
    got = verdicts(SystemDouble(tegra=None, proc=None, smi=smi, trt="10.15.1.29", cuda_python="13.0.1",
                                cuda_runtime=13000, cuda_driver=13000, nvpmodel=None, clocks=None))
    assert got["driver"].version == "580.65.06" and got["driver"].details["gpu"] == "NVIDIA GeForce RTX 4090"
    assert got["cuda-python"].verdict == probes.OK
    assert got["tensorrt"].verdict == probes.OK and "in place" in got["tensorrt"].why
    assert got["jetpack"].verdict == probes.NA and got["power"].verdict == probes.NA


def test_both_onnxruntime_packages_are_a_conflict():
    got = verdicts(SystemDouble(ort_cpu="1.22.0", providers=("CPUExecutionProvider",)))
    p = got["onnxruntime"]
    assert p.verdict == probes.INCOMPATIBLE
    assert "onnxruntime 1.22.0" in p.why and "onnxruntime-gpu 1.20.0" in p.why and "uninstall" in p.why
    path = gpu_paths(list(got.values()))["ort-cuda"]
    assert path.state == FAIL and path.reason.startswith("onnxruntime incompatible")


def test_no_cuda_provider_on_a_gpu_machine_is_missing():
    got = verdicts(SystemDouble(ort_gpu=None, ort_cpu="1.22.0", providers=("CPUExecutionProvider",)))
    assert got["onnxruntime"].verdict == probes.MISSING and "onnxruntime-gpu" in got["onnxruntime"].why


def test_power_mode_not_maxn_or_clocks_not_pinned_is_a_warning():
    got = verdicts(SystemDouble(nvpmodel="NV Power Mode: 15W\n0"))
    assert got["power"].verdict == probes.WARNING and "15W" in got["power"].why
    unpinned = CLOCKS_PINNED.replace("MinFreq=1020000000", "MinFreq=306000000")
    assert "sudo jetson_clocks" in verdicts(SystemDouble(clocks=unpinned))["power"].why
    assert "needs root" in verdicts(SystemDouble(clocks=None))["power"].why


def test_no_gpu_skips_rather_than_fails():
    got = verdicts(SystemDouble(tegra=None, proc=None, trt=None, cuda_python=None, nvpmodel=None, clocks=None,
                                providers=("CPUExecutionProvider",), ort_gpu=None, ort_cpu="1.32.0"))
    assert got["driver"].verdict == probes.MISSING and got["onnxruntime"].verdict == probes.OK
    paths = gpu_paths(list(got.values()))
    assert {p.state for p in paths.values()} == {SKIP}
    assert all(p.reason.startswith("no NVIDIA GPU here") for p in paths.values())


@pytest.mark.parametrize("l4t, jetpack", [((36, 4, 0), "6.1"), ((36, 4, 3), "6.2"), ((36, 4, 4), "6.2.1"),
                                          ((36, 3, 0), "6.0"), ((35, 4, 1), "5.1.2"), ((38, 2, 0), "7.0"),
                                          ((37, 0, 0), None)])
def test_l4t_to_jetpack(l4t, jetpack):
    assert probes.jetpack_of(l4t) == jetpack


def test_the_gpu_branch_runs_every_mode_when_the_paths_are_open(doctor_run, tmp_path, monkeypatch):
    """The doctor's flow when TensorRT and ONNX Runtime CUDA can run, with test doubles: SystemDouble says a good
    desktop GPU is there, the engine build is a double, and a CPU session stands in for each GPU session. This checks
    the orchestration (engines, then load, then every mode against the CPU's AR tokens; exit 0), NOT a GPU."""
    _, first = doctor_run
    bundle = first / "work" / "tiny-bundle"
    real_open = checks.open_session
    opened = []

    def cpu_session_standing_in_for_the_gpu(path, backend):
        opened.append(backend)
        return real_open(path, checks.CPU)

    monkeypatch.setattr("specexport.doctor.run.open_session", cpu_session_standing_in_for_the_gpu)
    monkeypatch.setattr("specexport.doctor.run.build_bundle_engines",
                        lambda path, any_device: {"engines": ["shallow", "deep"], "double": True})
    desktop = SystemDouble(tegra=None, proc=None, smi="580.65.06, NVIDIA GeForce RTX 4090, 8.9", trt="10.15.1.29",
                           cuda_python="13.0.1", cuda_runtime=13000, cuda_driver=13000, nvpmodel=None, clocks=None)
    report = run_doctor(tmp_path, bundle=bundle, tiny=False, max_new_tokens=8, system=desktop)
    by = {c["name"]: c for c in report["checks"]}
    assert report["exit_code"] == 0, {n: c["reason"] for n, c in by.items() if c["status"] != "passed"}
    assert opened == ["cpu", "tensorrt", "ort-cuda"]
    for backend in ("tensorrt", "ort-cuda"):
        for mode in checks.MODES:
            assert by[f"bundle/{backend}/{mode}"]["status"] == checks.PASSED and by[f"bundle/{backend}/{mode}"]["gpu"]
    assert by["bundle/tensorrt/engines"]["details"]["double"] is True
    assert report["summary"]["gpu_checks_run"] == 1 + 2 * (1 + len(checks.MODES))


class SessionDouble:
    """Stands in for a Session: every prompt gives the same canned tokens (a test double, not a backend)."""

    def __init__(self, tokens):
        self.tokens = tokens

    def generate(self, prompt, **options):
        from types import SimpleNamespace

        return SimpleNamespace(tokens=list(self.tokens), stats=SimpleNamespace(steps=len(self.tokens)))


def test_a_gpu_mismatch_says_whether_the_mode_or_the_rounding_parts():
    cpu_ar, gpu_ar = [[1, 2, 3]], [[1, 2, 4]]
    with pytest.raises(checks.CheckFailed, match="lossless there"):
        checks.check_identity(SessionDouble([1, 2, 4]), "self", ["p"], cpu_ar, 3, checks.TENSORRT, backend_ar=gpu_ar)
    with pytest.raises(checks.CheckFailed, match="broken on TensorRT"):
        checks.check_identity(SessionDouble([1, 9, 4]), "self", ["p"], cpu_ar, 3, checks.TENSORRT, backend_ar=gpu_ar)
    assert checks.check_identity(SessionDouble([1, 2, 3]), "tree", ["p"], cpu_ar, 3, checks.TENSORRT,
                                 backend_ar=cpu_ar)["new_tokens"] == 3


def test_on_a_gpu_a_version_problem_fails_the_gpu_checks_with_its_sentence(doctor_run, tmp_path):
    """SystemDouble: a Jetson on JetPack 6.0 with TensorRT 8.6. There is a GPU, so the TensorRT checks fail (exit 1)
    with the refusal, rather than being skipped; nothing touches a GPU."""
    _, first = doctor_run
    jetpack_60 = SystemDouble(tegra=JETPACK_60, trt="8.6.2.3")
    report = run_doctor(tmp_path, bundle=first / "work" / "tiny-bundle", tiny=False, backends=["tensorrt"],
                        max_new_tokens=4, system=jetpack_60)
    by = {c["name"]: c for c in report["checks"]}
    assert report["exit_code"] == EXIT_FAILED
    assert by["bundle/cpu/self"]["status"] == checks.PASSED
    for name in ("bundle/tensorrt/engines", "bundle/tensorrt/load", "bundle/tensorrt/pearl"):
        assert by[name]["status"] == checks.FAILED
        assert by[name]["reason"].startswith("jetpack too old: JetPack 6.0 (L4T 36.3.0) ships TensorRT 8.x")
    md = (tmp_path / "doctor.md").read_text()
    assert "**tensorrt** (too old): TensorRT 8.6.2.3 (JetPack 6.0) is refused" in md
