"""The bench's default questions ship with the project (recipes/data/bench_prompts.jsonl): chat prompts written
for it in Spec-Bench's jsonl shape and categories, so a fresh clone's `specexport bench` and `make bench` have
questions and the report's per-category tables fill; none is Spec-Bench's or one of the training prompts
(recipes/data/train_prompts.jsonl), so the bench measures drafts on prompts they were not trained on."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from specexport.bench.questions import DEFAULT_QUESTIONS, load_questions, resolve_questions
from specexport.cli.main import main

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "recipes" / "data" / "bench_prompts.jsonl"
TRAIN = REPO / "recipes" / "data" / "train_prompts.jsonl"
SPECBENCH = REPO.parent / "shared" / "specbench" / "question.jsonl"
RUN = 6  # words in a row two prompts may not share: longer than a stock phrase, shorter than a copied clause


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def _runs(text: str) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i:i + RUN]) for i in range(len(words) - RUN + 1)}


def _shared(prompts: list[str], others: list[str]) -> list[tuple[str, str]]:
    """(prompt, the words it shares) for each shipped prompt equal to another or sharing RUN words in a row."""
    whole = {" ".join(_words(t)) for t in others}
    runs = set().union(*(_runs(t) for t in others))
    found = []
    for text in prompts:
        if " ".join(_words(text)) in whole:
            found.append((text[:60], "the whole prompt"))
        found += [(text[:60], " ".join(run)) for run in sorted(_runs(text) & runs)]
    return found


@pytest.fixture(scope="module")
def shipped() -> list[str]:
    return [q.text for q in load_questions(SHIPPED)]


def test_the_default_questions_are_the_shipped_set():
    """No file outside the repository: the default is the package's own data (in the wheel as well)."""
    assert resolve_questions(None) == SHIPPED.resolve() == Path(DEFAULT_QUESTIONS).resolve()
    assert SHIPPED.resolve().is_relative_to(REPO.resolve())


def test_the_shipped_set_has_spec_bench_shape_and_categories():
    rows = [json.loads(line) for line in SHIPPED.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert all(set(r) == {"question_id", "category", "turns"} and len(r["turns"]) == 1 and r["turns"][0].strip()
               for r in rows)
    assert len({r["question_id"] for r in rows}) == len(rows)
    per_category = Counter(r["category"] for r in rows)
    # `make bench` asks the first of each category, `make bench-bar` the first three
    assert len(per_category) >= 10 and min(per_category.values()) >= 3, per_category


def test_no_shipped_prompt_is_a_training_prompt(shipped):
    train = [json.loads(line)["prompt"] for line in TRAIN.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(train) > 1000  # the file read is the training set
    assert _shared(shipped, train) == []


@pytest.mark.skipif(not SPECBENCH.is_file(), reason="Spec-Bench's question.jsonl is not beside the repository")
def test_no_shipped_prompt_is_spec_bench_s(shipped):
    spec = [t for line in SPECBENCH.read_text(encoding="utf-8").splitlines() if line.strip()
            for t in json.loads(line)["turns"]]
    assert len(spec) > 400
    assert _shared(shipped, spec) == []


def test_the_check_finds_a_copied_prompt(shipped):
    """The overlap check is not vacuous: a copy, or a clause lifted into a new prompt, is found."""
    assert _shared(shipped[:1], [shipped[0].upper()])
    lifted = "Please answer this: " + " ".join(_words(shipped[3])[2:2 + RUN]) + " and nothing else."
    assert _shared(shipped[3:4], [lifted])


def test_bench_without_questions_runs_the_shipped_set(tiny_bundles, tmp_path):
    bundle = tiny_bundles("ort", 2, adapter="untrained")
    out = tmp_path / "report"
    result = CliRunner().invoke(main, [
        "bench", "--bundle", str(bundle), "--categories", "qa,coding", "--limit", "1", "--max-new-tokens", "6",
        "--modes", "self", "--baselines", "none", "--threads", "1", "--no-memory", "--no-warmup", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    assert Path(data["settings"]["questions"]).resolve() == SHIPPED.resolve()
    assert set(data["results"]["specexport-self"]["categories"]) == {"qa", "coding"}
    assert "| qa |" in (out / "report.md").read_text()


def test_make_bench_passes_questions_only_when_asked():
    """`make bench` runs on a fresh clone with the shipped set, and QUESTIONS=PATH passes Spec-Bench."""
    def bench_line(*extra: str) -> str:
        proc = subprocess.run(["make", "-n", "-s", "--no-print-directory", "-C", str(REPO), "bench", *extra],
                              capture_output=True, text=True, timeout=120)
        lines = [ln for ln in proc.stdout.splitlines() if "specexport bench" in ln]
        assert len(lines) == 1, proc.stdout + proc.stderr
        return lines[0]

    assert "--questions" not in bench_line()
    assert "--questions /data/spec_bench/question.jsonl" in bench_line("QUESTIONS=/data/spec_bench/question.jsonl")
