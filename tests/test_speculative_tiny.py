"""Self-speculative decoding on a tiny random model: token-identical to AR for every l, eta, gamma."""

from __future__ import annotations

import numpy as np
import pytest
from specexport.runtime import load

PROMPTS = ["hash table", "the quick brown fox", "write a haiku about the sea", "explain how"]


@pytest.mark.parametrize("exit_layer", [1, 2, 3])
@pytest.mark.parametrize(("flavour", "attention"), [("ort", None), ("ort", "gqa"), ("standard", None)],
                         ids=["ort", "ort-gqa", "standard"])
def test_greedy_self_speculative_equals_ar(tiny_bundles, exit_layer, flavour, attention):
    session = load(tiny_bundles(flavour, exit_layer, adapter="untrained", attention=attention))
    for prompt in PROMPTS:
        ar = session.generate(prompt, max_new_tokens=40, mode="ar")
        for gamma, eta in [(1, 0.0), (3, 0.0), (6, 0.6), (8, 0.0)]:
            spec = session.generate(prompt, max_new_tokens=40, mode="self", gamma=gamma, eta=eta)
            assert spec.tokens == ar.tokens, (prompt, gamma, eta)
            assert spec.stats.drafted > 0
            assert 1.0 <= spec.stats.mean_accepted_tokens <= gamma + 1


def test_rollback_and_full_acceptance_paths_are_exercised(tiny_bundles):
    """eta = 0 with gamma 8 drafts long runs: both rejections and full acceptances must occur."""
    session = load(tiny_bundles("ort", 3, adapter="untrained"))
    out = session.generate("the quick brown fox", max_new_tokens=60, mode="self", gamma=2, eta=0.0)
    s = out.stats
    assert 0 < s.accepted < s.drafted  # some rejected, some accepted
    assert out.tokens == session.generate("the quick brown fox", max_new_tokens=60, mode="ar").tokens


def test_context_end_is_respected(tiny_bundles):
    session = load(tiny_bundles("ort", 2, context=48, adapter="untrained"))
    ids = session.prompt_ids("hash table", session.options())
    out = session.generate_ids(ids, max_new_tokens=500, mode="self", gamma=6, eta=0.0)
    ar = session.generate_ids(ids, max_new_tokens=500, mode="ar")
    assert out.tokens == ar.tokens
    assert len(ids) + len(out.tokens) <= 48 or out.finish_reason == "eos"


def test_seeded_sampling_runs_and_reproduces(tiny_bundles):
    session = load(tiny_bundles("ort", 2, adapter="untrained"))
    a = session.generate("hash table", max_new_tokens=30, mode="self", temperature=0.8, seed=3)
    b = session.generate("hash table", max_new_tokens=30, mode="self", temperature=0.8, seed=3)
    assert a.tokens == b.tokens and len(a.tokens) > 0
    assert np.isfinite(b.stats.acceptance_rate)


def test_ignore_eos_runs_past_eos_to_the_full_length(tiny_bundles):
    """With an early token of AR's output taken as EOS, a request stops there; with ignore_eos it goes on to
    max_new_tokens with the same tokens, EOS included, and a speculative mode gives that output too."""
    session = load(tiny_bundles("ort", 2, adapter="untrained"))
    full = session.generate("the quick brown fox", max_new_tokens=30, mode="ar")
    assert len(full.tokens) == 30
    session.codec.eos_ids = {full.tokens[4]}  # the real EOS never comes up in the tiny model's 30 tokens
    stop = full.tokens.index(full.tokens[4])
    cut = session.generate("the quick brown fox", max_new_tokens=30, mode="ar")
    assert cut.tokens == full.tokens[:stop] and cut.finish_reason == "eos"
    for mode in ("ar", "self", "lookup"):
        out = session.generate("the quick brown fox", max_new_tokens=30, mode=mode, ignore_eos=True)
        assert out.tokens == full.tokens and out.finish_reason == "length", mode


@pytest.mark.parametrize("mode", ["ar", "self"])
def test_tau_counts_the_step_that_decoded_the_end_token(tiny_bundles, mode):
    """An answer that ends at EOS: the step that decoded the EOS is a step, and its token counts though it is not
    emitted, so AR's tau is 1.00 exactly (it read 23 tokens over 24 steps, 0.96, before)."""
    session = load(tiny_bundles("ort", 2, adapter="untrained"))
    full = session.generate("the quick brown fox", max_new_tokens=30, mode="ar", ignore_eos=True)
    end = full.tokens[12]  # declared the end token: the answer now stops before it
    session.codec.eos_ids = {end}
    out = session.generate("the quick brown fox", max_new_tokens=30, mode=mode, gamma=3)
    assert out.finish_reason == "eos" and out.tokens == full.tokens[:full.tokens.index(end)]
    assert out.stats.eos_tokens == 1
    if mode == "ar":
        assert out.stats.steps == len(out.tokens) + 1 and out.stats.mean_accepted_tokens == 1.0
    else:
        assert out.stats.mean_accepted_tokens >= 1.0
