"""`run_doctor`: the probes, then the checks of the tiny random Llama and of a given bundle on every backend,
then doctor.json and doctor.md. What cannot run here is skipped with the reason; on a machine with a GPU, a
GPU check that a version problem blocks fails with that problem's sentence instead, since there it is
something to fix."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.errors import SpecExportError
from .attention_op import probe_attention_op
from .checks import (
    CPU,
    MODES,
    ORT_CUDA,
    PASSED,
    PROMPTS,
    TENSORRT,
    Check,
    CheckFailed,
    Runner,
    Skip,
    build_bundle_engines,
    check_identity,
    decode,
    device_target,
    mode_blockers,
    open_session,
)
from .probes import BAD, NA, OK, Probe, System, probe_all
from .report import build_report, write_report

if TYPE_CHECKING:
    from ..runtime.manifest import Manifest

GPU_BACKENDS = (TENSORRT, ORT_CUDA)
TINY_CONTEXT = 256
TINY_EXIT_LAYER = 2
HOST_TARGET = "orin-nano"  # without a GPU the tiny model is planned (and op-checked) for JetPack 6
RUN, SKIP, FAIL = "run", "skip", "fail"


@dataclass
class GpuPath:
    state: str  # run | skip (no GPU here) | fail (a GPU, but a version problem blocks this path)
    reason: str = ""


def gpu_present(probes: dict[str, Probe]) -> bool:
    return (probes["driver"].verdict == OK or probes["jetpack"].verdict != NA
            or bool((probes["cuda"].details or {}).get("device")))


def gpu_paths(probes: list[Probe]) -> dict[str, GpuPath]:
    """Whether each GPU backend can be checked here, from the probes' verdicts."""
    by = {p.name: p for p in probes}
    needs = {TENSORRT: ("driver", "jetpack", "cuda", "tensorrt", "cuda-python"), ORT_CUDA: ("driver", "onnxruntime")}
    present = gpu_present(by)
    out = {}
    for backend, names in needs.items():
        bad = next((by[n] for n in names if by[n].verdict in BAD), None)
        if bad is None:
            out[backend] = GpuPath(RUN)
        elif not present:
            out[backend] = GpuPath(SKIP, f"no NVIDIA GPU here: {by['driver'].why}")
        else:
            out[backend] = GpuPath(FAIL, f"{bad.name} {bad.verdict}: {bad.why}")
    return out


def _what(mode: str, backend: str) -> str:
    if backend == CPU:
        return "AR on ONNX Runtime CPU: the reference" if mode == "ar" else f"{mode}: the CPU's AR tokens on the CPU"
    return f"{mode} on {backend}: the CPU runtime's AR tokens"


def subject_checks(runner: Runner, subject: str, bundle: Path, paths: dict[str, GpuPath],
                   backends: Sequence[str], prompts: Sequence[str], max_new_tokens: int, any_device: bool) -> dict:
    """Every check of one bundle: the CPU reference and modes, the TensorRT operator check when it has a plan,
    then per GPU backend its engines (TensorRT) and every mode against the CPU reference."""
    from ..runtime.bundle import read_manifest

    info: dict = {"bundle": str(bundle)}
    manifest: Manifest | None = None

    def read() -> dict:
        nonlocal manifest
        manifest = read_manifest(bundle)
        return {"schema_version": manifest.schema_version, "pieces": list(manifest.pieces),
                "flavour": manifest.graph.flavour, "precision": manifest.graph.precision,
                "tensorrt_target": (manifest.tensorrt.target or {}).get("name")}

    runner.run(f"{subject}/manifest", "the bundle's manifest reads", read)
    if manifest is None:
        for backend in (CPU, *backends):
            runner.skip(f"{subject}/{backend}", f"{subject} on {backend}", "the manifest did not read (above)",
                        gpu=backend != CPU)
        return info
    trt_plan = manifest.tensorrt.plan
    cpu = runner.run(f"{subject}/cpu/load", "open on ONNX Runtime CPU, checksums verified",
                     lambda: open_session(bundle, CPU))
    modes = list(MODES)
    reference: list[list[int]] | None = None
    if cpu is not None:
        blocked = mode_blockers(cpu)
        info["modes_not_applicable"] = blocked
        modes = [m for m in MODES if m not in blocked]

        def ar() -> dict:
            nonlocal reference
            reference = decode(cpu, "ar", prompts, max_new_tokens)
            return {"prompts": len(prompts), "new_tokens": sum(map(len, reference))}

        runner.run(f"{subject}/cpu/ar", _what("ar", CPU), ar)
        for mode in modes[1:]:
            if reference is None:
                runner.skip(f"{subject}/cpu/{mode}", _what(mode, CPU), "no CPU reference: AR did not run")
                continue
            runner.run(f"{subject}/cpu/{mode}", _what(mode, CPU),
                       lambda m=mode: check_identity(cpu, m, prompts, reference, max_new_tokens))
        del cpu
    if trt_plan and subject != "tiny":  # the tiny bundle's build ran the operator check already
        runner.run(f"{subject}/cpu/opcheck", "every node against the plan's TensorRT operator matrix",
                   lambda: opcheck(bundle, manifest))
    for backend in backends:
        engines_what = "build (or keep) one TensorRT engine per piece on this GPU"
        named = ([(f"{subject}/{backend}/engines", engines_what)] if backend == TENSORRT else [])
        named += [(f"{subject}/{backend}/load", f"open on {backend}")]
        named += [(f"{subject}/{backend}/{m}", _what(m, backend)) for m in modes]
        path = paths[backend]
        why_not = None
        if backend == TENSORRT and not trt_plan:
            why_not = (f"bundle {bundle} has no TensorRT plan (its pieces are the {manifest.graph.flavour}"
                       " flavour); make one with `specexport build --backend tensorrt --target NAME --plan-only`")
        elif path.state != RUN:
            why_not = path.reason
        elif reference is None:
            why_not = "no CPU reference to compare with: the CPU checks of this bundle did not pass"
        if why_not:
            for name, what in named:
                if path.state == FAIL and why_not == path.reason:
                    runner.run(name, what, lambda w=why_not: _raise(w), gpu=True)
                else:
                    runner.skip(name, what, why_not, gpu=True)
            continue
        if backend == TENSORRT:
            runner.run(named[0][0], engines_what, lambda: build_bundle_engines(bundle, any_device=any_device),
                       gpu=True)
        session = runner.run(f"{subject}/{backend}/load", f"open on {backend}",
                             lambda b=backend: open_session(bundle, b), gpu=True)
        backend_ar = None  # this backend's own AR tokens, once its ar check ran ("ar" comes first in MODES)
        for mode in modes:
            name = f"{subject}/{backend}/{mode}"
            if session is None:
                runner.skip(name, _what(mode, backend), f"the bundle did not open on {backend}", gpu=True)
                continue
            runner.run(name, _what(mode, backend), lambda m=mode, b=backend, s=session, own=backend_ar:
                       check_identity(s, m, prompts, reference, max_new_tokens, b, own), gpu=True)
            if mode == "ar":
                last = runner.checks[-1]
                backend_ar = reference if last.status == PASSED else last.details.get("tokens")
        del session
    return info


def _raise(message: str) -> None:
    raise CheckFailed(message)


def opcheck(bundle: Path, manifest: Manifest) -> dict:
    try:
        from ..exporter.tensorrt.opcheck import check_pieces
        from ..exporter.tensorrt.targets import load_target
    except ImportError as exc:
        raise Skip(f"the operator check needs onnx ({exc.name} is missing): pip install onnx") from None
    name = (manifest.tensorrt.target or {}).get("name")
    try:
        target = load_target(name)
    except SpecExportError as exc:
        raise Skip(f"the plan's target {name!r} is not one doctor knows ({exc})") from None
    report = check_pieces(bundle, manifest.pieces, target)
    report.raise_if_failed()
    return {"target": name, **report.summary()}


def tiny_bundle(work: Path, paths: dict[str, GpuPath], probes: list[Probe]) -> dict:
    """The tiny random Llama (with a noisy drafter and an untrained adapter, so every mode has its pieces),
    exported as fp16 pieces for TensorRT: the operator check and parity with PyTorch run inside the build,
    and the plan is for this GPU when TensorRT can run here, else for the JetPack 6 target."""
    from .tiny import make_noisy_drafter, make_tiny_checkpoint, require_export_extra

    try:
        require_export_extra()
    except SpecExportError as exc:  # a runtime-only install (a Jetson's, often): the rest still runs
        raise Skip(str(exc)) from None
    from ..exporter.build import build_bundle

    work.mkdir(parents=True, exist_ok=True)
    ckpt = make_tiny_checkpoint(work / "tiny-llama")
    drafter = make_noisy_drafter(ckpt, work / "tiny-drafter")
    target = HOST_TARGET
    if paths[TENSORRT].state == RUN:
        by = {p.name: p for p in probes}
        device = by["cuda"].details["device"]
        target = str(device_target(work / "this-gpu.toml", by["tensorrt"].version, device["compute_capability"],
                                   TINY_CONTEXT))
    out = work / "tiny-bundle"
    build_bundle(out, model=str(ckpt), drafter=str(drafter), adapter="untrained", exit_layer=TINY_EXIT_LAYER,
                 context=TINY_CONTEXT, backend="tensorrt", target=target, plan_only=True, force=True,
                 command="specexport doctor")
    return {"bundle": str(out), "target": Path(target).stem if target.endswith(".toml") else target}


def run_doctor(out: Path, bundle: Path | None = None, tiny: bool = True, backends: Sequence[str] = GPU_BACKENDS,
               prompts: Sequence[str] = PROMPTS, max_new_tokens: int = 32, system: System | None = None,
               on_check: Callable[[Check], None] | None = None, command: str = "specexport doctor") -> dict:
    """Probe, check, and write ``out``/doctor.json and ``out``/doctor.md; returns the report (its
    ``exit_code``: 0 all passed, 1 a check failed, 3 all that ran passed but some could not run here)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    probes = [*probe_all(system), probe_attention_op()]
    paths = gpu_paths(probes)
    runner = Runner(on_check)
    subjects: dict[str, dict] = {}
    if tiny:
        built = runner.run("tiny/cpu/export", "tiny random Llama: fp16 pieces for TensorRT, operator check, parity"
                           " with PyTorch, build plan", lambda: tiny_bundle(out / "work", paths, probes))
        if built is not None:
            subjects["tiny"] = subject_checks(runner, "tiny", Path(built["bundle"]), paths, backends, prompts,
                                              min(max_new_tokens, 24), any_device=True)
        else:
            for backend in backends:
                runner.skip(f"tiny/{backend}", f"the tiny model on {backend}", "the tiny bundle was not built"
                            f" ({runner.checks[0].reason})", gpu=True)
    if bundle is not None:
        subjects["bundle"] = subject_checks(runner, "bundle", Path(bundle), paths, backends, prompts, max_new_tokens,
                                            any_device=False)
    report = build_report(probes, runner.checks, {b: vars(paths[b]) for b in backends}, subjects, command)
    write_report(out, report)
    return report

