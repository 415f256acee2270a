"""`specexport bench`: Spec-Bench through a bundle and its peers, interleaved, into report.json/.md/.png.

Only numpy and the standard library load with this module; the bundle's session, PyTorch/transformers
(the Hugging Face baselines), onnxruntime_genai and matplotlib load when a run needs them, and a
baseline whose package is missing is skipped with the reason.

Method (Spec-Bench's, on one machine):

- the first turn of each question, through the bundle's chat template; the question text is cut to its
  last ``max_prompt_tokens`` (1,500) tokens first, so the longest summarization and RAG prompts fit;
- the prompt is tokenized once by the bundle and every system gets the same token ids;
- greedy, batch 1, at most ``max_new_tokens`` new tokens, stopping at EOS (EOS is not counted);
- per question every system runs once, the order rotated from question to question, so that drift of
  the machine (other jobs, heat) hits all systems alike; each system runs one untimed warm-up first;
- a run's time is the wall clock of the call from prompt ids to new ids, prefill included.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = "specexport.bench/1"
REPO = Path(__file__).resolve().parents[1]
DEFAULT_QUESTIONS = "../shared/specbench/question.jsonl"
DEFAULT_MAX_PROMPT_TOKENS = 1500
DEFAULT_MAX_NEW_TOKENS = 128
REFERENCE = "specexport-ar"
BASELINES = ("hf", "hf-lookup", "ortgenai", "ortgenai-fp32", "ortgenai-int4")
DEFAULT_BASELINES = ("hf", "hf-lookup", "ortgenai")
HF_LOOKUP_TOKENS = 10
METRICS = ("questions", "new_tokens", "seconds", "tokens_per_s", "tokens_per_s_total", "speedup",
           "speedup_total", "mean_accepted_tokens", "acceptance_rate", "identical_to_ar", "identical_count")

# The documented meaning of every key of report.json; stored in the report itself under "keys".
# The names are stable: a change of meaning changes SCHEMA.
KEYS = {
    "schema": f"'{SCHEMA}'; changes whenever a key below changes meaning",
    "keys": "this description of the keys",
    "created": "UTC time the run started (ISO 8601)",
    "command": "the command line that produced the report",
    "elapsed_s": "wall time of the whole run, set-up and memory probe included",
    "machine": "cpu_model, cores (logical CPUs), platform, python, loadavg_start/loadavg_end (1/5/15 min)",
    "versions": "installed versions of the packages involved (null when not installed)",
    "bundle": "path, name, precision, flavour, exit_layer, pieces and source checkpoint of the bundle",
    "settings": "questions file, categories, limit per category, max_new_tokens, max_prompt_tokens, greedy,"
                " batch_size, warmup, threads (every system's intra-op threads; null = one per core),"
                " reference, systems (run order of the first question)",
    "systems": "system name -> {label, kind (specexport|baseline), mode, precision, setup_s, note}",
    "skipped": "system name -> why it did not run (missing package or piece, failed set-up), or why it"
               " stopped early (its results then cover the questions before the failure)",
    "results": "system name -> {overall: METRICS, categories: {category: METRICS}}",
    "results.*.questions": "number of questions the figures cover",
    "results.*.new_tokens": "new tokens generated, summed over the questions (EOS not counted)",
    "results.*.seconds": "wall time of the generate calls, summed (prefill included)",
    "results.*.tokens_per_s": "median over questions of new_tokens / seconds of that question (prefill included)",
    "results.*.tokens_per_s_total": "new_tokens / seconds over all the questions",
    "results.*.speedup": f"median over questions of tokens_per_s / tokens_per_s of {REFERENCE} on the same"
                         " question",
    "results.*.speedup_total": f"tokens_per_s_total / tokens_per_s_total of {REFERENCE}",
    "results.*.mean_accepted_tokens": "tau: tokens emitted per target-model forward pass, the prefill's"
                                      " included and a final EOS counted as emitted (1.00 for"
                                      " autoregressive decoding); null when the system does not expose its"
                                      " steps",
    "results.*.acceptance_rate": "accepted / drafted tokens; null when nothing was drafted or the system"
                                 " does not expose it",
    "results.*.identical_to_ar": f"every output's token ids equal {REFERENCE}'s for the question (must hold"
                                 " for specexport modes: lossless; baselines differ by floating-point"
                                 " arithmetic, so for them it is informative only)",
    "results.*.identical_count": f"number of questions whose output equals {REFERENCE}'s",
    "results.*.overall.ratio_to": "other system name -> median over questions of this system's"
                                  " tokens_per_s / the other's",
    "memory": "peak resident memory of one `specexport generate` run in a fresh process (peak_rss_bytes:"
              " getrusage(RUSAGE_CHILDREN).ru_maxrss of a small launcher whose only child it is) against"
              " the fp32 weights on disk (weights_fp32_bytes: the source checkpoint's weight files) and the"
              " bundle's files (bundle_bytes); ratio = peak_rss_bytes / weights_fp32_bytes",
    "chart": "file name of the chart (speedup and tau per category) beside report.json, or null",
    "chart_note": "why there is no chart (only when chart is null)",
    "records": "one per question and system: question_id, category, system, prompt_tokens, prompt_cut,"
               " new_tokens, seconds, tokens_per_s, steps, drafted, accepted, mean_accepted_tokens,"
               " acceptance_rate, speedup, identical_to_ar, first_mismatch (index of the first token that"
               " differs from the reference, null if none), finish_reason",
}


class Skip(Exception):
    """A system cannot run here; the message says why, in one sentence."""


# -- Spec-Bench questions ---------------------------------------------------------------------------


@dataclass
class Question:
    question_id: int | str
    category: str
    text: str  # the first user turn


def resolve_questions(path: str | os.PathLike | None = None) -> Path:
    """The questions file: as given, else relative to the current directory, else to the repository."""
    given = Path(path or DEFAULT_QUESTIONS)
    candidates = [given] if given.is_absolute() else [Path.cwd() / given, REPO / given]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    from .errors import SpecExportError

    tried = ", ".join(str(c) for c in candidates)
    raise SpecExportError(f"no Spec-Bench questions file at {tried}; pass --questions FILE (the question.jsonl"
                          " of hemingkx/Spec-Bench)")


def load_questions(path: str | os.PathLike, categories: Sequence[str] | None = None,
                   limit: int | None = None) -> list[Question]:
    """First turns, in the file's order; `limit` keeps the first N questions of each category."""
    from .errors import SpecExportError

    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
                rows.append(Question(q["question_id"], q["category"], q["turns"][0]))
            except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
                raise SpecExportError(f"{path}:{n} is not a Spec-Bench question ({exc})") from None
    known = list(dict.fromkeys(q.category for q in rows))
    if categories:
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise SpecExportError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)};"
                                  f" {path} has {', '.join(known)}")
        rows = [q for q in rows if q.category in set(categories)]
    if limit is not None:
        if limit < 1:
            raise SpecExportError("--limit must be at least 1")
        seen: dict[str, int] = {}
        kept = []
        for q in rows:
            seen[q.category] = seen.get(q.category, 0) + 1
            if seen[q.category] <= limit:
                kept.append(q)
        rows = kept
    if not rows:
        raise SpecExportError(f"no questions selected from {path}")
    return rows


def cut_text(text: str, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
             max_tokens: int) -> tuple[str, bool]:
    """Keep the last `max_tokens` tokens of `text` (Spec-Bench's long prompts); returns (text, was cut)."""
    ids = encode(text)
    if max_tokens <= 0 or len(ids) <= max_tokens:
        return text, False
    return decode(ids[-max_tokens:]), True


# -- one run of one system --------------------------------------------------------------------------


@dataclass
class RunResult:
    tokens: list[int]
    seconds: float
    steps: int | None = None  # target forward passes, the prefill's included; None = unknown
    drafted: int | None = None
    accepted: int | None = None
    finish_reason: str = "length"

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)


def strip_eos(tokens: Iterable[int], eos_ids: set[int], limit: int) -> tuple[list[int], str]:
    out = []
    for t in tokens:
        if t in eos_ids:
            return out, "eos"
        out.append(int(t))
        if len(out) >= limit:
            break
    return out, "length"


class System:
    name = "system"
    label = "system"
    kind = "baseline"
    mode = "ar"
    precision = "fp32"
    note = ""

    def setup(self) -> None:
        """Load what the system needs (untimed); raise Skip with a reason if it cannot run."""

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def describe(self) -> dict:
        return {"label": self.label, "kind": self.kind, "mode": self.mode, "precision": self.precision,
                "note": self.note}


class SpecExportSystem(System):
    kind = "specexport"

    def __init__(self, session, mode: str) -> None:
        self.session = session
        self.mode = mode
        self.name = f"specexport-{mode}"
        self.label = "specexport AR" if mode == "ar" else f"specexport {mode}"
        self.precision = session.bundle.manifest.get("graph", {}).get("precision", "fp32")

    def generate(self, prompt_ids, max_new_tokens):
        t0 = time.perf_counter()
        g = self.session.generate_ids(prompt_ids, max_new_tokens=max_new_tokens, mode=self.mode,
                                      temperature=0.0, top_k=0, top_p=1.0)
        seconds = time.perf_counter() - t0
        s = g.stats
        return RunResult(list(g.tokens), seconds, steps=s.steps, drafted=s.drafted, accepted=s.accepted,
                         finish_reason=g.finish_reason)


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


class _StepCounter:
    """A transformers streamer that counts target forward passes (one `put` each, after the prompt's)."""

    def __init__(self) -> None:
        self.puts = 0

    def put(self, value) -> None:
        self.puts += 1

    def end(self) -> None:
        pass


_HF_MODELS: dict[str, object] = {}  # one PyTorch model per checkpoint, shared by hf and hf-lookup


class HFSystem(System):
    """Hugging Face transformers `generate`, PyTorch fp32 on the CPU; `lookup` = prompt lookup decoding."""

    def __init__(self, checkpoint: Path | None, eos_ids: set[int], lookup: int | None = None,
                 threads: int | None = None) -> None:
        self.checkpoint = checkpoint
        self.eos_ids = eos_ids
        self.lookup = lookup
        self.threads = threads
        self.name = "hf-lookup" if lookup else "hf"
        self.label = f"HF prompt lookup ({lookup})" if lookup else "HF transformers"
        self.mode = "prompt-lookup" if lookup else "ar"
        self.model = None

    def setup(self):
        for module in ("torch", "transformers"):
            if _missing(module):
                raise Skip(f"{module} is not installed (pip install 'specexport[export]')")
        if self.checkpoint is None or not (self.checkpoint / "config.json").is_file():
            raise Skip(f"the bundle's source checkpoint {self.checkpoint} is not on this machine; rebuild the"
                       " bundle here with `specexport build`")
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        if self.threads:
            torch.set_num_threads(self.threads)
        self.torch = torch
        key = str(self.checkpoint)
        if key not in _HF_MODELS:
            model = transformers.AutoModelForCausalLM.from_pretrained(key, dtype=torch.float32)
            _HF_MODELS[key] = model.eval()
        self.model = _HF_MODELS[key]
        self.note = f"torch {torch.__version__}, {torch.get_num_threads()} threads"

    def generate(self, prompt_ids, max_new_tokens):
        torch = self.torch
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        counter = _StepCounter()
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, streamer=counter,
                      attention_mask=torch.ones_like(ids), eos_token_id=sorted(self.eos_ids),
                      pad_token_id=min(self.eos_ids), temperature=None, top_k=None, top_p=None)
        if self.lookup:
            kwargs["prompt_lookup_num_tokens"] = self.lookup
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, **kwargs)
        seconds = time.perf_counter() - t0
        tokens, reason = strip_eos(out[0, len(prompt_ids):].tolist(), self.eos_ids, max_new_tokens)
        return RunResult(tokens, seconds, steps=max(counter.puts - 1, 0), finish_reason=reason)

    def close(self):
        self.model = None
        _HF_MODELS.pop(str(self.checkpoint), None)


def ortgenai_model_dir(checkpoint: Path, precision: str, log: Callable[[str], None] = print) -> Path:
    """ONNX Runtime GenAI's own export of `checkpoint`, built once into the cache by its model builder.

    The builder runs in a subprocess of ``$SPECEXPORT_ORTGENAI_PYTHON`` (default: this interpreter), so
    it can live in a separate environment should it ever need another transformers than the exporter.
    """
    from .paths import cache_dir

    version = importlib.metadata.version("onnxruntime-genai")
    out = cache_dir("ortgenai") / f"{checkpoint.name}-{precision}-og{version}"
    if (out / "genai_config.json").is_file():
        return out
    python = os.environ.get("SPECEXPORT_ORTGENAI_PYTHON") or sys.executable
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [python, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(tmp),
           "-p", precision, "-e", "cpu", "-c", str(cache_dir("ortgenai", "hf-cache"))]
    log(f"building the ONNX Runtime GenAI {precision} model once (its own builder) into {out}")
    logfile = tmp.parent / f"{out.name}.build.log"
    with open(logfile, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not (tmp / "genai_config.json").is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        tail = logfile.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise Skip(f"ONNX Runtime GenAI's builder failed (exit {rc}): {tail[0][:200]} (log: {logfile})")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


class OrtGenAISystem(System):
    """ONNX Runtime GenAI on its own builder's export. Its intra-op threads are set like the bundle's
    sessions (`threads`, default 0 = ONNX Runtime's one per core): left alone, onnxruntime-genai 0.18
    runs one thread, half its speed on two cores."""

    def __init__(self, checkpoint: Path | None, eos_ids: set[int], precision: str = "fp32",
                 log: Callable[[str], None] = print, threads: int | None = None) -> None:
        self.checkpoint = checkpoint
        self.eos_ids = eos_ids
        self.precision = precision
        self.threads = threads
        self.name = f"ortgenai-{precision}"
        self.label = f"ORT GenAI {precision}"
        self.log = log
        self.model = None

    def setup(self):
        if _missing("onnxruntime_genai"):
            raise Skip("onnxruntime-genai is not installed (pip install 'specexport[bench]')")
        if self.checkpoint is None or not (self.checkpoint / "config.json").is_file():
            raise Skip(f"the bundle's source checkpoint {self.checkpoint} is not on this machine; rebuild the"
                       " bundle here with `specexport build`")
        import onnxruntime_genai as og

        self.og = og
        path = ortgenai_model_dir(self.checkpoint, self.precision, self.log)
        config = og.Config(str(path))
        threads = self.threads or 0
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        self.model = og.Model(config)
        self.note = (f"onnxruntime-genai {importlib.metadata.version('onnxruntime-genai')},"
                     f" intra_op_num_threads {threads}{' (one per core)' if not threads else ''}, model {path}")

    def generate(self, prompt_ids, max_new_tokens):
        og = self.og
        t0 = time.perf_counter()
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(prompt_ids) + max_new_tokens, min_length=0)
        gen = og.Generator(self.model, params)
        gen.append_tokens(list(prompt_ids))
        raw: list[int] = []
        while not gen.is_done() and len(raw) < max_new_tokens:
            gen.generate_next_token()
            token = int(gen.get_next_tokens()[0])
            raw.append(token)
            if token in self.eos_ids:
                break
        seconds = time.perf_counter() - t0
        del gen
        tokens, reason = strip_eos(raw, self.eos_ids, max_new_tokens)
        return RunResult(tokens, seconds, steps=len(raw), finish_reason=reason)

    def close(self):
        self.model = None


# -- aggregation ------------------------------------------------------------------------------------


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _emitted(new_tokens: int, finish_reason: str) -> int:
    """Tokens the target emitted: the new tokens, plus the EOS that ended the answer (which took a step)."""
    return new_tokens + (finish_reason == "eos")


def make_record(question: Question, system: str, result: RunResult, prompt_tokens: int, prompt_cut: bool) -> dict:
    tps = result.new_tokens / result.seconds if result.seconds > 0 else None
    return {
        "question_id": question.question_id, "category": question.category, "system": system,
        "prompt_tokens": prompt_tokens, "prompt_cut": prompt_cut, "new_tokens": result.new_tokens,
        "seconds": result.seconds, "tokens_per_s": tps, "steps": result.steps, "drafted": result.drafted,
        "accepted": result.accepted,
        "mean_accepted_tokens": _emitted(result.new_tokens, result.finish_reason) / result.steps
        if result.steps else None,
        "acceptance_rate": result.accepted / result.drafted if result.drafted else None,
        "finish_reason": result.finish_reason,
        # filled in against the reference once every system has run the question:
        "speedup": None, "identical_to_ar": None, "first_mismatch": None,
    }


def compare_to_reference(records: list[dict], outputs: dict[str, list[int]], reference: str = REFERENCE) -> None:
    """Per-question speedup and identity against the reference system's record of the same question."""
    ref = next((r for r in records if r["system"] == reference), None)
    if ref is None:
        return
    for r in records:
        r["speedup"] = _ratio(r["tokens_per_s"], ref["tokens_per_s"])
        mismatch = first_mismatch(outputs[r["system"]], outputs[reference])
        r["identical_to_ar"] = mismatch is None
        r["first_mismatch"] = mismatch


def group_metrics(rows: list[dict], ref_rows: list[dict]) -> dict:
    """METRICS for one system over `rows` (one record per question); `ref_rows`: the reference's."""
    n_tokens = sum(r["new_tokens"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    total = n_tokens / seconds if seconds > 0 else None
    ref_tokens = sum(r["new_tokens"] for r in ref_rows)
    ref_seconds = sum(r["seconds"] for r in ref_rows)
    ref_total = ref_tokens / ref_seconds if ref_seconds > 0 else None
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
        refs = [by_key[(reference, r["question_id"])] for r in rows if (reference, r["question_id"]) in by_key]
        overall = group_metrics(rows, refs)
        ratio_to = {}
        for other in systems:
            if other == name:
                continue
            ratios = [_ratio(r["tokens_per_s"], by_key[(other, r["question_id"])]["tokens_per_s"])
                      for r in rows if (other, r["question_id"]) in by_key]
            if any(x is not None for x in ratios):
                ratio_to[other] = _median(ratios)
        overall["ratio_to"] = ratio_to
        cats = {}
        for cat in categories:
            cat_rows = [r for r in rows if r["category"] == cat]
            if cat_rows:
                cats[cat] = group_metrics(cat_rows, [x for x in refs if x["category"] == cat])
        results[name] = {"overall": overall, "categories": cats}
    return results


# -- machine, versions, memory ----------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict:
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}


def versions() -> dict:
    out = {}
    for dist in ("specexport", "numpy", "onnxruntime", "onnxruntime-genai", "tokenizers", "torch",
                 "transformers", "matplotlib"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir()
               if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt", ".pth"))


# A small launcher: its only child is `specexport generate`, forked from this ~10 MB interpreter. Linux
# keeps a process's peak RSS across exec, so a child forked straight from the bench process (gigabytes
# of baselines loaded) would report the bench's own peak; getrusage(RUSAGE_CHILDREN) of the launcher
# is the generate process's alone.
_PROBE = (
    "import json, resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
    "err = r.stderr.decode(errors='replace').strip().splitlines()\n"
    "print(json.dumps({'exit_code': r.returncode, 'ru_maxrss': resource.getrusage(resource.RUSAGE_CHILDREN)"
    ".ru_maxrss, 'stderr_tail': err[-1] if err else ''}))\n"
)


def measure_memory(bundle: Path, prompt: str, max_new_tokens: int, checkpoint: Path | None,
                   mode: str = "auto") -> dict:
    """Peak resident memory of one `specexport generate` run in a fresh process, against the fp32
    weights on disk (the source checkpoint's weight files) and the bundle's files."""
    bundle = Path(bundle)
    cmd = [sys.executable, "-m", "specexport.runtime.cli", "generate", "--bundle", str(bundle),
           "--max-new-tokens", str(max_new_tokens), "--mode", mode, "--json", prompt]
    t0 = time.perf_counter()
    probe = subprocess.run([sys.executable, "-c", _PROBE, *cmd], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    try:
        got = json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        got = {"exit_code": probe.returncode, "ru_maxrss": 0, "stderr_tail": probe.stderr.strip()[-200:]}
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    bundle_bytes = sum(p.stat().st_size for p in bundle.iterdir() if p.is_file())
    weights = _weights_bytes(checkpoint) if checkpoint and checkpoint.is_dir() else 0
    out = {
        "command": " ".join(["specexport", *cmd[3:-1], json.dumps(prompt[:40] + "…")]),
        "mode": mode, "exit_code": got["exit_code"], "seconds": seconds,
        "peak_rss_bytes": got["ru_maxrss"] * scale if got["exit_code"] == 0 else None,
        "weights_fp32_bytes": weights or None, "weights_source": str(checkpoint) if weights else None,
        "bundle_bytes": bundle_bytes,
    }
    out["ratio"] = _ratio(out["peak_rss_bytes"], weights) if weights else None
    out["ratio_to_bundle"] = _ratio(out["peak_rss_bytes"], bundle_bytes)
    if got["exit_code"] != 0:
        out["error"] = got["stderr_tail"] or f"exit {got['exit_code']}"
    return out


# -- the run ----------------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    bundle: Path
    questions: str | None = None
    categories: list[str] | None = None
    limit: int | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    modes: list[str] | None = None  # None: every mode the runtime has (those the bundle lacks are skipped)
    baselines: list[str] = field(default_factory=lambda: list(DEFAULT_BASELINES))
    warmup: bool = True
    memory: bool = True
    threads: int | None = None
    command: str = ""


def _checkpoint(manifest: dict) -> Path | None:
    path = manifest.get("provenance", {}).get("checkpoint")
    return Path(path) if path else None


def make_systems(session, cfg: BenchConfig, log: Callable[[str], None]) -> tuple[list[System], dict[str, str]]:
    from . import session as session_module
    from .errors import SpecExportError

    skipped: dict[str, str] = {}
    modes = list(cfg.modes) if cfg.modes else list(session_module.LOOPS)
    if "ar" in modes:
        modes.remove("ar")
    systems: list[System] = [SpecExportSystem(session, "ar")]
    for mode in dict.fromkeys(modes):
        if mode == "auto":
            raise SpecExportError("--modes takes concrete modes (ar, self, ...), not auto")
        try:
            session.resolve_mode(mode)
        except SpecExportError as exc:
            skipped[f"specexport-{mode}"] = str(exc)
            continue
        systems.append(SpecExportSystem(session, mode))

    manifest = session.bundle.manifest
    checkpoint = _checkpoint(manifest)
    eos = set(session.codec.eos_ids)
    precision = manifest.get("graph", {}).get("precision", "fp32")
    for name in dict.fromkeys(cfg.baselines):
        if name not in BASELINES:
            raise SpecExportError(f"unknown baseline {name!r}; use any of {', '.join(BASELINES)}")
        if name == "hf":
            systems.append(HFSystem(checkpoint, eos, threads=cfg.threads))
        elif name == "hf-lookup":
            systems.append(HFSystem(checkpoint, eos, lookup=HF_LOOKUP_TOKENS, threads=cfg.threads))
        elif name == "ortgenai":  # fp32, plus the bundle's own precision when that is int4
            systems.append(OrtGenAISystem(checkpoint, eos, "fp32", log, cfg.threads))
            if precision == "int4":
                systems.append(OrtGenAISystem(checkpoint, eos, "int4", log, cfg.threads))
        else:
            systems.append(OrtGenAISystem(checkpoint, eos, name.split("-", 1)[1], log, cfg.threads))
    unique: dict[str, System] = {}
    for s in systems:
        unique.setdefault(s.name, s)
    return list(unique.values()), skipped


def start_systems(candidates: Sequence[System], skipped: dict[str, str], warmup: tuple[list[int], int] | None,
                  log: Callable[[str], None] = print) -> tuple[list[System], dict[str, float]]:
    """Set up each system (and run its untimed warm-up); those that cannot run go to `skipped`."""
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
                    progress: Callable[[str, Question, dict | None], None] | None = None,
                    log: Callable[[str], None] = print) -> list[dict]:
    """Every system on question 1, then every system on question 2, ..., the order rotated by one
    system per question. A baseline or speculative mode that fails stops there (its reason goes to
    `skipped`, its earlier records stay); the reference failing is an error. `progress(system,
    question, record)` follows every run (record None when the system failed or had failed)."""
    names = [s.name for s in systems]
    if REFERENCE not in names:
        raise ValueError(f"the reference system {REFERENCE} must be among the systems")
    records: list[dict] = []
    for i, (q, (ids, cut)) in enumerate(zip(questions, prompts, strict=True)):
        k = i % len(systems)
        order = [*systems[k:], *systems[:k]]  # rotated: no system always runs right after another
        q_records, outputs = [], {}
        for system in order:
            record = None
            try:
                if system.name in skipped:  # failed on an earlier question
                    continue
                try:
                    result = system.generate(ids, max_new_tokens)
                except Exception as exc:
                    if system.name == REFERENCE:
                        raise
                    skipped[system.name] = (f"failed on question {q.question_id}: {type(exc).__name__}: {exc};"
                                            " its figures cover the questions before it")
                    log(f"{system.name}: {skipped[system.name]}")
                    continue
                record = make_record(q, system.name, result, len(ids), cut)
                q_records.append(record)
                outputs[system.name] = result.tokens
            finally:
                if progress:
                    progress(system.name, q, record)
        compare_to_reference(q_records, outputs)
        q_records.sort(key=lambda r: names.index(r["system"]))
        records.extend(q_records)
    return records


def run_bench(cfg: BenchConfig, progress: Callable[[str, Question, dict | None], None] | None = None,
              log: Callable[[str], None] = print, total_hook: Callable[[int], None] | None = None) -> dict:
    """Run the benchmark; returns the report (see KEYS). `progress(system, question, record)` after every run;
    `total_hook(n)` once the number of runs is known."""
    from .errors import SpecExportError
    from .session import load

    started = time.perf_counter()
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    loadavg_start = _loadavg()
    qpath = resolve_questions(cfg.questions)
    questions = load_questions(qpath, cfg.categories, cfg.limit)

    session = load(cfg.bundle, threads=cfg.threads)
    codec = session.codec
    opts = session.options(chat=True)
    prompts = []
    for q in questions:
        text, cut = cut_text(q.text, codec.encode, codec.decode, cfg.max_prompt_tokens)
        ids = session.prompt_ids(text, opts)
        if len(ids) + 1 >= session.bundle.max_context:
            raise SpecExportError(f"question {q.question_id} is {len(ids)} tokens after the cut, more than the"
                                  f" bundle's context {session.bundle.max_context}; lower --max-prompt-tokens")
        prompts.append((ids, cut))

    candidates, skipped = make_systems(session, cfg, log)
    warmup = (prompts[0][0][-64:], min(8, cfg.max_new_tokens)) if cfg.warmup else None
    systems, setup_s = start_systems(candidates, skipped, warmup, log)
    if total_hook:
        total_hook(len(systems) * len(questions))
    records = run_interleaved(systems, questions, prompts, cfg.max_new_tokens, skipped, progress, log)
    for system in systems:
        system.close()
    order_names = [s.name for s in systems]
    results = aggregate(records, order_names)

    memory = None
    if cfg.memory:
        log("measuring peak memory of `specexport generate` in a subprocess")
        memory = measure_memory(Path(cfg.bundle), questions[0].text, cfg.max_new_tokens,
                                _checkpoint(session.bundle.manifest))

    manifest = session.bundle.manifest
    return {
        "schema": SCHEMA,
        "keys": KEYS,
        "created": created,
        "command": cfg.command,
        "elapsed_s": time.perf_counter() - started,
        "machine": {**machine_info(), "loadavg_start": loadavg_start, "loadavg_end": _loadavg()},
        "versions": versions(),
        "bundle": {
            "path": str(Path(cfg.bundle).resolve()), "name": manifest.get("name"),
            "precision": manifest.get("graph", {}).get("precision"),
            "flavour": manifest.get("graph", {}).get("flavour"),
            "exit_layer": manifest.get("model", {}).get("exit_layer"),
            "pieces": list(manifest.get("pieces", {})),
            "checkpoint": str(_checkpoint(manifest)) if _checkpoint(manifest) else None,
        },
        "settings": {
            "questions": str(qpath), "categories": list(dict.fromkeys(q.category for q in questions)),
            "limit": cfg.limit, "max_new_tokens": cfg.max_new_tokens, "max_prompt_tokens": cfg.max_prompt_tokens,
            "greedy": True, "batch_size": 1, "warmup": cfg.warmup, "threads": cfg.threads,
            "reference": REFERENCE, "systems": order_names,
        },
        "systems": {s.name: {**s.describe(), "setup_s": setup_s.get(s.name)} for s in systems},
        "skipped": skipped,
        "results": results,
        "memory": memory,
        "records": records,
    }


# -- rendering --------------------------------------------------------------------------------------


def _f(value, fmt: str = "{:.1f}", none: str = "–") -> str:
    return none if value is None else fmt.format(value)


def _flag(value) -> str:
    return "–" if value is None else ("yes" if value else "**no**")


def render_markdown(report: dict) -> str:
    results = report["results"]
    systems = [s for s in report["settings"]["systems"] if s in results]
    labels = {s: report["systems"][s]["label"] for s in systems}
    st, m = report["settings"], report["machine"]
    n_q = results[systems[0]]["overall"]["questions"] if systems else 0
    lines = [
        f"# specexport bench: {report['bundle']['name']} ({report['bundle']['precision']})",
        "",
        f"{report['created']} · {m['cpu_model']}, {m['cores']} cores · {n_q} Spec-Bench questions"
        f" ({'first ' + str(st['limit']) + ' per category' if st['limit'] else 'all'}), first turn, chat"
        f" template, prompts cut to their last {st['max_prompt_tokens']} tokens · greedy, batch 1, up to"
        f" {st['max_new_tokens']} new tokens · tokens/s include the prefill; speedup is over"
        f" {labels.get(st['reference'], st['reference'])} on the same question · load average"
        f" {m.get('loadavg_start')} → {m.get('loadavg_end')}",
        "",
        f"`{report['command']}`" if report["command"] else "",
        "",
        "## Overall",
        "",
        "| system | tokens/s (median) | tokens/s (total) | speedup (median) | speedup (total) | τ |"
        " acceptance | identical to AR |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in systems:
        o = results[s]["overall"]
        ident = _flag(o["identical_to_ar"]) + f" ({o['identical_count']}/{o['questions']})"
        lines.append(f"| {labels[s]} | {_f(o['tokens_per_s'])} | {_f(o['tokens_per_s_total'])} |"
                     f" {_f(o['speedup'], '{:.2f}×')} | {_f(o['speedup_total'], '{:.2f}×')} |"
                     f" {_f(o['mean_accepted_tokens'], '{:.2f}')} | {_f(o['acceptance_rate'], '{:.1%}')} | {ident} |")
    categories = report["settings"]["categories"]

    def table(title: str, key: str, fmt: str, only: Sequence[str]) -> None:
        if not only:
            return
        lines.extend(["", f"## {title}", "", "| category | " + " | ".join(labels[s] for s in only) + " |",
                      "|---|" + "---|" * len(only)])
        lines.append("| overall | " + " | ".join(_f(results[s]["overall"][key], fmt) for s in only) + " |")
        for cat in categories:
            cells = [_f(results[s]["categories"].get(cat, {}).get(key), fmt) for s in only]
            lines.append(f"| {cat} | " + " | ".join(cells) + " |")

    table("tokens/s per category (median over questions)", "tokens_per_s", "{:.1f}", systems)
    table(f"Speedup over {labels.get(st['reference'], st['reference'])} per category (median over questions)",
          "speedup", "{:.2f}×", [s for s in systems if s != st["reference"]])
    table("Mean accepted tokens τ per category", "mean_accepted_tokens", "{:.2f}",
          [s for s in systems if results[s]["overall"]["mean_accepted_tokens"] is not None])
    spec = [s for s in systems if report["systems"][s]["kind"] == "specexport" and s != st["reference"]]
    if spec:
        bad = [f"{labels[s]} ({results[s]['overall']['identical_count']}/{results[s]['overall']['questions']})"
               for s in spec if not results[s]["overall"]["identical_to_ar"]]
        lines.extend(["", "Lossless check: " + ("every speculative output equals specexport AR's." if not bad
                      else "**outputs differ from specexport AR** for " + ", ".join(bad) + ".")])
    if report["skipped"]:
        lines.extend(["", "## Skipped", ""])
        lines.extend(f"- {name}: {reason}" for name, reason in report["skipped"].items())
    mem = report.get("memory")
    if mem:
        mb = 1e6
        lines.extend(["", "## Memory", ""])
        if mem.get("error"):
            lines.append(f"`specexport generate` failed: {mem['error']}")
        else:
            ratio = (f" = {mem['ratio']:.2f}× the fp32 weights on disk ({mem['weights_fp32_bytes'] / mb:.0f} MB)"
                     if mem.get("ratio") else "")
            lines.append(f"Peak resident memory of `specexport generate --mode {mem['mode']}`"
                         f" ({st['max_new_tokens']} new tokens): {mem['peak_rss_bytes'] / mb:.0f} MB{ratio};"
                         f" the bundle's files: {mem['bundle_bytes'] / mb:.0f} MB.")
    v = report["versions"]
    lines.extend(["", "## Versions", "", ", ".join(f"{k} {val}" for k, val in v.items() if val), "",
                  "Systems: " + "; ".join(f"{labels[s]} = `{s}`"
                                           + (f" ({report['systems'][s]['note']})" if report["systems"][s]["note"]
                                              else "") for s in systems), ""])
    return "\n".join(lines)


def render_chart(report: dict, path: Path) -> str | None:
    """Speedup and τ per category, systems side by side. Returns None, or why the chart was skipped."""
    if _missing("matplotlib"):
        return "matplotlib is not installed (pip install 'specexport[bench]'), so no chart"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    results = report["results"]
    systems = [s for s in report["settings"]["systems"] if s in results]
    labels = {s: report["systems"][s]["label"] for s in systems}
    cats = ["overall", *report["settings"]["categories"]]

    def value(s: str, cat: str, key: str):
        block = results[s]["overall"] if cat == "overall" else results[s]["categories"].get(cat, {})
        v = block.get(key)
        return np.nan if v is None else v

    panels = [("speedup", f"speedup over {labels.get(REFERENCE, REFERENCE)} (median)", systems),
              ("mean_accepted_tokens", "mean accepted tokens τ",
               [s for s in systems if results[s]["overall"]["mean_accepted_tokens"] is not None])]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(cats) + 2), 8), constrained_layout=True)
    x = np.arange(len(cats))
    for ax, (key, title, only) in zip(axes, panels, strict=True):
        width = 0.8 / max(len(only), 1)
        for j, s in enumerate(only):
            ax.bar(x + (j - (len(only) - 1) / 2) * width, [value(s, c, key) for c in cats], width, label=labels[s])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(x, cats, rotation=30, ha="right")
        ax.set_title(title)
        ax.legend(fontsize=8, ncols=min(len(only), 3))
    fig.suptitle(f"Spec-Bench, {report['bundle']['name']} ({report['bundle']['precision']}),"
                 f" {report['machine']['cpu_model']} ×{report['machine']['cores']}")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_report(report: dict, out: Path) -> dict[str, Path | str]:
    """report.json, report.md and report.png (or a note why not) in `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path | str] = {}
    note = render_chart(report, out / "report.png") if report["results"] else "no results"
    if note:
        report["chart"] = None
        report["chart_note"] = note
        paths["png"] = note
    else:
        report["chart"] = "report.png"
        paths["png"] = out / "report.png"
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    md = render_markdown(report)
    if note:
        md += f"\n_No chart: {note}._\n"
    else:
        md += "\n![speedup and τ per category](report.png)\n"
    (out / "report.md").write_text(md)
    paths["json"] = out / "report.json"
    paths["md"] = out / "report.md"
    return paths
