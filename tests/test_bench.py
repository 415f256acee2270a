"""`specexport bench`: Spec-Bench loading and cutting, the interleaved loop, aggregation, the GenAI worker
protocol, reports and the command.

Most tests use synthetic records, fake systems or a fake onnxruntime_genai (no model). The end-to-end runs
go through a tiny random bundle with an (untrained) adapter and the Hugging Face baselines on its
checkpoint, and, where an interpreter with onnxruntime-genai exists (`make bench-env`), through the real
ONNX Runtime GenAI builder on the same checkpoint; one slow test runs the real default bundle."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from specexport.bench import hf as hf_baseline
from specexport.bench import ortgenai as bench_ortgenai
from specexport.bench import report as bench_report
from specexport.bench import systems as bench_systems
from specexport.bench.machine import default_threads
from specexport.bench.metrics import (
    KEYS,
    METRICS,
    REFERENCE,
    SCHEMA,
    RunResult,
    aggregate,
    compare_to_reference,
    first_mismatch,
    lossless_failure_sentence,
    lossless_failures,
    make_record,
)
from specexport.bench.questions import Question, cut_text, load_questions, resolve_questions
from specexport.bench.report import render_markdown, write_report
from specexport.bench.runner import BenchConfig, run_bench, run_interleaved, start_systems
from specexport.bench.systems import Skip, System, strip_eos
from specexport.cli.bench import register
from specexport.runtime.errors import SpecExportError

from .conftest import fake_genai_library

SPECBENCH = Path(__file__).resolve().parents[2] / "shared" / "specbench" / "question.jsonl"


def write_questions(path: Path) -> Path:
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
        {"question_id": 2, "category": "writing", "turns": ["Write an email."]},
        {"question_id": 3, "category": "qa", "turns": ["Who wrote Hamlet?"]},
        {"question_id": 4, "category": "writing", "turns": ["Write a story."]},
        {"question_id": 5, "category": "qa", "turns": ["What is 2+2?"]},
        {"question_id": 6, "category": "rag", "turns": ["context " * 50 + "question?"], "reference": ["x"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return path


# -- questions ------------------------------------------------------------------------------------------


def test_load_questions_first_turn_in_file_order(tmp_path):
    qs = load_questions(write_questions(tmp_path / "q.jsonl"))
    assert [q.question_id for q in qs] == [1, 2, 3, 4, 5, 6]
    assert qs[0].text == "Write a poem." and qs[0].category == "writing"


def test_load_questions_limit_is_per_category(tmp_path):
    qs = load_questions(write_questions(tmp_path / "q.jsonl"), limit=1)
    assert [(q.category, q.question_id) for q in qs] == [("writing", 1), ("qa", 3), ("rag", 6)]
    qs = load_questions(tmp_path / "q.jsonl", categories=["qa", "writing"], limit=2)
    assert [q.question_id for q in qs] == [1, 2, 3, 5]


def test_load_questions_rejects_unknown_category_and_bad_lines(tmp_path):
    path = write_questions(tmp_path / "q.jsonl")
    with pytest.raises(SpecExportError, match=r"unknown category poetry.*writing, qa, rag"):
        load_questions(path, categories=["poetry"])
    with pytest.raises(SpecExportError, match="at least 1"):
        load_questions(path, limit=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa"}\n')
    with pytest.raises(SpecExportError, match=r"bad\.jsonl:1 is not a Spec-Bench question"):
        load_questions(bad)


def test_resolve_questions(tmp_path, monkeypatch):
    path = write_questions(tmp_path / "q.jsonl")
    assert resolve_questions(str(path)) == path.resolve()
    monkeypatch.chdir(tmp_path)
    assert resolve_questions("q.jsonl") == path.resolve()
    with pytest.raises(SpecExportError, match="--questions"):
        resolve_questions("nowhere.jsonl")


@pytest.mark.skipif(not SPECBENCH.is_file(), reason="shared/specbench is not beside the repository")
def test_real_specbench_through_questions_13_categories():
    path = resolve_questions(str(SPECBENCH))
    assert path == SPECBENCH.resolve() and resolve_questions(None) != path  # Spec-Bench only when asked for
    qs = load_questions(path, limit=2)
    cats = list(dict.fromkeys(q.category for q in qs))
    assert len(cats) == 13 and len(qs) == 26
    assert {"summarization", "rag", "translation", "math_reasoning", "qa", "writing"} <= set(cats)


def test_cut_text_keeps_the_last_tokens():
    text = " ".join(f"w{i}" for i in range(10))
    assert cut_text(text, str.split, " ".join, 20) == (text, False)
    assert cut_text(text, str.split, " ".join, 10) == (text, False)
    assert cut_text(text, str.split, " ".join, 3) == ("w7 w8 w9", True)


def test_default_threads_follow_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert default_threads() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert default_threads() >= 1


# -- one run --------------------------------------------------------------------------------------------


def test_tau_counts_the_eos_step():
    ar_eos = make_record(1, "qa", REFERENCE, RunResult([5] * 49, 1.0, steps=50, finish_reason="eos"), 10, False)
    assert ar_eos["mean_accepted_tokens"] == pytest.approx(1.0)
    spec = make_record(1, "qa", "specexport-self", RunResult([5] * 49, 1.0, steps=20, drafted=40, accepted=30,
                                                             finish_reason="eos"), 10, False)
    assert spec["mean_accepted_tokens"] == pytest.approx(2.5)
    assert spec["acceptance_rate"] == pytest.approx(0.75)
    compare_to_reference([ar_eos, spec], {REFERENCE: [5] * 49, "specexport-self": [5] * 49})
    tau = aggregate([ar_eos, spec], [REFERENCE, "specexport-self"])
    assert tau[REFERENCE]["overall"]["mean_accepted_tokens"] == pytest.approx(1.0)
    assert tau["specexport-self"]["overall"]["identical_to_ar"] is True


def test_strip_eos_and_first_mismatch():
    assert strip_eos([5, 6, 2, 7], {2}, 10) == ([5, 6], "eos")
    assert strip_eos([5, 6, 7], {2}, 2) == ([5, 6], "length")
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 9, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2


# -- aggregation ----------------------------------------------------------------------------------------

QS = [Question(1, "writing", "a"), Question(2, "writing", "b"), Question(3, "qa", "c")]


def synthetic_records() -> list[dict]:
    """AR: 10 tokens in 1 s, 2 s, 1 s. 'spec' is 2x, 1x, 4x faster; differs from AR on question 2.
    'hf' runs at half AR's speed and exposes no steps."""
    ar_out = {1: [1, 2, 3], 2: [4, 5, 6], 3: [7, 8, 9]}
    runs = {
        REFERENCE: {q: RunResult([0] * 10, s, steps=10, drafted=0, accepted=0)
                    for q, s in ((1, 1.0), (2, 2.0), (3, 1.0))},
        "specexport-spec": {1: RunResult([0] * 10, 0.5, steps=5, drafted=8, accepted=5),
                            2: RunResult([0] * 10, 2.0, steps=10, drafted=10, accepted=0),
                            3: RunResult([0] * 10, 0.25, steps=2, drafted=8, accepted=8)},
        "hf": {q: RunResult([0] * 10, s) for q, s in ((1, 2.0), (2, 4.0), (3, 2.0))},
    }
    outs = {REFERENCE: ar_out, "specexport-spec": {1: [1, 2, 3], 2: [4, 5, 0], 3: [7, 8, 9]}, "hf": ar_out}
    records = []
    for q in QS:
        recs = [make_record(q.question_id, q.category, name, runs[name][q.question_id], 40, False) for name in runs]
        compare_to_reference(recs, {name: outs[name][q.question_id] for name in runs})
        records.extend(recs)
    return records


def test_records_get_speedup_and_identity_per_question():
    recs = {(r["system"], r["question_id"]): r for r in synthetic_records()}
    assert recs[("specexport-spec", 1)]["speedup"] == pytest.approx(2.0)
    assert recs[("specexport-spec", 3)]["speedup"] == pytest.approx(4.0)
    assert recs[("specexport-spec", 2)]["identical_to_ar"] is False
    assert recs[("specexport-spec", 2)]["first_mismatch"] == 2
    assert recs[(REFERENCE, 2)]["identical_to_ar"] is True and recs[(REFERENCE, 2)]["speedup"] == 1.0
    assert recs[("specexport-spec", 1)]["mean_accepted_tokens"] == pytest.approx(2.0)
    assert recs[(REFERENCE, 1)]["acceptance_rate"] is None  # nothing drafted: undefined, not 0
    assert recs[("hf", 1)]["mean_accepted_tokens"] is None


def test_aggregate_medians_totals_and_flags():
    results = aggregate(synthetic_records(), [REFERENCE, "specexport-spec", "hf"])
    ar, spec, hf = (results[s]["overall"] for s in (REFERENCE, "specexport-spec", "hf"))
    assert set(METRICS) <= set(ar)
    assert ar["questions"] == 3 and ar["new_tokens"] == 30 and ar["seconds"] == pytest.approx(4.0)
    assert ar["tokens_per_s"] == pytest.approx(10.0)  # median of 10, 5, 10
    assert ar["tokens_per_s_total"] == pytest.approx(7.5)
    assert ar["speedup"] == 1.0 and ar["speedup_total"] == pytest.approx(1.0)
    assert ar["mean_accepted_tokens"] == pytest.approx(1.0) and ar["acceptance_rate"] is None
    assert ar["identical_to_ar"] is True and ar["identical_count"] == 3
    # spec: per question 20, 5, 40 tokens/s; speedups 2, 1, 4
    assert spec["tokens_per_s"] == pytest.approx(20.0)
    assert spec["speedup"] == pytest.approx(2.0)
    assert spec["speedup_total"] == pytest.approx((30 / 2.75) / 7.5)
    assert spec["mean_accepted_tokens"] == pytest.approx(30 / 17)
    assert spec["acceptance_rate"] == pytest.approx(13 / 26)
    assert spec["identical_to_ar"] is False and spec["identical_count"] == 2
    assert spec["ratio_to"]["hf"] == pytest.approx(statistics.median([4.0, 2.0, 8.0]))
    # Spec-Bench's evaluation/speed.py: mean tokens/s over mean tokens/s, 65/3 against 25/3 (AR), 12.5/3 (hf)
    assert spec["speedup_specbench"] == pytest.approx(65 / 25)
    assert spec["ratio_to_specbench"]["hf"] == pytest.approx(65 / 12.5)
    assert ar["speedup_specbench"] == pytest.approx(1.0)
    assert hf["speedup"] == pytest.approx(0.5) and hf["mean_accepted_tokens"] is None
    assert hf["acceptance_rate"] is None and hf["identical_to_ar"] is True
    w = results["specexport-spec"]["categories"]["writing"]
    assert w["questions"] == 2 and w["speedup"] == pytest.approx(1.5) and w["identical_to_ar"] is False
    q = results["specexport-spec"]["categories"]["qa"]
    assert q["speedup"] == pytest.approx(4.0) and q["speedup_total"] == pytest.approx(4.0)
    assert q["identical_to_ar"] is True
    assert list(results[REFERENCE]["categories"]) == ["writing", "qa"]


def test_a_system_that_stopped_early_is_compared_on_its_own_questions():
    records = [r for r in synthetic_records() if not (r["system"] == "hf" and r["question_id"] == 3)]
    hf = aggregate(records, [REFERENCE, "hf"])["hf"]["overall"]
    assert hf["questions"] == 2
    assert hf["speedup_total"] == pytest.approx((20 / 6.0) / (20 / 3.0))  # AR over questions 1 and 2 only


# -- the interleaved loop with fake systems ---------------------------------------------------------


class FakeSystem(System):
    def __init__(self, name, out=(1, 2, 3), fail_on=None, skip=None, calls=None):
        self.name = self.label = name
        self.kind = "specexport" if name.startswith("specexport") else "baseline"
        self.out, self.fail_on, self.skip = list(out), fail_on, skip
        self.calls = calls if calls is not None else []
        self.closed = False

    def setup(self):
        if self.skip:
            raise Skip(self.skip)

    def generate(self, prompt_ids, max_new_tokens):
        self.calls.append((self.name, tuple(prompt_ids)))
        if self.fail_on is not None and prompt_ids[0] == self.fail_on:
            raise RuntimeError("boom")
        return RunResult(self.out[:max_new_tokens], 0.1, steps=len(self.out))

    def close(self):
        self.closed = True


def test_interleaved_rotates_order_and_handles_failures():
    calls: list = []
    systems = [FakeSystem(REFERENCE, calls=calls), FakeSystem("specexport-self", out=(1, 2, 4), calls=calls),
               FakeSystem("hf", fail_on=2, calls=calls)]
    qs = [Question(i, "qa", "x") for i in (1, 2, 3)]
    prompts = [([i], False) for i in (1, 2, 3)]
    skipped: dict = {}
    errors: list = []
    seen = []
    records = run_interleaved(systems, qs, prompts, 8, skipped,
                              progress=lambda s, q, r: seen.append((q.question_id, s, r)), log=lambda m: None,
                              errors=errors)
    # question 1: ar, self, hf; question 2 starts one later: self, hf (fails), ar; question 3: hf, ar, self
    assert [c[0] for c in calls] == [REFERENCE, "specexport-self", "hf", "specexport-self", "hf", REFERENCE,
                                     "hf", REFERENCE, "specexport-self"]
    assert len(seen) == 9
    assert [r is None for _, s, r in seen if s == "hf"] == [False, True, False]  # the failure is one question
    assert errors == [{"system": "hf", "question_id": 2, "category": "qa", "error": "RuntimeError: boom"}]
    assert skipped == {}
    assert [(r["question_id"], r["system"]) for r in records] == [
        (1, REFERENCE), (1, "specexport-self"), (1, "hf"), (2, REFERENCE), (2, "specexport-self"),
        (3, REFERENCE), (3, "specexport-self"), (3, "hf")]
    assert all(r["identical_to_ar"] is False for r in records if r["system"] == "specexport-self")
    assert records[2]["identical_to_ar"] is True


def test_repeats_keep_each_systems_run_of_median_time():
    """With repeats, every question goes round that many times (the order rotating every round) and a
    record is the system's median run: one slow round does not decide its ratio."""

    class Timed(FakeSystem):
        def __init__(self, name, times, **kw):
            super().__init__(name, **kw)
            self.times = list(times)

        def generate(self, prompt_ids, max_new_tokens):
            result = super().generate(prompt_ids, max_new_tokens)
            return RunResult(result.tokens, self.times.pop(0), steps=result.steps)

    calls: list = []
    systems = [Timed(REFERENCE, [0.2, 0.9, 0.2], calls=calls), Timed("hf", [0.1, 0.1, 5.0], calls=calls)]
    seen = []
    records = run_interleaved(systems, [Question(1, "qa", "x")], [([1], False)], 8, {},
                              progress=lambda s, q, r: seen.append(s), log=lambda m: None, repeats=3)
    assert [c[0] for c in calls] == [REFERENCE, "hf", "hf", REFERENCE, REFERENCE, "hf"]
    assert len(seen) == 6
    ref, hf = records
    assert ref["seconds"] == 0.2 and ref["seconds_runs"] == [0.2, 0.9, 0.2]
    assert hf["seconds"] == 0.1 and hf["seconds_runs"] == [0.1, 0.1, 5.0]
    assert hf["speedup"] == pytest.approx(2.0)  # the medians: 0.2 s against 0.1 s, not 0.9 or 5.0
    with pytest.raises(SpecExportError, match="--repeats must be at least 1"):
        run_bench(BenchConfig(bundle=Path("nowhere"), repeats=0))


def test_reference_failure_is_an_error_and_skips_are_reported():
    with pytest.raises(RuntimeError):
        run_interleaved([FakeSystem(REFERENCE, fail_on=1)], [Question(1, "qa", "x")], [([1], False)], 8, {})
    skipped: dict = {}
    broken = FakeSystem("hf-lookup", fail_on=1)
    systems, setup_s = start_systems([FakeSystem(REFERENCE), FakeSystem("hf", skip="torch is not installed"),
                                      broken], skipped, ([1], 2), log=lambda m: None)
    assert [s.name for s in systems] == [REFERENCE] and set(setup_s) == {REFERENCE}
    assert skipped["hf"] == "torch is not installed"
    assert skipped["hf-lookup"] == "failed to start: RuntimeError: boom" and broken.closed


def test_hf_baseline_skips_with_a_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_systems, "missing", lambda module: module == "torch")
    with pytest.raises(Skip, match=r"torch is not installed \(pip install"):
        hf_baseline.HFSystem(tmp_path, {2}).setup()
    monkeypatch.setattr(bench_systems, "missing", lambda module: False)
    with pytest.raises(Skip, match=r"checkpoint .*gone is not on this machine"):
        hf_baseline.HFSystem(tmp_path / "gone", {2}).setup()


# -- ONNX Runtime GenAI: interpreter, builder guard, worker protocol ------------------------------------


def fake_python(path: Path, answer: dict) -> str:
    """An 'interpreter' that answers the worker's `versions` call with `answer`."""
    path.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    path.chmod(0o755)
    return str(path)


def test_genai_skips_with_a_reason(tmp_path):
    with pytest.raises(Skip, match=r"interpreter .*nowhere/python does not exist; run `make bench-env`"):
        bench_ortgenai.env_versions(str(tmp_path / "nowhere" / "python"))
    python = fake_python(tmp_path / "py", {"onnxruntime-genai": None, "executable": "py"})
    with pytest.raises(Skip, match=r"onnxruntime-genai is not installed in .*py; run `make bench-env`"):
        bench_ortgenai.env_versions(python)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(Skip, match=r"checkpoint .*ckpt is not on this machine"):
        bench_ortgenai.OrtGenAISystem(ckpt, {2}, python=python).setup()


def test_genai_builder_needs_transformers_5(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "cache"))
    found = {"onnxruntime-genai": "0.18.0", "transformers": "4.57.1", "torch": "2.13.0", "executable": "/py"}
    ckpt = tmp_path / "ckpt"
    with pytest.raises(Skip, match=r"needs transformers >= 5 but /py has 4\.57\.1; run `make bench-env`"):
        bench_ortgenai.build_model("/py", found, ckpt, "k", "fp32", log=lambda m: None)
    with pytest.raises(Skip, match=r"needs torch and transformers >= 5"):
        bench_ortgenai.build_model("/py", {**found, "torch": None}, ckpt, "k", "fp32", log=lambda m: None)


def test_find_python_order(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECEXPORT_ORTGENAI_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    assert bench_ortgenai.find_python("/given/python") == "/given/python"
    monkeypatch.setenv("SPECEXPORT_ORTGENAI_PYTHON", "/env/python")
    assert bench_ortgenai.find_python() == "/env/python"
    monkeypatch.delenv("SPECEXPORT_ORTGENAI_PYTHON")
    (tmp_path / ".venv-genai" / "bin").mkdir(parents=True)
    (tmp_path / ".venv-genai" / "bin" / "python").write_text("")
    assert bench_ortgenai.find_python() == str(tmp_path / ".venv-genai" / "bin" / "python")


FAKE_GENAI = '''
"""A stand-in for onnxruntime_genai: greedy 'generation' counts up from the last prompt token."""
print("noise on stdout that must not reach the protocol")


class Config:
    def __init__(self, path):
        self.path = path

    def overlay(self, text):
        import json
        assert json.loads(text)["model"]["decoder"]["session_options"]["intra_op_num_threads"] == 3


class Model:
    def __init__(self, config):
        pass


class GeneratorParams:
    def __init__(self, model):
        pass

    def set_search_options(self, **options):
        self.max_length, self.min_length = options["max_length"], options["min_length"]


class Generator:
    def __init__(self, model, params):
        self.max_length, self.min_length, self.ids = params.max_length, params.min_length, []

    def append_tokens(self, ids):
        self.ids = list(ids)

    def is_done(self):
        return len(self.ids) >= self.max_length or self.ids[-1] == 99

    def generate_next_token(self):
        print("more noise")
        token = self.ids[-1] + 1
        if token == 99 and len(self.ids) + 1 < self.min_length:  # EOS held off before min_length, as GenAI does
            token += 1
        self.ids.append(token)

    def get_next_tokens(self):
        return [self.ids[-1]]
'''


def test_genai_worker_protocol_with_a_fake_library(tmp_path, monkeypatch):
    """The whole OrtGenAISystem path (interpreter check, cached model, worker, EOS, close) against a fake
    onnxruntime_genai, so the protocol is tested where the real library is not installed."""
    ckpt = fake_genai_library(tmp_path, monkeypatch, FAKE_GENAI)
    assert bench_ortgenai.env_versions(sys.executable)["onnxruntime-genai"] == "0.0.1"

    system = bench_ortgenai.OrtGenAISystem(ckpt, {99}, "fp32", threads=3, python=sys.executable, source_key="sha")
    system.setup()
    try:
        assert "onnxruntime-genai 0.0.1" in system.note and system.versions["onnxruntime-genai"] == "0.0.1"
        out = system.generate([1, 2, 10], 4)
        assert out.tokens == [11, 12, 13, 14] and out.finish_reason == "length" and out.steps == 4
        out = system.generate([95], 10)
        assert out.tokens == [96, 97, 98] and out.finish_reason == "eos" and out.steps == 4
        assert out.seconds > 0
        system.ignore_eos = True  # bench --ignore-eos: the run is max_new_tokens long, EOS held off
        out = system.generate([95], 10)
        assert out.tokens == [96, 97, 98, *range(100, 107)] and out.finish_reason == "length" and out.steps == 10
    finally:
        system.close()
    assert system.proc is None


# -- reports --------------------------------------------------------------------------------------------


def synthetic_report() -> dict:
    names = [REFERENCE, "specexport-spec", "hf"]
    records = synthetic_records()
    return {
        "schema": SCHEMA, "keys": KEYS, "created": "2026-01-01T00:00:00+00:00", "command": "specexport bench",
        "elapsed_s": 1.0,
        "machine": {"cpu_model": "Test CPU", "cores": 2, "platform": "x", "python": "3.11",
                    "loadavg_start": [0.1, 0.1, 0.1], "loadavg_end": [0.2, 0.1, 0.1]},
        "versions": {"specexport": "0.1.0", "torch": None,
                     "ortgenai_env": {"onnxruntime-genai": "0.18.0", "executable": "/x/python"}},
        "bundle": {"path": "/b", "name": "tiny", "precision": "fp32", "flavour": "ort", "exit_layer": 2,
                   "pieces": ["shallow", "deep"], "checkpoint": None},
        "settings": {"questions": "q.jsonl", "categories": ["writing", "qa"], "limit": 2, "max_new_tokens": 128,
                     "max_prompt_tokens": 1500, "greedy": True, "batch_size": 1, "warmup": True,
                     "threads": 2, "reference": REFERENCE, "systems": names},
        "systems": {n: {"label": {"hf": "HF transformers"}.get(n, n), "kind": "baseline" if n == "hf" else "specexport",
                        "mode": "ar", "precision": "fp32", "setup_s": 0.1, "note": ""} for n in names},
        "skipped": {"ortgenai-fp32": "onnxruntime-genai is not installed"},
        "results": aggregate(records, names),
        "memory": {"mode": "auto", "exit_code": 0, "peak_rss_bytes": 700e6, "weights_fp32_bytes": 538e6,
                   "bundle_bytes": 650e6, "ratio": 700 / 538, "ratio_to_bundle": 700 / 650},
        "records": records,
    }


def test_lossless_failures_name_specexport_systems_only():
    """A specexport system that differs from AR fails the run; a baseline that differs, or one described as
    lossy, does not."""
    report = synthetic_report()
    assert lossless_failures(report) == {"specexport-spec": (1, 3)}
    sentence = lossless_failure_sentence(report)
    assert "\n" not in sentence and ". " not in sentence  # one sentence
    assert f"specexport-spec differs from {REFERENCE}'s output on 1 of 3 questions" in sentence
    for r in report["records"]:
        if r["system"] == "hf":
            r["identical_to_ar"] = False
    report["systems"]["specexport-spec"]["lossy"] = True
    assert lossless_failures(report) == {} and lossless_failure_sentence(report) is None
    report["systems"]["specexport-spec"]["lossy"] = False
    for r in report["records"]:
        if r["system"] == "specexport-spec":
            r["identical_to_ar"] = True
    assert lossless_failure_sentence(report) is None
    # a specexport mode that crashed on a question fails the run too; a baseline's crash does not
    report["errors"] = [{"system": "hf", "question_id": 1, "category": "qa", "error": "RuntimeError: boom"}]
    assert lossless_failure_sentence(report) is None
    report["errors"].append({"system": "specexport-spec", "question_id": 2, "category": "qa", "error": "x"})
    assert "specexport-spec failed on 1 question" in lossless_failure_sentence(report)


def test_keys_document_every_key_of_the_report():
    report = synthetic_report()
    assert set(report) <= set(KEYS)
    assert {"schema", "results", "records", "memory", "machine", "versions", "command", "chart"} <= set(KEYS)
    for metric in METRICS:
        assert f"results.*.{metric}" in KEYS
    # the stable names CI pipelines read, per system, overall and per category
    for block in (report["results"]["hf"]["overall"], report["results"]["hf"]["categories"]["qa"]):
        assert {"tokens_per_s", "speedup", "mean_accepted_tokens", "acceptance_rate", "identical_to_ar"} <= set(block)


def test_markdown_tables():
    md = render_markdown(synthetic_report())
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("| system |"))
    assert "tokens/s (median)" in header and "speedup (median)" in header and "identical to AR" in header
    row = next(line for line in lines if line.startswith("| specexport-spec |"))
    assert "| 20.0 |" in row and "2.00×" in row and "**no** (2/3)" in row and "50.0%" in row
    assert next(line for line in lines if line.startswith("| HF transformers |")).count("–") >= 2
    assert "| category | specexport-ar | specexport-spec | HF transformers |" in md
    assert "| writing |" in md and "| qa |" in md
    assert "## Side by side" in md and "| specexport-spec | 2.00× | 1 | 4.00× |" in md
    assert "## Side by side, Spec-Bench's way" in md and "| specexport-spec | 2.60× | 1 | 5.20× |" in md
    assert "2.60× |" in row  # the Spec-Bench speedup column
    # per category both ways: writing's median of 2x and 1x, and mean 12.5 tokens/s over AR's mean 7.5
    tables = {t.split("\n")[0]: t for t in md.split("## ")}
    median_table = tables["Speedup over specexport-ar per category (median over questions)"]
    specbench_table = tables["Speedup over specexport-ar per category, Spec-Bench's way (mean tokens/s ÷"
                             " specexport-ar's mean)"]
    assert "| writing | 1.50× | 0.50× |" in median_table
    assert "| writing | 1.67× | 0.50× |" in specbench_table and "| qa | 4.00× | 0.50× |" in specbench_table
    assert "outputs differ from specexport AR" in md
    assert "ortgenai-fp32: onnxruntime-genai is not installed" in md
    assert "1.30× the fp32 weights on disk" in md
    assert "ONNX Runtime GenAI's interpreter: onnxruntime-genai 0.18.0" in md and "/x/python" not in md


def test_write_report_files(tmp_path):
    paths = write_report(synthetic_report(), tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert set(data) <= set(KEYS)
    assert data["schema"] == SCHEMA and data["keys"] == KEYS
    assert data["results"]["specexport-spec"]["overall"]["identical_to_ar"] is False
    assert paths["md"].read_text().startswith("# specexport bench: tiny (fp32)")
    if bench_systems.missing("matplotlib"):
        assert "matplotlib" in paths["png"] and data["chart"] is None
    else:
        assert Path(paths["png"]).read_bytes()[:4] == b"\x89PNG" and data["chart"] == "report.png"


def test_chart_skipped_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_report, "missing", lambda module: module == "matplotlib")
    paths = write_report(synthetic_report(), tmp_path)
    assert "matplotlib is not installed" in paths["png"]
    assert not (tmp_path / "report.png").exists()
    assert "No chart: matplotlib is not installed" in (tmp_path / "report.md").read_text()
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["chart"] is None and "matplotlib" in data["chart_note"]


def test_bench_is_light_to_import():
    code = ("import sys, specexport.bench.runner, specexport.cli.bench, specexport.bench.report;"
            " print(sorted(m for m in ('torch', 'transformers', 'onnxruntime', 'onnxruntime_genai', 'matplotlib')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def cli() -> click.Group:
    @click.group()
    def main():
        pass

    register(main)
    return main


def test_cli_registers_bench():
    result = CliRunner().invoke(cli(), ["bench", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--bundle", "--questions", "--categories", "--limit", "--max-new-tokens", "--modes",
                   "--baselines", "--out", "--json", "--threads", "--genai-python"):
        assert option in result.output


def test_cli_errors_are_one_sentence(tiny_bundles, tmp_path):
    from specexport.cli.main import main

    bundle = tiny_bundles("ort", 2)
    questions = write_questions(tmp_path / "q.jsonl")
    runner = CliRunner()
    result = runner.invoke(main, ["bench", "--bundle", str(bundle), "--questions", str(questions),
                                  "--categories", "poetry", "--out", str(tmp_path / "r")])
    assert result.exit_code == 1 and "error: unknown category poetry" in result.output
    assert "Traceback" not in result.output
    for args, message in ((["--baselines", "vllm"], "error: unknown baseline 'vllm'"),
                          (["--policy", "bogus"], "error: unknown draft-length policy 'bogus'"),
                          (["--tree", "8:0"], "error: --tree '8:0' is not a tree shape"),
                          (["--max-new-tokens", "0"], "error: --max-new-tokens must be at least 1"),
                          (["--max-prompt-tokens", "300"], "error: question 6 is")):
        result = runner.invoke(main, ["bench", "--bundle", str(bundle), "--questions", str(questions),
                                      "--out", str(tmp_path / "r"), *args])
        assert result.exit_code == 1 and message in result.output, result.output
    assert not (tmp_path / "r").exists()


# -- end to end -----------------------------------------------------------------------------------------


MISSING = ("is not installed", "does not exist", "is not on this machine", "did not report its packages")


def ran_or_told_why(data: dict, name: str, questions: int) -> None:
    """A peer either ran every question and produced tokens, or was skipped with one sentence naming what is
    missing here (a package, an interpreter, the checkpoint); not both (a system that stopped early is in
    both), and not a failure (a failed start or run is a bug, not a missing piece)."""
    ran, skipped = name in data["results"], name in data["skipped"]
    assert ran != skipped, (name, data["skipped"].get(name))
    if skipped:
        reason = data["skipped"][name]
        assert "\n" not in reason and "Traceback" not in reason and not reason.startswith("failed"), reason
        assert any(m in reason for m in MISSING), reason
        return
    overall = data["results"][name]["overall"]
    assert overall["questions"] == questions and overall["new_tokens"] > 0 and overall["tokens_per_s"] > 0, overall
    records = [r for r in data["records"] if r["system"] == name]
    assert len(records) == questions and all(r["seconds"] > 0 for r in records)


def test_end_to_end_tiny_bundle(tiny_bundles, tmp_path):
    """The whole command on a tiny random model: the bundle's AR and self modes, HF and its prompt lookup
    on the same checkpoint, every output compared with AR's; an ortgenai baseline with no GenAI
    interpreter is skipped with the reason."""
    pytest.importorskip("transformers")
    bundle = tiny_bundles("ort", 2, adapter="untrained")
    questions = write_questions(tmp_path / "q.jsonl")
    out = tmp_path / "report"
    missing_genai = fake_python(tmp_path / "py", {"onnxruntime-genai": None, "executable": "py"})
    result = CliRunner().invoke(cli(), [
        "bench", "--bundle", str(bundle), "--questions", str(questions), "--categories", "qa,rag", "--limit", "1",
        "--max-new-tokens", "12", "--max-prompt-tokens", "40", "--baselines", "hf,hf-lookup,ortgenai",
        "--genai-python", missing_genai, "--threads", "1", "--out", str(out), "--no-memory", "--tree", "8", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    assert json.loads(result.stdout) == data
    assert data["settings"]["categories"] == ["qa", "rag"] and data["settings"]["threads"] == 1
    assert data["settings"]["systems"] == [REFERENCE, "specexport-self", "specexport-lookup", "specexport-auto", "hf",
                                           "hf-lookup"]
    assert "no drafter piece" in data["skipped"]["specexport-model"]  # and hier: modes the bundle cannot run
    assert "no drafter piece" in data["skipped"]["specexport-model-tree8"]
    assert "onnxruntime-genai is not installed" in data["skipped"]["ortgenai-fp32"]
    records = data["records"]
    for r in records:  # auto says how its steps split between its choices; nothing else has choices
        if r["system"] == "specexport-auto":
            assert 1 <= sum(r["auto_steps"].values()) <= r["steps"] - 1 and "self" in r["auto_steps"]
        else:
            assert r["auto_steps"] is None
    rag = [r for r in records if r["category"] == "rag"]
    assert all(r["prompt_cut"] for r in rag) and not any(r["prompt_cut"] for r in records if r["category"] == "qa")
    assert len({r["prompt_tokens"] for r in rag}) == 1  # every system got the same prompt ids
    ar = data["results"][REFERENCE]["overall"]
    assert ar["questions"] == 2 and ar["speedup"] == 1.0 and ar["mean_accepted_tokens"] == pytest.approx(1.0)
    spec = data["results"]["specexport-self"]
    assert spec["overall"]["identical_to_ar"] is True  # lossless
    assert spec["overall"]["mean_accepted_tokens"] >= 1.0 and spec["overall"]["acceptance_rate"] is not None
    assert set(spec["categories"]) == {"qa", "rag"}
    for name in ("hf", "hf-lookup"):
        ran_or_told_why(data, name, questions=2)
        assert data["results"][name]["overall"]["mean_accepted_tokens"] >= 1.0
    ran_or_told_why(data, "ortgenai-fp32", questions=2)
    md = (out / "report.md").read_text()
    assert md.count("| qa |") >= 3 and "Lossless check: every speculative output equals" in md


def test_a_lossless_mode_that_differs_from_ar_fails_the_run(tiny_bundles, tmp_path, monkeypatch):
    """The real command on a tiny bundle with one mode broken on purpose (its last token changed): the
    report is still written, then the run exits 1 with one sentence naming the system and how many
    questions differed; the intact mode is not named."""
    bundle = tiny_bundles("ort", 2, adapter="untrained")
    real = bench_systems.SpecExportSystem.generate

    def generate(self, prompt_ids, max_new_tokens):
        result = real(self, prompt_ids, max_new_tokens)
        if self.mode == "lookup" and result.tokens:
            result.tokens[-1] = (result.tokens[-1] + 1) % 300
        return result

    monkeypatch.setattr(bench_systems.SpecExportSystem, "generate", generate)
    out = tmp_path / "report"
    result = CliRunner().invoke(cli(), [
        "bench", "--bundle", str(bundle), "--questions", str(write_questions(tmp_path / "q.jsonl")),
        "--categories", "qa", "--max-new-tokens", "8", "--modes", "self,lookup", "--baselines", "none",
        "--threads", "1", "--no-warmup", "--no-memory", "--out", str(out)])
    assert result.exit_code == 1, result.output
    data = json.loads((out / "report.json").read_text())  # written before the run failed
    assert data["results"]["specexport-lookup"]["overall"]["identical_count"] == 0
    assert data["results"]["specexport-self"]["overall"]["identical_to_ar"] is True
    assert "outputs differ from specexport AR" in (out / "report.md").read_text()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    wanted = "specexport-lookup differs from specexport-ar's output on 2 of 2 questions"
    assert len(errors) == 1 and wanted in errors[0], result.stderr
    assert "specexport-self" not in errors[0] and "Traceback" not in result.output


def test_ignore_eos_runs_every_system_to_max_new_tokens(tiny_bundles, tmp_path, monkeypatch):
    """`--ignore-eos` on a tiny bundle whose every token id is taken as EOS: without it each run would end at
    its first token; with it every system's every run is --max-new-tokens long, and the report says so."""
    from specexport.runtime import text

    real_init = text.TextCodec.__init__

    def every_token_ends(self, root, spec):
        real_init(self, root, spec)
        self.eos_ids = set(range(self.tokenizer.get_vocab_size()))

    monkeypatch.setattr(text.TextCodec, "__init__", every_token_ends)
    out = tmp_path / "report"
    result = CliRunner().invoke(cli(), [
        "bench", "--bundle", str(tiny_bundles("ort", 2, adapter="untrained")), "--questions",
        str(write_questions(tmp_path / "q.jsonl")), "--categories", "qa", "--max-new-tokens", "9", "--modes",
        "self,lookup", "--baselines", "none", "--threads", "1", "--no-warmup", "--no-memory", "--ignore-eos",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    assert data["settings"]["ignore_eos"] is True
    assert {r["system"] for r in data["records"]} == {REFERENCE, "specexport-self", "specexport-lookup"}
    assert all(r["new_tokens"] == 9 and r["finish_reason"] == "length" for r in data["records"])
    assert data["results"]["specexport-self"]["overall"]["identical_to_ar"] is True
    assert "exactly 9 new tokens (EOS ignored)" in (out / "report.md").read_text()


def test_hf_baseline_ignore_eos(tiny_checkpoint):
    """HF's generate with its third token taken as EOS stops before it; with ignore_eos (EOS held off by
    min_new_tokens) it gives max_new_tokens."""
    pytest.importorskip("transformers")
    system = hf_baseline.HFSystem(tiny_checkpoint, {-1}, threads=1)
    system.setup()
    try:
        free = system.generate([1, 40, 41, 42], 6).tokens
        system.eos_ids = {free[2]}
        assert system.generate([1, 40, 41, 42], 6).tokens == free[:free.index(free[2])]
        system.ignore_eos = True
        out = system.generate([1, 40, 41, 42], 6)
        assert len(out.tokens) == 6 and out.finish_reason == "length" and free[2] not in out.tokens[:6]
    finally:
        system.close()


def test_genai_baseline_on_the_tiny_checkpoint(genai_python, tiny_checkpoint, tmp_path, monkeypatch):
    """The real ONNX Runtime GenAI builder fed the local checkpoint (offline), then greedy decoding in the
    worker: the same prompt ids give tokens, and a second set-up reuses the cached model."""
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "cache"))
    logs: list[str] = []
    system = bench_ortgenai.OrtGenAISystem(tiny_checkpoint, {2}, "fp32", threads=1, python=genai_python,
                                           source_key="tiny", log=logs.append)
    system.setup()
    try:
        out = system.generate([1, 40, 41, 42, 43], 8)
        assert 0 < out.new_tokens <= 8 and out.seconds > 0 and out.steps >= out.new_tokens
    finally:
        system.close()
    assert len(logs) == 1 and "building the ONNX Runtime GenAI fp32 model" in logs[0]
    again = bench_ortgenai.OrtGenAISystem(tiny_checkpoint, {2}, "fp32", threads=1, python=genai_python,
                                          source_key="tiny", log=logs.append)
    again.setup()
    again.close()
    assert len(logs) == 1  # built once, then taken from the cache


@pytest.mark.slow
def test_end_to_end_default_bundle(default_bundle, tmp_path):
    """Two Spec-Bench questions, 32 tokens, on SmolLM2 with every default baseline that can run here and the
    memory probe: specexport modes are lossless and HF's fp32 greedy output equals the bundle's. One thread per
    system: the bench otherwise gives PyTorch every core, and two spinning OpenMP threads on a shared 2-core
    machine make the HF baseline several times slower (what is tested does not depend on the count). Prompts cut
    to their last 256 tokens: the summarization question's ~700 made every system's prefill most of the test's
    time, and the cut is the bench's own (--max-prompt-tokens)."""
    if not SPECBENCH.is_file():
        pytest.skip("shared/specbench is not beside the repository")
    out = tmp_path / "report"
    result = CliRunner().invoke(cli(), [
        "bench", "--bundle", str(default_bundle), "--questions", str(SPECBENCH), "--categories", "qa,summarization",
        "--limit", "1", "--max-new-tokens", "32", "--max-prompt-tokens", "256", "--tree", "16", "--threads", "1",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    assert data["results"][REFERENCE]["overall"]["new_tokens"] > 0
    assert data["settings"]["trees"] == ["16"] and "specexport-model-tree16" in data["results"]
    assert data["settings"]["max_prompt_tokens"] == 256
    assert data["results"]["hf"]["overall"]["identical_to_ar"] is True
    for name, res in data["results"].items():
        if data["systems"][name]["kind"] == "specexport":
            assert res["overall"]["identical_to_ar"] is True, name
    for name in ("hf-lookup", "ortgenai-fp32"):
        ran_or_told_why(data, name, questions=2)
    mem = data["memory"]
    assert mem["exit_code"] == 0 and mem["peak_rss_bytes"] > 100e6 and mem["weights_fp32_bytes"] > 500e6
    assert "tokens/s per category" in (out / "report.md").read_text()


@pytest.mark.skipif(bench_systems.missing("matplotlib"), reason="the chart needs matplotlib")
def test_the_chart_names_its_questions_draws_real_categories_and_keeps_its_legend_on_the_page():
    """Before: titled "Spec-Bench" whatever --questions held, an "overall" bar group beside the only category
    (the same figures twice), and six legend columns of long labels cut off at both edges."""
    import copy

    import matplotlib.pyplot as plt

    report = copy.deepcopy(synthetic_report())
    report["settings"]["questions"] = "/data/my-chat-prompts.jsonl"
    report["settings"]["categories"] = ["writing"]
    for s in report["systems"]:
        report["systems"][s]["label"] = f"{s} with a long descriptive label for the legend"
        report["results"][s]["categories"] = {"writing": report["results"][s]["categories"]["writing"]}
    fig = bench_report.chart_figure(report)
    try:
        assert fig._suptitle.get_text().startswith("my-chat-prompts.jsonl ·")
        for ax in fig.axes:
            assert [t.get_text() for t in ax.get_xticklabels()] == ["writing"]
        (legend,) = fig.legends
        box = legend.get_window_extent()
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1
    finally:
        plt.close(fig)
    assert bench_report.question_set({"questions": "x/spec_bench/question.jsonl"}) == "Spec-Bench"
    assert bench_report.question_set({"questions": "recipes/data/bench_prompts.jsonl"}) == "the shipped bench prompts"
