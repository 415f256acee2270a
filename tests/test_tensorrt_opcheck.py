"""The operator check: standard-flavour bundles pass for every target, the ort flavour and graphs built to
break a rule fail naming their nodes. No TensorRT involved: this is the matrix evaluated node by node."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from specexport.exporter.tensorrt.opcheck import check_model, check_pieces, require_supported
from specexport.runtime.bundle import read_manifest
from specexport.runtime.errors import SpecExportError

from .test_tensorrt_fp16 import make_tiny_bundle


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("opcheck")
    return {"standard": make_tiny_bundle(root / "standard", tiny_checkpoint),
            "ort": make_tiny_bundle(root / "ort", tiny_checkpoint, flavour="ort", precision="fp32")}


def _pieces(bundle):
    return read_manifest(bundle).pieces


@pytest.mark.parametrize("target", ["orin-nano", "agx-orin", "thor", "rtx-4090"])
def test_standard_flavour_passes_every_target(bundles, target):
    report = require_supported(bundles["standard"], _pieces(bundles["standard"]), target)
    assert report.ok and not report.errors
    assert set(report.pieces) == {"shallow", "deep", "adapter"}
    ops = report.pieces["deep"]["ops"]
    assert ops["ScatterElements"] == 4 and ops["MatMul"] > 0  # the KV write and the projections were checked
    assert report.summary()["ok"]


def test_ort_flavour_fails_naming_the_contrib_nodes(bundles):
    pieces = _pieces(bundles["ort"])
    report = check_pieces(bundles["ort"], pieces, "orin-nano")
    assert not report.ok
    gqa = [f for f in report.errors if f.op_type == "GroupQueryAttention"]
    assert gqa and all(f.domain == "com.microsoft" for f in gqa)
    assert any(f.op_type == "SimplifiedLayerNormalization" for f in report.errors)
    with pytest.raises(SpecExportError) as exc:
        report.raise_if_failed()
    message = str(exc.value)
    assert message.startswith("TensorRT 10.3 (target orin-nano) cannot parse")
    assert gqa[0].node in message and "com.microsoft:GroupQueryAttention" in message
    assert "--flavour standard" in message


def _const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def broken_model(opset: int = 17) -> onnx.ModelProto:
    """A graph made to fail: TopK with K = 4096, Unique (unsupported), a com.microsoft op, an Unsqueeze whose
    axes fold to a constant but are not an initializer (fine from TensorRT 10.7 on), and one whose axes
    come from a Shape (never constant)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8192])
    nodes = [
        helper.make_node("TopK", ["x", "k_big"], ["topv", "topi"], name="topk_big", axis=-1),
        helper.make_node("TopK", ["x", "k_small"], ["topv2", "topi2"], name="topk_small", axis=-1),
        helper.make_node("Unique", ["x"], ["uniq_y"], name="uniq"),
        helper.make_node("FusedMatMul", ["x", "w"], ["fm"], name="ms_fused", domain="com.microsoft"),
        helper.make_node("Add", ["one", "zero"], ["folded_axes"], name="fold_axes"),
        helper.make_node("Unsqueeze", ["x", "folded_axes"], ["u1"], name="unsq_folded"),
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape_x"),
        helper.make_node("Slice", ["x_shape", "zero", "one"], ["dyn_axes"], name="slice_shape"),
        helper.make_node("Unsqueeze", ["x", "dyn_axes"], ["u2"], name="unsq_dynamic"),
    ]
    graph = helper.make_graph(
        nodes, "broken", [x],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("topv", "topv2", "uniq_y", "u1", "u2")],
        [_const("k_big", [4096]), _const("k_small", [8]), _const("one", [1]), _const("zero", [0]),
         _const("w", np.zeros((8192, 4)), np.float32)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _names(findings):
    return {f.node for f in findings}


def test_hand_made_graph_fails_on_each_broken_rule():
    errors, _, _ = check_model(broken_model(), "10.3", "toy")
    names = _names(errors)
    assert {"topk_big", "uniq", "ms_fused", "unsq_folded", "unsq_dynamic"} <= names
    assert "topk_small" not in names and "fold_axes" not in names and "shape_x" not in names
    reasons = {f.node: f.reason for f in errors}
    assert "3840" in reasons["topk_big"] and "4096" in reasons["topk_big"]
    assert "not supported" in reasons["uniq"]
    assert "com.microsoft" in reasons["ms_fused"]
    # TensorRT 10.7 added dynamic Unsqueeze axes: on 10.13 an axes value that folds to a constant is fine
    errors_13, _, _ = check_model(broken_model(), "10.13", "toy")
    assert "unsq_folded" not in _names(errors_13)
    assert {"topk_big", "uniq", "ms_fused", "unsq_dynamic"} <= _names(errors_13)


def test_failure_sentence_names_the_nodes(tmp_path):
    model = broken_model()
    onnx.save(model, str(tmp_path / "toy.onnx"))
    with pytest.raises(SpecExportError) as exc:
        require_supported(tmp_path, {"toy": SimpleNamespace(file="toy.onnx")}, "orin-nano")
    message = str(exc.value)
    for node in ("toy/topk_big", "toy/uniq", "toy/ms_fused", "toy/unsq_dynamic"):
        assert node in message
    assert "toy/topk_small" not in message


def test_operators_from_later_versions_and_opset_range():
    """RMSNormalization is an opset-23 op TensorRT parses from 10.15 on: 10.3 and 10.13 refuse it (and the
    opset), 10.15 accepts both."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4, 64])
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], name="rms", axis=-1)
    graph = helper.make_graph([node], "rms", [x], [y], [_const("scale", np.ones(64), np.float16)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    for version, ok in (("10.3", False), ("10.13", False), ("10.15", True)):
        errors, _, _ = check_model(model, version, "rms")
        assert (not errors) == ok, (version, errors)
    errors, _, _ = check_model(model, "10.13", "rms")
    assert any("from TensorRT 10.15 on" in f.reason for f in errors)
    assert any(f.op_type == "opset_import" for f in errors)


def test_types_are_checked():
    """A MatMul on INT64 is valid ONNX but not in TensorRT's type list; a DOUBLE Softmax is only a warning
    (TensorRT casts DOUBLE down to FLOAT)."""
    a = helper.make_tensor_value_info("a", TensorProto.INT64, [4, 4])
    b = helper.make_tensor_value_info("b", TensorProto.DOUBLE, [4])
    nodes = [helper.make_node("MatMul", ["a", "a"], ["aa"], name="matmul_int"),
             helper.make_node("Softmax", ["b"], ["sb"], name="softmax_double")]
    graph = helper.make_graph(nodes, "t", [a, b], [helper.make_tensor_value_info("aa", TensorProto.INT64, [4, 4]),
                                                   helper.make_tensor_value_info("sb", TensorProto.DOUBLE, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    errors, warnings, _ = check_model(model, "10.3", "t")
    assert _names(errors) == {"matmul_int"} and _names(warnings) == {"softmax_double"}
    assert "INT64" in errors[0].reason


def test_check_command(bundles):
    from specexport.cli.main import main
    from specexport.cli.tensorrt import register

    register(main)
    runner = CliRunner()
    ok = runner.invoke(main, ["check", str(bundles["standard"]), "--target", "jetpack6"])
    assert ok.exit_code == 0, ok.output
    assert "all nodes supported" in ok.output and "TensorRT 10.3" in ok.output
    bad = runner.invoke(main, ["check", str(bundles["ort"]), "--target", "thor", "--json"])
    assert bad.exit_code == 1
    assert "GroupQueryAttention" in bad.output and "cannot parse" in bad.output
    unknown = runner.invoke(main, ["check", str(bundles["standard"]), "--target", "tx2"])
    assert unknown.exit_code == 1 and "unknown TensorRT target 'tx2'" in unknown.output


def test_adapter_with_mlp_and_pruned_vocabulary_passes(tiny_checkpoint):
    """The adapter's variants (an MLP block, an FR-Spec pruned head mapped back by a Gather) in fp16."""
    import torch
    from specexport.exporter import llama_graph
    from specexport.exporter.hf_weights import extract
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), dtype=torch.float32).eval()
    w = extract(model, 64)
    layer = w.layers[2]
    graph = llama_graph.build_adapter(
        w.dims, w.rope, llama_graph.AdapterWeights(layer.input_norm, layer.attn, w.final_norm), w.lm_head,
        "standard", np.float16, mlp=layer, vocab_map=np.arange(0, 300, 3))
    for version in ("10.3", "10.13", "10.15"):
        errors, warnings, counts = check_model(graph, version, "adapter")
        assert not errors and not warnings, errors
    assert counts["Gather"] >= 3 and counts["ArgMax"] == 1


# -- quantized graphs: TensorRT's Q/DQ rules (exporter/tensorrt/qdq.py) ------------------------------------------


def qdq_matmul(block: int = 128, k: int = 256, n: int = 64, zero: np.ndarray | None = None, scale_sign: float = 1.0,
               axis: int = 0, qtype: int = TensorProto.INT4, packed: bool = True) -> onnx.ModelProto:
    """x [b, s, k] @ DequantizeLinear(W int4 [k, n], per-block scales along k): ModelOpt's INT4 weight-only shape."""
    values = np.random.default_rng(0).integers(-8, 8, (k, n))
    if qtype == TensorProto.INT4:
        weight = helper.make_tensor("w_q", TensorProto.INT4, [k, n], values.ravel().tolist())
        if not packed:  # one value a byte: what a writer that forgot ONNX's packing stores
            weight = TensorProto(name="w_q", data_type=TensorProto.INT4, dims=[k, n],
                                 raw_data=values.astype(np.int8).tobytes())
    else:
        weight = numpy_helper.from_array(values.astype(np.int8), "w_q")
    shape = [k // block, n] if axis == 0 else [k, n // block]
    scale = numpy_helper.from_array(np.full(shape, 0.01 * scale_sign, np.float16), "w_scale")
    inits = [weight, scale]
    dq_inputs = ["w_q", "w_scale"]
    if zero is not None:
        inits.append(helper.make_tensor("w_zero", qtype, shape, zero.ravel().tolist()))
        dq_inputs.append("w_zero")
    nodes = [helper.make_node("DequantizeLinear", dq_inputs, ["w"], axis=axis, block_size=block, name="dq_w"),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["b", "s", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["b", "s", n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def qdq_errors(model: onnx.ModelProto) -> list[str]:
    errors, _, _ = check_model(model, "10.15", "deep")
    return [f"{f.node}: {f.reason}" for f in errors]


def test_int4_weight_only_blocks_pass():
    for block in (64, 128):
        assert qdq_errors(qdq_matmul(block)) == [], block
    assert qdq_errors(qdq_matmul(128, zero=np.zeros((2, 64), np.int8))) == []


@pytest.mark.parametrize(("case", "fragment"), [
    ({"block": 32}, "its INT4 blocks are 32 values; TensorRT takes blocks of 64 or 128"),
    ({"block": 96, "k": 192}, "its INT4 blocks are 96 values"),
    ({"zero": np.ones((2, 64), np.int8)}, "its zero point 'w_zero' is not all zeros"),
    ({"scale_sign": -1.0}, "its scale 'w_scale' has values that are not strictly positive"),
    ({"packed": False}, "its INT4 weights 'w_q' are not packed two values a byte"),
])
def test_a_quantized_graph_tensorrt_would_not_build_is_refused_naming_the_node(case, fragment):
    errors = qdq_errors(qdq_matmul(**case))
    assert any(e.startswith("dq_w: ") and fragment in e for e in errors), errors


def test_int4_activations_and_per_channel_int4_are_refused():
    k = 256
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], axis=-1, name="q_x"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["y"], axis=-1, name="dq_x")]
    graph = helper.make_graph(nodes, "a", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", k])],
                              [numpy_helper.from_array(np.full([k], 0.1, np.float32), "s"),
                               helper.make_tensor("z", TensorProto.INT4, [k], [0] * k)])
    errors = qdq_errors(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    assert any(e.startswith("q_x: ") and "TensorRT takes for weights only" in e for e in errors), errors
    assert any(e.startswith("dq_x: ") and "dequantizes INT4 activations" in e for e in errors), errors
    assert any("per-block scales" in e for e in errors), errors
    from specexport.exporter.tensorrt.opcheck import OpCheckReport

    found, _, _ = check_model(qdq_matmul(32), "10.15", "deep")  # a bundle's report: one sentence naming the node
    with pytest.raises(SpecExportError, match=r"cannot parse 1 node\(s\): DequantizeLinear at deep/dq_w \(its INT4"):
        OpCheckReport("thor", "10.15", errors=found).raise_if_failed()
