"""On the real default model with its shipped adapter: Kangaroo's self-speculative decoding gives
exactly the tokens of autoregressive decoding of the same bundle, and its drafts are really used."""

from __future__ import annotations

import pytest
from specexport.runtime import load

from .real_prompts import PROMPTS

pytestmark = pytest.mark.slow
NEW_TOKENS = 128


@pytest.fixture(scope="module")
def session(default_bundle):
    s = load(default_bundle)
    assert s.pieces.adapter is not None, "the default bundle was built without the shipped adapter"
    return s


def test_greedy_self_speculative_equals_ar_on_20_prompts(session):
    mismatches, accepted, drafted, steps, tokens = [], 0, 0, 0, 0
    for prompt in PROMPTS:
        ids = session.prompt_ids(prompt, session.options())
        ar = session.generate_ids(ids, max_new_tokens=NEW_TOKENS, mode="ar").tokens
        spec = session.generate_ids(ids, max_new_tokens=NEW_TOKENS, mode="self")
        if spec.tokens != ar:
            mismatches.append(prompt)
        accepted += spec.stats.accepted
        drafted += spec.stats.drafted
        steps += spec.stats.steps
        tokens += len(spec.tokens)
    assert len(PROMPTS) == 20
    assert not mismatches, f"self-speculative output differs from AR on: {mismatches}"
    # a trained adapter's drafts are accepted far above chance (1/49,152); an untrained one's are not
    assert drafted > 0 and accepted / drafted > 0.2, (accepted, drafted)
    assert tokens / steps > 1.3, tokens / steps
