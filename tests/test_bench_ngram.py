"""ONNX Runtime GenAI's own n-gram speculation as a bench baseline (ortgenai-ngram-*), and the report's
comparison with GenAI at its best: per question the faster of GenAI's AR and its n-gram run.

Synthetic records and a fake onnxruntime_genai cover the arithmetic and the worker's protocol; where an
interpreter with the real onnxruntime-genai exists (`make bench-env`), one short run goes through it.
"""

from __future__ import annotations

import statistics
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from specexport.bench import ortgenai as bench_ortgenai
from specexport.bench import runner as bench_runner
from specexport.bench.metrics import REFERENCE, RunResult, aggregate, compare_to_reference, make_record
from specexport.bench.report import genai_best, render_markdown
from specexport.bench.runner import BASELINES, BenchConfig, check_config, make_systems
from specexport.runtime.errors import SpecExportError

from .conftest import fake_genai_library

# -- the faster of the two, per question ----------------------------------------------------------------

# seconds for 12 tokens per question: GenAI AR wins question 1, its n-gram run questions 2 and 3
SECONDS = {
    REFERENCE: {1: 1.0, 2: 1.0, 3: 1.0},  # 12 tokens/s
    "specexport-lookup": {1: 0.5, 2: 0.5, 3: 0.25},  # 24, 24, 48
    "ortgenai-fp32": {1: 0.5, 2: 1.0, 3: 1.0},  # 24, 12, 12
    "ortgenai-ngram-fp32": {1: 1.0, 2: 0.25, 3: 0.5},  # 12, 48, 24
    "hf": {1: 2.0, 2: 2.0, 3: 2.0},
}


def report_of(seconds: dict[str, dict[int, float]]) -> dict:
    """The parts of a bench report that genai_best and render_markdown read, from `seconds` per system and
    question (12 tokens each; every output equal to AR's)."""
    names = list(seconds)
    records = []
    for q in sorted({q for runs in seconds.values() for q in runs}):
        recs = [make_record(q, "qa", name, RunResult([0] * 12, runs[q], steps=12), 40, False)
                for name, runs in seconds.items() if q in runs]
        compare_to_reference(recs, {r["system"]: [0] * 12 for r in recs})
        records.extend(recs)
    kinds = {n: "specexport" if n.startswith("specexport") else "baseline" for n in names}
    return {
        "created": "2026-01-01T00:00:00+00:00", "command": "", "bundle": {"name": "tiny", "precision": "fp32"},
        "machine": {"cpu_model": "Test CPU", "cores": 2},
        "versions": {"specexport": "0.1.0"},
        "settings": {"categories": ["qa"], "limit": None, "max_new_tokens": 12, "max_prompt_tokens": 1500,
                     "threads": 2, "reference": REFERENCE, "systems": names},
        "systems": {n: {"label": n, "kind": kinds[n], "mode": "ar", "precision": "fp32", "note": ""}
                    for n in names},
        "skipped": {}, "errors": [], "memory": None, "records": records, "results": aggregate(records, names),
    }


def test_genai_best_takes_the_faster_of_ar_and_ngram_per_question():
    best = genai_best(report_of(SECONDS))
    assert list(best) == ["fp32"]
    fp32 = best["fp32"]
    assert (fp32["ar"], fp32["ngram"], fp32["questions"], fp32["ngram_wins"]) == (
        "ortgenai-fp32", "ortgenai-ngram-fp32", 3, 2)
    # per question the best is 24, 48, 24 tokens/s: the AR's on question 1, the n-gram run's on 2 and 3
    assert fp32["ratio"][REFERENCE] == pytest.approx(statistics.median([12 / 24, 12 / 48, 12 / 24]))
    assert fp32["ratio"]["specexport-lookup"] == pytest.approx(statistics.median([24 / 24, 24 / 48, 48 / 24]))
    # not the ratio to either GenAI system alone, which the side-by-side table already has
    results = report_of(SECONDS)["results"]["specexport-lookup"]["overall"]["ratio_to"]
    assert fp32["ratio"]["specexport-lookup"] not in (results["ortgenai-fp32"], results["ortgenai-ngram-fp32"])
    assert set(fp32["ratio"]) == {REFERENCE, "specexport-lookup"}  # specexport systems only


def test_genai_best_covers_only_questions_both_ran_and_precisions_paired():
    seconds = {**SECONDS, "ortgenai-ngram-fp32": {2: 0.25, 3: 0.5}}  # the n-gram run failed on question 1
    fp32 = genai_best(report_of(seconds))["fp32"]
    assert fp32["questions"] == 2 and fp32["ngram_wins"] == 2
    assert fp32["ratio"][REFERENCE] == pytest.approx(statistics.median([12 / 48, 12 / 24]))
    # AR at fp32 beside n-gram at int4 is no pair: nothing to compare with
    unpaired = {REFERENCE: SECONDS[REFERENCE], "ortgenai-fp32": SECONDS["ortgenai-fp32"],
                "ortgenai-ngram-int4": SECONDS["ortgenai-ngram-fp32"]}
    assert genai_best(report_of(unpaired)) == {}


def test_markdown_has_the_genai_best_table_only_when_a_pair_ran():
    md = render_markdown(report_of(SECONDS))
    table = md.split("## Against ONNX Runtime GenAI's best")[1].split("\n## ")[0]
    assert "| | GenAI best fp32 |" in table
    assert "| specexport-ar | 0.50× |" in table and "| specexport-lookup | 1.00× |" in table
    assert "ortgenai" not in table.split("\n\n")[1] and "hf" not in table  # rows: specexport systems
    assert "n-gram was the faster on 2 of 3 questions" in table
    assert "## Side by side" in md  # the existing tables stay
    without = {k: v for k, v in SECONDS.items() if k != "ortgenai-ngram-fp32"}
    assert "GenAI's best" not in render_markdown(report_of(without))


# -- the baseline names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ortgenai-ngram-fp32", "ortgenai-ngram-int4", "ortgenai-ngram-int8"])
def test_ngram_baselines_are_accepted(name):
    assert name in BASELINES
    check_config(BenchConfig(bundle="b", baselines=["ortgenai", name]))


@pytest.mark.parametrize("name", ["ortgenai-ngram", "ortgenai-ngram-fp16", "ortgenai-fp32-ngram", "ngram"])
def test_other_ngram_names_are_refused(name):
    with pytest.raises(SpecExportError, match=f"unknown baseline '{name}'; use any of .*ortgenai-ngram-int4"):
        check_config(BenchConfig(bundle="b", baselines=[name]))


def test_cli_baselines_option_takes_the_ngram_names(tmp_path):
    """--baselines is checked before the bundle loads: a refused name says so, an accepted one gets as far as
    the (missing) bundle."""
    from specexport.cli.main import main

    args = ["bench", "--bundle", str(tmp_path / "no-bundle"), "--out", str(tmp_path / "r"), "--no-memory"]
    result = CliRunner().invoke(main, [*args, "--baselines", "ortgenai-ngram-fp16"])
    assert result.exit_code == 1 and "error: unknown baseline 'ortgenai-ngram-fp16'" in result.output
    result = CliRunner().invoke(main, [*args, "--baselines", "ortgenai-ngram-fp32,ortgenai-ngram-int4"])
    assert result.exit_code != 0 and "unknown baseline" not in result.output, result.output
    assert "Traceback" not in result.output


def test_make_systems_declares_the_ngram_baselines(monkeypatch, tmp_path):
    """Each ortgenai-ngram-P is GenAI at P with the n-gram options, beside (not instead of) ortgenai-P."""
    monkeypatch.setattr(bench_runner, "_checkpoint", lambda manifest: tmp_path)
    manifest = SimpleNamespace(precision="int4", provenance=SimpleNamespace(source_sha256="sha"))
    session = SimpleNamespace(bundle=SimpleNamespace(manifest=manifest), codec=SimpleNamespace(eos_ids=[2]),
                              one_row_calls="none", one_row_calls_note="run as one row")
    cfg = BenchConfig(bundle="b", modes=["ar"], baselines=["ortgenai-int4", "ortgenai-ngram-int4",
                                                            "ortgenai-ngram-fp32"])
    systems, skipped = make_systems(session, cfg, threads=1, log=lambda m: None)
    assert skipped == {}
    by_name = {s.name: s for s in systems}
    assert list(by_name) == [REFERENCE, "ortgenai-int4", "ortgenai-ngram-int4", "ortgenai-ngram-fp32"]
    assert by_name["ortgenai-int4"].speculative is None
    for name, precision in (("ortgenai-ngram-int4", "int4"), ("ortgenai-ngram-fp32", "fp32")):
        system = by_name[name]
        assert system.precision == precision and system.speculative == {"ngram_size": 4, "max_draft_tokens": 8}
        assert system.describe()["mode"] == "ngram" and system.label == f"ORT GenAI n-gram {precision}"


def test_speculative_counts_from_genai_statistics():
    # a real 0.18 run: 23 tokens and an EOS, 5 plain steps (the prefill's among them), 4 rounds of 5 passes
    stats = {"standard_fallback_steps": 5, "target_forward_passes": 5, "draft_tokens_proposed": 32,
             "draft_tokens_evaluated": 18, "draft_tokens_accepted": 15}
    assert bench_ortgenai.speculative_counts(stats) == (10, 32, 15)
    assert bench_ortgenai.speculative_counts({}) == (None, None, None)


# -- the worker, with a fake library and with the real one ----------------------------------------------

FAKE_SPECULATIVE_GENAI = '''
"""A stand-in for onnxruntime_genai with speculation: 'generation' counts up from the last prompt token, and
with speculative options the statistics say one plain step and one pass per two further tokens."""


class Config:
    def __init__(self, path):
        pass

    def overlay(self, text):
        pass


class Model:
    def __init__(self, config):
        pass


class GeneratorParams:
    def __init__(self, model):
        self.speculative = None

    def set_search_options(self, **options):
        self.max_length = options["max_length"]

    def set_speculative_options(self, **options):
        assert options == {"ngram_size": 4, "max_draft_tokens": 8}, options
        self.speculative = options


class Generator:
    def __init__(self, model, params):
        self.max_length, self.speculative, self.ids, self.n = params.max_length, params.speculative, [], 0

    def append_tokens(self, ids):
        self.ids = list(ids)

    def is_done(self):
        return len(self.ids) >= self.max_length or self.ids[-1] == 99

    def generate_next_token(self):
        self.ids.append(self.ids[-1] + 1)
        self.n += 1

    def get_next_tokens(self):
        return [self.ids[-1]]

    def get_speculative_stats(self):
        assert self.speculative, "statistics asked of a run without speculation"
        rounds = (self.n - 1) // 2
        return {"standard_fallback_steps": 1 + (self.n - 1) % 2, "target_forward_passes": rounds,
                "draft_tokens_proposed": 8 * rounds, "draft_tokens_accepted": rounds, "rounds": rounds,
                "total_target_ms": 1.0}
'''


def test_ngram_worker_protocol_with_a_fake_library(tmp_path, monkeypatch):
    """The speculative options reach GeneratorParams, the statistics come back as forward passes, drafted and
    accepted tokens, and a batch is refused (GenAI's Engine takes no such settings)."""
    ckpt = fake_genai_library(tmp_path, monkeypatch, FAKE_SPECULATIVE_GENAI)
    system = bench_ortgenai.OrtGenAISystem(ckpt, {99}, "fp32", threads=1, python=sys.executable, source_key="sha",
                                           speculative=bench_ortgenai.NGRAM_OPTIONS)
    system.setup()
    try:
        assert system.name == "ortgenai-ngram-fp32"
        assert "speculative options: ngram_size 4, max_draft_tokens 8" in system.note
        out = system.generate([1, 2, 10], 5)
        assert out.tokens == [11, 12, 13, 14, 15] and out.finish_reason == "length"
        assert (out.steps, out.drafted, out.accepted) == (3, 16, 2)
        with pytest.raises(RuntimeError, match="speculates on single requests only"):
            system.generate_batch([([1], 2)], lambda k, t: None)
        assert system.generate([95], 10).tokens == [96, 97, 98]  # the worker goes on after a refused batch
    finally:
        system.close()
    plain = bench_ortgenai.OrtGenAISystem(ckpt, {99}, "fp32", threads=1, python=sys.executable, source_key="sha")
    plain.setup()
    try:  # without the options: no speculation asked for, and the AR count of forward passes
        out = plain.generate([1, 2, 10], 5)
        assert plain.name == "ortgenai-fp32" and out.steps == 5 and out.drafted is None
    finally:
        plain.close()


def test_ngram_baseline_on_the_tiny_checkpoint(genai_python, tiny_checkpoint, tmp_path, monkeypatch):
    """The real onnxruntime-genai speculating with n-gram lookup on its builder's export of the tiny checkpoint:
    a prompt that repeats itself, 16 tokens, greedy; the answer is GenAI AR's, and the statistics give the
    forward passes."""
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "cache"))
    prompt = [1, *[40, 41, 42, 43, 44] * 6]
    outputs = {}
    for speculative in (None, bench_ortgenai.NGRAM_OPTIONS):
        system = bench_ortgenai.OrtGenAISystem(tiny_checkpoint, {2}, "fp32", threads=1, python=genai_python,
                                               source_key="tiny", log=lambda m: None, speculative=speculative)
        system.setup()
        try:
            system.ignore_eos = True  # 16 tokens either way
            outputs[system.name] = out = system.generate(prompt, 16)
        finally:
            system.close()
        assert out.new_tokens == 16 and out.seconds > 0
    ar, ngram = outputs["ortgenai-fp32"], outputs["ortgenai-ngram-fp32"]
    assert ngram.tokens == ar.tokens
    assert ngram.steps is not None and 1 <= ngram.steps <= 2 * 17 and ngram.drafted is not None
    assert ngram.accepted is not None and 0 <= ngram.accepted <= ngram.drafted


def test_ngram_baseline_skips_where_genai_cannot_speculate(tmp_path, monkeypatch):
    """An onnxruntime-genai without GeneratorParams.set_speculative_options (before 0.18) is a reason to skip."""
    source = FAKE_SPECULATIVE_GENAI.replace("def set_speculative_options", "def _no_speculative_options")
    ckpt = fake_genai_library(tmp_path, monkeypatch, source)
    system = bench_ortgenai.OrtGenAISystem(ckpt, {99}, "fp32", threads=1, python=sys.executable, source_key="sha",
                                           speculative=bench_ortgenai.NGRAM_OPTIONS)
    with pytest.raises(bench_ortgenai.Skip, match=r"has no GeneratorParams\.set_speculative_options"):
        system.setup()
    assert system.proc is None
