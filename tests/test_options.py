"""Options are checked where they enter, the Python API and the CLI alike: one sentence naming the option;
on the CLI, exit code 2."""

from __future__ import annotations

import pytest
from specexport.runtime import OptionError, load
from specexport.runtime.options import Limits, make_options

from .test_cli import assert_one_sentence_error, cli

BAD = [
    ({"max_new_tokens": -5}, "max_new_tokens"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 2.0}, "top_p"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"seed": -1}, "seed"),
    ({"gamma": 0}, "gamma"),
    ({"eta": 1.5}, "eta"),
    ({"eta": -0.1}, "eta"),
    ({"beta": 0}, "beta"),
    ({"tau": -1.0}, "tau"),
    ({"mode": "fast"}, "mode"),
    ({"schedule": "parallel"}, "schedule"),
    ({"verify": "loose"}, "verify"),
    ({"policy": "confidence:3"}, "policy"),
    ({"policy": "greedy"}, "policy"),
    ({"tree": "4:x"}, "tree"),
    ({"tree": "300"}, "tree"),  # 311 tokens in one call: beyond the limit below
    ({"gamma": 400}, "gamma"),
    ({"stop": [""]}, "stop"),
    ({"chat": "yes"}, "chat"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"temprature": 0.5}, "temprature"),
]


@pytest.mark.parametrize("overrides, name", BAD, ids=[f"{k}={v!r}" for (o, _) in BAD for k, v in o.items()])
def test_a_bad_option_is_one_sentence_naming_it(overrides, name):
    with pytest.raises(OptionError) as err:
        make_options({}, overrides, Limits(max_context=256, verify_rows=255))
    message = str(err.value)
    assert name in message and "\n" not in message, message


@pytest.mark.parametrize("overrides", [
    {"top_p": 1.0}, {"eta": 0.0}, {"eta": 1.0}, {"max_new_tokens": 0}, {"temperature": 0}, {"tree": "4:3:2:10"},
    {"policy": "goodput:4"}, {"gamma": 254}, {"seed": 2**40}, {"ignore_eos": True},
])
def test_the_edges_of_each_range_are_accepted(overrides):
    opts = make_options({}, overrides, Limits(max_context=256, verify_rows=255))
    for key, value in overrides.items():
        assert getattr(opts, key) == value


def test_the_session_checks_against_its_bundle(tiny_bundles):
    session = load(tiny_bundles(context=256))
    with pytest.raises(OptionError, match="tree 300 verifies up to 311 tokens"):
        session.generate("hello", tree="300")
    with pytest.raises(OptionError, match="temperature"):
        session.stream("hello", temperature=-1)  # refused when asked for, not at the first token
    assert session.generate("hello", max_new_tokens=0).tokens == []


def _usage_error(proc, *fragments: str) -> None:
    assert_one_sentence_error(proc, *fragments, code=2)
    assert proc.stdout == ""


def test_the_cli_exits_2_with_one_line(tiny_bundles):
    bundle = str(tiny_bundles(context=256))
    _usage_error(cli("generate", "--bundle", bundle, "--temperature", "-1", "hi"), "temperature")
    _usage_error(cli("generate", "--bundle", bundle, "--top-p", "2", "hi"), "top_p")
    _usage_error(cli("generate", "--bundle", bundle, "--max-new-tokens", "-5", "hi"), "max_new_tokens")
    _usage_error(cli("generate", "--bundle", bundle, "--eta", "1.5", "hi"), "eta")
    _usage_error(cli("generate", "--bundle", bundle, "--tree", "300", "hi"), "tree 300", "255")
