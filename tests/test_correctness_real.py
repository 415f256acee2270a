"""On the real default model: the bundle decodes exactly like Hugging Face transformers (greedy, 20 prompts x 64
tokens, every step checked against transformers' argmax in one teacher-forced pass: tests/hf_reference.py), and
where the model is cut changes nothing."""

from __future__ import annotations

import pytest
import torch
from specexport.runtime import load

from .conftest import real_ar, real_session
from .hf_reference import first_departure
from .real_prompts import PROMPTS

pytestmark = pytest.mark.slow
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def session():
    return real_session("fp32")


def ar_tokens(session, ids: list[int]) -> list[int]:
    """The default bundle's greedy AR output for `ids`, computed once for the run (both exit-layer cases and
    test_lossless_real compare against the same prompts)."""
    return real_ar("fp32", ids, NEW_TOKENS)


@pytest.fixture(scope="module")
def hf_model(default_bundle):
    from transformers import AutoModelForCausalLM

    checkpoint = source_checkpoint(default_bundle)
    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


def source_checkpoint(bundle) -> str:
    """The bundle's source checkpoint, found from the hash its manifest records (it names no path)."""
    from specexport.exporter.model_source import find_checkpoint
    from specexport.runtime.bundle import read_manifest

    found = find_checkpoint(read_manifest(bundle).provenance.source_sha256)
    assert found is not None, "the default bundle's converted checkpoint is not in the cache"
    return str(found)


def test_greedy_matches_transformers(session, hf_model):
    eos = session.codec.eos_ids
    departures = {}
    for prompt in PROMPTS:
        ids = session.prompt_ids(prompt, session.options())
        ours = ar_tokens(session, ids)
        at = first_departure(hf_model, ids, ours, eos, NEW_TOKENS)
        if at is not None:
            departures[prompt] = at
    assert len(PROMPTS) == 20
    assert not departures, f"left transformers' greedy output at token (by prompt): {departures}"
    # the check sees a single changed token, and a generation cut short
    ids = session.prompt_ids(PROMPTS[0], session.options())
    ours = ar_tokens(session, ids)
    assert len(ours) > 10
    changed = [*ours[:10], (ours[10] + 1) % hf_model.config.vocab_size, *ours[11:]]
    assert first_departure(hf_model, ids, changed, eos, NEW_TOKENS) == 10
    assert first_departure(hf_model, ids, ours[:7], eos, NEW_TOKENS) == 7


@pytest.mark.parametrize("exit_layer", [1, 29])
def test_exit_layer_changes_nothing(session, default_bundle, exit_layer, tmp_path_factory):
    from specexport.exporter.build import build_bundle

    checkpoint = source_checkpoint(default_bundle)
    out = tmp_path_factory.mktemp(f"l{exit_layer}") / "bundle"
    # no adapter ships for these cuts; AR never runs the drafter, so it is not built (nor parity-checked)
    build_bundle(out, model=checkpoint, exit_layer=exit_layer, adapter="none", drafter="none")
    other = load(out)
    for prompt in PROMPTS[:6]:
        ids = session.prompt_ids(prompt, session.options())
        assert other.generate_ids(ids, max_new_tokens=NEW_TOKENS, mode="ar").tokens == ar_tokens(session, ids), prompt
