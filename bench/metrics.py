"""Per-question records and their aggregation into the figures of report.json, with the keys documented.

Every ratio is taken question by question against the reference run of the same question (run right
before or after it, see bench.run_interleaved) and then summarised by its median, so a slow minute of
the machine moves both sides of a ratio instead of one system's total. Spec-Bench's own figure
(evaluation/speed.py: the mean over questions of tokens/s, divided by the baseline's mean) is given beside
it, so a report can be set against published Spec-Bench tables; a mean weighs the fast questions most.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

SCHEMA = "specexport.bench/1"
REFERENCE = "specexport-ar"
METRICS = ("questions", "new_tokens", "seconds", "tokens_per_s", "tokens_per_s_total", "speedup",
           "speedup_total", "speedup_specbench", "mean_accepted_tokens", "acceptance_rate", "identical_to_ar",
           "identical_count")

# The documented meaning of every key of report.json; the report carries it under "keys". The names are
# stable: CI pipelines read them, so a change of meaning changes SCHEMA.
KEYS = {
    "schema": f"'{SCHEMA}'; changes whenever a key below changes meaning",
    "keys": "this description of the keys",
    "created": "UTC time the run started (ISO 8601)",
    "command": "the command line that produced the report",
    "elapsed_s": "wall time of the whole run, set-up, model builds and memory probe included",
    "machine": "cpu_model, cores (logical CPUs usable by the run), platform, python, loadavg_start and"
               " loadavg_end (1/5/15-minute load averages; another job on the machine shows here)",
    "versions": "installed versions of the packages involved (null when not installed); ortgenai_env: the"
                " versions in the interpreter that builds and runs ONNX Runtime GenAI (null if none ran)",
    "bundle": "path, name, precision, flavour, exit_layer, pieces and source checkpoint of the bundle",
    "settings": "questions file, categories, limit (per category), max_new_tokens, max_prompt_tokens, greedy,"
                " batch_size, warmup, repeats (rounds per question; a record is the run of median time), threads"
                " (intra-op threads given to every system), thread_pool ('shared': one"
                " process-wide ONNX Runtime pool; 'per-session': a pool per piece, as PEARL needs), schedules,"
                " policies and trees (--schedule, --policy, --tree; null when not given), ignore_eos (every run"
                " max_new_tokens long, EOS or not), reference, systems (the"
                " run order of the first question; it rotates by one per question)",
    "systems": "system name -> {label, kind (specexport|baseline), mode, precision, setup_s, note}",
    "skipped": "system name -> why it did not run (missing package or piece, failed set-up)",
    "errors": "[{system, question_id, category, error}]: a run that failed; the system went on with the next"
              " question, and its figures cover the questions it ran",
    "results": "system name -> {overall: METRICS + ratio_to + ratio_to_specbench, categories: {category:"
               " METRICS}}",
    "results.*.questions": "number of questions the figures cover",
    "results.*.new_tokens": "new tokens generated, summed over the questions (EOS not counted)",
    "results.*.seconds": "wall time of the generate calls, summed (prefill included)",
    "results.*.tokens_per_s": "median over questions of new_tokens / seconds of that question (prefill included)",
    "results.*.tokens_per_s_total": "new_tokens / seconds over all the questions",
    "results.*.speedup": f"median over questions of tokens_per_s / tokens_per_s of {REFERENCE} on the same"
                         " question",
    "results.*.speedup_total": f"tokens_per_s_total / tokens_per_s_total of {REFERENCE} over the same questions",
    "results.*.speedup_specbench": "Spec-Bench's speedup (its evaluation/speed.py): the mean over questions of"
                                   f" tokens_per_s / the same mean of {REFERENCE} over the same questions",
    "results.*.mean_accepted_tokens": "tau: tokens emitted per target-model forward pass, the prefill's"
                                      " included and a final EOS counted as emitted (1.00 for"
                                      " autoregressive decoding); null when the system does not expose its"
                                      " forward passes",
    "results.*.acceptance_rate": "accepted / drafted tokens; null when nothing was drafted or the system"
                                 " does not expose it",
    "results.*.identical_to_ar": f"true when every output's token ids equal {REFERENCE}'s for the same question"
                                 " (must hold for specexport modes, which are lossless; baselines run other"
                                 " floating-point arithmetic, so for them it is informative only); when a"
                                 " lossless specexport system is not, `specexport bench` exits with 1 after"
                                 " writing the report",
    "results.*.identical_count": f"number of questions whose output equals {REFERENCE}'s",
    "results.*.overall.ratio_to": "other system name -> median over questions of this system's"
                                  " tokens_per_s / the other's on the same question",
    "results.*.overall.ratio_to_specbench": "other system name -> this system's mean tokens_per_s / the"
                                            " other's, over the questions both ran (Spec-Bench's way)",
    "memory": "peak resident memory of one `specexport generate` run in a fresh process: peak_rss_bytes,"
              " weights_fp32_bytes (the source checkpoint's weight files), bundle_bytes, ratio ="
              " peak_rss_bytes / weights_fp32_bytes; null with --no-memory",
    "chart": "file name of the chart (speedup and tau per category) beside report.json, or null",
    "chart_note": "why there is no chart (only when chart is null)",
    "records": "one per question and system: question_id, category, system, prompt_tokens, prompt_cut,"
               " new_tokens, seconds, tokens_per_s, steps, drafted, accepted, mean_accepted_tokens,"
               " acceptance_rate, speedup, identical_to_ar, first_mismatch (index of the first token that"
               " differs from the reference, null if none), finish_reason (eos|length); with --repeats > 1 also"
               " seconds_runs (every round's seconds; the record's figures are the median round's); auto_steps:"
               " auto's steps per choice (self, model, tree, lookup, ar: a plain step), null for other systems",
}


@dataclass
class RunResult:
    """One system's answer to one prompt. `steps` counts target forward passes, the prefill's included;
    None where the system does not expose them (and so for drafted/accepted)."""

    tokens: list[int]
    seconds: float
    steps: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    finish_reason: str = "length"
    auto_steps: dict[str, int] | None = None  # auto's steps per choice

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)


def _summary(how: Callable[[list[float]], float], values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return how(vals) if vals else None


def _median(values: Iterable[float | None]) -> float | None:
    return _summary(statistics.median, values)


def _mean(values: Iterable[float | None]) -> float | None:
    return _summary(statistics.fmean, values)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where `a` and `b` differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _emitted(new_tokens: int, finish_reason: str) -> int:
    # the EOS that ended an answer took a forward pass like any token, so tau counts it
    return new_tokens + (finish_reason == "eos")


def make_record(question_id: int | str, category: str, system: str, result: RunResult, prompt_tokens: int,
                prompt_cut: bool) -> dict:
    """The per-question record of report.json (speedup and identity are filled by compare_to_reference)."""
    tps = result.new_tokens / result.seconds if result.seconds > 0 else None
    return {
        "question_id": question_id, "category": category, "system": system,
        "prompt_tokens": prompt_tokens, "prompt_cut": prompt_cut, "new_tokens": result.new_tokens,
        "seconds": result.seconds, "tokens_per_s": tps, "steps": result.steps, "drafted": result.drafted,
        "accepted": result.accepted,
        "mean_accepted_tokens": _emitted(result.new_tokens, result.finish_reason) / result.steps
        if result.steps else None,
        "acceptance_rate": result.accepted / result.drafted if result.drafted else None,
        "finish_reason": result.finish_reason, "auto_steps": result.auto_steps,
        "speedup": None, "identical_to_ar": None, "first_mismatch": None,
    }


def compare_to_reference(records: list[dict], outputs: dict[str, list[int]], reference: str = REFERENCE) -> None:
    """Per-question speedup and identity of each record against the reference's record of the same question."""
    ref = next((r for r in records if r["system"] == reference), None)
    if ref is None:
        return
    for r in records:
        r["speedup"] = _ratio(r["tokens_per_s"], ref["tokens_per_s"])
        mismatch = first_mismatch(outputs[r["system"]], outputs[reference])
        r["identical_to_ar"] = mismatch is None
        r["first_mismatch"] = mismatch


def group_metrics(rows: list[dict], ref_rows: list[dict]) -> dict:
    """METRICS of one system over `rows` (one record per question); `ref_rows`: the reference's records."""
    n_tokens = sum(r["new_tokens"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    total = n_tokens / seconds if seconds > 0 else None
    ref_seconds = sum(r["seconds"] for r in ref_rows)
    ref_total = sum(r["new_tokens"] for r in ref_rows) / ref_seconds if ref_seconds > 0 else None
    steps = [r["steps"] for r in rows]
    drafted = [r["drafted"] for r in rows]
    emitted = sum(_emitted(r["new_tokens"], r["finish_reason"]) for r in rows)
    tau = emitted / sum(steps) if rows and None not in steps and sum(steps) > 0 else None
    accept = (sum(r["accepted"] or 0 for r in rows) / sum(drafted)
              if rows and None not in drafted and sum(drafted) > 0 else None)
    flags = [r["identical_to_ar"] for r in rows if r["identical_to_ar"] is not None]
    return {
        "questions": len(rows),
        "new_tokens": n_tokens,
        "seconds": seconds,
        "tokens_per_s": _median(r["tokens_per_s"] for r in rows),
        "tokens_per_s_total": total,
        "speedup": _median(r["speedup"] for r in rows),
        "speedup_total": _ratio(total, ref_total),
        "speedup_specbench": _ratio(_mean(r["tokens_per_s"] for r in rows), _mean(r["tokens_per_s"] for r in ref_rows)),
        "mean_accepted_tokens": tau,
        "acceptance_rate": accept,
        "identical_to_ar": all(flags) if flags else None,
        "identical_count": sum(flags),
    }


def aggregate(records: list[dict], systems: Sequence[str], reference: str = REFERENCE) -> dict:
    """results[system] = {overall: METRICS + ratio_to, categories: {category: METRICS}}."""
    categories = list(dict.fromkeys(r["category"] for r in records))
    by_key = {(r["system"], r["question_id"]): r for r in records}
    results = {}
    for name in systems:
        rows = [r for r in records if r["system"] == name]
        if not rows:
            continue
        # the reference over the same questions only: a system that stopped early is not compared with
        # questions it never ran
        refs = [by_key[(reference, r["question_id"])] for r in rows if (reference, r["question_id"]) in by_key]
        overall = group_metrics(rows, refs)
        ratio_to, ratio_to_specbench = {}, {}
        for other in systems:
            if other == name:
                continue
            others = (by_key.get((other, r["question_id"])) for r in rows)
            pairs = [(r["tokens_per_s"], o["tokens_per_s"]) for r, o in zip(rows, others, strict=True)
                     if o is not None and r["tokens_per_s"] is not None and o["tokens_per_s"] is not None]
            if pairs:
                ratio_to[other] = _median(_ratio(a, b) for a, b in pairs)
                ratio_to_specbench[other] = _ratio(_mean(a for a, _ in pairs), _mean(b for _, b in pairs))
        overall["ratio_to"], overall["ratio_to_specbench"] = ratio_to, ratio_to_specbench
        cats = {}
        for cat in categories:
            cat_rows = [r for r in rows if r["category"] == cat]
            if cat_rows:
                cats[cat] = group_metrics(cat_rows, [x for x in refs if x["category"] == cat])
        results[name] = {"overall": overall, "categories": cats}
    return results


def lossless_failures(report: dict) -> dict[str, tuple[int, int]]:
    """Lossless systems whose output differed from the reference's: name -> (questions that differed,
    questions run). Lossless: every specexport system (exact verification) unless its description says
    `lossy: true` (a relaxed rule such as --verify specdec, should bench ever run one); baselines run other
    arithmetic, so they do not count."""
    reference = report["settings"]["reference"]
    failures = {}
    for name, desc in report["systems"].items():
        if name == reference or desc.get("kind") != "specexport" or desc.get("lossy"):
            continue
        flags = [r["identical_to_ar"] for r in report["records"] if r["system"] == name
                 and r["identical_to_ar"] is not None]
        differed = flags.count(False)
        if differed:
            failures[name] = (differed, len(flags))
    return failures


def lossless_failure_sentence(report: dict) -> str | None:
    """One sentence naming each lossless system that was not token-identical to the reference and on how
    many questions, and each specexport system that failed on a question, or None when every one was
    identical and ran."""
    failures = lossless_failures(report)
    crashed: dict[str, int] = {}
    for e in report.get("errors", []):
        if report["systems"].get(e["system"], {}).get("kind") == "specexport":
            crashed[e["system"]] = crashed.get(e["system"], 0) + 1
    if not failures and not crashed:
        return None
    parts = [f"{name} differs from {report['settings']['reference']}'s output on {differed} of {total}"
             f" question{'s' if total != 1 else ''}" for name, (differed, total) in failures.items()]
    parts += [f"{name} failed on {n} question{'s' if n != 1 else ''}" for name, n in crashed.items()]
    return (f"lossless systems went wrong: {', '.join(parts)} (first_mismatch and errors in report.json say"
            " where); the report was written, but the run fails")

