"""The TensorRT path for real: build engines from a tiny fp16 bundle and check them against PyTorch.
These need TensorRT's Python bindings and an NVIDIA GPU; everywhere else they skip, saying why
(`pytest -rs` prints the reason). Nothing in this file has been run on a GPU yet. The token-identity checks
are `specexport doctor`'s own (specexport.doctor.checks), so this file and the command check the same thing."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from specexport.exporter.parity import TOLERANCE, relative_error
from specexport.runtime.errors import SpecExportError

from .test_tensorrt_fp16 import CONTEXT, STEPS, make_tiny_bundle, torch_reference

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu():
    from specexport.exporter.tensorrt.engines import require_tensorrt

    try:
        trt, cudart, device = require_tensorrt()
    except SpecExportError as exc:
        pytest.skip(f"needs TensorRT and an NVIDIA GPU: {exc}")
    return trt, cudart, device


def _device_target(tmp_path, trt, device) -> str:
    """A target for this very device (the one `specexport doctor` plans its tiny model for)."""
    from specexport.doctor.checks import device_target

    return str(device_target(tmp_path / "this-gpu.toml", trt.__version__, device["compute_capability"], CONTEXT))


@pytest.fixture(scope="module", params=["swap", "inplace"])
def built(request, gpu, tmp_path_factory, tiny_checkpoint):
    """Engines of the tiny fp16 bundle in both KV forms; the in-place (TensorScatter) form needs TensorRT 10.15."""
    from specexport.exporter.tensorrt.engines import build_engines, plan_bundle
    from specexport.runtime.backends.tensorrt import INPLACE_KV_FROM

    trt, _, device = gpu
    inplace = request.param == "inplace"
    if inplace and tuple(int(p) for p in trt.__version__.split(".")[:2]) < INPLACE_KV_FROM:
        pytest.skip(f"in-place KV updates need TensorRT 10.15 or later, this is {trt.__version__}")
    root = tmp_path_factory.mktemp("gpu")
    bundle = make_tiny_bundle(root / "b", tiny_checkpoint, inplace=inplace)
    plan_bundle(bundle, _device_target(root, trt, device))
    build_engines(bundle, any_device=True)
    return bundle


def test_gpu_engines_are_recorded(built, gpu):
    trt, _, device = gpu
    manifest = json.loads((built / "manifest.json").read_text())
    engines = manifest["tensorrt"]["engines"]
    assert [e["piece"] for e in engines] == ["shallow", "deep", "adapter"]
    for e in engines:
        assert e["tensorrt_version"] == trt.__version__
        assert e["compute_capability"] == device["compute_capability"]
    assert (built / "tensorrt" / "timing.cache").is_file()


def test_gpu_pieces_match_pytorch_across_cache_use(built, tiny_checkpoint):
    from specexport.runtime.session import load

    session = load(built, backend="tensorrt")
    p = session.pieces
    ids = np.random.default_rng(7).integers(0, 300, size=40).tolist()
    ref = torch_reference(tiny_checkpoint, ids)
    rng = np.random.default_rng(1)
    worst: dict[str, float] = {}
    for lo, hi, keep in STEPS:
        if lo == "garbage":  # a rejected verification: must not leak into later positions
            h = p.shallow.run(rng.integers(0, 300, size=(1, keep)), hi)["hidden"]
            p.deep.run(h, hi, keep=keep)
            continue
        h = p.shallow.run(np.asarray([ids[lo:hi]]), lo)["hidden"]
        logits = p.deep.run(h, lo, keep=keep)["logits"]
        draft = p.adapter.run(h, lo, keep=keep)
        worst["h"] = max(worst.get("h", 0), relative_error(h[0], ref["h"][lo:hi]))
        worst["logits"] = max(worst.get("logits", 0), relative_error(logits[0], ref["logits"][hi - keep:hi]))
        worst["adapter"] = max(worst.get("adapter", 0),
                               relative_error(draft["logits"][0], ref["adapter_logits"][hi - keep:hi]))
    assert all(v <= TOLERANCE["fp16"] for v in worst.values()), worst


def test_gpu_generate_runs(built):
    from specexport.runtime.session import load

    session = load(built, backend="tensorrt")
    tokens = session.generate_ids([1, 5, 9, 12], max_new_tokens=8, chat=False).tokens
    assert 0 < len(tokens) <= 8


def test_gpu_trtexec_script_and_adopt(built, tmp_path):
    import subprocess

    from specexport.exporter.tensorrt.engines import build_engines

    if shutil.which("trtexec") is None:
        pytest.skip("trtexec is not on PATH (JetPack: /usr/src/tensorrt/bin)")
    bundle = tmp_path / "b"
    shutil.copytree(built, bundle)
    subprocess.run(["sh", str(bundle / "tensorrt" / "build_deep.sh")], check=True)
    manifest = build_engines(bundle, pieces=["deep"], adopt=True, any_device=True).to_dict()
    entry = next(e for e in manifest["tensorrt"]["engines"] if e["piece"] == "deep")
    assert entry["built_with"] == "trtexec"


def test_gpu_build_command(gpu, tmp_path, tiny_checkpoint):
    """`specexport build --target <this GPU>` without --plan-only: export, check, plan and engines in one go."""
    from click.testing import CliRunner
    from specexport.cli.main import main
    from specexport.runtime.bundle import load_bundle
    from specexport.runtime.session import load

    trt, _, device = gpu
    out = tmp_path / "b"
    result = CliRunner().invoke(main, ["build", "--model", str(tiny_checkpoint), "--target",
                                       _device_target(tmp_path, trt, device), "--out", str(out), "--context",
                                       str(CONTEXT), "--adapter", "none"])
    assert result.exit_code == 0, result.output
    assert [e.piece for e in load_bundle(out).manifest.tensorrt.engines] == ["shallow", "deep"]
    tokens = load(out, backend="tensorrt").generate_ids([1, 5, 9, 12], max_new_tokens=8, chat=False, mode="ar").tokens
    assert 0 < len(tokens) <= 8


def test_gpu_modes_give_the_cpu_runtimes_tokens(built):
    """doctor's identity check, mode by mode: TensorRT's greedy tokens are ONNX Runtime CPU's AR tokens of the same
    fp16 pieces (check_identity raises, naming where they part)."""
    from specexport.doctor.checks import (
        CPU,
        MODES,
        PROMPTS,
        TENSORRT,
        check_identity,
        decode,
        mode_blockers,
        open_session,
    )

    reference = decode(open_session(built, CPU), "ar", PROMPTS, 16)
    session = open_session(built, TENSORRT)
    modes = [m for m in MODES if m not in mode_blockers(session)]
    assert {"ar", "self", "lookup", "pearl"} <= set(modes)
    for mode in modes:
        check_identity(session, mode, PROMPTS, reference, 16, TENSORRT)


def test_gpu_doctor_passes_on_tensorrt(gpu, tmp_path):
    """`specexport doctor --backend tensorrt` end to end: the tiny model's engines and every mode on TensorRT."""
    from specexport.doctor.run import run_doctor

    report = run_doctor(tmp_path, backends=["tensorrt"])
    failed = {c["name"]: c["reason"] for c in report["checks"] if c["status"] != "passed"}
    assert report["exit_code"] == 0, failed
    assert report["summary"]["gpu_checks_run"] >= 8
