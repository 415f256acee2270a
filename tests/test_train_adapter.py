"""Adapter training on a smoke scale: held-out loss falls, agreement beats the raw early exit, the run
is deterministic, resumable, and the result exports and passes parity."""

from __future__ import annotations

import json

import pytest
from specexport.exporter.build import build_bundle
from specexport.exporter.model_source import resolve
from specexport.exporter.training.adapter_source import train_for_target
from specexport.runtime import load
from specexport.runtime.sampling import SamplingParams
from transformers import AutoModelForCausalLM

from .test_sampling_lossless import assert_lossless, sample_runs

SETTINGS = {"prompt_limit": 48, "max_new_tokens": 48, "batch_size": 16, "steps": 40, "tokens_per_batch": 1024,
            "lr": 3e-3, "warmup": 5, "eval_every": 20, "holdout": 0.15}


@pytest.fixture(scope="module")
def trained(tiny_checkpoint, tmp_path_factory):
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
    out = tmp_path_factory.mktemp("adapter")
    train_for_target(model, tiny_checkpoint, resolve(tiny_checkpoint).origin_sha256, 2, SETTINGS, out)
    return model, out, json.loads((out / "adapter.json").read_text())


def test_training_improves_on_heldout_and_beats_raw_exit(trained):
    _, _, meta = trained
    assert meta["heldout"]["loss"] < meta["heldout_before"]["loss"]
    assert meta["heldout"]["agreement"] > meta["heldout_before"]["agreement"]
    assert meta["heldout"]["agreement"] > meta["raw_exit_agreement"]
    assert meta["train_tokens"] > 0 and meta["heldout"]["tokens"] > 0


def test_training_is_deterministic(trained, tiny_checkpoint, tmp_path):
    model, _, meta = trained
    train_for_target(model, tiny_checkpoint, resolve(tiny_checkpoint).origin_sha256, 2, SETTINGS, tmp_path)
    again = json.loads((tmp_path / "adapter.json").read_text())
    assert again["heldout"] == meta["heldout"]


def test_trained_adapter_builds_and_decodes_losslessly(trained, tiny_checkpoint, tmp_path):
    _, out, _ = trained
    target = tmp_path / "bundle"
    # the adapter's graph at fp32, held to fp32's tolerance (the default recipe would draft at int8)
    manifest = build_bundle(target, model=str(tiny_checkpoint), context=128, adapter=str(out),
                            drafting_precision="bundle").to_dict()
    assert manifest["pieces"]["adapter"]["parity"]["max_relative_error"]["logits"] <= 1e-3
    assert manifest["pieces"]["adapter"]["training"]["heldout"]["agreement"] > 0
    session = load(target)
    for prompt in ("hash table", "the quick brown fox"):
        assert session.generate(prompt, max_new_tokens=32, mode="self").tokens == \
            session.generate(prompt, max_new_tokens=32, mode="ar").tokens


def test_pruned_draft_vocabulary_is_lossless(trained, tiny_checkpoint, tmp_path):
    """FR-Spec: a head over the 64 most frequent tokens drafts real ids; greedy output is unchanged and
    sampling still follows the target's distribution (verification keeps the full vocabulary)."""
    import numpy as np

    _, out, _ = trained
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "tiny"\n[adapter]\ndraft_vocab = 64\n')
    manifest = build_bundle(tmp_path / "b", recipe=str(recipe), model=str(tiny_checkpoint), context=128,
                            adapter=str(out)).to_dict()
    spec = manifest["pieces"]["adapter"]
    assert spec["draft_vocab"]["size"] == 64
    assert next(t for t in spec["outputs"] if t["name"] == "logits")["shape"][-1] == 64
    vocab = np.load(tmp_path / "b" / "draft_vocab.npy")
    session = load(tmp_path / "b")
    for prompt in ("hash table", "the quick brown fox"):
        ar = session.generate(prompt, max_new_tokens=32, mode="ar").tokens
        spec_out = session.generate(prompt, max_new_tokens=32, mode="self", eta=0.0)
        assert spec_out.tokens == ar
    # sampling: the target's distribution (tests/test_sampling_lossless.py states the test: the randomized
    # PIT of every token against the target's rows, Kolmogorov-Smirnov at alpha 1e-3, 300 seeds x 16 tokens)
    pvalues, total, outputs = sample_runs(session, SamplingParams(0.8), ("self",), mode="self", gamma=3, eta=0.0)
    assert_lossless(pvalues, total)  # drafts accepted and rejected, and the output follows the target
    emitted = np.concatenate([np.asarray(t, dtype=np.int64) for t in outputs])
    assert 0 < np.isin(emitted, vocab).mean() < 1  # drafts from the head, and ids outside it from the residual


def test_training_on_a_pruned_head_exports_that_head(trained, tiny_checkpoint, tmp_path):
    """An adapter trained over the 64 most frequent tokens keeps exactly those rows at export, with no
    recipe setting, and still decodes losslessly (verification keeps the full vocabulary)."""
    import numpy as np
    from specexport.exporter.training.fit_adapter import pruned_vocab

    model, _, _ = trained
    settings = {**SETTINGS, "steps": 20, "draft_vocab": 64}
    train_for_target(model, tiny_checkpoint, resolve(tiny_checkpoint).origin_sha256, 2, settings, tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "adapter.json").read_text())
    assert meta["draft_vocab"] == 64 and 0 < meta["heldout"]["agreement"] <= 1
    manifest = build_bundle(tmp_path / "b", model=str(tiny_checkpoint), context=128,
                            adapter=str(tmp_path / "a")).to_dict()
    assert manifest["pieces"]["adapter"]["draft_vocab"]["size"] == 64
    expected = pruned_vocab(np.load(tmp_path / "a" / "token_counts.npy"), 64)
    assert np.array_equal(np.load(tmp_path / "b" / "draft_vocab.npy"), expected)
    session = load(tmp_path / "b")
    assert session.generate("hash table", max_new_tokens=24, mode="self").tokens == \
        session.generate("hash table", max_new_tokens=24, mode="ar").tokens
