"""`specexport bench`: Spec-Bench through a bundle's modes and its peers, interleaved, into a report.

Method (Spec-Bench's, on one machine):

- the first turn of each question goes through the bundle's chat template; the question text is cut to
  its last ``max_prompt_tokens`` (1,500) tokens first, so the longest summarization and RAG prompts fit;
- the prompt is tokenized once by the bundle and every system gets the same token ids;
- greedy, batch 1, at most ``max_new_tokens`` new tokens, stopping at EOS (EOS is not counted); with
  ``ignore_eos`` every system generates exactly ``max_new_tokens`` (ours past EOS, the peers with EOS held
  off), so systems whose outputs differ (another quantization) are timed over runs of equal length;
- every system gets the same number of intra-op threads;
- per question every system runs once (or `repeats` times, round after round, keeping each system's run
  of median time), the order rotated by one system from question to question, so drift of the machine
  (other jobs, heat) hits all systems alike; each system first runs one untimed warm-up;
- a run's time is the wall clock of the call from prompt ids to new ids, prefill included; ratios are
  taken per question and summarised by their median (bench_metrics).

The pieces: bench_questions (Spec-Bench), bench_systems (the bundle's modes, Hugging Face baselines),
bench_ortgenai (ONNX Runtime GenAI in its own interpreter), bench_metrics (records, aggregation, the
documented keys), bench_machine (machine, versions, memory), bench_report (json, markdown, chart).
Only the standard library loads with these modules; the bundle's session, torch, transformers and
matplotlib load when a run needs them, and a baseline whose package is missing is skipped with a reason.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.errors import SpecExportError
from .machine import default_threads, loadavg, machine_info, measure_memory, versions
from .metrics import KEYS, REFERENCE, SCHEMA, aggregate, compare_to_reference, make_record
from .ortgenai import NGRAM_OPTIONS, OrtGenAISystem
from .ortgenai import PRECISIONS as GENAI_PRECISIONS
from .questions import DEFAULT_MAX_PROMPT_TOKENS, Question, cut_text, load_questions, resolve_questions
from .systems import Skip, SpecExportSystem, System

if TYPE_CHECKING:
    from ..runtime.manifest import Manifest
    from ..runtime.session import Session

DEFAULT_MAX_NEW_TOKENS = 128
# ortgenai-ngram-*: GenAI's own n-gram speculation (bench_ortgenai.NGRAM_OPTIONS) on the same GenAI model as
# ortgenai-* of that precision; where both ran, the report also sets each mode against the faster per question
BASELINES = ("hf", "hf-lookup", "ortgenai", "ortgenai-fp32", "ortgenai-int4", "ortgenai-int8",
             "ortgenai-ngram-fp32", "ortgenai-ngram-int4", "ortgenai-ngram-int8")
DEFAULT_BASELINES = ("hf", "hf-lookup", "ortgenai")
WARMUP_PROMPT_TOKENS = 64
WARMUP_NEW_TOKENS = 8

Progress = Callable[[str, Question, "dict | None"], None]


@dataclass
class BenchConfig:
    bundle: Path
    questions: str | None = None
    categories: list[str] | None = None
    limit: int | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    modes: list[str] | None = None  # None: every mode the runtime has (those the bundle lacks are skipped)
    schedules: list[str] | None = None  # with policies: each speculative mode runs under their cross product
    policies: list[str] | None = None  # (None, None: each mode once, as the session's defaults)
    trees: list[str] | None = None  # token-tree shapes, each a model-drafter system (runtime/tree.py)
    baselines: list[str] = field(default_factory=lambda: list(DEFAULT_BASELINES))
    warmup: bool = True
    repeats: int = 1  # rounds per question; each record is a system's run of median time
    memory: bool = True
    threads: int | None = None  # None: bench_machine.default_threads()
    genai_python: str | None = None  # None: bench_ortgenai.find_python()
    command: str = ""
    expect_digest: str | None = None  # refuse any bundle but this one (its manifest's SHA-256)
    ignore_eos: bool = False  # every system generates max_new_tokens (runs of equal length)


def thread_pool() -> str:
    """'shared' when this process runs every ONNX Runtime session in one pool, else 'per-session'."""
    from ..runtime.backends.ort import shared_pool_in_use

    return "shared" if shared_pool_in_use() else "per-session"


def _checkpoint(manifest: Manifest) -> Path | None:
    """The bundle's source checkpoint on this machine, found by the hash its manifest records (the HF and
    ORT GenAI baselines start from it)."""
    from ..exporter.model_source import find_checkpoint

    return find_checkpoint(manifest.provenance.source_sha256)


def variants(cfg: BenchConfig) -> list[tuple[str | None, str | None]]:
    """(schedule, policy) pairs each speculative mode runs under: the cross product of --schedule and
    --policy, or the session's defaults alone when neither is given."""
    if cfg.schedules is None and cfg.policies is None:
        return [(None, None)]
    return [(s, p) for s in cfg.schedules or ["sequential"] for p in cfg.policies or ["confidence"]]


def uses_pearl(cfg: BenchConfig) -> bool:
    return "pearl" in (cfg.schedules or [])


def make_systems(session: Session, cfg: BenchConfig, threads: int,
                 log: Callable[[str], None] = print) -> tuple[list[System], dict[str, str]]:
    """The systems to run, reference first, and those known already not to run (name -> reason).
    PEARL's systems share the session: pearl_threads gives every piece all `threads`, and a run with
    PEARL opens the pieces with pools of their own (cli/bench.py)."""
    from ..runtime.choices import MODES
    from ..runtime.pearl import pearl_threads

    skipped: dict[str, str] = {}
    systems: list[System] = [SpecExportSystem(session, "ar", threads)]
    split = pearl_threads(threads)
    pearl_note = (f"ONNX Runtime, PEARL: drafter and deep on two Python threads, a thread pool per piece,"
                  f" intra-op threads: deep {split['deep']}, drafting pieces {split['shallow']}")
    modes = cfg.modes if cfg.modes is not None else MODES

    def refusal(system: SpecExportSystem) -> str | None:
        """Why the session refuses the system's options (the sentence `generate` gives), or None."""
        try:
            plan = session.plan(session.options(**system.options()))
        except SpecExportError as exc:
            return str(exc)
        if plan.mode != system.mode and plan.mode in modes:
            return f"schedule {plan.schedule} runs mode {system.mode} as {plan.mode}, which runs already"
        return None

    for mode in dict.fromkeys(modes):
        if mode == "ar":
            continue
        for schedule, policy in variants(cfg):
            pearl = schedule == "pearl"
            system = SpecExportSystem(session, mode, threads, schedule, policy, note=pearl_note if pearl else None)
            why = refusal(system)
            if why is None:
                systems.append(system)
            else:
                skipped[system.name] = why
    # each tree shape from the drafter, and from the draft head where the bundle has one
    for tree in cfg.trees or []:
        for mode in ["model", *(["head"] if session.pieces.head is not None else [])]:
            system = SpecExportSystem(session, mode, threads, tree=tree)
            why = refusal(system)
            if why is None:
                systems.append(system)
            else:
                skipped[system.name] = why

    manifest = session.bundle.manifest
    checkpoint = _checkpoint(manifest)
    source_key = manifest.provenance.source_sha256
    eos = set(session.codec.eos_ids)
    precision = manifest.precision

    def genai(p: str, speculative: dict | None = None) -> OrtGenAISystem:
        return OrtGenAISystem(checkpoint, eos, p, threads, cfg.genai_python, source_key, log,
                              speculative=speculative)

    for name in dict.fromkeys(cfg.baselines):
        if name in ("hf", "hf-lookup"):
            from .hf import HF_LOOKUP_TOKENS, HFSystem  # PyTorch: the exporter's extra
        if name == "hf":
            systems.append(HFSystem(checkpoint, eos, threads=threads, source_sha256=source_key))
        elif name == "hf-lookup":
            systems.append(HFSystem(checkpoint, eos, lookup=HF_LOOKUP_TOKENS, threads=threads,
                                    source_sha256=source_key))
        elif name == "ortgenai":  # fp32, plus the bundle's own precision when it is a quantized one
            systems.append(genai("fp32"))
            if precision != "fp32" and precision in GENAI_PRECISIONS:
                systems.append(genai(precision))
        elif name.startswith("ortgenai-ngram-"):
            systems.append(genai(name.rsplit("-", 1)[1], NGRAM_OPTIONS))
        else:
            systems.append(genai(name.split("-", 1)[1]))
    unique: dict[str, System] = {}
    for s in systems:
        s.ignore_eos = cfg.ignore_eos
        unique.setdefault(s.name, s)
    return list(unique.values()), skipped


def check_config(cfg: BenchConfig) -> None:
    """Reject bad settings before anything heavy loads."""
    if cfg.max_new_tokens < 1:
        raise SpecExportError("--max-new-tokens must be at least 1")
    if cfg.threads is not None and cfg.threads < 1:
        raise SpecExportError("--threads must be at least 1")
    if cfg.repeats < 1:
        raise SpecExportError("--repeats must be at least 1")
    unknown = [b for b in cfg.baselines if b not in BASELINES]
    if unknown:
        raise SpecExportError(f"unknown baseline {unknown[0]!r}; use any of {', '.join(BASELINES)} (or none)")
    from ..runtime.choices import MODES, SCHEDULES
    from ..runtime.policies import CostModel, make_policy

    unknown = [m for m in cfg.modes or [] if m not in MODES]
    if unknown:
        raise SpecExportError(f"unknown mode {unknown[0]!r}; use any of {', '.join(MODES)}")
    for schedule in cfg.schedules or []:
        if schedule not in SCHEDULES:
            raise SpecExportError(f"unknown schedule {schedule!r}; use any of {', '.join(SCHEDULES)}")
    for policy in cfg.policies or []:  # parsed here so a typo fails before anything loads
        make_policy(policy, 1, 0.5, cost=lambda gamma_max: CostModel(0.0, 0.0, 0.0))
    from ..runtime.tree import TreeShape

    for tree in cfg.trees or []:
        TreeShape.parse(tree)


def start_systems(candidates: Sequence[System], skipped: dict[str, str], warmup: tuple[list[int], int] | None,
                  log: Callable[[str], None] = print) -> tuple[list[System], dict[str, float]]:
    """Set up each system and run its untimed warm-up; those that cannot run go to `skipped`."""
    systems: list[System] = []
    setup_s: dict[str, float] = {}
    for system in candidates:
        t0 = time.perf_counter()
        try:
            system.setup()
            if warmup:
                system.generate(*warmup)
        except Skip as exc:
            skipped[system.name] = str(exc)
        except Exception as exc:
            if system.name == REFERENCE:
                raise
            skipped[system.name] = f"failed to start: {type(exc).__name__}: {exc}"
            system.close()
        else:
            setup_s[system.name] = time.perf_counter() - t0
            systems.append(system)
            continue
        log(f"skipping {system.name}: {skipped[system.name]}")
    return systems, setup_s


def run_interleaved(systems: Sequence[System], questions: Sequence[Question],
                    prompts: Sequence[tuple[list[int], bool]], max_new_tokens: int, skipped: dict[str, str],
                    progress: Progress | None = None, log: Callable[[str], None] = print,
                    repeats: int = 1, errors: list[dict] | None = None) -> list[dict]:
    """Every system on question 1, then every system on question 2, ..., the order rotated by one system
    per question (and per repeat), so no system always runs right after the same other one. With
    `repeats` > 1 each question goes round that many times and each system's record is its run of median
    time (`seconds_runs` keeps them all), so one busy moment of a shared machine does not decide a ratio. A
    baseline or speculative mode that fails on a question has the error recorded in `errors` (system,
    question, the error's sentence) and goes on with the next question; the reference failing is an error.
    `progress(system, question, record)` follows every run (record None when the run failed)."""
    errors = [] if errors is None else errors
    names = [s.name for s in systems]
    if REFERENCE not in names:
        raise ValueError(f"the reference system {REFERENCE} must be among the systems")
    records: list[dict] = []
    for i, (q, (ids, cut)) in enumerate(zip(questions, prompts, strict=True)):
        runs: dict[str, list[tuple[dict, list[int]]]] = {}  # system -> (record, output) per round
        for rep in range(repeats):
            k = (i + rep) % len(systems)
            for system in [*systems[k:], *systems[:k]]:
                result = _run(system, q, ids, max_new_tokens, skipped, errors, log)
                record = None
                if result is not None:
                    record = make_record(q.question_id, q.category, system.name, result, len(ids), cut)
                    runs.setdefault(system.name, []).append((record, result.tokens))
                if progress:
                    progress(system.name, q, record)
        q_records, outputs = [], {}
        failed = {e["system"] for e in errors if e["question_id"] == q.question_id}
        for name, rounds in runs.items():
            if name in failed:  # failed on another repeat of this question: no record for it
                continue
            record, outputs[name] = sorted(rounds, key=lambda r: r[0]["seconds"])[(len(rounds) - 1) // 2]
            if repeats > 1:
                record["seconds_runs"] = [r["seconds"] for r, _ in rounds]
            q_records.append(record)
        compare_to_reference(q_records, outputs)
        q_records.sort(key=lambda r: names.index(r["system"]))
        records.extend(q_records)
    return records


def _run(system: System, q: Question, ids: list[int], max_new_tokens: int, skipped: dict[str, str],
         errors: list[dict], log: Callable[[str], None]):
    """One timed generation, or None when the system did not start or fails on this question (the error
    goes to `errors`; the system runs the next question as usual)."""
    if system.name in skipped:
        return None
    try:
        return system.generate(ids, max_new_tokens)
    except Exception as exc:
        if system.name == REFERENCE:
            raise
        error = " ".join(f"{type(exc).__name__}: {exc}".split())
        errors.append({"system": system.name, "question_id": q.question_id, "category": q.category,
                       "error": error})
        log(f"{system.name} failed on question {q.question_id}: {error}; it goes on with the next question")
        return None


def prepare_prompts(session: Session, questions: Sequence[Question],
                    max_prompt_tokens: int) -> list[tuple[list[int], bool]]:
    """(chat-formatted prompt ids, whether the question was cut) per question, tokenized by the bundle."""
    codec = session.codec
    opts = session.options(chat=True)
    prompts = []
    for q in questions:
        text, cut = cut_text(q.text, codec.encode, codec.decode, max_prompt_tokens)
        ids = session.prompt_ids(text, opts)
        if len(ids) + 1 >= session.bundle.max_context:
            raise SpecExportError(f"question {q.question_id} is {len(ids)} tokens after the cut, more than the"
                                  f" bundle's context of {session.bundle.max_context}; lower --max-prompt-tokens")
        prompts.append((ids, cut))
    return prompts


def run_bench(cfg: BenchConfig, progress: Progress | None = None, log: Callable[[str], None] = print,
              total_hook: Callable[[int], None] | None = None) -> dict:
    """Run the benchmark and return the report (its keys are documented in bench_metrics.KEYS).
    `progress(system, question, record)` follows every run; `total_hook(n)` once the number of runs is known."""
    from ..runtime.session import load

    started = time.perf_counter()
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    load_start = loadavg()
    check_config(cfg)
    threads = cfg.threads or default_threads()
    qpath = resolve_questions(cfg.questions)
    questions = load_questions(qpath, cfg.categories, cfg.limit)

    session = load(cfg.bundle, threads=threads, expect_digest=cfg.expect_digest)
    prompts = prepare_prompts(session, questions, cfg.max_prompt_tokens)
    candidates, skipped = make_systems(session, cfg, threads, log)
    warmup = (prompts[0][0][-WARMUP_PROMPT_TOKENS:], min(WARMUP_NEW_TOKENS, cfg.max_new_tokens)) if cfg.warmup else None
    systems, setup_s = start_systems(candidates, skipped, warmup, log)
    errors: list[dict] = []
    try:
        if total_hook:
            total_hook(len(systems) * len(questions) * cfg.repeats)
        records = run_interleaved(systems, questions, prompts, cfg.max_new_tokens, skipped, progress, log,
                                  cfg.repeats, errors)
    finally:
        for system in systems:
            system.close()
    order = [s.name for s in systems]
    manifest = session.bundle.manifest
    checkpoint = _checkpoint(manifest)

    memory = None
    if cfg.memory:
        log("measuring the peak memory of one `specexport generate` in a fresh process")
        first_text = cut_text(questions[0].text, session.codec.encode, session.codec.decode, cfg.max_prompt_tokens)[0]
        memory = measure_memory(Path(cfg.bundle), first_text, cfg.max_new_tokens, checkpoint, threads)

    genai_env = next((s.versions for s in systems if isinstance(s, OrtGenAISystem) and s.versions), None)
    return {
        "schema": SCHEMA,
        "keys": KEYS,
        "created": created,
        "command": cfg.command,
        "elapsed_s": time.perf_counter() - started,
        "machine": {**machine_info(), "loadavg_start": load_start, "loadavg_end": loadavg()},
        "versions": {**versions(), "ortgenai_env": genai_env},
        "bundle": {
            "path": str(Path(cfg.bundle).resolve()), "name": manifest.name, "digest": session.bundle.digest,
            "precision": manifest.precision, "flavour": manifest.graph.flavour,
            "exit_layer": manifest.model.exit_layer, "pieces": list(manifest.pieces),
            "checkpoint": str(checkpoint) if checkpoint else None,
        },
        "settings": {
            "questions": str(qpath), "categories": list(dict.fromkeys(q.category for q in questions)),
            "limit": cfg.limit, "max_new_tokens": cfg.max_new_tokens, "max_prompt_tokens": cfg.max_prompt_tokens,
            "greedy": True, "batch_size": 1, "warmup": cfg.warmup, "repeats": cfg.repeats, "threads": threads,
            "thread_pool": thread_pool(), "schedules": cfg.schedules, "policies": cfg.policies,
            "trees": cfg.trees, "ignore_eos": cfg.ignore_eos,
            "reference": REFERENCE, "systems": order,
        },
        "systems": {s.name: {**s.describe(), "setup_s": setup_s.get(s.name)} for s in systems},
        "skipped": skipped,
        "errors": errors,
        "results": aggregate(records, order),
        "memory": memory,
        "records": records,
    }
