"""A request's options are resolved once into a plan (runtime/plan.py), checked together and against what the
bundle can run: the Python API, the CLI and the batch scheduler refuse a bad combination with the same
sentence, and the runtime's lists of modes are the one list in runtime/choices.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from specexport.runtime import OptionError, load
from specexport.runtime.choices import MODES, SCHEDULES, VERIFY_RULES
from specexport.runtime.drafters import LOOKUP_MAX_TOKENS
from specexport.runtime.manifest import SpeculativeDefaults
from specexport.runtime.options import make_options
from specexport.runtime.plan import (
    MODE_PIECES,
    PEARL_MODES,
    TREE_GROWERS,
    Capabilities,
    make_plan,
)
from specexport.runtime.policies import GOODPUT_MODES
from specexport.runtime.tree import TreeShape
from specexport.runtime.verification import SPECDEC_BETA, SPECDEC_TAU

from .test_cli import assert_one_sentence_error, cli

EVERYTHING = Capabilities(Path("b"), frozenset({"adapter", "drafter", "head"}), frozenset({"model", "head"}),
                          SpeculativeDefaults(gamma=4, eta=0.5))
NOTHING = Capabilities(Path("b"), frozenset(), frozenset(), SpeculativeDefaults(gamma=4, eta=0.5))


def plan_of(caps: Capabilities = EVERYTHING, **overrides):
    return make_plan(make_options({}, overrides), caps)


def test_one_list_of_modes():
    from specexport.cli.main import generate
    from specexport.runtime.assemble import DRAFTERS

    assert ("ar", *DRAFTERS) == MODES  # the decoder has a drafter for every mode but ar, in the list's order
    assert len(set(MODES)) == len(MODES)
    for named in (MODE_PIECES, PEARL_MODES, TREE_GROWERS, GOODPUT_MODES):
        assert set(named) <= set(MODES), named
    choices = {p.name: getattr(p.type, "choices", None) for p in generate.params}
    assert tuple(choices["mode"]) == MODES
    assert tuple(choices["schedule"]) == SCHEDULES and tuple(choices["verify"]) == VERIFY_RULES


def test_the_plan_keeps_what_the_check_parsed(monkeypatch):
    """Options are parsed once, where they are checked: the plan holds that policy and tree shape. A value
    changed after the check is checked (and parsed) again, never planned from the stale parse."""
    from specexport.runtime import options as options_module
    from specexport.runtime.policies import PolicySpec

    parsed = []
    real_tree, real_policy = TreeShape.parse.__func__, PolicySpec.parse.__func__
    monkeypatch.setattr(TreeShape, "parse",
                        classmethod(lambda cls, spec: parsed.append("tree") or real_tree(cls, spec)))
    monkeypatch.setattr(PolicySpec, "parse",
                        classmethod(lambda cls, spec: parsed.append("policy") or real_policy(cls, spec)))
    opts = make_options({}, {"mode": "model", "tree": "4:3:2"})
    plan = make_plan(opts, EVERYTHING)
    assert parsed == ["policy", "tree"] and plan.tree is options_module.parsed(opts).tree == TreeShape(4, 3, 2)
    opts.tree = "8"
    assert make_plan(opts, EVERYTHING).tree == TreeShape(8) and parsed == ["policy", "tree", "policy", "tree"]
    unchecked = options_module.Options(mode="self", policy="fixed:3")  # built by hand: checked by the plan
    assert (make_plan(unchecked, EVERYTHING).policy_value, parsed[-1]) == (3, "policy")


def test_the_defaults_are_applied_in_the_plan():
    plan = plan_of(mode="self")
    assert (plan.mode, plan.gamma, plan.eta, plan.policy, plan.policy_value) == ("self", 4, 0.5, "confidence", 0.5)
    assert plan.lookup_tokens == LOOKUP_MAX_TOKENS  # lookup's drafts cost nothing: its own cap, not gamma
    assert (plan.verify, plan.beta, plan.tau, plan.lossy, plan.tree) == ("exact", None, None, False, None)
    given = plan_of(mode="lookup", gamma=2, eta=0.9, policy="fixed")
    assert (given.gamma, given.eta, given.lookup_tokens, given.policy, given.policy_value) == (2, 0.9, 2, "fixed", 2)
    relaxed = plan_of(mode="self", verify="specdec")
    assert (relaxed.beta, relaxed.tau, relaxed.lossy) == (SPECDEC_BETA, SPECDEC_TAU, True)
    given = plan_of(mode="self", verify="specdec", beta=1, tau=0.5)
    assert (given.beta, given.tau) == (1, 0.5)
    tree = plan_of(mode="head", tree="4:3:2")
    assert tree.tree == TreeShape.parse("4:3:2") and tree.label == "head-tree4:3:2"
    assert plan_of(mode="auto", schedule="pearl").mode == "self"  # PEARL runs auto as a drafter it has
    no_adapter = Capabilities(Path("b"), frozenset({"drafter"}), frozenset(), EVERYTHING.speculative)
    assert plan_of(no_adapter, mode="auto", schedule="pearl").mode == "model"
    assert plan_of(mode="model", temperature=0.7).greedy is False
    assert plan_of(mode="model").greedy is True
    assert plan_of(mode="model", policy="goodput:5").policy_value == 5


# (options, the bundle's capabilities, a fragment of the one sentence)
REFUSED = [
    ({"mode": "self"}, NOTHING, "no adapter piece, so mode self is not available"),
    ({"mode": "hier"}, NOTHING, "no drafter or adapter piece"),
    ({"mode": "head"}, NOTHING, "no head piece"),
    ({"mode": "model", "tree": "8"}, NOTHING, "no drafter piece"),
    ({"mode": "self", "tree": "8"}, EVERYTHING, "needs mode model or mode head (not self)"),
    ({"mode": "ar", "tree": "8"}, EVERYTHING, "(not ar)"),
    ({"mode": "model", "tree": "8", "temperature": 0.7}, EVERYTHING, "greedy decoding only"),
    ({"mode": "model", "tree": "8", "schedule": "pearl"}, EVERYTHING, "drop schedule"),
    ({"mode": "model", "tree": "8", "policy": "fixed"}, EVERYTHING, "drop schedule, verify and policy"),
    ({"mode": "model", "tree": "8"}, Capabilities(Path("b"), frozenset({"drafter"}), frozenset(),
                                                 EVERYTHING.speculative), "predates token trees"),
    ({"mode": "ar", "verify": "specdec"}, EVERYTHING, "mode ar drafts nothing"),
    ({"mode": "self", "verify": "specdec", "temperature": 0.7}, EVERYTHING, "greedy decoding only"),
    ({"mode": "self", "schedule": "pearl", "verify": "specdec"}, EVERYTHING, "lossless only"),
    ({"mode": "lookup", "schedule": "pearl"}, EVERYTHING, "not lookup"),
    ({"mode": "ar", "schedule": "pearl"}, EVERYTHING, "not ar"),
    ({"mode": "auto", "schedule": "pearl"}, NOTHING, "no adapter or drafter piece"),
    ({"mode": "hier", "policy": "goodput"}, EVERYTHING, "cost model for modes self, model, lookup, not hier"),
    ({"mode": "auto", "policy": "goodput:4"}, EVERYTHING, "not auto"),
    ({"mode": "self", "policy": "fixed:x"}, EVERYTHING, "bad number"),
]


@pytest.mark.parametrize("overrides, caps, fragment", REFUSED, ids=[r[2] for r in REFUSED])
def test_each_refusal_is_one_sentence(overrides, caps, fragment):
    with pytest.raises(OptionError) as err:
        plan_of(caps, **overrides)
    message = str(err.value)
    assert fragment in message and "\n" not in message and ". " not in message.rstrip("."), message


def test_what_runs_is_planned():
    for mode in MODES:
        plan_of(mode=mode)  # every mode on a bundle that has every piece
    for mode in ("ar", "lookup", "auto"):
        assert plan_of(NOTHING, mode=mode).mode == mode  # the modes that need no drafting piece
    assert plan_of(mode="model", schedule="pearl", policy="goodput").mode == "model"
    assert plan_of(mode="lookup", verify="specdec").lossy


# the same bad request through the Python API, the CLI and the batch scheduler: (bundle, options, fragment)
EVERYWHERE = [
    ("plain", {"mode": "self"}, "no adapter piece, so mode self is not available"),
    ("plain", {"mode": "hier"}, "no drafter or adapter piece"),
    ("plain", {"mode": "model", "tree": "8"}, "no drafter piece"),
    ("plain", {"mode": "auto", "schedule": "pearl"}, "needs a drafter to run beside deep"),
    ("drafting", {"mode": "model", "tree": "8", "temperature": 0.7}, "greedy decoding only"),
    ("drafting", {"mode": "model", "tree": "8", "schedule": "pearl"}, "drop schedule"),
    ("drafting", {"mode": "self", "tree": "8"}, "needs mode model or mode head"),
    ("drafting", {"mode": "ar", "verify": "specdec"}, "mode ar drafts nothing"),
    ("drafting", {"mode": "self", "verify": "specdec", "temperature": 0.7}, "greedy decoding only"),
    ("drafting", {"mode": "lookup", "schedule": "pearl"}, "not lookup"),
    ("drafting", {"mode": "self", "schedule": "pearl", "verify": "specdec"}, "lossless only"),
    ("drafting", {"mode": "hier", "policy": "goodput"}, "cost model for modes"),
]


def _flags(overrides: dict) -> list[str]:
    return [arg for key, value in overrides.items() for arg in (f"--{key.replace('_', '-')}", str(value))]


@pytest.fixture(scope="module")
def bundles(tiny_bundles, drafting_bundle):
    return {"plain": tiny_bundles("standard"), "drafting": drafting_bundle}


@pytest.fixture(scope="module")
def runners(bundles):
    from specexport.runtime.batching import BatchScheduler

    sessions = {name: load(path, threads=1) for name, path in bundles.items()}
    schedulers = {name: BatchScheduler(session, max_batch=1) for name, session in sessions.items()}
    yield sessions, schedulers
    for scheduler in schedulers.values():
        scheduler.close()


@pytest.mark.parametrize("bundle, overrides, fragment", EVERYWHERE, ids=[f"{b}-{f}" for b, _, f in EVERYWHERE])
def test_the_same_sentence_everywhere(runners, bundles, bundle, overrides, fragment):
    sessions, schedulers = runners
    with pytest.raises(OptionError) as err:
        sessions[bundle].generate("hash table", max_new_tokens=4, **overrides)
    sentence = str(err.value)
    assert fragment in sentence, sentence
    with pytest.raises(OptionError) as err:
        sessions[bundle].stream("hash table", **overrides)  # refused when asked for, before any token
    assert str(err.value) == sentence
    with pytest.raises(OptionError) as err:
        schedulers[bundle].submit([5, 6, 7], max_new_tokens=4, **overrides)
    assert str(err.value) == sentence
    proc = cli("generate", "--bundle", str(bundles[bundle]), "--max-new-tokens", "4", *_flags(overrides), "hi")
    assert_one_sentence_error(proc, sentence, code=2)
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_what_batching_cannot_run_is_its_own_sentence(runners):
    """Every mode, tree, policy and verification rule a Session runs runs batched; PEARL's schedule is refused
    in a sentence of its own."""
    sessions, schedulers = runners
    scheduler = schedulers["drafting"]
    sessions["drafting"].options(mode="self", schedule="pearl")  # one request at a time runs it
    with pytest.raises(OptionError, match="schedule pearl does not run batched"):
        scheduler.submit([5, 6, 7], mode="self", schedule="pearl")
    for overrides in ({"mode": "hier"}, {"mode": "lookup", "verify": "specdec"}, {"mode": "model", "tree": "4:2:2"},
                      {"mode": "self", "policy": "fixed:2"}):
        scheduler.options(**overrides)  # planned, not refused
    request = scheduler.submit([5, 6, 7], max_new_tokens=3, mode="lookup", gamma=2)
    assert request.plan.lookup_tokens == 2 and len(request.result()) == 3


def test_generate_takes_the_mode_as_mode_alone(bundles):
    """`--drafter` is a drafter's directory in `build`; `generate` takes the mode as --mode (the old alias is
    hidden and says so in one line)."""
    helped = cli("generate", "--help")
    assert helped.returncode == 0 and "--drafter" not in helped.stdout and "--mode" in helped.stdout
    old = cli("generate", "--bundle", str(bundles["drafting"]), "--drafter", "lookup", "--max-new-tokens", "4",
              "--json", "hash table")
    assert old.returncode == 0, old.stderr
    warnings = [line for line in old.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == ["warning: generate's --drafter lookup is deprecated; use --mode lookup"], old.stderr


def test_the_bench_takes_the_modes_of_the_one_list():
    from specexport.bench.runner import BenchConfig, check_config
    from specexport.runtime.errors import SpecExportError

    check_config(BenchConfig(bundle=Path("b"), modes=list(MODES), baselines=[]))
    with pytest.raises(SpecExportError, match="unknown mode 'fast'; use any of ar, self"):
        check_config(BenchConfig(bundle=Path("b"), modes=["self", "fast"], baselines=[]))
