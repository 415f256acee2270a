"""TensorRT's INT4 and INT8 pieces, quantized by NVIDIA ModelOpt's ONNX quantizer (exporter/tensorrt/quantize_pieces.py)
and checked here as the fp16 pieces are: on ONNX Runtime's CPU provider, every mode token for token AR's of the same
pieces. ModelOpt runs for real, in its own environment (`make .venv-modelopt/.installed`, which `make test` sets up);
no TensorRT engine is built here."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from specexport.doctor.tiny import make_noisy_drafter
from specexport.exporter.build import build_bundle
from specexport.exporter.tensorrt import quantize_pieces
from specexport.exporter.tensorrt.opcheck import check_pieces
from specexport.runtime import load
from specexport.runtime.bundle import read_manifest
from specexport.runtime.errors import SpecExportError

try:
    MODELOPT = quantize_pieces.find_modelopt()
except SpecExportError as exc:
    MODELOPT, WHY = None, str(exc)
needs_modelopt = pytest.mark.skipif(MODELOPT is None, reason="NVIDIA ModelOpt's environment is not installed"
                                    " (`make .venv-modelopt/.installed`)")
PROMPTS = ["hash table", "the quick brown fox", "write a haiku about the sea"]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, tiny_checkpoint):
    """The tiny model's TensorRT pieces for thor at int4 and int8, with a drafter (plan only: no TensorRT here)."""
    if MODELOPT is None:
        pytest.skip(WHY)
    root = tmp_path_factory.mktemp("trt-quantized")
    drafter_checkpoint = make_noisy_drafter(tiny_checkpoint, root / "drafter")
    built = {}
    for precision in ("int4", "int8"):
        built[precision] = root / precision
        build_bundle(built[precision], model=str(tiny_checkpoint), context=128, adapter="untrained",
                     drafter=str(drafter_checkpoint), backend="tensorrt", target="thor", plan_only=True,
                     precision=precision)
    return built


def _ops(path, name: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path / f"{name}.onnx"), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@needs_modelopt
@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_the_pieces_carry_modelopt_s_qdq_and_the_manifest_says_how(quantized, precision):
    manifest = read_manifest(quantized[precision])
    assert manifest.graph.precision == precision
    assert manifest.tensorrt.builder.precision == precision  # the plan builds the Q/DQ the file carries
    for name in ("shallow", "deep", "drafter"):
        q = manifest.pieces[name].quantization
        ops = _ops(quantized[precision], name)
        assert ops.get("DequantizeLinear", 0) > 0, (name, ops)
        assert (ops.get("QuantizeLinear", 0) > 0) == (precision == "int8"), (name, ops)  # INT4 is weight-only
        assert q["tool"].startswith("nvidia-modelopt") and q["precision"] == precision
        assert q["method"] == ("awq_clip" if precision == "int4" else "max")
        assert q["embedding"] == "fp16" and (name != "deep" or q["lm_head"] == "fp16")
        assert q["calibration"]["tokens"] > 0 and "training prompts" in q["calibration"]["set"]
        if name != "shallow":  # shallow's is deep's, measured through the quantized shallow
            assert q["agreement_with_fp16"]["top1"] >= quantize_pieces.MIN_TOP1[precision]
        if precision == "int4":
            assert q["block_size"] == 64  # the tiny model's hidden size is 64: 128 would not divide it
    # the adapter (one layer and an LM head) stays fp16
    assert manifest.pieces["adapter"].quantization is None and "DequantizeLinear" not in _ops(quantized[precision],
                                                                                               "adapter")
    # the LM head stays fp16: deep's MatMul over lm_head reads the float table, not a DequantizeLinear
    deep = onnx.load(str(quantized[precision] / "deep.onnx"), load_external_data=False)
    assert any(n.op_type == "MatMul" and "lm_head" in n.input for n in deep.graph.node)
    assert check_pieces(quantized[precision], manifest.pieces, "thor").ok


@needs_modelopt
@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_every_mode_on_the_quantized_pieces_is_ar_of_the_same_pieces(quantized, precision):
    session = load(quantized[precision])
    drafted = 0
    for prompt in PROMPTS:
        ar = session.generate(prompt, max_new_tokens=24, mode="ar")
        for options in ({"mode": "self"}, {"mode": "model"}, {"mode": "lookup"}, {"mode": "auto"},
                        {"mode": "model", "tree": "2:1:2:0"}, {"mode": "model", "schedule": "pearl"}):
            out = session.generate(prompt, max_new_tokens=24, **options)
            assert out.tokens == ar.tokens, (precision, prompt, options)
            drafted += out.stats.drafted
    assert drafted > 0


@needs_modelopt
def test_a_precision_the_target_lacks_is_refused_before_anything_is_written(tmp_path, tiny_checkpoint):
    with pytest.raises(SpecExportError, match=r"target orin-nano's TensorRT 10\.3 builds fp16 and int8 pieces, not"
                                              r" int4 \(INT4 weight-only graphs need opset 21"):
        build_bundle(tmp_path / "b", model=str(tiny_checkpoint), context=128, adapter="none", drafter="none",
                     backend="tensorrt", target="orin-nano", plan_only=True, precision="int4")
    assert not (tmp_path / "b").exists()


def test_modelopt_that_cannot_be_found_is_refused_in_one_sentence(tmp_path, tiny_checkpoint, monkeypatch):
    monkeypatch.setenv(quantize_pieces.ENV, str(tmp_path / "no-python"))
    with pytest.raises(SpecExportError, match=r"does not import NVIDIA ModelOpt's ONNX quantizer.*make "
                                              r"\.venv-modelopt/\.installed"):
        build_bundle(tmp_path / "b", model=str(tiny_checkpoint), context=128, adapter="none", drafter="none",
                     backend="tensorrt", target="thor", plan_only=True, precision="int8")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(("table", "said"), [
    ({"method": "gptq"}, r"method = 'gptq' is not a ModelOpt int4 method; use awq_clip or awq_lite or rtn_dq"),
    ({"block_size": 32}, r"block_size = 32; TensorRT's INT4 blocks are 64 or 128"),
    ({"sequences": 0}, r"sequences = 0 is not a positive whole number"),
    ({"calibrate": 1}, r"has no key 'calibrate'"),
])
def test_the_recipe_s_modelopt_table_is_validated(table, said):
    with pytest.raises(SpecExportError, match=said):
        quantize_pieces.settings("int4", table)


def test_the_int4_block_is_the_largest_that_divides_every_weight():
    def matmul_model(k: int) -> onnx.ModelProto:
        w = onnx.numpy_helper.from_array(np.zeros((k, 8), np.float16), "w")
        node = onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
        graph = onnx.helper.make_graph([node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT16,
                                                                                        [1, k])],
                                       [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT16, [1, 8])], [w])
        return onnx.helper.make_model(graph)

    how = quantize_pieces.settings("int4", None)
    assert quantize_pieces.block_for([matmul_model(1536), matmul_model(256)], how) == 128
    assert quantize_pieces.block_for([matmul_model(1536), matmul_model(576)], how) == 64  # SmolLM2's hidden size
    with pytest.raises(SpecExportError, match=r"no INT4 block size TensorRT takes \(64 or 128\) divides"):
        quantize_pieces.block_for([matmul_model(96)], how)
    assert quantize_pieces.block_for([matmul_model(96)], quantize_pieces.settings("int4", {"block_size": 128})) == 128


def test_calibration_windows_are_equal_length_and_refuse_nothing_to_calibrate_on():
    windows = quantize_pieces.calibration_windows([list(range(50)), list(range(10)), list(range(40))], 2, 32)
    assert windows.shape == (2, 32) and windows.dtype == np.int64
    short = quantize_pieces.calibration_windows([list(range(5)), list(range(9))], 2, 32)
    assert short.shape == (2, 5)
    with pytest.raises(SpecExportError, match="no calibration sequence"):
        quantize_pieces.calibration_windows([[1]], 1, 32)


def test_a_record_names_the_tool_method_and_calibration():
    tool = quantize_pieces.ModelOpt("python", "0.47.0")
    how = quantize_pieces.Settings("int4", "awq_clip", 64, 8, 128)
    out = quantize_pieces.record(tool, how, "8 windows", 1024, 2.5, lm_head=True)
    assert json.loads(json.dumps(out)) == out
    assert out["tool"] == "nvidia-modelopt 0.47.0" and out["block_size"] == 64 and out["lm_head"] == "fp16"
    assert out["calibration"] == {"set": "8 windows", "tokens": 1024}
