"""The doctor's checks: each one timed, each ending passed, failed or skipped with one sentence why.

Token identity is the check that matters: greedy output of every lossless mode must be the target's own,
token for token, and the reference is the CPU runtime's autoregressive decode (ONNX Runtime CPU) of the
same bundle. On the CPU that checks the modes against AR; on TensorRT and on ONNX Runtime's CUDA provider
it checks the GPU path against the CPU, mode by mode. The functions here are what `specexport doctor`,
`tests/test_tensorrt_gpu.py` and samples/jetson run.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..runtime.errors import SpecExportError

if TYPE_CHECKING:
    from ..runtime.session import Generation, Session

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
CPU, TENSORRT, ORT_CUDA = "cpu", "tensorrt", "ort-cuda"
BACKEND_NAMES = {CPU: "ONNX Runtime CPU", TENSORRT: "TensorRT", ORT_CUDA: "ONNX Runtime CUDA"}

TREE = "4:3:2:10"  # 15 rows at most: inside every target's verify profile (verify_max 16)
# what each checked mode asks of the session (the keyword options of Session.generate)
MODE_SETTINGS: dict[str, dict[str, Any]] = {
    "ar": {"mode": "ar"},
    "self": {"mode": "self"},
    "model": {"mode": "model"},
    "lookup": {"mode": "lookup"},
    "tree": {"mode": "model", "tree": TREE},
    "pearl": {"mode": "auto", "schedule": "pearl"},
}
MODES = tuple(MODE_SETTINGS)
# the prompts repeat themselves so that prompt lookup has something to copy
PROMPTS = (
    "Explain how a hash table works.",
    "Write a haiku about the sea. Write a haiku about the sea.",
    "What is seventeen times twenty three? What is seventeen times twenty three?",
)


@dataclass
class Check:
    name: str  # subject/backend/what, such as tiny/tensorrt/self
    what: str  # one line for doctor.md
    status: str
    reason: str
    seconds: float
    gpu: bool  # needs a GPU: skipped, not failed, on a machine without one
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class Skip(Exception):
    """A check that cannot run here; its message says why."""


class CheckFailed(SpecExportError):
    """A check that ran and found something wrong; ``details`` go into doctor.json."""

    def __init__(self, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


class Runner:
    """Runs checks one after another, timing each; ``on_check`` sees every finished check (progress)."""

    def __init__(self, on_check: Callable[[Check], None] | None = None) -> None:
        self.checks: list[Check] = []
        self.on_check = on_check or (lambda c: None)

    def _add(self, check: Check) -> Check:
        self.checks.append(check)
        self.on_check(check)
        return check

    def skip(self, name: str, what: str, reason: str, gpu: bool = False) -> Check:
        return self._add(Check(name, what, SKIPPED, reason, 0.0, gpu))

    def run(self, name: str, what: str, fn: Callable[[], Any], gpu: bool = False) -> Any:
        """fn's result when it passes (its dict result is the check's details), else None."""
        t0 = time.perf_counter()
        result, details = None, {}
        try:
            result = fn()
            status, reason = PASSED, ""
            if isinstance(result, dict):
                details = result
        except Skip as exc:
            status, reason = SKIPPED, str(exc)
        except CheckFailed as exc:
            status, reason, details = FAILED, str(exc), exc.details
        except SpecExportError as exc:
            status, reason = FAILED, str(exc)
        except Exception as exc:  # a check must report, never end the doctor
            status, reason = FAILED, f"unexpected {type(exc).__name__}: {exc}"
        self._add(Check(name, what, status, reason, round(time.perf_counter() - t0, 3), gpu, details))
        return result if status == PASSED else None


# -- what a bundle can run ---------------------------------------------------------------------------

def mode_blockers(session: Session) -> dict[str, str]:
    """Checked modes this session cannot run -> why, in the runtime's own sentence (its plan refuses them:
    runtime/plan.py), such as `self` on a bundle without an adapter."""
    out = {}
    for name, settings in MODE_SETTINGS.items():
        try:
            session.options(**settings)
        except SpecExportError as exc:
            out[name] = str(exc)
    return out


# -- sessions and decoding -----------------------------------------------------------------------------

def open_session(bundle: Path, backend: str) -> Session:
    """The bundle on ``backend``: cpu (ONNX Runtime CPU), tensorrt (its engines) or ort-cuda (ONNX Runtime's
    CUDA provider, every piece on the device or one sentence naming the one that is not)."""
    from ..runtime.pearl import pearl_threads
    from ..runtime.session import load

    # a thread pool per piece, so that PEARL's drafter and `deep` really run side by side
    threads = pearl_threads(os.cpu_count() or 1)
    if backend == CPU:
        return load(bundle, threads=threads)
    if backend == TENSORRT:
        return load(bundle, backend="tensorrt")
    if backend == ORT_CUDA:
        session = load(bundle, providers=["CUDAExecutionProvider", "CPUExecutionProvider"], threads=threads)
        p = session.pieces
        off = [name for name in ("shallow", "deep", "adapter", "drafter")
               if getattr(p, name) is not None and getattr(getattr(p, name), "device", None) != "cuda"]
        if off:
            raise CheckFailed(f"ONNX Runtime put piece {off[0]!r} on the CPU, not the CUDA execution provider"
                              " (it falls back when the provider cannot load: CUDA, cuDNN or cuBLAS libraries"
                              " missing or of another major version)")
        return session
    raise SpecExportError(f"unknown backend {backend!r}; use one of {', '.join(BACKEND_NAMES)}")


def generations(session: Session, mode: str, prompts: Sequence[str], max_new_tokens: int) -> list[Generation]:
    """Greedy `Generation`s of ``mode``, one per prompt (the chat template applied, as `specexport generate`
    does)."""
    return [session.generate(p, max_new_tokens=max_new_tokens, temperature=0.0, **MODE_SETTINGS[mode])
            for p in prompts]


def decode(session: Session, mode: str, prompts: Sequence[str], max_new_tokens: int) -> list[list[int]]:
    """Greedy tokens of ``mode`` for each prompt."""
    return [g.tokens for g in generations(session, mode, prompts, max_new_tokens)]


def first_difference(got: list[list[int]], reference: list[list[int]]) -> str | None:
    """Where two decodes of the same prompts part, as a clause, or None when they are identical."""
    for i, (a, b) in enumerate(zip(got, reference, strict=True)):
        if a == b:
            continue
        k = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        got_k, ref_k = (str(t[k]) if k < len(t) else "the end" for t in (a, b))
        return (f"prompt {i + 1} parts at new token {k}: {got_k} where the reference has {ref_k}"
                f" ({len(a)} tokens against {len(b)})")
    return None


def check_identity(session: Session, mode: str, prompts: Sequence[str], reference: list[list[int]], max_new_tokens: int,
                   backend: str = CPU, backend_ar: list[list[int]] | None = None) -> dict:
    """Decode ``mode`` and compare it with ``reference`` (the CPU runtime's AR tokens of the same prompts);
    raises CheckFailed with where they part. ``backend_ar``, the backend's own AR tokens, tells a mode that
    is lossless on the GPU but rounds differently from the CPU from a mode that is broken there."""
    t0 = time.perf_counter()
    gens = generations(session, mode, prompts, max_new_tokens)
    seconds = time.perf_counter() - t0
    tokens = [g.tokens for g in gens]
    n = sum(len(t) for t in tokens)
    steps = sum(g.stats.steps for g in gens)
    # tau says whether drafts were accepted at all: identity with tau 1.00 would not exercise verification
    details = {"prompts": len(prompts), "new_tokens": n, "tokens_per_s": round(n / seconds, 1) if seconds else None,
               "tau": round(n / steps, 2) if steps else None}
    diff = first_difference(tokens, reference)
    if diff:
        name = BACKEND_NAMES[backend]
        why = ""
        if backend_ar is not None and backend_ar != reference and mode != "ar":
            own = first_difference(tokens, backend_ar)
            why = (f"; it is {name}'s own AR output, so {mode} is lossless there and {name}'s AR parts from the CPU's"
                   " (rounding: see the ar check)" if own is None else
                   f"; it is not {name}'s own AR output either ({own}): {mode} is broken on {name}")
        raise CheckFailed(f"{mode} on {name} is not the CPU runtime's AR output: {diff}{why}",
                          {**details, "tokens": tokens, "reference": reference})
    return details


# -- TensorRT engines --------------------------------------------------------------------------------

def device_target(path: Path, trt_version: str, compute_capability: str, context: int,
                  workspace_mib: int = 1024) -> Path:
    """A target file for this very GPU: its compute capability and the newest operator matrix not newer than
    its TensorRT (so the plan's op check is the one that applies here)."""
    from ..exporter.tensorrt.targets import ops_matrix

    have = tuple(int(p) for p in trt_version.split(".")[:2])
    known = sorted((tuple(int(p) for p in v.split(".")), v) for v in ops_matrix()["versions"])
    matrix = next((v for k, v in reversed(known) if k <= have), known[0][1])
    path.write_text(f'name = "this-gpu"\ndescription = "the GPU specexport doctor runs on"\n[tensorrt]\n'
                    f'version = "{matrix}"\ncompute_capability = "{compute_capability}"\n[build]\n'
                    f"max_context = {context}\nworkspace_mib = {workspace_mib}\n")
    return path


def engines_ready(bundle: Path) -> list[str] | None:
    """The pieces whose engines this TensorRT built on this GPU when every planned piece has one, else None
    (then `build_engines` has work to do)."""
    from ..runtime.backends.tensorrt import check_engine_compat, cuda_runtime, device_info, import_tensorrt
    from ..runtime.bundle import read_manifest

    section = read_manifest(bundle).tensorrt
    engines = {e.piece: e for e in section.engines}
    if not section.plan or set(engines) != set(section.plan):
        return None
    trt, device = import_tensorrt(), device_info(cuda_runtime())
    try:
        for entry in engines.values():
            check_engine_compat(dataclasses.asdict(entry), trt.__version__, device["compute_capability"],
                                bundle=bundle)
            if not (Path(bundle) / entry.file).is_file():
                return None
    except SpecExportError:
        return None
    return sorted(engines)


def build_bundle_engines(bundle: Path, any_device: bool = False) -> dict:
    """Build the engines of every planned piece (or keep the ones already built here); returns details."""
    from ..exporter.tensorrt.engines import build_engines

    kept = engines_ready(bundle)
    if kept is not None:
        return {"engines": kept, "built": False, "note": "engines built earlier by this TensorRT on this GPU"}
    engines = build_engines(bundle, any_device=any_device, log=lambda m: None).tensorrt.engines
    return {"engines": [e.piece for e in engines], "built": True,
            "tensorrt_version": engines[0].tensorrt_version if engines else None,
            "sizes_mb": {e.piece: round(e.size_bytes / 1e6, 2) for e in engines}}
