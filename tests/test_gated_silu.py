"""specexport.GatedSiLU (native/gated_silu.cc, exporter/gated_silu.py): silu(gate) * up against NumPy, its AVX2
path bit for bit its portable one and a row of many bit for bit the row alone; the rewrite of a [gate; up]
MatMul's Split/SiLU/Mul chain and what it leaves alone; the default bundles carrying it; and a graph that uses it
behind a manifest that does not load the library, refused in one sentence."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from specexport.exporter import gated_silu
from specexport.runtime import attention_op, load
from specexport.runtime.errors import SpecExportError

from .test_matmul_op import open_model

pytestmark = pytest.mark.skipif(not attention_op.available(), reason="the operator library is not built")


def op_model() -> onnx.ModelProto:
    node = helper.make_node(attention_op.GATED_OP_TYPE, ["X"], ["Y"], domain=attention_op.DOMAIN)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(attention_op.DOMAIN, 1)])


@pytest.mark.parametrize("half", [1, 7, 8, 23, 1536])  # below, at and off AVX2's 8 lanes
def test_the_operator_against_numpy_and_its_paths_and_rows(half):
    rng = np.random.default_rng(half)
    x = (rng.standard_normal((3, 11, 2 * half)) * 4).astype(np.float32)
    x[0, 0, :2] = [-100.0, 100.0]  # past exp's clamps
    gate, up = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    want = gate / (1 + np.exp(-gate)) * up
    got = open_model(op_model(), threads=2).run(None, {"X": x})[0]
    assert got.shape == (3, 11, half) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    portable = open_model(op_model(), isa="portable").run(None, {"X": x})[0]
    assert portable.tobytes() == got.tobytes()
    one_row = open_model(op_model())
    for b, r in [(0, 0), (1, 5), (2, 10)]:
        assert one_row.run(None, {"X": x[b:b + 1, r:r + 1]})[0].tobytes() == got[b:b + 1, r:r + 1].tobytes()


def test_an_odd_last_axis_is_refused():
    with pytest.raises(Exception, match=r"GatedSiLU: the input's last axis must be even"):
        open_model(op_model()).run(None, {"X": np.zeros((1, 5), np.float32)})


def mlp_model(k: int = 16, n: int = 24, extra_reader: bool = False) -> onnx.ModelProto:
    """X @ W ([gate; up]) -> Split -> Mul(gate, Sigmoid(gate)) * up: the exporter's SiLU MLP; `extra_reader`
    makes the gate a graph output too, so the chain cannot go."""
    w = np.random.default_rng(0).standard_normal((k, 2 * n)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["gu"]),
             helper.make_node("Split", ["gu", "sizes"], ["g", "u"], axis=-1),
             helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", ["g", "s"], ["a"]),
             helper.make_node("Mul", ["a", "u"], ["Y"])]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)], outputs,
                              [numpy_helper.from_array(w, "W"),
                               numpy_helper.from_array(np.array([n, n], np.int64), "sizes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_rewrite_folds_the_chain_and_keeps_the_result():
    model = mlp_model()
    x = np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    assert gated_silu.use_gated_silu(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul", attention_op.GATED_OP_TYPE]
    assert {t.name for t in model.graph.initializer} == {"W"}  # the split sizes went with the Split
    # ONNX Runtime runs the chain as QuickGelu, its own sigmoid: close, not the same bits
    np.testing.assert_allclose(open_model(model).run(None, {"X": x})[0], want, rtol=1e-5, atol=2e-5)


def test_the_rewrite_leaves_a_chain_something_else_reads():
    model = mlp_model(extra_reader=True)
    assert gated_silu.use_gated_silu(model) == 0
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Split", "Sigmoid", "Mul", "Mul"]


def test_default_bundles_carry_it_instead_of_the_chain(tiny_bundles):
    deep = onnx.load(tiny_bundles() / "deep.onnx", load_external_data=False)
    ops = [n.op_type for n in deep.graph.node]
    manifest = json.loads((tiny_bundles() / "manifest.json").read_text())
    assert manifest["graph"]["attention"] == "rowwise"
    assert ops.count(attention_op.GATED_OP_TYPE) == manifest["model"]["dims"]["layers"] - manifest["model"][
        "exit_layer"]
    assert "Split" not in ops and "Sigmoid" not in ops
    fallback = onnx.load(tiny_bundles(attention="gqa") / "deep.onnx", load_external_data=False)
    assert attention_op.GATED_OP_TYPE not in [n.op_type for n in fallback.graph.node]  # no library needed


def test_a_graph_using_it_behind_a_manifest_without_the_library_is_refused(tiny_bundles, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundles(attention="gqa"), copy)
    deep = onnx.load(copy / "deep.onnx")
    assert gated_silu.use_gated_silu(deep) > 0
    onnx.save(deep, copy / "deep.onnx")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["deep.onnx"] = hashlib.sha256((copy / "deep.onnx").read_bytes()).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecExportError, match=r"uses specexport's GatedSiLU operator, which comes only with"
                                               r" graph.attention or graph.matmul 'rowwise'") as err:
        load(copy)
    assert ". " not in str(err.value)
