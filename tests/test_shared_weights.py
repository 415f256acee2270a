"""One copy of a weight per bundle (exporter/shared_weights.py): a tensor two pieces hold bit for bit is stored
once, the later graph pointing into the first piece's data file, and a float tied table is one tensor for
shallow's rows and deep's LM head; the pieces compute what they computed before, to the bit."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo
from specexport.exporter.onnx_builder import save_model
from specexport.exporter.shared_weights import share_identical
from specexport.exporter.tied_rows import ROWS, read_rows_from_lm_head
from specexport.runtime import load

RNG = np.random.default_rng(0)
TABLE = RNG.standard_normal((50, 16)).astype(np.float32)


def gather_model(table: np.ndarray, other: np.ndarray) -> onnx.ModelProto:
    """ids -> table[ids] @ other: one tensor two models may share, one of its own."""
    nodes = [helper.make_node("Gather", ["embed_tokens", "ids"], ["rows"], axis=0),
             helper.make_node("MatMul", ["rows", "w"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "s", other.shape[1]])],
                              [numpy_helper.from_array(table, "embed_tokens"), numpy_helper.from_array(other, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(path, ids: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]


def test_a_tensor_two_pieces_hold_is_stored_once(tmp_path):
    ids = np.array([[3, 7, 49, 0]], dtype=np.int64)
    mine, theirs = RNG.standard_normal((16, 24)).astype(np.float32), RNG.standard_normal((16, 32)).astype(np.float32)
    save_model(gather_model(TABLE, mine), tmp_path / "shallow.onnx")
    save_model(gather_model(TABLE, theirs), tmp_path / "head.onnx")
    before = {n: run(tmp_path / f"{n}.onnx", ids) for n in ("shallow", "head")}
    size = (tmp_path / "head.onnx.data").stat().st_size
    assert share_identical(tmp_path, ["shallow", "head"], vocab=51)["head"] == (0, True)  # not a table of 51 rows
    report = share_identical(tmp_path, ["shallow", "head"], vocab=50)
    assert report == {"shallow": (0, True), "head": (TABLE.nbytes, True)}
    assert (tmp_path / "head.onnx.data").stat().st_size == size - TABLE.nbytes
    head = onnx.load(str(tmp_path / "head.onnx"), load_external_data=False)
    where = {t.name: ExternalDataInfo(t).location for t in head.graph.initializer}
    assert where == {"embed_tokens": "shallow.onnx.data", "w": "head.onnx.data"}
    for name, out in before.items():
        assert np.array_equal(run(tmp_path / f"{name}.onnx", ids), out), name
    again = share_identical(tmp_path, ["shallow", "head"])  # idempotent
    assert again == {"shallow": (0, True), "head": (0, True)}


def test_a_piece_whose_every_tensor_is_shared_keeps_no_data_file(tmp_path):
    w = RNG.standard_normal((16, 24)).astype(np.float32)
    for name in ("a", "b"):
        save_model(gather_model(TABLE, w), tmp_path / f"{name}.onnx")
    assert share_identical(tmp_path, ["a", "b"])["b"] == (TABLE.nbytes + w.nbytes, False)
    assert not (tmp_path / "b.onnx.data").exists()
    ids = np.array([[1, 2]], dtype=np.int64)
    assert np.array_equal(run(tmp_path / "a.onnx", ids), run(tmp_path / "b.onnx", ids))


def test_rows_read_from_the_lm_head_layout_are_the_rows(tmp_path):
    w = RNG.standard_normal((16, 24)).astype(np.float32)
    save_model(gather_model(TABLE, w), tmp_path / "rows.onnx")
    model = gather_model(TABLE, w)
    assert read_rows_from_lm_head(model)
    rows = next(t for t in model.graph.initializer if t.name == ROWS)
    assert numpy_helper.to_array(rows).shape == (16, 50)
    assert not read_rows_from_lm_head(model)  # the Gather is gone: nothing left to rewrite
    save_model(model, tmp_path / "by_hidden.onnx")
    ids = RNG.integers(0, 50, (2, 9))
    assert np.array_equal(run(tmp_path / "by_hidden.onnx", ids), run(tmp_path / "rows.onnx", ids))


def test_a_tied_table_is_stored_once_per_bundle(tiny_checkpoint, tmp_path):
    """At fp32 deep's LM head is shallow's table, stored once; AR and the self-draft stay the target's."""
    from specexport.exporter.build import build_bundle
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tiny_checkpoint).tie_word_embeddings
    build_bundle(tmp_path / "b", model=str(tiny_checkpoint), exit_layer=1, context=128, adapter="untrained")
    deep = onnx.load(str(tmp_path / "b" / "deep.onnx"), load_external_data=False)
    where = {t.name: ExternalDataInfo(t).location for t in deep.graph.initializer
             if t.data_location == TensorProto.EXTERNAL}
    assert where["lm_head"] == "shallow.onnx.data"
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert set(manifest["files"]) >= {"shallow.onnx.data", "deep.onnx.data"}
    session = load(tmp_path / "b", threads=1)
    ar = session.generate("hash table", max_new_tokens=24, mode="ar").tokens
    assert session.generate("hash table", max_new_tokens=24, mode="self").tokens == ar
