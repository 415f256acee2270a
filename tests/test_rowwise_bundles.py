"""Bundles built with --attention rowwise (exporter/row_attention.py) on the tiny random Llama, at fp32, int8 and
int4: the manifest and the graphs say so, one-row calls carry no copied row, verification rows are one-token
calls bit for bit, every mode gives AR's tokens, and a runtime without the operator refuses in one sentence."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from specexport.exporter.build import build_bundle
from specexport.runtime import attention_op, load
from specexport.runtime.decode import ids_array
from specexport.runtime.errors import SpecExportError

from .conftest import make_noisy_drafter, run_in_chunks
from .test_tree_attention import leading_rows_are_ar_bit_for_bit

pytestmark = pytest.mark.skipif(not attention_op.available(), reason="the attention operator is not built")

PRECISIONS = ("fp32", "int8", "int4")
PROMPTS = ["hash table", "the quick brown fox", "write a haiku about the sea"]
SYSTEMS = {
    "self": {"mode": "self"},
    "model": {"mode": "model"},
    "lookup": {"mode": "lookup"},
    "auto": {"mode": "auto"},
    "tree": {"mode": "model", "tree": "4:3:2:10:0.08:0.3"},
    "pearl": {"mode": "model", "schedule": "pearl"},
}


@pytest.fixture(scope="module")
def rowwise_bundle(tmp_path_factory, tiny_checkpoint):
    """precision -> a tiny rowwise bundle with an untrained adapter and a noisy drafter, built once."""
    root = tmp_path_factory.mktemp("rowwise")
    drafter = make_noisy_drafter(tiny_checkpoint, root / "drafter")
    built: dict[str, Path] = {}

    def build(precision: str) -> Path:
        if precision not in built:
            out = root / precision
            build_bundle(out, model=str(tiny_checkpoint), drafter=str(drafter), adapter="untrained", exit_layer=2,
                         context=256, flavour="ort", precision=precision, attention="rowwise",
                         # the tiny drafter's int4 logits are off PyTorch's by more than int4's parity allows
                         drafting_precision="int8" if precision == "int4" else None)
            built[precision] = out
        return built[precision]

    return build


@pytest.mark.parametrize("precision", PRECISIONS)
def test_manifest_and_graphs_use_the_operator(rowwise_bundle, precision):
    root = rowwise_bundle(precision)
    session = load(root)
    manifest = session.bundle.manifest
    assert manifest.graph.attention == "rowwise"
    for name, spec in manifest.pieces.items():
        ops = {n.op_type for n in onnx.load(str(root / spec.file), load_external_data=False).graph.node}
        assert attention_op.OP_TYPE in ops and "GroupQueryAttention" not in ops, name
    # no copied row in the graphs: attention rounds a one-row call as a row of many
    assert manifest.pieces["shallow"].one_row_padding == manifest.pieces["deep"].one_row_padding == "none"
    assert manifest.pieces["deep"].min_rows == 1
    # the weight MatMuls may still need the session's padding on this CPU, as its load-time probe decides (the
    # kernels' rounding of a one-row call depends on the CPU's paths, AVX-512 VNNI's among them): what the
    # session does is what the probe, run again on its unwrapped pieces, says; that its output is AR's is the
    # next test's
    from specexport.runtime.backends.common import WrappedPiece
    from specexport.runtime.row_padding import one_row_calls_match

    raw = SimpleNamespace(**{name: p.piece if isinstance(p, WrappedPiece) else p
                             for name, p in (("shallow", session.pieces.shallow), ("deep", session.pieces.deep))})
    match = one_row_calls_match(raw, manifest.model.dims.vocab)
    assert session.one_row_calls == ("none" if match else "session")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_verification_rows_are_one_token_calls_bit_for_bit(rowwise_bundle, precision):
    session = load(rowwise_bundle(precision))
    pieces = session.pieces
    ids = (session.prompt_ids("the quick brown fox jumps over the lazy dog", session.options()) * 4)[:68]
    prompt, chain = ids[:56], ids[56:]  # the chain crosses slot 64
    hidden_prompt = pieces.shallow.run(ids_array(prompt), 0)["hidden"].copy()
    whole = {}
    for chunks in ([12], [1] * 12, [1, 2, 3, 2, 4]):
        hidden = run_in_chunks(pieces.shallow, ids_array(prompt), ids_array(chain), chunks, "hidden")
        logits = run_in_chunks(pieces.deep, hidden_prompt, whole.get("hidden", hidden), chunks, "logits")
        if not whole:
            whole = {"hidden": hidden, "logits": logits}
            continue
        np.testing.assert_array_equal(hidden, whole["hidden"], err_msg=f"shallow, calls of {chunks} rows")
        np.testing.assert_array_equal(logits, whole["logits"], err_msg=f"deep, calls of {chunks} rows")
    leading_rows_are_ar_bit_for_bit(pieces, session.bundle.manifest.model.dims.hidden)


def every_mode_gives_ar_tokens(session, label: str) -> None:
    """Every system of SYSTEMS gives AR's tokens on every prompt, and some of them drafted."""
    drafted = 0
    for prompt in PROMPTS:
        ar = session.generate(prompt, max_new_tokens=48, mode="ar")
        assert len(ar.tokens) > 10
        for system, opts in SYSTEMS.items():
            out = session.generate(prompt, max_new_tokens=48, **opts)
            assert out.tokens == ar.tokens, (label, system, prompt)
            drafted += out.stats.drafted
    assert drafted > 0


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_mode_gives_ar_tokens(rowwise_bundle, precision):
    every_mode_gives_ar_tokens(load(rowwise_bundle(precision)), precision)


def test_load_refuses_without_the_operator(rowwise_bundle, monkeypatch):
    root = rowwise_bundle("fp32")
    missing = f"specexport was installed without its attention operator; {attention_op.HOW_TO_BUILD}"
    monkeypatch.setattr(attention_op, "load_error", lambda: missing)
    with pytest.raises(SpecExportError, match=r"row-invariant attention operator.*--attention gqa") as err:
        load(root)
    assert str(err.value).count(". ") == 0  # one sentence


def test_rowwise_needs_the_ort_flavour(tmp_path, tiny_checkpoint):
    with pytest.raises(SpecExportError, match="--attention rowwise replaces the 'ort' flavour"):
        build_bundle(tmp_path / "b", model=str(tiny_checkpoint), context=256, adapter="none", flavour="standard",
                     attention="rowwise")


def test_inspect_and_doctor_report_it(rowwise_bundle, monkeypatch):
    from specexport.doctor.attention_op import probe_attention_op
    from specexport.runtime.inspect_bundle import inspect_bundle, render

    text = render(inspect_bundle(rowwise_bundle("fp32")))
    assert f"attention rowwise (specexport.{attention_op.OP_TYPE}; loads here)" in text
    assert probe_attention_op().verdict == "ok"
    monkeypatch.setattr(attention_op, "load_error", lambda: "specexport was installed without its attention operator")
    assert "cannot load here: specexport was installed without" in render(inspect_bundle(rowwise_bundle("fp32")))
    missing = probe_attention_op()
    assert missing.verdict == "warning" and "--attention rowwise will not load" in missing.why


def test_choices_the_operator_cannot_honour_are_refused(monkeypatch):
    from specexport.exporter import row_attention

    row_attention.check_choice("gqa", "standard", "fp16", "float")  # today's graphs: nothing to check
    for args, words in [(("flash", "ort", "fp32", "float"), "unknown attention 'flash'"),
                        (("rowwise", "ort", "fp16", "float"), "computes in fp32"),
                        (("rowwise", "ort", "int4", "int8"), "kv_cache = 'int8'")]:
        with pytest.raises(SpecExportError, match=words):
            row_attention.check_choice(*args)
    monkeypatch.setattr(attention_op, "load_error", lambda: "specexport was installed without its attention operator")
    with pytest.raises(SpecExportError, match="needs the operator to check the pieces, but specexport was installed"):
        row_attention.check_choice("rowwise", "ort", "fp32", "float")


def test_the_rewrite_keeps_inputs_and_refuses_what_it_cannot_run():
    from onnx import helper
    from specexport.exporter import row_attention

    inputs = ["qkv", "", "", "pk", "pv", "seqlens_k", "total", "cos", "sin", "pos", "bias"]
    node = helper.make_node("GroupQueryAttention", inputs, ["o", "k", "v"], domain="com.microsoft", num_heads=4,
                            kv_num_heads=2, do_rotary=1, rotary_interleaved=0, scale=0.25)
    model = helper.make_model(helper.make_graph([node], "g", [], []))
    assert row_attention.use_rowwise(model) == 1
    out = model.graph.node[0]
    assert (out.op_type, out.domain, list(out.input)) == (attention_op.OP_TYPE, attention_op.DOMAIN, inputs)
    assert {a.name for a in out.attribute} == {"num_heads", "kv_num_heads", "do_rotary", "scale"}
    assert any(o.domain == attention_op.DOMAIN for o in model.opset_import)
    quantized = helper.make_node("GroupQueryAttention", [*inputs, "", "ks", "vs"], ["o", "k", "v"],
                                 domain="com.microsoft", num_heads=4, kv_num_heads=2, k_quant_type="PER_CHANNEL")
    with pytest.raises(SpecExportError, match="build with --attention gqa"):
        row_attention.use_rowwise(helper.make_model(helper.make_graph([quantized], "g", [], [])))


@pytest.mark.parametrize("arch", ["qwen3", "phi3", "gemma3_text", "mistral"])
def test_families_with_the_operator(tmp_path, arch):
    """q/k norms, partial rotary, sliding windows and Gemma's local RoPE table through the operator: the build's
    parity checks pass, every mode gives AR's tokens, and a token tree deeper than the window gives each branch
    exactly the logits of that branch run as a chain (no masked slot changes a row's arithmetic)."""

    from .conftest import make_arch_checkpoint
    from .test_architectures import CONTEXT, DEEP_TREE, EXIT, NEW_TOKENS, tree_rows_beside_chains
    from .test_architectures import PROMPTS as ARCH_PROMPTS

    ckpt = make_arch_checkpoint(tmp_path / "model", arch)
    drafter = make_noisy_drafter(ckpt, tmp_path / "drafter")
    build_bundle(tmp_path / "b", model=str(ckpt), drafter=str(drafter), adapter="untrained", exit_layer=EXIT,
                 context=CONTEXT, flavour="ort", attention="rowwise")
    session = load(tmp_path / "b", threads=1)
    for prompt in ARCH_PROMPTS:
        ar = session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="ar").tokens
        for how in ({"mode": "self", "gamma": 3, "eta": 0.0}, {"mode": "model", "gamma": 3, "eta": 0.0},
                    {"mode": "lookup"}, {"mode": "model", "tree": "4:3:2:10"}):
            assert session.generate(prompt, max_new_tokens=NEW_TOKENS, **how).tokens == ar, (prompt, how)
    n = len(DEEP_TREE)
    for i, tree_state, chain_state, got, want in tree_rows_beside_chains(session.pieces, (n - 1, 9, 4)):
        np.testing.assert_array_equal(tree_state, chain_state, err_msg=f"shallow, tree row {i}")
        np.testing.assert_array_equal(got, want, err_msg=f"deep, tree row {i}")


def test_a_gpu_provider_is_refused(rowwise_bundle):
    with pytest.raises(SpecExportError, match=r"CUDAExecutionProvider would run on the host.*--attention gqa"):
        load(rowwise_bundle("fp32"), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
