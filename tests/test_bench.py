"""`specexport bench`: Spec-Bench loading and truncation, the interleaved loop, aggregation, reports.

Most tests use synthetic records or fake systems (no model). One end-to-end run goes through a tiny
random bundle with the Hugging Face baseline on its checkpoint; one (slow) through the real default
bundle."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from specexport.runtime import bench
from specexport.runtime.bench import (
    KEYS,
    METRICS,
    REFERENCE,
    SCHEMA,
    Question,
    RunResult,
    Skip,
    System,
    aggregate,
    compare_to_reference,
    cut_text,
    first_mismatch,
    load_questions,
    make_record,
    render_markdown,
    run_interleaved,
    start_systems,
    strip_eos,
    write_report,
)
from specexport.runtime.cli_bench import register
from specexport.runtime.errors import SpecExportError

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
    assert bench.resolve_questions(str(path)) == path.resolve()
    monkeypatch.chdir(tmp_path)
    assert bench.resolve_questions("q.jsonl") == path.resolve()
    with pytest.raises(SpecExportError, match="--questions"):
        bench.resolve_questions("nowhere.jsonl")


@pytest.mark.skipif(not SPECBENCH.is_file(), reason="shared/specbench is not beside the repository")
def test_real_specbench_default_path_13_categories():
    path = bench.resolve_questions(None)
    assert path == SPECBENCH.resolve()
    qs = load_questions(path, limit=2)
    cats = list(dict.fromkeys(q.category for q in qs))
    assert len(cats) == 13 and len(qs) == 26
    assert {"summarization", "rag", "translation", "math_reasoning", "qa", "writing"} <= set(cats)


def test_cut_text_keeps_the_last_tokens():
    encode = str.split
    decode = " ".join
    text = " ".join(f"w{i}" for i in range(10))
    assert cut_text(text, encode, decode, 20) == (text, False)
    assert cut_text(text, encode, decode, 10) == (text, False)
    assert cut_text(text, encode, decode, 3) == ("w7 w8 w9", True)


# -- one run --------------------------------------------------------------------------------------------


def test_tau_counts_the_eos_step():
    q = Question(1, "qa", "x")
    ar_eos = make_record(q, REFERENCE, RunResult([5] * 49, 1.0, steps=50, finish_reason="eos"), 10, False)
    assert ar_eos["mean_accepted_tokens"] == pytest.approx(1.0)
    spec = make_record(q, "specexport-self", RunResult([5] * 49, 1.0, steps=20, drafted=40, accepted=30,
                                                       finish_reason="eos"), 10, False)
    assert spec["mean_accepted_tokens"] == pytest.approx(2.5)
    compare_to_reference([ar_eos, spec], {REFERENCE: [5] * 49, "specexport-self": [5] * 49})
    tau = aggregate([ar_eos, spec], [REFERENCE, "specexport-self"])
    assert tau[REFERENCE]["overall"]["mean_accepted_tokens"] == pytest.approx(1.0)


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
        recs = [make_record(q, name, runs[name][q.question_id], 40, False) for name in runs]
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
    assert spec["ratio_to"]["hf"] == pytest.approx(statistics_median([4.0, 2.0, 8.0]))
    assert hf["speedup"] == pytest.approx(0.5) and hf["mean_accepted_tokens"] is None
    assert hf["acceptance_rate"] is None and hf["identical_to_ar"] is True
    # per category
    w = results["specexport-spec"]["categories"]["writing"]
    assert w["questions"] == 2 and w["speedup"] == pytest.approx(1.5) and w["identical_to_ar"] is False
    q = results["specexport-spec"]["categories"]["qa"]
    assert q["speedup"] == pytest.approx(4.0) and q["speedup_total"] == pytest.approx(4.0)
    assert q["identical_to_ar"] is True
    assert list(results[REFERENCE]["categories"]) == ["writing", "qa"]


def statistics_median(values):
    import statistics

    return statistics.median(values)


# -- the interleaved loop with fake systems ---------------------------------------------------------


class FakeSystem(System):
    def __init__(self, name, out=(1, 2, 3), fail_on=None, skip=None, calls=None):
        self.name = self.label = name
        self.kind = "specexport" if name.startswith("specexport") else "baseline"
        self.out, self.fail_on, self.skip = list(out), fail_on, skip
        self.calls = calls if calls is not None else []

    def setup(self):
        if self.skip:
            raise Skip(self.skip)

    def generate(self, prompt_ids, max_new_tokens):
        self.calls.append((self.name, tuple(prompt_ids)))
        if self.fail_on is not None and prompt_ids[0] == self.fail_on:
            raise RuntimeError("boom")
        return RunResult(self.out[:max_new_tokens], 0.1, steps=len(self.out))


def test_interleaved_rotates_order_and_handles_failures():
    calls: list = []
    systems = [FakeSystem(REFERENCE, calls=calls), FakeSystem("specexport-self", out=(1, 2, 4), calls=calls),
               FakeSystem("hf", fail_on=2, calls=calls)]
    qs = [Question(i, "qa", "x") for i in (1, 2, 3)]
    prompts = [([i], False) for i in (1, 2, 3)]
    skipped: dict = {}
    seen = []
    records = run_interleaved(systems, qs, prompts, 8, skipped,
                              progress=lambda s, q, r: seen.append((q.question_id, s, r)), log=lambda m: None)
    # question 1: ar, self, hf; question 2 starts one later: self, hf (fails), ar; question 3: hf is out
    assert [c[0] for c in calls] == [REFERENCE, "specexport-self", "hf", "specexport-self", "hf", REFERENCE,
                                     REFERENCE, "specexport-self"]
    assert len(seen) == 9  # the progress bar still counts the runs a failed system no longer makes
    assert [r is None for _, s, r in seen if s == "hf"] == [False, True, True]
    assert "failed on question 2" in skipped["hf"]
    assert [(r["question_id"], r["system"]) for r in records] == [
        (1, REFERENCE), (1, "specexport-self"), (1, "hf"), (2, REFERENCE), (2, "specexport-self"),
        (3, REFERENCE), (3, "specexport-self")]
    assert all(r["identical_to_ar"] is False for r in records if r["system"] == "specexport-self")
    assert records[2]["identical_to_ar"] is True


def test_reference_failure_is_an_error_and_skips_are_reported():
    with pytest.raises(RuntimeError):
        run_interleaved([FakeSystem(REFERENCE, fail_on=1)], [Question(1, "qa", "x")], [([1], False)], 8, {})
    skipped: dict = {}
    systems, setup_s = start_systems([FakeSystem(REFERENCE), FakeSystem("hf", skip="torch is not installed")],
                                     skipped, ([1], 2), log=lambda m: None)
    assert [s.name for s in systems] == [REFERENCE] and set(setup_s) == {REFERENCE}
    assert skipped == {"hf": "torch is not installed"}


def test_baselines_skip_with_a_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "_missing", lambda module: module in ("onnxruntime_genai", "torch"))
    with pytest.raises(Skip, match="torch is not installed"):
        bench.HFSystem(tmp_path, {2}).setup()
    with pytest.raises(Skip, match="onnxruntime-genai is not installed"):
        bench.OrtGenAISystem(tmp_path, {2}).setup()
    monkeypatch.setattr(bench, "_missing", lambda module: False)
    with pytest.raises(Skip, match=r"checkpoint .* is not on this machine"):
        bench.OrtGenAISystem(tmp_path / "gone", {2}).setup()


# -- reports --------------------------------------------------------------------------------------------


def synthetic_report() -> dict:
    names = [REFERENCE, "specexport-spec", "hf"]
    records = synthetic_records()
    return {
        "schema": SCHEMA, "keys": KEYS, "created": "2026-01-01T00:00:00+00:00", "command": "specexport bench",
        "elapsed_s": 1.0,
        "machine": {"cpu_model": "Test CPU", "cores": 2, "platform": "x", "python": "3.11",
                    "loadavg_start": [0.1, 0.1, 0.1], "loadavg_end": [0.2, 0.1, 0.1]},
        "versions": {"specexport": "0.1.0", "torch": None},
        "bundle": {"path": "/b", "name": "tiny", "precision": "fp32", "flavour": "ort", "exit_layer": 2,
                   "pieces": ["shallow", "deep"], "checkpoint": None},
        "settings": {"questions": "q.jsonl", "categories": ["writing", "qa"], "limit": 2, "max_new_tokens": 128,
                     "max_prompt_tokens": 1500, "greedy": True, "batch_size": 1, "warmup": True,
                     "threads": None, "reference": REFERENCE, "systems": names},
        "systems": {n: {"label": {"hf": "HF transformers"}.get(n, n), "kind": "baseline" if n == "hf" else "specexport",
                        "mode": "ar", "precision": "fp32", "setup_s": 0.1, "note": ""} for n in names},
        "skipped": {"ortgenai-fp32": "onnxruntime-genai is not installed"},
        "results": aggregate(records, names),
        "memory": {"mode": "auto", "exit_code": 0, "peak_rss_bytes": 700e6, "weights_fp32_bytes": 538e6,
                   "bundle_bytes": 650e6, "ratio": 700 / 538, "ratio_to_bundle": 700 / 650},
        "records": records,
    }


def test_keys_document_every_top_level_key():
    report = synthetic_report()
    assert set(report) <= set(KEYS)
    assert {"schema", "results", "records", "memory", "machine", "versions", "command"} <= set(KEYS)
    for metric in METRICS:
        assert f"results.*.{metric}" in KEYS


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
    assert "outputs differ from specexport AR" in md
    assert "ortgenai-fp32: onnxruntime-genai is not installed" in md
    assert "1.30× the fp32 weights on disk" in md


def test_write_report_files(tmp_path):
    paths = write_report(synthetic_report(), tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert set(data) <= set(KEYS)
    assert data["schema"] == SCHEMA and data["keys"] == KEYS
    assert data["results"]["specexport-spec"]["overall"]["identical_to_ar"] is False
    assert paths["md"].read_text().startswith("# specexport bench: tiny (fp32)")
    if bench._missing("matplotlib"):
        assert "matplotlib" in paths["png"]
    else:
        assert Path(paths["png"]).read_bytes()[:4] == b"\x89PNG" and data["chart"] == "report.png"


def test_chart_skipped_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "_missing", lambda module: module == "matplotlib")
    paths = write_report(synthetic_report(), tmp_path)
    assert "matplotlib is not installed" in paths["png"]
    assert not (tmp_path / "report.png").exists()
    assert "No chart: matplotlib is not installed" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "report.json").read_text())["chart"] is None


def test_bench_is_light_to_import():
    import subprocess
    import sys

    code = ("import sys, specexport.runtime.bench, specexport.runtime.cli_bench;"
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
                   "--baselines", "--out", "--json"):
        assert option in result.output


# -- end to end -----------------------------------------------------------------------------------------


def test_end_to_end_tiny_bundle(tiny_bundles, tmp_path):
    """The whole path on a tiny random model: bundle AR, its modes, and HF on the same checkpoint."""
    pytest.importorskip("transformers")
    bundle = tiny_bundles("ort", 2)
    questions = write_questions(tmp_path / "q.jsonl")
    out = tmp_path / "report"
    result = CliRunner().invoke(cli(), [
        "bench", "--bundle", str(bundle), "--questions", str(questions), "--categories", "qa,rag", "--limit", "1",
        "--max-new-tokens", "8", "--max-prompt-tokens", "40", "--baselines", "hf", "--out", str(out),
        "--no-memory", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    assert json.loads(result.stdout) == data
    assert data["settings"]["categories"] == ["qa", "rag"]
    records = data["records"]
    assert {r["system"] for r in records} >= {REFERENCE, "hf"}
    rag = [r for r in records if r["category"] == "rag"]
    assert all(r["prompt_cut"] for r in rag) and not any(r["prompt_cut"] for r in records if r["category"] == "qa")
    ar = data["results"][REFERENCE]["overall"]
    assert ar["questions"] == 2 and ar["speedup"] == 1.0 and ar["mean_accepted_tokens"] == pytest.approx(1.0)
    for name, res in data["results"].items():
        if data["systems"][name]["kind"] == "specexport":
            assert res["overall"]["identical_to_ar"] is True, name  # lossless
    # HF runs the same fp32 weights on the same ids: greedy output should agree with the bundle's
    assert data["results"]["hf"]["overall"]["questions"] == 2
    assert (out / "report.md").read_text().count("| qa |") >= 2


@pytest.mark.slow
def test_end_to_end_default_bundle(default_bundle, tmp_path):
    """`--limit 1 --categories qa --max-new-tokens 8 --baselines hf` on SmolLM2, memory probe included."""
    if not SPECBENCH.is_file():
        pytest.skip("shared/specbench is not beside the repository")
    out = tmp_path / "report"
    result = CliRunner().invoke(cli(), [
        "bench", "--bundle", str(default_bundle), "--questions", str(SPECBENCH), "--categories", "qa",
        "--limit", "1", "--max-new-tokens", "8", "--baselines", "hf", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    assert data["results"][REFERENCE]["overall"]["new_tokens"] > 0
    assert data["results"]["hf"]["overall"]["identical_to_ar"] is True  # same fp32 weights, same greedy path
    for name, res in data["results"].items():
        if data["systems"][name]["kind"] == "specexport":
            assert res["overall"]["identical_to_ar"] is True, name
    mem = data["memory"]
    assert mem["exit_code"] == 0 and mem["peak_rss_bytes"] > 100e6 and mem["weights_fp32_bytes"] > 500e6
    assert "tokens/s per category" in (out / "report.md").read_text()
