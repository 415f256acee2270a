"""`specexport build --backend tensorrt`, for real, on this machine without TensorRT or a GPU: the plan-only
bundle (fp16 standard-flavour pieces checked against PyTorch within the fp16 tolerance, the operator check,
the plan and the trtexec scripts, every file checksummed), the in-place form for TensorRT 10.15+ targets,
and the refusals: no TensorRT without --plan-only, a target whose op check fails, `generate --backend
tensorrt` here. Each refusal is one sentence, exit code 1, and leaves no bundle behind."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from specexport.cli.main import main
from specexport.exporter.parity import TOLERANCE
from specexport.runtime.bundle import load_bundle

CONTEXT = 128


def _build(tmp, checkpoint, out_name, *extra):
    out = tmp / out_name
    args = ["build", "--model", str(checkpoint), "--out", str(out), "--context", str(CONTEXT), *extra]
    return out, CliRunner().invoke(main, args)


@pytest.fixture(scope="module")
def plan_only(tmp_path_factory, tiny_checkpoint):
    out, result = _build(tmp_path_factory.mktemp("build"), tiny_checkpoint, "orin", "--backend", "tensorrt",
                         "--target", "orin-nano", "--plan-only", "--adapter", "untrained")
    assert result.exit_code == 0, result.output
    return out, result


def _one_sentence_error(result) -> str:
    """The one `error: ...` line of a failed command (progress bars of model loading may precede it)."""
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    assert isinstance(result.exception, SystemExit)  # a handled refusal, not a crash
    return errors[0]


def test_plan_only_bundle(plan_only):
    out, result = plan_only
    manifest = load_bundle(out).manifest.to_dict()  # every checksum verifies, tensorrt/ included
    assert manifest["graph"]["flavour"] == "standard" and manifest["graph"]["precision"] == "fp16"
    assert manifest["graph"]["opset"] == 17
    assert set(manifest["pieces"]) == {"shallow", "deep", "adapter"}
    for name, spec in manifest["pieces"].items():  # checked against PyTorch within the fp16 tolerance
        assert spec["parity"]["tolerance"] == TOLERANCE["fp16"]
        assert all(err <= TOLERANCE["fp16"] for err in spec["parity"]["max_relative_error"].values()), name
        assert spec["kv"]["mode"] == "swap"
        assert {t["dtype"] for t in spec["inputs"] if t["name"].startswith("past_")} == {"float16"}
    section = manifest["tensorrt"]
    assert section["target"]["name"] == "orin-nano" and section["opcheck"]["ok"] and section["engines"] == []
    assert section["context"] == CONTEXT and section["builder"]["workspace_mib"] == 512
    for name in ("shallow", "deep", "adapter"):
        script = f"tensorrt/build_{name}.sh"
        assert section["plan"][name]["script"] == script and script in manifest["files"]
        assert (out / script).read_text().count("--profile=") == 3
    assert "tensorrt/build_all.sh" in manifest["files"]
    assert "specexport engines build" in result.output  # says what to do next


def test_plan_only_bundle_runs_on_onnxruntime(plan_only):
    """The fp16 pieces of a TensorRT bundle still run here, on ONNX Runtime CPU, through the CLI."""
    out, _ = plan_only
    result = CliRunner().invoke(main, ["generate", "--bundle", str(out), "--raw", "--max-new-tokens", "6", "--json",
                                       "--mode", "ar", "a hash table"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output.splitlines()[-1])["tokens"]) > 0


def test_generate_with_tensorrt_here_is_one_sentence(plan_only):
    out, _ = plan_only
    result = CliRunner().invoke(main, ["generate", "--bundle", str(out), "--backend", "tensorrt", "hello"])
    line = _one_sentence_error(result)
    assert "TensorRT's Python bindings are not importable" in line and "--backend onnxruntime" in line


def test_engines_build_here_is_one_sentence(plan_only, tmp_path):
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(plan_only[0], bundle)
    line = _one_sentence_error(CliRunner().invoke(main, ["engines", "build", str(bundle)]))
    assert "TensorRT's Python bindings are not importable" in line
    load_bundle(bundle)  # untouched


def test_build_without_tensorrt_needs_plan_only(tmp_path, tiny_checkpoint):
    out, result = _build(tmp_path, tiny_checkpoint, "b", "--backend", "tensorrt", "--target", "orin-nano")
    line = _one_sentence_error(result)
    assert "building TensorRT engines needs TensorRT and an NVIDIA GPU" in line and "add --plan-only" in line
    assert not out.exists() and not list(tmp_path.glob(".b*"))  # no partial bundle


def test_build_refuses_a_target_whose_op_check_fails(tmp_path, tiny_checkpoint):
    """The 'ort' flavour's contrib ops: TensorRT cannot parse them, and build says which nodes."""
    out, result = _build(tmp_path, tiny_checkpoint, "b", "--target", "thor", "--flavour", "ort", "--plan-only",
                         "--adapter", "none")
    line = _one_sentence_error(result)
    assert line.startswith("error: TensorRT 10.13 (target thor) cannot parse")
    assert "com.microsoft:GroupQueryAttention at shallow/GroupQueryAttention_" in line
    assert "SimplifiedLayerNormalization at shallow/" in line and "--flavour standard" in line
    assert not out.exists() and not list(tmp_path.glob(".b*"))


@pytest.mark.parametrize("args, words", [
    (["--target", "orin-nano", "--plan-only", "--context", "4096"], "--context 4096 is more than target orin-nano"),
    (["--backend", "tensorrt", "--plan-only"], "--backend tensorrt needs --target"),
    (["--plan-only"], "--target and --plan-only are TensorRT options"),
    (["--target", "xavier-nx", "--plan-only"], "unknown TensorRT target 'xavier-nx'"),
])
def test_option_errors(tmp_path, tiny_checkpoint, args, words):
    out = tmp_path / "b"
    result = CliRunner().invoke(main, ["build", "--model", str(tiny_checkpoint), "--out", str(out), *args])
    assert words in _one_sentence_error(result)
    assert not out.exists()


def test_inplace_target_bundle(tmp_path, tiny_checkpoint, plan_only):
    """rtx-4090 (TensorRT 10.15): TensorScatter cache writes at opset 24, parity-checked like the rest, planned
    for in-place binding; on ONNX Runtime it generates the same tokens as the orin (swap) bundle."""
    import onnx

    out, result = _build(tmp_path, tiny_checkpoint, "b", "--target", "rtx-4090", "--plan-only", "--adapter",
                         "untrained")
    assert result.exit_code == 0, result.output
    manifest = load_bundle(out).manifest.to_dict()
    assert manifest["graph"]["opset"] == 24
    assert {p["kv"]["mode"] for p in manifest["tensorrt"]["plan"].values()} == {"inplace"}
    for spec in manifest["pieces"].values():
        assert all(err <= TOLERANCE["fp16"] for err in spec["parity"]["max_relative_error"].values())
        model = onnx.load(str(out / spec["file"]), load_external_data=False)
        assert {n.op_type for n in model.graph.node} >= {"TensorScatter"}
        assert "ScatterElements" not in {n.op_type for n in model.graph.node}

    def tokens(bundle):
        res = CliRunner().invoke(main, ["generate", "--bundle", str(bundle), "--raw", "--max-new-tokens", "8",
                                        "--json", "a hash table"])
        assert res.exit_code == 0, res.output
        return json.loads(res.output.splitlines()[-1])["tokens"]

    assert tokens(out) == tokens(plan_only[0])
