"""Property-based tests (hypothesis): whatever options a caller passes, a request either generates or is
refused with one sentence (SpecExportError), never another exception; exact modes stay AR's tokens."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specexport.runtime import SpecExportError, load

MODES = ["ar", "self", "lookup", "auto", "model", "hier", "fast", ""]
PROMPTS = ["hash table", "the sea", "12 + 30 =", "a"]

anything = st.one_of(st.none(), st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True),
                     st.text(max_size=4), st.booleans())
options = st.fixed_dictionaries({}, optional={
    "max_new_tokens": st.one_of(st.integers(-3, 12), anything),
    "mode": st.sampled_from(MODES),
    "temperature": st.one_of(st.floats(-1, 2), anything),
    "top_p": st.one_of(st.floats(-0.5, 1.5), anything),
    "top_k": st.one_of(st.integers(-2, 50), anything),
    "seed": st.one_of(st.integers(-2, 2**40), anything),
    "stop": st.one_of(st.lists(st.text(max_size=3), max_size=2), anything),
    "gamma": st.one_of(st.integers(-1, 8), anything),
    "eta": st.one_of(st.floats(-0.5, 1.5), anything),
    "policy": st.sampled_from([None, "fixed", "fixed:2", "confidence:0.3", "entropy:0.5", "goodput:3",
                               "confidence:7", "nope", "fixed:x"]),
    "tree": st.sampled_from([None, "4:3:2:10", "2:1:2:0", "4:x", "0", "900"]),
    "schedule": st.sampled_from(["sequential", "pearl", "fast"]),
    "verify": st.sampled_from(["exact", "specdec", "maybe"]),
    "system": st.one_of(st.none(), st.text(max_size=8), st.integers()),
    "chat": st.one_of(st.booleans(), anything),
})


@pytest.fixture(scope="module")
def session(tiny_bundles):
    return load(tiny_bundles(adapter="untrained"), threads=1)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.sampled_from(PROMPTS), opts=options)
def test_any_options_generate_or_are_one_sentence(session, prompt, opts):
    try:
        result = session.generate(prompt, **opts)
    except SpecExportError as exc:
        message = str(exc)
        assert message and "\n" not in message and "Traceback" not in message, message
        return
    assert isinstance(result.text, str) and result.finish_reason in ("length", "eos", "stop")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.sampled_from(PROMPTS), mode=st.sampled_from(["self", "lookup", "auto"]),
       gamma=st.one_of(st.none(), st.integers(1, 6)), policy=st.sampled_from([None, "fixed:2", "entropy:0.5"]),
       n=st.integers(1, 20))
def test_exact_modes_are_ar_token_for_token(session, prompt, mode, gamma, policy, n):
    ar = session.generate(prompt, max_new_tokens=n, mode="ar").tokens
    assert session.generate(prompt, max_new_tokens=n, mode=mode, gamma=gamma, policy=policy).tokens == ar
