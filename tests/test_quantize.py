"""int8/int4 weight-only quantization (MatMulNBits): packing, bundles, parity, speculative == AR, refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo
from specexport.exporter import quantize, row_matmul
from specexport.exporter.build import build_bundle
from specexport.runtime.errors import SpecExportError
from specexport.runtime.inspect_bundle import inspect_bundle
from specexport.runtime.session import load

from .test_tree_attention import leading_rows_are_ar_bit_for_bit

PROMPTS = ["Explain how a hash table works.", "write a haiku about the sea", "what is seventeen times twenty three"]


@pytest.fixture(scope="module")
def quantized_bundles(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("quantized")
    bundles = {}
    for precision in ("int8", "int4"):
        bundles[precision] = root / precision
        build_bundle(bundles[precision], model=str(tiny_checkpoint), context=256, adapter="untrained",
                     precision=precision)
    return bundles


def _one_node_model(node: onnx.NodeProto, inputs: list, outputs: list, weight: np.ndarray) -> onnx.ModelProto:
    """A graph of `node` alone, its weight (node.input[0] or [1], named in the node) an initializer."""
    name = next(n for n in node.input if n not in {i.name for i in inputs})
    graph = helper.make_graph([node], "g", inputs, outputs, [numpy_helper.from_array(weight, name)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _matmul_model(w: np.ndarray) -> onnx.ModelProto:
    return _one_node_model(helper.make_node("MatMul", ["a", "w"], ["y"], name="mm"),
                           [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", w.shape[0]])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", w.shape[1]])], w)


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_packing_is_what_onnxruntime_decodes(precision, symmetric):
    # K = 80 is not a multiple of the block: the padded last block must decode right too
    rng = np.random.default_rng(0)
    w = rng.standard_normal((80, 24)).astype(np.float32)
    spec = quantize.spec_for(precision, symmetric=symmetric, accuracy_level=0)  # exact fp32 compute
    model, summary = quantize.quantize_model(_matmul_model(w), spec)
    assert [n.op_type for n in model.graph.node] == ["MatMulNBits"] and summary["matmuls_quantized"] == 1
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a = rng.standard_normal((3, 80)).astype(np.float32)
    want = a @ quantize.fake_quantize(w, spec)
    np.testing.assert_allclose(session.run(None, {"a": a})[0], want, rtol=1e-4, atol=1e-4)
    assert np.abs(quantize.fake_quantize(w, spec) - w).max() < (0.6 if precision == "int4" else 0.04)


def _embedding_model(table: np.ndarray) -> onnx.ModelProto:
    return _one_node_model(helper.make_node("Gather", [quantize.EMBED, "ids"], ["x"], axis=0),
                           [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", table.shape[1]])], table)


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_embedding_rows_are_what_the_reference_rounds(precision, symmetric):
    """GatherBlockQuantized decodes our packing of the table's rows to the very floats `fake_quantize_embedding`
    gives the parity reference (bit for bit: a row is codes times scales, no sum); a width that is not whole
    blocks keeps the table in fp32."""
    import torch

    rng = np.random.default_rng(1)
    table = (rng.standard_normal((300, 128)) * 0.05).astype(np.float32)
    spec = quantize.spec_for(precision, symmetric=symmetric)
    model, summary = quantize.quantize_model(_embedding_model(table), spec)
    assert [n.op_type for n in model.graph.node] == ["GatherBlockQuantized"] and summary["embedding_quantized"]
    ids = np.array([[0, 7, 299], [5, 5, 123]])
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    reference = torch.nn.Embedding.from_pretrained(torch.from_numpy(table))
    quantize.fake_quantize_embedding(reference, spec)
    np.testing.assert_array_equal(got, reference(torch.from_numpy(ids)).numpy())
    assert 0 < np.abs(got - table[ids]).max() < 0.002  # 8-bit rows at either precision
    odd, summary = quantize.quantize_model(_embedding_model(table[:, :96]), spec)  # 1.5 blocks of 64
    assert [n.op_type for n in odd.graph.node] == ["Gather"] and summary["embedding_quantized"] is False


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_rows_read_from_the_rowwise_lm_head_are_what_the_reference_rounds(precision, symmetric):
    """A tied table's rows decoded by GatherRowsNBits from the LM head's codes, scales and zero points in the rowwise
    matmul's tiles are, bit for bit, the rounded LM head's rows the parity reference uses; the tensors are the
    very bytes `use_rowwise` gives deep's LM head, so the bundle stores them once."""
    from specexport.exporter import tied_rows
    from specexport.runtime import attention_op

    if not attention_op.available():
        pytest.skip(f"the operator library is not built: {attention_op.load_error()}")
    rng = np.random.default_rng(2)
    lm_head = (rng.standard_normal((128, 83)) * 0.05).astype(np.float32)  # [hidden, vocab]: 83 is no whole tile
    spec = quantize.spec_for(precision, symmetric=symmetric)
    rows = tied_rows.rows_for(lm_head, spec, "rowwise")
    assert tied_rows.rows_for(lm_head, spec, "mlas") is None and tied_rows.rows_for(lm_head, None, "rowwise") is None
    model = _embedding_model(np.ascontiguousarray(lm_head.T))
    assert rows.apply(model) and not rows.apply(model)  # the Gather is gone: nothing left to rewrite
    assert quantize.EMBED not in {t.name for t in model.graph.initializer}
    ids = np.array([[0, 7, 82, 8], [5, 5, 81, 63]])
    options = ort.SessionOptions()
    attention_op.register(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(got, rows.rounded()[ids])
    with pytest.raises(Exception, match=r"token id 83 is outside 0\.\.82"):
        session.run(None, {"ids": np.array([[83]])})
    assert 0 < np.abs(got - lm_head.T[ids]).max() < (0.05 if precision == "int4" else 0.002)
    deep = _one_node_model(helper.make_node("MatMul", ["a", quantize.LM_HEAD], ["y"]),
                           [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["r", 128])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["r", 83])], lm_head)
    deep, _ = quantize.quantize_model(deep, spec)
    row_matmul.use_rowwise(deep)
    held = sorted(t.raw_data for t in deep.graph.initializer)
    read = sorted(t.raw_data for t in model.graph.initializer if t.name.startswith(tied_rows.ROWS + "_"))
    assert held == read


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_bundle_is_quantized_and_passes_parity(quantized_bundles, precision):
    bundle = quantized_bundles[precision]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["graph"]["precision"] == precision
    assert manifest["graph"]["quantization"]["bits"] == quantize.BITS[precision]
    assert set(manifest["pieces"]) == {"shallow", "deep", "adapter"}
    # the default build runs int4 through specexport's row-invariant matmul where the operator is built
    qop = "RowInvariantMatMulNBits" if manifest["graph"].get("matmul") == "rowwise" else "MatMulNBits"
    assert manifest["graph"].get("matmul", "mlas") == row_matmul.choose(None, "ort", precision, ())[0]
    for name, piece in manifest["pieces"].items():
        q = piece["quantization"]
        assert q["block_size"] == {"int8": 64, "int4": 32}[precision] and q["matmuls_quantized"] > 0, name
        graph = onnx.load(str(bundle / piece["file"]), load_external_data=False).graph
        ops = [n.op_type for n in graph.node]
        weights = {t.name for t in graph.initializer}
        assert qop in ops, name
        assert not [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights], name
        report = piece["parity"]
        assert all(v <= report["tolerance"] for v in report["max_relative_error"].values()), name
        assert all(v <= report["dequantized_tolerance"] for v in report["dequantized_max_relative_error"].values())
        assert all(v >= report["min_top1_agreement"] for v in report["top1_agreement"].values()), name
    shallow = manifest["pieces"]["shallow"]
    graph = onnx.load(str(bundle / shallow["file"]), load_external_data=False).graph
    assert quantize.EMBED not in {t.name for t in graph.initializer} and shallow["quantization"]["float_weights"] == []
    if qop == "RowInvariantMatMulNBits":
        # the tiny model ties its table: shallow reads its rows from deep's LM head, which stores them once
        assert shallow["quantization"]["embedding"] == "rows of deep's LM head"
        assert not [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
        deep = onnx.load(str(bundle / "deep.onnx"), load_external_data=False).graph
        where = {t.name: ExternalDataInfo(t).location for t in deep.initializer}  # "" for the small ones kept inline
        assert where[f"{quantize.LM_HEAD}_q{quantize.BITS[precision]}_rowwise"] == "shallow.onnx.data"
    else:  # the token embedding is read as 8-bit rows, in blocks along the hidden axis, not kept in fp32
        assert shallow["quantization"]["embedding_quantized"] is True
        gather = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
        assert {a.name: helper.get_attribute_value(a) for a in gather.attribute}["bits"] == 8  # at either precision
    assert manifest["pieces"]["deep"]["quantization"]["lm_head_quantized"] is True
    deep = onnx.load(str(bundle / manifest["pieces"]["deep"]["file"]), load_external_data=False).graph
    head = next(n for n in deep.node if n.op_type == qop and n.input[1].startswith(quantize.LM_HEAD))
    # the defaults: the head as its layers, in blocks of 64 at int8 and 32 at int4
    block = {a.name: helper.get_attribute_value(a) for a in head.attribute}["block_size"]
    assert block == {"int8": 64, "int4": 32}[precision]


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_self_speculative_equals_ar_of_the_same_quantized_bundle(quantized_bundles, precision):
    session = load(quantized_bundles[precision])
    for prompt in PROMPTS:
        ar = session.generate(prompt, mode="ar", max_new_tokens=40)
        spec = session.generate(prompt, mode="self", max_new_tokens=40)
        assert spec.tokens == ar.tokens, prompt
        assert spec.stats.drafted > 0


def test_mispacked_weights_fail_parity_naming_the_piece(tmp_path, tiny_checkpoint, monkeypatch):
    def swapped(codes, bits):  # the high and low nibbles the wrong way round
        packed = quantize_pack(codes, bits)
        return ((packed >> 4) | (packed << 4)).astype(np.uint8)

    quantize_pack = quantize._pack
    monkeypatch.setattr(quantize, "_pack", swapped)
    with pytest.raises(SpecExportError, match="piece 'shallow'"):
        build_bundle(tmp_path / "bad", model=str(tiny_checkpoint), context=256, adapter="none", precision="int4")
    assert list(tmp_path.iterdir()) == []  # no bundle, no partial directory


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--flavour", "standard"], "int4 weights need the 'ort' graph flavour (ONNX Runtime's MatMulNBits)"),
    (["--backend", "tensorrt", "--target", "orin-nano"], "TensorRT 10.3 builds fp16 and int8 pieces, not int4"),
])
def test_quantized_precision_refused_where_matmulnbits_cannot_run(tmp_path, tiny_checkpoint, flags, fragment):
    out = tmp_path / "bundle"
    proc = subprocess.run([sys.executable, "-m", "specexport.cli.main", "build", "--out", str(out), "--model",
                           str(tiny_checkpoint), "--precision", "int4", *flags], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], proc.stderr
    assert lines[0].count(". ") == 0
    assert list(tmp_path.iterdir()) == []


def test_unknown_block_size_is_one_sentence():
    with pytest.raises(SpecExportError, match="power of two"):
        quantize.spec_for("int4", block_size=48)
    with pytest.raises(SpecExportError, match="lm_head_block_size = 48 is not a power of two"):
        quantize.spec_for("int4", lm_head_block_size=48)
    with pytest.raises(SpecExportError, match="lm_head_bits = 5; use 4 or 8"):
        quantize.spec_for("int8", lm_head_bits=5)


def _two_matmul_model(w: np.ndarray, head: np.ndarray) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["a", "w"], ["h"], name="mm"),
             helper.make_node("MatMul", ["h", quantize.LM_HEAD], ["y"], name="head")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", w.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", head.shape[1]])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(head, quantize.LM_HEAD)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("precision", "head_bits", "head_block"), [("int4", None, 128), ("int4", 8, 64),
                                                                    ("int8", 4, 32), ("int8", None, 128)])
def test_the_lm_head_takes_its_own_bits_and_block(precision, head_bits, head_block):
    rng = np.random.default_rng(1)
    w, head = rng.standard_normal((160, 160)).astype(np.float32), rng.standard_normal((160, 48)).astype(np.float32)
    spec = quantize.spec_for(precision, lm_head_bits=head_bits, lm_head_block_size=head_block, accuracy_level=0)
    head_spec = spec.for_lm_head()
    assert (head_spec.bits, head_spec.block_size) == (head_bits or spec.bits, head_block)
    model, _ = quantize.quantize_model(_two_matmul_model(w, head), spec)
    attrs = {n.name: {a.name: helper.get_attribute_value(a) for a in n.attribute} for n in model.graph.node}
    assert (attrs["mm_nbits"]["bits"], attrs["mm_nbits"]["block_size"]) == (spec.bits, spec.block_size)
    assert (attrs["head_nbits"]["bits"], attrs["head_nbits"]["block_size"]) == (head_spec.bits, head_block)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a = rng.standard_normal((3, 160)).astype(np.float32)
    want = a @ quantize.fake_quantize(w, spec) @ quantize.fake_quantize(head, head_spec)
    np.testing.assert_allclose(session.run(None, {"a": a})[0], want, rtol=1e-3, atol=1e-3)
    # PyTorch's side of the parity check rounds the head the same way, and the layers as before
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(160, 160, bias=False), torch.nn.Linear(160, 48, bias=False))
    with torch.no_grad():
        net[0].weight.copy_(torch.from_numpy(w.T.copy()))
        net[1].weight.copy_(torch.from_numpy(head.T.copy()))
    quantize.fake_quantize_torch(net, spec, lm_head=net[1])
    np.testing.assert_array_equal(net[0].weight.detach().numpy().T, quantize.fake_quantize(w, spec))
    np.testing.assert_array_equal(net[1].weight.detach().numpy().T, quantize.fake_quantize(head, head_spec))


def test_float_precisions_are_not_quantized():
    assert quantize.spec_for("fp32") is None and quantize.spec_for("fp16") is None


def test_dequantized_weights_round_trip_through_the_packing():
    w = np.random.default_rng(3).standard_normal((64, 10)).astype(np.float32)
    for precision in ("int8", "int4"):
        spec = quantize.spec_for(precision)
        packed = quantize.quantize_weight(w, spec)
        assert packed.packed.shape == (10, 64 // spec.block_size, spec.block_size * spec.bits // 8)
        np.testing.assert_array_equal(quantize.dequantize(packed, spec.bits, spec.block_size),
                                      quantize.fake_quantize(w, spec))


def test_cli_help_lists_precision():
    from click.testing import CliRunner
    from specexport.cli.main import main

    result = CliRunner().invoke(main, ["build", "--help"])
    assert "--precision" in result.output and "int4" in result.output


def test_recipe_precision_and_quantize_overrides_are_used(tmp_path, tiny_checkpoint):
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "tiny"\n[export]\nexit_layer = 2\nprecision = "int4"\n'
                      '[export.quantize]\nblock_size = 16\nsymmetric = true\nlm_head = false\n')
    manifest = build_bundle(tmp_path / "b", recipe=str(recipe), model=str(tiny_checkpoint), context=128,
                            adapter="none").to_dict()
    assert manifest["graph"]["precision"] == "int4"
    deep = manifest["pieces"]["deep"]["quantization"]
    assert deep["block_size"] == 16 and deep["symmetric"] is True
    assert deep["lm_head_quantized"] is False and deep["float_weights"] == ["lm_head"]


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_one_token_calls_equal_rows_of_a_verification_call_bit_for_bit(quantized_bundles, precision):
    # int8 activations amplify last-bit differences between GQA's one-row and multi-row paths; the
    # exporter keeps every call multi-row, so splitting a call must not change a single bit
    # (gqa graphs pad attention, rowwise ones need not; the session pads the rest where this machine needs it)
    manifest = json.loads((quantized_bundles[precision] / "manifest.json").read_text())
    assert manifest["pieces"]["deep"]["min_rows"] == 1 and manifest["pieces"]["shallow"]["min_rows"] == 1
    session = load(quantized_bundles[precision])
    graph_pads = "none" if manifest["graph"].get("attention") == "rowwise" else "attention"  # rowwise: no copy
    assert session.one_row_calls in (graph_pads, "session")
    deep = session.pieces.deep
    rng = np.random.default_rng(1)
    prefix = rng.standard_normal((1, 20, 64)).astype(np.float32)
    h = rng.standard_normal((1, 6, 64)).astype(np.float32)

    def run(chunks: list[int], start: int = 20) -> np.ndarray:
        deep.run(prefix, 0)
        outs, pos = [], start
        for n in chunks:
            outs.append(deep.run(h[:, pos - start:pos - start + n], pos, keep=n)["logits"])
            pos += n
        return np.concatenate(outs, axis=1)

    whole = run([6])
    np.testing.assert_array_equal(run([1] * 6), whole)
    np.testing.assert_array_equal(run([1, 2, 3]), whole)
    # the last cache slot has no room for the appended row: the call still runs
    deep.run(rng.standard_normal((1, 255, 64)).astype(np.float32), 0)
    assert np.isfinite(deep.run(h[:, :1], 255)["logits"]).all()


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_a_tree_calls_leading_chain_rows_are_ar_bit_for_bit_when_quantized(quantized_bundles, precision):
    # the rows `tree.settle` makes final are AR's to the bit; the others sum over masked slots and need not be
    leading_rows_are_ar_bit_for_bit(load(quantized_bundles[precision]).pieces, 64)


def test_drafting_pieces_take_the_recipes_drafting_precision(tmp_path, tiny_checkpoint):
    """An fp32 bundle whose adapter and drafter are int8 (the recipe's [export.drafting_precision]): the output
    path stays fp32, the drafting pieces pass int8's parity against PyTorch running their rounded weights, and
    every mode that drafts with them still gives AR's tokens."""
    from specexport.doctor.tiny import make_noisy_drafter

    make_noisy_drafter(tiny_checkpoint, tmp_path / "drafter")
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "tiny"\n[export]\nexit_layer = 2\n[export.drafting_precision]\nfp32 = "int8"\n'
                      'int4 = "int8"\n')
    bundle = tmp_path / "b"
    manifest = build_bundle(bundle, recipe=str(recipe), model=str(tiny_checkpoint), context=256,
                            adapter="untrained", drafter=str(tmp_path / "drafter")).to_dict()
    assert manifest["graph"]["precision"] == "fp32" and manifest["graph"]["quantization"] is None
    for name in ("shallow", "deep"):
        assert manifest["pieces"][name]["quantization"] is None, name
        ops = {n.op_type for n in onnx.load(str(bundle / f"{name}.onnx"), load_external_data=False).graph.node}
        assert "MatMulNBits" not in ops, name
    for name in ("adapter", "drafter"):
        piece = manifest["pieces"][name]
        assert piece["quantization"]["bits"] == 8 and piece["quantization"]["lm_head_quantized"] is True, name
        ops = {n.op_type for n in onnx.load(str(bundle / piece["file"]), load_external_data=False).graph.node}
        assert "MatMulNBits" in ops, name
        report = piece["parity"]
        assert report["tolerance"] == 0.2 and report["dequantized_tolerance"] == 0.25, name  # int8's, not fp32's
        assert all(v <= report["dequantized_tolerance"] for v in report["dequantized_max_relative_error"].values())
        assert all(v >= report["min_top1_agreement"] for v in report["top1_agreement"].values()), name
    weights = {name: piece["weights"] for name, piece in inspect_bundle(bundle)["pieces"].items()}
    assert weights == {"shallow": "fp32", "deep": "fp32", "adapter": "int8", "drafter": "int8"}
    session = load(bundle)
    for prompt in PROMPTS:
        ar = session.generate(prompt, mode="ar", max_new_tokens=40)
        for mode in ("self", "model", "auto"):
            spec = session.generate(prompt, mode=mode, max_new_tokens=40)
            assert spec.tokens == ar.tokens, (prompt, mode)
            assert spec.stats.drafted > 0, (prompt, mode)


@pytest.mark.parametrize(("table", "message"), [
    ('"int8"', "is not a table"),
    ('{ bf16 = "int8" }', "'bf16', not a bundle precision"),
    ('{ fp32 = "fp16" }', 'fp32 = \'fp16\'; use "int8" or "int4"'),
])
def test_a_wrong_drafting_precision_is_one_sentence(tmp_path, tiny_checkpoint, table, message):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'name = "tiny"\n[export]\nexit_layer = 2\ndrafting_precision = {table}\n')
    with pytest.raises(SpecExportError, match=message) as err:
        build_bundle(tmp_path / "b", recipe=str(recipe), model=str(tiny_checkpoint), context=128, adapter="none")
    assert str(err.value).count(". ") == 0
    assert not (tmp_path / "b").exists()


def test_drafting_precision_applies_to_the_ort_flavour_only():
    table = {"fp32": "int8", "fp16": "int4"}
    assert quantize.drafting_precision(table, "fp32", "ort") == "int8"
    assert quantize.drafting_precision(table, "int4", "ort") == "int4"  # no entry: the bundle's own
    assert quantize.drafting_precision(table, "fp16", "standard") == "fp16"  # MatMulNBits is ONNX Runtime's
    assert quantize.drafting_precision(None, "fp32", "ort") == "fp32"


@pytest.mark.parametrize(("choice", "bits"), [("int4", 4), ("bundle", None)])
def test_build_takes_the_drafting_precision_from_the_command_line(tmp_path, tiny_checkpoint, choice, bits):
    out = tmp_path / "b"
    proc = subprocess.run([sys.executable, "-m", "specexport.cli.main", "build", "--out", str(out), "--model",
                           str(tiny_checkpoint), "--context", "128", "--adapter", "untrained",
                           "--drafting-precision", choice, "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    pieces = json.loads(proc.stdout)["pieces"]
    assert (pieces["adapter"]["quantization"] or {}).get("bits") == bits
    assert pieces["deep"]["quantization"] is None  # the bundle stays fp32


def test_an_unknown_drafting_precision_argument_is_one_sentence(tmp_path, tiny_checkpoint):
    with pytest.raises(SpecExportError, match="'fp16' is unknown; use bundle, int8 or int4") as err:
        build_bundle(tmp_path / "b", model=str(tiny_checkpoint), context=128, adapter="none",
                     drafting_precision="fp16")
    assert str(err.value).count(". ") == 0 and not (tmp_path / "b").exists()
