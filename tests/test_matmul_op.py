"""specexport.RowInvariantMatMulNBits (native/row_matmul.cc, exporter/row_matmul.py): the operator against a NumPy
reference of its arithmetic and against ONNX Runtime's MatMulNBits, every row of a many-row call bit for bit that
row's one-row call, each vector path (AVX2, AVX-512 VNNI) bit for bit the portable one, and tiny int4 and int8
bundles built with `--attention rowwise --matmul rowwise` whose every mode gives AR's tokens with no one-row
padding."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from specexport.exporter import quantize, row_matmul
from specexport.exporter.build import build_bundle
from specexport.runtime import attention_op, load
from specexport.runtime.errors import SpecExportError

from .conftest import make_noisy_drafter
from .test_rowwise_bundles import every_mode_gives_ar_tokens

pytestmark = pytest.mark.skipif(not attention_op.available(), reason="the operator library is not built")

# (K, N, bits, block, symmetric): ragged K and N, every block size the kernels unroll, both zero-point forms
SHAPES = [(64, 24, 4, 32, False), (100, 13, 8, 64, False), (300, 21, 4, 128, True), (96, 40, 8, 32, True),
          (512, 16, 4, 256, False), (70, 9, 8, 256, False)]


def nbits_model(k: int, n: int, bits: int, block: int, symmetric: bool, seed: int = 0):
    """A one-node MatMulNBits model of random weights quantized as the exporter does, and the packed weight."""
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    pw = quantize.quantize_weight(w, quantize.QuantSpec(bits=bits, block_size=block, symmetric=symmetric,
                                                        search=False))
    inits = [numpy_helper.from_array(pw.packed, "B"), numpy_helper.from_array(pw.scales, "S")]
    if pw.zero_points is not None:
        inits.append(numpy_helper.from_array(pw.zero_points, "Z"))
    node = helper.make_node("MatMulNBits", ["A", *(t.name for t in inits)], ["Y"], domain="com.microsoft", K=k, N=n,
                            bits=bits, block_size=block, accuracy_level=4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets), pw


def open_model(model, threads: int = 1, isa: str | None = None) -> ort.InferenceSession:
    """A session on `model`; `isa` ('portable', 'avx2') forces that path of the operator (read when its kernel is
    made)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    attention_op.register(opts)
    old = os.environ.pop("SPECEXPORT_MATMUL_ISA", None)
    if isa is not None:
        os.environ["SPECEXPORT_MATMUL_ISA"] = isa
        # the library reads the variable as the kernel will: the path forced is the path taken
        assert attention_op.matmul_isa() == isa, f"SPECEXPORT_MATMUL_ISA={isa} did not take effect"
    try:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    finally:
        os.environ.pop("SPECEXPORT_MATMUL_ISA", None)
        if old is not None:
            os.environ["SPECEXPORT_MATMUL_ISA"] = old


def rowwise(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    assert row_matmul.use_rowwise(out) == 1
    return out


def reference(a: np.ndarray, pw: quantize.PackedWeight, bits: int, block: int) -> np.ndarray:
    """The operator's arithmetic in NumPy: activations to int8 codes per block, exact integer block dot
    products with the weight codes less zero point * code sum, a float32 sum over blocks in block order."""
    m, k = a.shape
    blocks = -(-k // block)
    padded = np.zeros((m, blocks * block), np.float32)
    padded[:, :k] = a
    padded = padded.reshape(m, blocks, block)
    scale = (np.abs(padded).max(-1) / np.float32(127)).astype(np.float32)
    inv = np.where(scale > 0, np.float32(1) / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    q = np.clip(np.rint(padded * inv[..., None]), -127, 127).astype(np.int64)
    codes = quantize._unpack(pw.packed, bits, block).astype(np.int64)  # [N, blocks, block]
    if pw.zero_points is None:
        zero = np.full((pw.n, blocks), 1 << (bits - 1), np.int64)
    else:
        zero = quantize._unpack(pw.zero_points.reshape(pw.n, -1), bits, blocks).astype(np.int64)
    dots = np.einsum("mbk,nbk->mnb", q, codes) - zero[None] * q.sum(-1)[:, None, :]
    wscale = pw.scales.reshape(pw.n, blocks)
    acc = np.zeros((m, pw.n), np.float32)
    for b in range(blocks):  # float64 holds the product exactly: one rounding, as a fused multiply-add
        s = (scale[:, b:b + 1] * wscale[None, :, b]).astype(np.float32)
        acc = (dots[..., b].astype(np.float64) * s + acc).astype(np.float32)
    return acc


@pytest.mark.parametrize("k,n,bits,block,symmetric", SHAPES)
def test_the_operator_computes_its_arithmetic_and_matmulnbits_result(k, n, bits, block, symmetric):
    model, pw = nbits_model(k, n, bits, block, symmetric)
    a = np.random.default_rng(1).standard_normal((7, k)).astype(np.float32)
    a[3] = 0.0  # an all-zero row: scale 0, no division by it
    ours = open_model(rowwise(model)).run(None, {"A": a})[0]
    np.testing.assert_array_equal(ours, reference(a, pw, bits, block))  # its arithmetic, bit for bit
    mlas = open_model(model).run(None, {"A": a})[0]
    # both quantize the activations to int8 per block: they differ by rounding, far below quantization error
    exact = a @ quantize.dequantize(pw, bits, block)
    assert np.abs(ours - mlas).max() <= 1e-3 * np.abs(exact).max()
    assert np.abs(ours - exact).max() <= 0.05 * np.abs(exact).max()
    assert not ours[3].any()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from(SHAPES[:4]), rows=st.integers(1, 32), batch=st.sampled_from([(), (1,), (2,), (3, 1)]),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_each_row_is_that_row_computed_alone(shape, rows, batch, threads, seed):
    k, n = shape[:2]
    session = open_model(rowwise(nbits_model(*shape)[0]), threads)
    a = (np.random.default_rng(seed).standard_normal((*batch, rows, k)) * 3).astype(np.float32)
    whole = session.run(None, {"A": a})[0]
    assert whole.shape == (*batch, rows, n)
    flat_a, flat = a.reshape(-1, k), whole.reshape(-1, n)
    for r in range(flat_a.shape[0]):
        alone = session.run(None, {"A": flat_a[r:r + 1]})[0]
        np.testing.assert_array_equal(alone[0], flat[r], err_msg=f"row {r} of {flat_a.shape[0]}")


def test_the_doctor_names_the_matmul_path():
    from specexport.doctor.attention_op import probe_attention_op

    probe = probe_attention_op()
    assert probe.details["matmul_isa"] == attention_op.matmul_isa() in ("avx512vnni", "avx2", "portable")
    assert f"{attention_op.MATMUL_OP_TYPE} its {attention_op.matmul_isa()} path" in probe.why


def fast_and_portable(model) -> tuple[dict[str, ort.InferenceSession], ort.InferenceSession]:
    """Sessions on `model` taking each vector path this CPU has (by name, 2 threads: the widest, and AVX2 forced
    where the widest is AVX-512) and the portable path; a skip where this CPU has no vector path to compare."""
    widest = attention_op.matmul_isa()
    if widest == "portable":
        pytest.skip("this CPU takes the portable path only")
    fast = {widest: open_model(model, 2)}
    if widest != "avx2":
        fast["avx2"] = open_model(model, 2, isa="avx2")
    return fast, open_model(model, 1, isa="portable")


def test_the_vector_paths_give_the_portable_paths_bits():
    for shape in SHAPES:
        fast, portable = fast_and_portable(rowwise(nbits_model(*shape, seed=3)[0]))
        for rows in (1, 2, 3, 5, 8, 13):
            a = (np.random.default_rng(rows).standard_normal((rows, shape[0])) * 2).astype(np.float32)
            want = portable.run(None, {"A": a})[0]
            for isa, session in fast.items():
                np.testing.assert_array_equal(session.run(None, {"A": a})[0], want,
                                              err_msg=f"{isa}, {shape}, {rows} rows")


def test_the_vector_paths_quantize_awkward_activations_as_the_portable_path():
    """The activations' int8 codes (vectorised on the AVX2 and AVX-512 paths): an all-zero block (scale 0), codes
    exactly half-way between two integers (rounded to even), signed zeros, subnormals and huge values."""
    k, n, bits, block, symmetric = SHAPES[1]  # K = 100 in blocks of 64: the last block cut short
    fast, portable = fast_and_portable(rowwise(nbits_model(k, n, bits, block, symmetric, seed=5)[0]))
    rows = np.zeros((6, k), np.float32)
    rows[1, :64] = np.arange(64) - 31.5  # max 32.5: codes of x * 127 / 32.5, several ties among them
    rows[1, 64:] = 127.0 * np.where(np.arange(k - 64) % 2, 0.5, -2.5) / 127.0  # inv = 1 / (2.5 / 127)
    rows[2] = np.where(np.arange(k) % 3, -0.0, 1e-42)  # subnormals beside negative zeros
    rows[3] = np.linspace(-3e38, 3e38, k)
    rows[4, :64] = 1.0
    rows[4, 64:] = -0.0
    rows[5] = np.random.default_rng(9).standard_normal(k) * 1e-3
    rows[5, 10] = 127.0 / 2 * 1e-3  # a tie at code 63.5
    want = portable.run(None, {"A": rows})[0]
    for isa, session in fast.items():
        np.testing.assert_array_equal(session.run(None, {"A": rows})[0], want, err_msg=isa)


# (K, N, bits, block, symmetric) for the gated epilogue: halves of whole tiles (gate and up computed side by side)
# and halves that share a tile (the epilogue after every tile)
GATED = [(64, 48, 4, 32, False), (100, 26, 8, 64, False), (300, 80, 4, 128, True), (96, 18, 4, 32, True)]


def gated_model(k: int, n: int, bits: int, block: int, symmetric: bool, seed: int = 0, gate_read: bool = False):
    """MatMulNBits over [gate; up], Split in halves, Mul(gate, Sigmoid(gate)), Mul with up: the exporter's SiLU
    MLP; `gate_read`: gate is a graph output too (then the chain must stay)."""
    model, pw = nbits_model(k, n, bits, block, symmetric, seed)
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.array([n // 2, n // 2], np.int64), "halves"))
    graph.node.extend([helper.make_node("Split", ["Y", "halves"], ["gate", "up"], axis=-1),
                       helper.make_node("Sigmoid", ["gate"], ["sg"]), helper.make_node("Mul", ["gate", "sg"], ["act"]),
                       helper.make_node("Mul", ["act", "up"], ["H"])])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("H", TensorProto.FLOAT, None))
    if gate_read:
        graph.output.append(helper.make_tensor_value_info("gate", TensorProto.FLOAT, None))
    return model, pw


def silu_mul_reference(y: np.ndarray) -> np.ndarray:
    g, u = np.split(y.astype(np.float64), 2, axis=-1)
    return g / (1 + np.exp(-g)) * u


def attribute(node, name: str):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


@pytest.mark.parametrize("k,n,bits,block,symmetric", GATED)
def test_the_gated_operator_is_silu_of_gate_times_up(k, n, bits, block, symmetric):
    model, pw = gated_model(k, n, bits, block, symmetric)
    fused = rowwise(model)
    assert [(node.op_type, attribute(node, "gated")) for node in fused.graph.node] == [
        (attention_op.MATMUL_OP_TYPE, b"silu")]
    assert {t.name for t in fused.graph.initializer} == set(fused.graph.node[0].input[1:])  # the sizes are gone
    a = (np.random.default_rng(2).standard_normal((9, k)) * 4).astype(np.float32)
    a[4] = 0.0
    ours = open_model(fused).run(None, {"A": a})[0]
    assert ours.shape == (9, n // 2)
    want = silu_mul_reference(reference(a, pw, bits, block))
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    unfused = open_model(model).run(None, {"A": a})[0]  # MatMulNBits and ONNX Runtime's SiLU: rounding apart
    assert np.abs(ours - unfused).max() <= 1e-3 * np.abs(unfused).max()
    assert not ours[4].any()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from(GATED), rows=st.integers(1, 32), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_each_gated_row_is_that_row_computed_alone(shape, rows, threads, seed):
    session = open_model(rowwise(gated_model(*shape)[0]), threads)
    a = (np.random.default_rng(seed).standard_normal((1, rows, shape[0])) * 3).astype(np.float32)
    whole = session.run(None, {"A": a})[0]
    assert whole.shape == (1, rows, shape[1] // 2)
    for r in range(rows):
        np.testing.assert_array_equal(session.run(None, {"A": a[:, r:r + 1]})[0][0, 0], whole[0, r], err_msg=f"row {r}")


def test_the_gated_vector_paths_give_the_portable_paths_bits():
    for shape in GATED:
        fast, portable = fast_and_portable(rowwise(gated_model(*shape, seed=5)[0]))
        for rows, spread in ((1, 1), (3, 4), (8, 30), (13, 200)):  # up to gates far past the exp's clamps
            a = (np.random.default_rng(rows).standard_normal((rows, shape[0])) * spread).astype(np.float32)
            want = portable.run(None, {"A": a})[0]
            assert np.isfinite(want).all()
            for isa, session in fast.items():
                np.testing.assert_array_equal(session.run(None, {"A": a})[0], want,
                                              err_msg=f"{isa}, {shape}, {rows} rows")


def test_the_fusion_takes_only_the_exact_silu_chain():
    def rewritten(model):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        row_matmul.use_rowwise(out)
        return [n.op_type for n in out.graph.node], attribute(out.graph.node[0], "gated")

    assert rewritten(gated_model(64, 48, 4, 32, False, gate_read=True)[0]) == (
        [attention_op.MATMUL_OP_TYPE, "Split", "Sigmoid", "Mul", "Mul"], None)
    uneven, _ = gated_model(64, 48, 4, 32, False)
    uneven.graph.initializer[-1].CopyFrom(numpy_helper.from_array(np.array([16, 32], np.int64), "halves"))
    assert rewritten(uneven)[1] is None
    tanh, _ = gated_model(64, 48, 4, 32, False)
    tanh.graph.node[2].op_type = "Tanh"  # not SiLU (a GELU chain has no Sigmoid either)
    assert rewritten(tanh)[1] is None
    swapped, _ = gated_model(64, 48, 4, 32, False)
    swapped.graph.node[3].input[:] = ["sg", "gate"]  # the same products in the other order: still SiLU
    swapped.graph.node[4].input[:] = ["up", "act"]
    assert rewritten(swapped) == ([attention_op.MATMUL_OP_TYPE], b"silu")


def test_the_rewrite_and_its_refusals(monkeypatch):
    model, _ = nbits_model(64, 24, 4, 32, False)
    out = rowwise(model)
    node = out.graph.node[0]
    assert (node.op_type, node.domain) == (attention_op.MATMUL_OP_TYPE, attention_op.DOMAIN)
    assert {t.name for t in out.graph.initializer} == set(node.input[1:])  # MatMulNBits's weights are gone
    assert any(o.domain == attention_op.DOMAIN for o in out.opset_import)
    level1 = onnx.ModelProto()
    level1.CopyFrom(model)
    next(a for a in level1.graph.node[0].attribute if a.name == "accuracy_level").i = 1
    with pytest.raises(SpecExportError, match=r"accuracy_level 1.*quantizes activations to int8 as level 4 does"):
        row_matmul.use_rowwise(level1)
    row_matmul.check_choice("mlas", "standard", "fp16", (16,))  # nothing to check
    for args, words in [(("fast", "ort", "int4", (32,)), "unknown matmul 'fast'"),
                        (("rowwise", "ort", "fp32", ()), "replaces the int4/int8 'ort' pieces' MatMulNBits"),
                        (("rowwise", "standard", "int4", (32,)), "replaces the int4/int8"),
                        (("rowwise", "ort", "int4", (32, 16)), "blocks of 32 to 256 values.*blocks of 16")]:
        with pytest.raises(SpecExportError, match=words):
            row_matmul.check_choice(*args)
    monkeypatch.setattr(attention_op, "load_error", lambda: "specexport was installed without its attention operator")
    with pytest.raises(SpecExportError, match="needs the operator to check the pieces, but specexport was installed"):
        row_matmul.check_choice("rowwise", "ort", "int8", (64,))


def test_int4_weights_in_another_packing_are_refused():
    """int4 weights repacked for an older layout would be read as other codes: the kernel refuses them by name."""
    out = rowwise(nbits_model(64, 24, 4, 32, False)[0])
    node = out.graph.node[0]
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "packing")) == row_matmul.PACKING
    open_model(out)
    for packing in (None, row_matmul.PACKING - 1):
        old = onnx.ModelProto()
        old.CopyFrom(out)
        kept = [a for a in old.graph.node[0].attribute if a.name != "packing"]
        del old.graph.node[0].attribute[:]
        old.graph.node[0].attribute.extend(kept + ([helper.make_attribute("packing", packing)] if packing else []))
        with pytest.raises(Exception, match=r"int4 weights are packed in an older layout.*rebuild the bundle"):
            open_model(old)
    int8 = rowwise(nbits_model(96, 40, 8, 32, True)[0])
    assert not any(a.name == "packing" for a in int8.graph.node[0].attribute)  # int8's layout is unchanged
    open_model(int8)


@pytest.fixture(scope="module")
def rowwise_mm_bundle(tmp_path_factory, tiny_checkpoint):
    """precision -> a tiny bundle with both rowwise operators, an untrained adapter and a noisy drafter."""
    root = tmp_path_factory.mktemp("rowwise-matmul")
    drafter = make_noisy_drafter(tiny_checkpoint, root / "drafter")
    built = {}

    def build(precision: str):
        if precision not in built:
            build_bundle(root / precision, model=str(tiny_checkpoint), drafter=str(drafter), adapter="untrained",
                         exit_layer=2, context=256, flavour="ort", precision=precision, attention="rowwise",
                         matmul="rowwise", drafting_precision="int8" if precision == "int4" else None)
            built[precision] = root / precision
        return built[precision]

    return build


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_bundles_with_both_operators_decode_as_ar_without_padding(rowwise_mm_bundle, precision):
    session = load(rowwise_mm_bundle(precision))
    assert session.bundle.manifest.graph.matmul == "rowwise"
    gated = {}
    for name, spec in session.bundle.manifest.pieces.items():
        nodes = onnx.load(str(session.bundle.root / spec.file), load_external_data=False).graph.node
        ops = {n.op_type for n in nodes}
        assert attention_op.MATMUL_OP_TYPE in ops and "MatMulNBits" not in ops, name
        # every SiLU MLP runs in the operator's gated epilogue: no Split or Sigmoid left in any piece
        assert not ops & {"Split", "Sigmoid"}, name
        gated[name] = sum(attribute(n, "gated") == b"silu" for n in nodes)
    assert gated["shallow"] > 0 and gated["deep"] > 0, gated  # the pieces holding decoder layers
    assert session.one_row_calls == "none"  # the load-time probe found one-row calls rounding as rows of many
    from specexport.runtime.inspect_bundle import inspect_bundle, render

    assert f"matmul rowwise (specexport.{attention_op.MATMUL_OP_TYPE}; loads here)" in render(
        inspect_bundle(session.bundle.root))
    every_mode_gives_ar_tokens(session, precision)


def test_load_refuses_a_rowwise_matmul_bundle_without_the_library(rowwise_mm_bundle, monkeypatch):
    root = rowwise_mm_bundle("int8")
    monkeypatch.setattr(attention_op, "load_error", lambda: "specexport was installed without its attention operator")
    with pytest.raises(SpecExportError, match=r"row-invariant (attention|matmul) operator") as err:
        load(root)
    assert str(err.value).count(". ") == 0


def test_a_batch_scheduler_opened_from_the_path_registers_the_library(rowwise_mm_bundle):
    """Batched verification opens the pieces itself: every request gets its AR tokens, with no padded rows."""
    from specexport.runtime.batching import BatchScheduler

    from .test_batching_rowwise import JOBS, tokens_of

    root = rowwise_mm_bundle("int4")
    session = load(root)
    want = [session.generate(p, mode="ar", max_new_tokens=n).tokens for p, _, n in JOBS]
    opts = session.options()
    with BatchScheduler(root, max_batch=3) as scheduler:
        requests = [scheduler.submit(session.prompt_ids(p, opts), mode=m, max_new_tokens=n) for p, m, n in JOBS]
        got = [tokens_of(r) for r in requests]
        assert scheduler.one_row_calls != "session"
    assert got == want


def test_the_default_matmul_per_precision_and_its_fallbacks(monkeypatch):
    int4, int8 = quantize.spec_for("int4"), quantize.spec_for("int8")
    assert row_matmul.choose(None, "ort", "int4", (int4, int8)) == ("rowwise", None)
    assert row_matmul.choose(None, "ort", "int8", (int8,)) == ("rowwise", None)
    assert row_matmul.choose(None, "ort", "fp32", (None, int8)) == ("mlas", None)  # fp32 pieces, int8 drafting
    assert row_matmul.choose("mlas", "ort", "int4", (int4,)) == ("mlas", None)
    # a recipe's quantization the operator does not take keeps MatMulNBits rather than failing the build
    assert row_matmul.choose(None, "ort", "int4", (quantize.spec_for("int4", accuracy_level=0),)) == ("mlas", None)
    assert row_matmul.choose(None, "ort", "int4", (quantize.spec_for("int4", block_size=16),)) == ("mlas", None)
    monkeypatch.setattr(attention_op, "load_error", lambda: "the library is gone")
    choice, note = row_matmul.choose(None, "ort", "int4", (int4,))
    assert choice == "mlas" and note == "building with ONNX Runtime's MatMulNBits (--matmul mlas): the library is gone"
    with pytest.raises(SpecExportError, match="needs the operator"):
        row_matmul.choose("rowwise", "ort", "int4", (int4,))
