"""int8 KV caches of the target's `ort` pieces (exporter/kv_cache.py): the rewrite, its scales, and the row
property it is for (a one-token call's attention gives a verification row's bits)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from specexport.exporter import kv_cache, multirow, quantize
from specexport.exporter.build import build_bundle
from specexport.exporter.llama_graph import Dims
from specexport.runtime.errors import SpecExportError
from specexport.runtime.session import load

HEADS, KV_HEADS, HEAD = 6, 2, 64
CONTEXT = 160


def _gqa_model() -> onnx.ModelProto:
    """One GroupQueryAttention as llama_graph writes it (rotary inside, an attention bias), float caches."""
    f = TensorProto.FLOAT
    io = [("query", f, [1, "s", HEADS * HEAD]), ("key", f, [1, "s", KV_HEADS * HEAD]),
          ("value", f, [1, "s", KV_HEADS * HEAD]), ("past_key.0", f, [1, KV_HEADS, "c", HEAD]),
          ("past_value.0", f, [1, KV_HEADS, "c", HEAD]), ("seqlens_k", TensorProto.INT32, [1]),
          ("total_sequence_length", TensorProto.INT32, []), ("cos", f, [CONTEXT, HEAD // 2]),
          ("sin", f, [CONTEXT, HEAD // 2]), ("position_ids", TensorProto.INT64, [1, "s"]),
          ("attention_bias", f, [1, 1, "s", "t"])]
    node = helper.make_node("GroupQueryAttention", [name for name, _, _ in io],
                            ["out", "present_key.0", "present_value.0"], domain="com.microsoft", num_heads=HEADS,
                            kv_num_heads=KV_HEADS, do_rotary=1, scale=HEAD ** -0.5)
    outputs = [helper.make_tensor_value_info("out", f, [1, "s", HEADS * HEAD]),
               *(helper.make_tensor_value_info(n, f, [1, KV_HEADS, "c", HEAD]) for n in node.output[1:])]
    graph = helper.make_graph([node], "gqa", [helper.make_tensor_value_info(*spec) for spec in io], outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


class Attention:
    """The GQA node over random queries, keys and values of CONTEXT positions, calls of any rows at any start."""

    def __init__(self, int8: bool, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.q = rng.standard_normal((1, CONTEXT, HEADS * HEAD), dtype=np.float32) * 2
        self.k = rng.standard_normal((1, CONTEXT, KV_HEADS * HEAD), dtype=np.float32) * 2
        self.v = rng.standard_normal((1, CONTEXT, KV_HEADS * HEAD), dtype=np.float32)
        angles = np.outer(np.arange(CONTEXT), 1e-4 ** (np.arange(HEAD // 2) / (HEAD // 2)))
        self.cos, self.sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        model = _gqa_model()
        self.dtype = np.float32
        if int8:
            bounds = kv_cache.ScaleRange(_dims(), HEAD // 2)
            bounds.add(self.k.reshape(CONTEXT, KV_HEADS, HEAD), self.v.reshape(CONTEXT, KV_HEADS, HEAD))
            kv_cache.quantize_kv_cache(model, [bounds.scales()])
            self.dtype = np.int8
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        empty = np.zeros((1, KV_HEADS, 0, HEAD), self.dtype)
        _, self.cache_k, self.cache_v = self.call(0, CONTEXT, empty, empty)  # every position as later calls see it

    def call(self, start: int, rows: int, past_k=None, past_v=None) -> list[np.ndarray]:
        end = start + rows
        past_k = self.cache_k[:, :, :start] if past_k is None else past_k
        past_v = self.cache_v[:, :, :start] if past_v is None else past_v
        return self.session.run(None, {
            "query": self.q[:, start:end], "key": self.k[:, start:end], "value": self.v[:, start:end],
            "past_key.0": past_k, "past_value.0": past_v, "seqlens_k": np.array([end - 1], np.int32),
            "total_sequence_length": np.array(end, np.int32), "cos": self.cos, "sin": self.sin,
            "position_ids": np.arange(start, end)[None], "attention_bias": np.zeros((1, 1, rows, end), np.float32)})


def _dims() -> Dims:
    return Dims(hidden=HEADS * HEAD, layers=1, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD, intermediate=8,
                vocab=8, rms_eps=1e-5, max_context=CONTEXT)


@pytest.fixture(scope="module")
def int8_attention() -> Attention:
    return Attention(int8=True)


def test_the_rewrite_makes_the_caches_int8_with_a_scale_per_channel(int8_attention):
    model = _gqa_model()
    scales = [(np.full(KV_HEADS * HEAD, 0.1, np.float32), np.full(KV_HEADS * HEAD, 0.2, np.float32))]
    kv_cache.quantize_kv_cache(model, scales)
    types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}
    caches = ("past_key.0", "past_value.0", "present_key.0", "present_value.0")
    assert [types[n] for n in caches] == [TensorProto.INT8] * 4
    assert types["query"] == types["out"] == TensorProto.FLOAT
    node = model.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["k_quant_type"] == attrs["v_quant_type"] == b"PER_CHANNEL" and attrs["kv_cache_bit_width"] == 8
    assert list(node.input[12:]) == ["kv_k_scale.0", "kv_v_scale.0"] and node.input[11] == ""
    assert int8_attention.cache_k.dtype == np.int8
    with pytest.raises(SpecExportError, match="2 layers"):
        kv_cache.quantize_kv_cache(_gqa_model(), scales * 2)


def test_one_token_calls_of_an_int8_cache_give_the_rows_of_many_row_calls(int8_attention):
    # the point of the int8 cache: with float caches MLAS's one-row SGEMM rounds probabilities x V otherwise
    # (exporter/multirow.py); here every start and call size gives the row the same bits
    for start in range(3, CONTEXT - 8, 5):
        one = int8_attention.call(start, 1)[0][0, 0]
        for rows in (2, 3, 5, 8):
            np.testing.assert_array_equal(int8_attention.call(start, rows)[0][0, 0], one, err_msg=f"{start}+{rows}")


def test_an_int8_cache_keeps_attention_close_to_the_float_one(int8_attention):
    exact = Attention(int8=False)
    for start, rows in ((40, 1), (100, 4), (150, 10)):
        want, got = exact.call(start, rows)[0], int8_attention.call(start, rows)[0]
        # a code step is ~1% of a channel's range; a sharp softmax over random keys (scores of ~30) widens it
        assert np.abs(got - want).max() < 0.05 * np.abs(want).max(), (start, rows)


def test_values_past_a_scale_saturate_rather_than_wrap():
    a = Attention(int8=False)
    model = _gqa_model()
    small = np.full(KV_HEADS * HEAD, 0.004, np.float32)  # far below the values: most codes saturate
    kv_cache.quantize_kv_cache(model, [(small, small)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    empty = np.zeros((1, KV_HEADS, 0, HEAD), np.int8)
    _, _, values = session.run(None, {
        "query": a.q[:, :4], "key": a.k[:, :4], "value": a.v[:, :4], "past_key.0": empty, "past_value.0": empty,
        "seqlens_k": np.array([3], np.int32), "total_sequence_length": np.array(4, np.int32), "cos": a.cos,
        "sin": a.sin, "position_ids": np.arange(4)[None], "attention_bias": np.zeros((1, 1, 4, 4), np.float32)})
    v = a.v[:, :4].reshape(1, 4, KV_HEADS, HEAD).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(values, np.clip(np.round(v / 0.004), -128, 127).astype(np.int8))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), rotary_half=st.sampled_from([4, 8, 16]), tokens=st.integers(1, 40))
def test_key_scales_cover_the_keys_at_every_rope_angle(seed, rotary_half, tokens):
    # the cache holds keys after RoPE, which turns channel i into a mix of i and i + half: calibrated before
    # rotation, a channel's bound must hold whatever angle a later position gives it
    head = 2 * rotary_half + 8  # eight channels past the rotary part pass through unrotated
    dims = Dims(hidden=head, layers=1, heads=1, kv_heads=1, head_dim=head, intermediate=8, vocab=8, rms_eps=1e-5,
                max_context=64)
    rng = np.random.default_rng(seed)
    k = (rng.standard_normal((tokens, 1, head)) * rng.uniform(0.1, 10, head)).astype(np.float32)
    v = rng.standard_normal((tokens, 1, head)).astype(np.float32)
    bounds = kv_cache.ScaleRange(dims, rotary_half)
    bounds.add(k, v)
    k_scale, v_scale = bounds.scales(margin=1.0)
    theta = rng.uniform(0, 2 * np.pi, (tokens, 1, rotary_half))
    x1, x2 = k[..., :rotary_half], k[..., rotary_half:2 * rotary_half]
    rotated = np.concatenate([x1 * np.cos(theta) - x2 * np.sin(theta), x2 * np.cos(theta) + x1 * np.sin(theta),
                              k[..., 2 * rotary_half:]], axis=-1)
    assert (np.abs(rotated).max(axis=(0, 1)) <= k_scale * 127 * (1 + 1e-5)).all()
    assert np.allclose(np.abs(v).max(axis=(0, 1)), v_scale * 127, rtol=1e-5)


def test_kv_cache_choices_are_checked_in_one_sentence():
    with pytest.raises(SpecExportError, match="kv_cache = 'int16'; use one of float, int8"):
        kv_cache.check_choice("int16", "ort", "int4")
    with pytest.raises(SpecExportError, match="comes with int8 or int4 weights; this build is fp32"):
        kv_cache.check_choice("int8", "ort", "fp32")
    with pytest.raises(SpecExportError, match="needs the 'ort' graph flavour"):
        kv_cache.check_choice("int8", "standard", "int8")
    kv_cache.check_choice("float", "standard", "fp16")
    assert multirow.padding_for("int4", "ort", None, kv_int8=True) == "none"
    assert multirow.padding_for("int4", "ort", None, kv_int8=False) == "attention"
    assert quantize.spec_for("int4").kv_cache == quantize.spec_for("int8").kv_cache == "float"


def test_a_bad_kv_cache_in_a_recipe_is_refused_before_anything_is_written(tmp_path, tiny_checkpoint):
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "tiny"\n[export]\nprecision = "int4"\n[export.quantize]\nkv_cache = "fp8"\n')
    with pytest.raises(SpecExportError, match="kv_cache = 'fp8'"):
        build_bundle(tmp_path / "b", recipe=str(recipe), model=str(tiny_checkpoint), context=128, adapter="none")
    assert not (tmp_path / "b").exists()


@pytest.fixture(scope="module")
def int8_cache_bundle(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("int8-cache")
    recipe = root / "r.toml"
    recipe.write_text('name = "tiny"\n[export]\nexit_layer = 2\nprecision = "int4"\n'
                      '[export.quantize]\nkv_cache = "int8"\n')
    build_bundle(root / "b", recipe=str(recipe), model=str(tiny_checkpoint), context=256, adapter="untrained")
    return root / "b"


def test_a_bundle_with_int8_caches_records_them_and_pads_nothing(int8_cache_bundle):
    manifest = json.loads((int8_cache_bundle / "manifest.json").read_text())
    for name in ("shallow", "deep"):
        piece = manifest["pieces"][name]
        assert piece["one_row_padding"] == "none" and piece["quantization"]["kv_cache"] == "int8", name
        assert {t["dtype"] for t in piece["inputs"] if t["name"].startswith("past_")} == {"int8"}, name
        graph = onnx.load(str(int8_cache_bundle / piece["file"]), load_external_data=False).graph
        assert not [n for n in graph.node if n.name.startswith("mr_")], name  # no copied row in the graph
    adapter = manifest["pieces"]["adapter"]  # a draft head keeps float caches: it only proposes
    assert {t["dtype"] for t in adapter["inputs"] if t["name"].startswith("past_")} == {"float32"}
    # the graphs pad nothing; whether this machine's kernels round a one-row call of the int8 caches as a row of
    # many is the load-time probe's to decide (AVX2 and AVX-512 answer differently), and the session pads itself
    # exactly when the probe says they do not (the tests below check the output is AR's either way)
    import dataclasses

    from specexport.runtime.row_padding import TwoRowCalls, one_row_calls_match

    session = load(int8_cache_bundle)
    raw = dataclasses.replace(session.pieces, **{n: getattr(session.pieces, n).piece for n in ("shallow", "deep")
                                                 if isinstance(getattr(session.pieces, n), TwoRowCalls)})
    matches = one_row_calls_match(raw, session.bundle.manifest.model.dims.vocab)
    assert session.one_row_calls == ("none" if matches else "session")


@pytest.mark.parametrize("mode", ["self", "lookup", "auto"])
def test_speculative_output_is_ar_with_int8_caches(int8_cache_bundle, mode):
    session = load(int8_cache_bundle)
    for prompt in ("Explain how a hash table works.", "write a haiku about the sea"):
        ids = session.prompt_ids(prompt, session.options())
        ar = session.generate_ids(ids, max_new_tokens=40, mode="ar").tokens
        assert session.generate_ids(ids, max_new_tokens=40, mode=mode).tokens == ar, (mode, prompt)


def test_one_token_calls_of_an_int8_cache_bundle_are_rows_of_a_verification_call(int8_cache_bundle):
    deep = load(int8_cache_bundle).pieces.deep
    rng = np.random.default_rng(1)
    prefix = rng.standard_normal((1, 20, 64)).astype(np.float32)
    h = rng.standard_normal((1, 6, 64)).astype(np.float32)

    def run(chunks: list[int]) -> np.ndarray:
        deep.run(prefix, 0)
        outs, pos = [], 20
        for n in chunks:
            outs.append(deep.run(h[:, pos - 20:pos - 20 + n], pos, keep=n)["logits"])
            pos += n
        return np.concatenate(outs, axis=1)

    whole = run([6])
    np.testing.assert_array_equal(run([1] * 6), whole)
    np.testing.assert_array_equal(run([2, 1, 3]), whole)
