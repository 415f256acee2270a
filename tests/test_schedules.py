"""Schedules (sequential, PEARL) and draft-length policies (fixed, confidence, entropy, goodput) on a tiny
random model with an untrained adapter: greedy output equals AR under every combination; PEARL survives
random delays in its pieces (races) with identical outputs; PEARL's sampling follows the target's
distribution (chi-square test of homogeneity against AR, alpha = 0.001, fixed seeds); goodput stops
drafting for a useless drafter; entropy stops on flat distributions; make_policy's errors; bench's
cross product of modes, schedules and policies."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats as sps
from specexport.bench.metrics import REFERENCE
from specexport.bench.runner import BenchConfig, make_systems
from specexport.runtime import load
from specexport.runtime.backends.common import WrappedPiece
from specexport.runtime.drafters import Draft, SelfDrafter
from specexport.runtime.errors import SpecExportError
from specexport.runtime.pearl import pearl, pearl_threads
from specexport.runtime.policies import (
    CostModel,
    DraftSignal,
    EntropyPolicy,
    GoodputPolicy,
    expected_tokens,
    make_policy,
)
from specexport.runtime.sampling import SamplingParams
from specexport.runtime.speculative import speculative
from specexport.runtime.stats import Stats

from .test_bench import cli, write_questions

PROMPTS = ["hash table", "the quick brown fox", "write a haiku about the sea"]
POLICIES = ["fixed:3", "confidence:0.5", "entropy", "entropy:0.9", "goodput"]
ALPHA = 1e-3


@pytest.fixture(scope="module")
def session(tiny_bundles):
    return load(tiny_bundles("ort", 2, adapter="untrained"))


# -- lossless: every schedule x policy equals AR ----------------------------------------------------------


@pytest.mark.parametrize("schedule", ["sequential", "pearl"])
def test_greedy_equals_ar_for_every_policy(session, schedule):
    for prompt in PROMPTS:
        ar = session.generate(prompt, max_new_tokens=40, mode="ar").tokens
        for policy in POLICIES:
            out = session.generate(prompt, max_new_tokens=40, mode="self", schedule=schedule, policy=policy)
            assert out.tokens == ar, (prompt, schedule, policy)
    assert [mode for mode, _ in session.context.costs] == ["self"]  # goodput timed the pieces once, then reused them


def test_pearl_on_the_standard_flavour_and_a_deeper_exit(tiny_bundles):
    session = load(tiny_bundles("standard", 3, adapter="untrained"))
    for prompt in PROMPTS:
        ar = session.generate(prompt, max_new_tokens=40, mode="ar").tokens
        out = session.generate(prompt, max_new_tokens=40, mode="self", schedule="pearl", policy="fixed:4")
        assert out.tokens == ar
        assert out.stats.extra["schedule"] == "pearl" and out.stats.drafted > 0


def test_pearl_respects_the_context_end(tiny_bundles):
    session = load(tiny_bundles("ort", 2, context=48, adapter="untrained"))
    ids = session.prompt_ids("hash table", session.options())
    ar = session.generate_ids(ids, max_new_tokens=500, mode="ar")
    out = session.generate_ids(ids, max_new_tokens=500, mode="self", schedule="pearl", policy="fixed:6")
    assert out.tokens == ar.tokens
    assert len(ids) + len(out.tokens) <= 48 or out.finish_reason == "eos"
    # driven past the end of the context, the loop ends instead of waiting for drafts that cannot come
    import threading

    tokens: list[int] = []
    loop = pearl(session.pieces, SelfDrafter(session.pieces), make_policy("fixed:6", 6, 0.5), ids, SamplingParams(),
                 np.random.default_rng(0), Stats(), 48)
    runner = threading.Thread(target=lambda: [tokens.extend(new) for new in loop])
    runner.start()
    runner.join(timeout=60)
    assert not runner.is_alive() and len(ids) + len(tokens) >= 48


def test_pearl_rejects_what_it_cannot_run(session):
    with pytest.raises(SpecExportError, match="unknown schedule 'parallel'"):
        session.generate("hash table", max_new_tokens=4, mode="self", schedule="parallel")
    with pytest.raises(SpecExportError, match="not lookup;"):
        session.generate("hash table", max_new_tokens=4, mode="lookup", schedule="pearl")
    with pytest.raises(SpecExportError, match="lossless only"):
        session.generate("hash table", max_new_tokens=4, mode="self", schedule="pearl", verify="specdec")


# -- races: random delays in the pieces ---------------------------------------------------------------------


class DelayingPiece(WrappedPiece):
    """A proxy of a piece that sleeps a random 0..max_ms before and after each call, so the drafter and
    verifier threads interleave differently on every run."""

    def __init__(self, piece, rng: random.Random, max_ms: float = 1.5) -> None:
        super().__init__(piece)
        self.rng, self.max_s = rng, max_ms / 1e3

    def run(self, x, start, keep=1, *args, **kw):
        time.sleep(self.rng.random() * self.max_s)
        out = self.piece.run(x, start, keep, *args, **kw)
        time.sleep(self.rng.random() * self.max_s)
        return out


def pearl_tokens(pieces, ids, policy, params, seed, n=24, drafter=None, stats=None) -> list[int]:
    """The first `n` tokens of PEARL with `drafter` (the self-draft by default)."""
    drafter = drafter or SelfDrafter(pieces)
    loop = pearl(pieces, drafter, policy, ids, params, np.random.default_rng(seed), stats or Stats(), 256)
    out: list[int] = []
    try:
        for new in loop:
            out.extend(new)
            if len(out) >= n:
                return out[:n]
    finally:
        loop.close()
    return out


def test_pearl_is_race_free_under_random_delays(session):
    """32 runs, each with other random delays in shallow, adapter and deep and another policy: greedy equals
    AR; sampling equals the undelayed run of the same seed (the draws are keyed by position)."""
    from dataclasses import replace

    base = session.pieces
    ids = session.prompt_ids("the quick brown fox", session.options())
    ar = session.generate_ids(ids, max_new_tokens=24, mode="ar").tokens
    hot = SamplingParams(temperature=0.8)
    for run in range(32):
        delays = random.Random(run)
        pieces = replace(base, shallow=DelayingPiece(base.shallow, delays), adapter=DelayingPiece(base.adapter, delays),
                         deep=DelayingPiece(base.deep, delays))
        policy = make_policy(["fixed:1", "fixed:3", "confidence:0.4", "fixed:6"][run % 4], 3, 0.5)
        assert pearl_tokens(pieces, ids, policy, SamplingParams(), run) == ar[:24], run
        if run % 4 == 0:
            sampled = pearl_tokens(pieces, ids, make_policy("fixed:3", 3, 0.5), hot, run)
            assert sampled == pearl_tokens(base, ids, make_policy("fixed:3", 3, 0.5), hot, run), run


def test_pearl_sampling_matches_ar_in_distribution(session):
    ids = session.prompt_ids("the quick brown fox", session.options())
    n = 1200

    def pairs(schedule: str, mode: str, seed0: int) -> Counter:
        c = Counter()
        for seed in range(seed0, seed0 + n):
            toks = session.generate_ids(ids, max_new_tokens=3, mode=mode, temperature=0.2, seed=seed,
                                        schedule=schedule, policy="fixed:3").tokens
            c[tuple(toks[1:3])] += 1  # tokens 2-3 come from PEARL's verifications
        return c

    ar, par = pairs("sequential", "ar", 0), pairs("pearl", "self", 100_000)
    common = [k for k in set(ar) | set(par) if ar[k] + par[k] >= 20]
    table = np.array([[ar[k] for k in common] + [n - sum(ar[k] for k in common)],
                      [par[k] for k in common] + [n - sum(par[k] for k in common)]])
    table = table[:, table.sum(0) > 0]
    assert table.shape[1] >= 5, "the test needs a spread-out distribution"
    assert sps.chi2_contingency(table).pvalue > ALPHA


# -- policies -------------------------------------------------------------------------------------------


COST = CostModel(draft_s=0.002, verify_s=0.017, verify_per_token_s=0.0015)


class WrongDrafter:
    """A useless drafter: proposes gamma tokens, each one off the target's (known) greedy output."""

    name = "wrong"

    def __init__(self, answer: list[int], offset: int, vocab: int) -> None:
        self.answer, self.offset, self.vocab = answer, offset, vocab

    def start(self, prompt, hidden):
        pass

    def propose(self, history, budget, policy, params, rng):
        at = len(history) - self.offset
        return Draft([(t + 1) % self.vocab for t in self.answer[at:at + budget]])

    def advance(self, hidden, pos, final):
        pass


class Recording(GoodputPolicy):
    def budget(self) -> int:
        k = super().budget()
        self.chosen = [*getattr(self, "chosen", []), k]
        return k


def test_goodput_stops_drafting_for_a_useless_drafter(session):
    ids = session.prompt_ids("hash table", session.options())
    ar = session.generate_ids(ids, max_new_tokens=80, mode="ar").tokens
    policy = Recording(4, COST)
    drafter = WrongDrafter(ar, len(ids), session.pieces.vocab_size)
    loop = speculative(session.pieces, drafter, policy, ids, SamplingParams(), np.random.default_rng(0), Stats(), 256)
    out: list[int] = []
    for new in loop:
        out.extend(new)
        if len(out) >= 80:
            break
    loop.close()
    assert out[:80] == ar[:80]
    warm = 30  # alpha falls from its prior 0.5 by 5% per rejected draft
    assert policy.chosen[0] > 0 and policy.alpha < 0.15
    late = policy.chosen[warm:]
    # zero drafts, except one probe after every probe_every plain steps
    assert set(late) <= {0, 1} and late.count(1) <= len(late) // (policy.probe_every + 1) + 1


def test_goodput_choice_follows_acceptance_and_costs():
    policy = GoodputPolicy(6, COST)
    policy.alpha = 0.0
    assert policy.best() == 0
    policy.alpha = 0.95
    assert policy.best() == 6
    policy.alpha = 0.3  # the default bundle's adapter: one draft, not three
    assert policy.best() == 1
    free = GoodputPolicy(6, CostModel(0.0, 0.017, 0.0))  # free drafts, flat verification: draft the most
    free.alpha = 0.2
    assert free.best() == 6
    assert expected_tokens(0.5, 2) == pytest.approx(1.75) and expected_tokens(1.0, 3) == 4.0
    policy.observe(3, 3, 0, 0)
    assert policy.alpha > 0.3
    before = policy.alpha
    policy.observe(3, 0, 0, 0)
    assert policy.alpha == pytest.approx(before * (1 - policy.weight))


def test_cost_model_fits_a_line():
    calls = []
    model = CostModel.measure(lambda: calls.append("d"), lambda n: time.sleep(0.002 * n), gamma_max=3, repeats=3)
    assert model.verify_per_token_s == pytest.approx(0.002, rel=0.5)
    assert sorted(model.measured["verify_s"]) == [1, 2, 3, 4] and calls.count("d") == 4


def test_entropy_policy_stops_on_flat_distributions():
    policy = EntropyPolicy(gamma=6, lam=0.5)
    flat = DraftSignal(top_prob=1 / 300, logits=np.zeros(300, dtype=np.float32))
    peaked = np.full(300, -20.0, dtype=np.float32)
    peaked[7] = 10.0
    assert not policy.keep_going(1, flat)
    assert policy.keep_going(1, DraftSignal(top_prob=1.0, logits=peaked))
    assert policy.keep_going(1, DraftSignal(top_prob=0.01))  # no logits (lookup): never stops early
    assert policy.budget() == 6


def test_entropy_policy_drafts_less_than_fixed(session):
    out = session.generate("the quick brown fox", max_new_tokens=40, mode="self", policy="entropy:0.99")
    fixed = session.generate("the quick brown fox", max_new_tokens=40, mode="self", policy="fixed:3")
    assert out.tokens == fixed.tokens and out.stats.drafted < fixed.stats.drafted


@pytest.mark.parametrize("spec, message", [
    ("greedy", "unknown draft-length policy 'greedy'; use fixed[:GAMMA]"),
    ("fixed:x", "policy 'fixed:x' has a bad number after ':'"),
    ("entropy:abc", "has a bad number after ':'"),
    ("fixed:-1", "policy 'fixed:-1' is out of range: GAMMA must be 0 or more"),
    ("confidence:1.5", "ETA is a probability"),
    ("entropy:1", "LAMBDA bounds an acceptance probability"),
    ("goodput:0", "GAMMA_MAX must be at least 1"),
    ("goodput", "the goodput policy needs a cost model"),
])
def test_make_policy_errors(spec, message):
    with pytest.raises(SpecExportError, match=message.replace("[", r"\[").replace("(", r"\(")) as info:
        make_policy(spec, 3, 0.6)
    assert str(info.value).count(". ") == 0  # one sentence


def test_make_policy_forms():
    assert make_policy(None, 3, 0.6).name == "confidence"
    assert make_policy("fixed", 3, 0.6).gamma == 3
    assert make_policy("entropy:0.3", 3, 0.6).lam == 0.3
    goodput = make_policy("goodput:5", 3, 0.6, cost=lambda g: COST)
    assert goodput.gamma_max == 5 and goodput.cost is COST


def test_goodput_rejects_modes_without_a_cost_model(session):
    with pytest.raises(SpecExportError, match="cost model for modes self, model, lookup, not 'hier'"):
        from specexport.runtime.policies import measure_cost

        measure_cost(session.pieces, "hier", 3, 256)


def test_pearl_threads():
    assert pearl_threads(2) == {"deep": 2, "shallow": 2, "adapter": 2, "drafter": 2, "head": 2}  # see pearl_threads
    assert pearl_threads(0) == {"deep": 1, "shallow": 1, "adapter": 1, "drafter": 1, "head": 1}


# -- bench: the cross product ---------------------------------------------------------------------------


def test_bench_systems_cross_modes_schedules_policies(session, tiny_bundles):
    cfg = BenchConfig(bundle=tiny_bundles("ort", 2, adapter="untrained"), modes=["self"], baselines=[],
                      schedules=["sequential", "pearl"], policies=["confidence", "goodput"])
    systems, _ = make_systems(session, cfg, threads=1)
    assert [s.name for s in systems] == [REFERENCE, "specexport-self-sequential-confidence",
                                         "specexport-self-sequential-goodput", "specexport-self-pearl-confidence",
                                         "specexport-self-pearl-goodput"]
    assert systems[3].label == "specexport self · pearl · confidence"
    plain, _ = make_systems(session, BenchConfig(bundle=cfg.bundle, modes=["self"], baselines=[]), threads=1)
    assert [s.name for s in plain] == [REFERENCE, "specexport-self"]  # no --schedule/--policy: names as before
    mixed = BenchConfig(bundle=cfg.bundle, modes=["self", "auto", "lookup"], baselines=[],
                        schedules=["sequential", "pearl"], policies=["goodput"])
    systems, skipped = make_systems(session, mixed, threads=1)
    assert [s.name for s in systems][1:] == ["specexport-self-sequential-goodput", "specexport-self-pearl-goodput",
                                             "specexport-lookup-sequential-goodput"]
    assert "not auto" in skipped["specexport-auto-sequential-goodput"]
    assert "runs mode auto as self, which runs already" in skipped["specexport-auto-pearl-goodput"]
    assert "not lookup;" in skipped["specexport-lookup-pearl-goodput"]


def test_bench_command_runs_the_cross_product(tiny_bundles, tmp_path):
    bundle = tiny_bundles("ort", 2, adapter="untrained")
    questions = write_questions(tmp_path / "q.jsonl")
    out = tmp_path / "report"
    result = CliRunner().invoke(cli(), [
        "bench", "--bundle", str(bundle), "--questions", str(questions), "--categories", "qa,writing", "--limit", "1",
        "--max-new-tokens", "12", "--baselines", "none", "--modes", "self", "--schedule", "sequential,pearl",
        "--policy", "confidence,entropy", "--threads", "1", "--out", str(out), "--no-memory"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    names = ["specexport-self-sequential-confidence", "specexport-self-sequential-entropy",
             "specexport-self-pearl-confidence", "specexport-self-pearl-entropy"]
    assert data["settings"]["systems"] == [REFERENCE, *names]
    for name in names:
        assert data["results"][name]["overall"]["identical_to_ar"] is True, name
    md = Path(out / "report.md").read_text()
    assert "specexport self · pearl · entropy" in md
    speedup = md.split("## Speedup over")[1].split("##")[0]
    assert "| qa |" in speedup and "specexport self · sequential · confidence" in speedup
    assert "per-session thread pools" in md  # the note PEARL's runs carry


def test_generate_command_with_pearl_and_goodput(tiny_bundles):
    """The console entry owns its process (it would switch to the shared pool): --schedule pearl must skip it."""
    from .test_cli import cli as run_cli

    bundle = str(tiny_bundles("ort", 2, adapter="untrained"))
    ar = run_cli("generate", "--bundle", bundle, "--max-new-tokens", "24", "--mode", "ar", "--json", "hash table")
    out = run_cli("generate", "--bundle", bundle, "--max-new-tokens", "24", "--mode", "self", "--schedule", "pearl",
                  "--policy", "goodput", "--json", "hash table")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["tokens"] == json.loads(ar.stdout)["tokens"]
    assert result["stats"]["extra"]["schedule"] == "pearl" and result["stats"]["mode"] == "self, pearl"
    bad = run_cli("generate", "--bundle", bundle, "--policy", "entropy:2", "hash table")
    assert bad.returncode == 2 and "error: policy 'entropy:2' is out of range" in bad.stderr  # a usage error


# -- an independent drafter (the `drafter` piece) under PEARL -------------------------------------------------


class TargetAsDrafter:
    """A stand-in `drafter` piece: the target itself (shallow + deep of a second session, so its caches are
    its own), wrong on purpose at every third position so that rollbacks happen."""

    name = "drafter"

    def __init__(self, other) -> None:
        self.shallow, self.deep = other.pieces.shallow, other.pieces.deep

    def run(self, x, start, keep=1):
        logits = self.deep.run(self.shallow.run(x, start)["hidden"], start, keep=1)["logits"]
        top = int(np.argmax(logits[0, -1]))
        if (start + x.shape[1]) % 3 == 0:
            top = (top + 1) % logits.shape[-1]
        return {"logits": logits, "top_token": np.array([[top]]), "top_prob": np.array([[0.9]], dtype=np.float32)}


def test_pearl_with_an_independent_drafter(session, tiny_bundles):
    from dataclasses import replace

    from specexport.runtime.drafters import ModelDrafter

    other = load(tiny_bundles("ort", 2, adapter="untrained"))
    ids = session.prompt_ids("write a haiku about the sea", session.options())
    ar = session.generate_ids(ids, max_new_tokens=30, mode="ar").tokens
    for run in range(4):
        delays = random.Random(run)
        pieces = replace(session.pieces, drafter=DelayingPiece(TargetAsDrafter(other), delays),
                         deep=DelayingPiece(session.pieces.deep, delays))
        stats = Stats()
        out = pearl_tokens(pieces, ids, make_policy("fixed:4", 4, 0.5), SamplingParams(), run, 30,
                           ModelDrafter(pieces), stats)
        assert out == ar[:30], run
        assert 0 < stats.accepted < stats.drafted  # the planted mistakes were rejected, the rest accepted


# -- TensorRT's two-stream handoff: call order only (no GPU here) ---------------------------------------------


class StreamCudaDouble:
    """Records cuda-python runtime calls; computes nothing (CALL ORDER ONLY, like tests/test_tensorrt_calls)."""

    cudaStreamNonBlocking = 1
    cudaEventDisableTiming = 2

    class cudaMemcpyKind:
        cudaMemcpyDeviceToDevice = 3

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.handles = iter(range(100, 10_000))

    def cudaStreamCreateWithFlags(self, flags):
        return 0, f"stream{next(self.handles)}"

    def cudaEventCreateWithFlags(self, flags):
        return 0, f"event{next(self.handles)}"

    def cudaMalloc(self, nbytes):
        return 0, 0x10000

    def cudaFree(self, ptr):
        return (0,)

    def __getattr__(self, name):  # every other call: recorded, succeeds
        def call(*args):
            self.calls.append((name, *args))
            return (0,)
        return call


class FakeTrtPiece:
    def __init__(self, name, cuda, calls) -> None:
        self.name, self.cudart, self.calls, self.stream = name, cuda, calls, "shared"

    def use_stream(self, stream) -> None:
        self.stream = stream
        self.primary = type("T", (), {"name": "hidden_in"})
        self.result_specs = [type("T", (), {"name": "hidden", "shape": ["batch", "seq", 4], "dtype": "float16"})]

    def input_ptr(self, name):
        return 0x90000

    def run(self, x, start, keep=1, device_in=None, device_out=None):
        self.calls.append((self.name, self.stream, start, device_in, device_out))
        return {"hidden": np.zeros((1, x.shape[1], 4), np.float16), "logits": np.zeros((1, keep, 7), np.float32)}


def test_trt_stream_handoff_call_order():
    from types import SimpleNamespace

    from specexport.runtime.backends.cuda_streams import RING, StreamHandoff
    from specexport.runtime.drafters import Step

    cuda = StreamCudaDouble()
    calls = cuda.calls
    pieces = SimpleNamespace(**{n: FakeTrtPiece(n, cuda, calls) for n in ("shallow", "deep", "adapter")},
                             drafter=None)
    handoff = StreamHandoff(pieces, self_draft=True)
    draft, verify = handoff.draft_stream, handoff.verify_stream
    assert pieces.shallow.stream == pieces.adapter.stream == draft and pieces.deep.stream == verify
    row = 4 * 2  # four fp16 values per position
    slot = 256  # ring slots are bound as TensorRT outputs: 256-byte aligned
    h = handoff.shallow(5, 10)
    handoff.shallow(6, 11)
    assert calls[:3] == [("cudaStreamWaitEvent", draft, handoff.consumed[10], 0),
                         ("shallow", draft, 10, None, {"hidden": 0x10000 + 10 * slot}),
                         ("cudaEventRecord", handoff.written[10], draft)]
    calls.clear()
    items = [Step(h, 6, None, DraftSignal(1.0)), Step(h, 7, None, DraftSignal(1.0))]
    handoff.deep(items, [5, 6], 10)
    d2d = cuda.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    assert calls == [
        ("cudaStreamWaitEvent", verify, handoff.written[10], 0),
        ("cudaMemcpyAsync", 0x90000, 0x10000 + 10 * slot, row, d2d, verify),
        ("cudaEventRecord", handoff.consumed[10], verify),
        ("cudaStreamWaitEvent", verify, handoff.written[11], 0),
        ("cudaMemcpyAsync", 0x90000 + row, 0x10000 + 11 * slot, row, d2d, verify),
        ("cudaEventRecord", handoff.consumed[11], verify),
        ("deep", verify, 10, 0x90000, None),
    ]
    calls.clear()
    handoff.shallow(7, 10 + RING)  # the same slot again: waits until deep copied it
    assert calls[0] == ("cudaStreamWaitEvent", draft, handoff.consumed[10], 0)
    handoff.close()
    assert pieces.shallow.stream == pieces.deep.stream == pieces.adapter.stream == "shared"
    assert [c[0] for c in calls].count("cudaEventDestroy") == 2 * RING
