"""Heads 256 wide (Gemma 3): ONNX Runtime's CPU GroupQueryAttention rounds such a row by its call's total
length, so the `ort` pieces take the row-invariant operator, which rounds a row alike in any call, and
GroupQueryAttention is refused for them at build and at load."""

from __future__ import annotations

import json

import numpy as np
import pytest
from specexport.exporter.build import build_bundle
from specexport.runtime import attention_op, load
from specexport.runtime.errors import SpecExportError

from .conftest import make_arch_checkpoint, make_noisy_drafter

pytestmark = pytest.mark.skipif(not attention_op.available(), reason="the attention operator was not built here")

SYSTEMS = [{"mode": "lookup"}, {"mode": "model"}, {"mode": "model", "tree": "4:3:2:0"}, {"mode": "auto"},
           {"mode": "self"}, {"mode": "model", "schedule": "pearl"}]


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    """A tiny Gemma 3 whose heads are 256 wide, as Gemma 3 270M's, with a drafter of its own, built by default."""
    root = tmp_path_factory.mktemp("gemma-256")
    checkpoint = make_arch_checkpoint(root / "model", "gemma3_text", head_dim=256, sliding_window=512)
    drafter = make_noisy_drafter(checkpoint, root / "drafter")
    build_bundle(root / "b", model=str(checkpoint), drafter=str(drafter), adapter="untrained", exit_layer=2,
                 context=256)
    return root / "b"


def _rows(deep, chunks: list[int], start: int, hidden: int) -> np.ndarray:
    deep.run(np.random.default_rng(2).standard_normal((1, start, hidden)).astype(np.float32), 0)
    h = np.random.default_rng(1).standard_normal((1, sum(chunks), hidden)).astype(np.float32)
    outs, done = [], 0
    for n in chunks:
        outs.append(deep.run(h[:, done:done + n], start + done, keep=n)["logits"].copy())
        done += n
    return np.concatenate(outs, axis=1)


def test_the_default_build_takes_the_operator_and_its_rows_ignore_the_call_length(wide_heads):
    session = load(wide_heads)
    assert session.bundle.manifest.graph.attention == "rowwise"
    deep, hidden = session.pieces.deep, session.bundle.manifest.model.dims.hidden
    # GroupQueryAttention's totals of 64 and 192 keys were where its rows changed
    for start in (40, 58, 62, 63, 64, 180):
        np.testing.assert_array_equal(_rows(deep, [12], start, hidden), _rows(deep, [1] * 12, start, hidden),
                                      err_msg=f"a 12-row call at {start}")


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_speculative_output_across_the_old_boundary_is_ar(wide_heads, system):
    session = load(wide_heads)
    drafted = 0
    for prompt in ("the sea", "a b c d e f g", "Explain how a hash table works."):
        ids = session.prompt_ids(prompt, session.options())
        assert len(ids) < 56  # generation crosses 64 keys
        ar = session.generate_ids(ids, max_new_tokens=96, mode="ar").tokens
        out = session.generate_ids(ids, max_new_tokens=96, **system)
        assert out.tokens == ar, prompt
        drafted += out.stats.drafted
    assert drafted > 0


def test_groupqueryattention_is_refused_at_build(wide_heads, tmp_path):
    checkpoint = wide_heads.parent / "model"
    with pytest.raises(SpecExportError, match=r"256 wide.*--attention rowwise"):
        build_bundle(tmp_path / "b", model=str(checkpoint), adapter="none", drafter="none", exit_layer=2,
                     context=256, attention="gqa")
    assert not (tmp_path / "b").exists()  # nothing half-written


def test_a_groupqueryattention_bundle_is_refused_at_load(wide_heads, tmp_path):
    import shutil

    copy = tmp_path / "gqa"
    shutil.copytree(wide_heads, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["graph"]["attention"] = "gqa"  # as a bundle built before the refusal would say
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecExportError, match=r"256-wide heads.*--attention rowwise"):
        load(copy)


def test_the_default_attention_and_its_fallback(monkeypatch):
    from specexport.exporter import row_attention

    assert row_attention.choose(None, "ort", "fp32", "float") == ("rowwise", None)
    assert row_attention.choose(None, "ort", "int4", "int8") == ("gqa", None)  # int8 caches: GQA's quantized cache
    assert row_attention.choose(None, "standard", "fp32", "float") == ("gqa", None)
    assert row_attention.choose("gqa", "ort", "fp32", "float") == ("gqa", None)
    monkeypatch.setattr(attention_op, "load_error", lambda: "the library is gone")
    assert row_attention.choose(None, "ort", "fp32", "float") == (
        "gqa", "building with ONNX Runtime's GroupQueryAttention (--attention gqa): the library is gone")
