"""The ONNX Runtime GenAI baseline: its own model builder's export of the bundle's source checkpoint,
run by a worker process in the interpreter that has onnxruntime-genai.

Why a separate interpreter: the GenAI builder needs transformers >= 5 (and brings its own onnxruntime),
while the exporter's environment pins its own range. `make bench-env` makes `.venv-genai` with the
builder's requirements; the bench finds it (or takes `--genai-python` / $SPECEXPORT_ORTGENAI_PYTHON) and
talks to it through ortgenai_worker.py over a pipe. The builder is fed the local checkpoint
directory found from the hash the bundle's manifest records (provenance.source_sha256), offline: nothing is downloaded.
Built models are kept under the cache (``$SPECEXPORT_CACHE/ortgenai``, git-ignored) and reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from ..runtime.paths import cache_dir
from .metrics import RunResult
from .questions import REPO
from .systems import Skip, System, no_checkpoint

WORKER = Path(__file__).with_name("ortgenai_worker.py")
VENV_NAME = ".venv-genai"
PRECISIONS = ("fp32", "int4", "int8")  # CPU precisions of the GenAI builder that a bundle can match
# GenAI's own speculation on its own model, the ortgenai-ngram-* baselines: with no draft model configured,
# GeneratorParams.set_speculative_options drafts by n-gram lookup over the prompt and the tokens so far
NGRAM_OPTIONS = {"ngram_size": 4, "max_draft_tokens": 8}
_HINT = "run `make bench-env` or pass --genai-python"


def find_python(given: str | os.PathLike | None = None) -> str:
    """The interpreter for the GenAI builder and worker: `given`, else $SPECEXPORT_ORTGENAI_PYTHON, else a
    `.venv-genai` in the current directory or the repository, else this interpreter."""
    if given:
        return str(given)
    if os.environ.get("SPECEXPORT_ORTGENAI_PYTHON"):
        return os.environ["SPECEXPORT_ORTGENAI_PYTHON"]
    for root in (Path.cwd(), REPO):
        candidate = root / VENV_NAME / "bin" / "python"
        if candidate.exists():
            return str(candidate)
    return sys.executable


def env_versions(python: str) -> dict:
    """Versions of the packages that matter in `python`; Skip when it has no onnxruntime-genai."""
    try:
        done = subprocess.run([python, str(WORKER), "versions"], capture_output=True, text=True, timeout=120)
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except FileNotFoundError:
        raise Skip(f"the ONNX Runtime GenAI interpreter {python} does not exist; {_HINT}") from None
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError):
        raise Skip(f"the ONNX Runtime GenAI interpreter {python} did not report its packages; {_HINT}") from None
    if not found.get("onnxruntime-genai"):
        raise Skip(f"onnxruntime-genai is not installed in {python}; {_HINT}")
    return found


def _builder_ready(found: dict) -> str | None:
    """Why the GenAI builder cannot run in that interpreter, or None."""
    transformers = found.get("transformers")
    if not transformers or not found.get("torch"):
        return f"ONNX Runtime GenAI's model builder needs torch and transformers >= 5 in {found['executable']}"
    if int(transformers.split(".")[0]) < 5:
        return (f"ONNX Runtime GenAI's model builder needs transformers >= 5 but {found['executable']} has"
                f" {transformers}")
    return None


def model_dir(checkpoint: Path, source_key: str, precision: str, found: dict) -> Path:
    """Where the GenAI export of `checkpoint` at `precision` lives in the cache (built or not)."""
    key = hashlib.sha256(f"{checkpoint.resolve()}|{source_key}".encode()).hexdigest()[:12]
    return cache_dir("ortgenai") / f"{checkpoint.name}-{key}-{precision}-og{found['onnxruntime-genai']}"


def build_model(python: str, found: dict, checkpoint: Path, source_key: str, precision: str,
                log: Callable[[str], None] = print) -> Path:
    """The GenAI builder's export of `checkpoint`, built once into the cache (written to a temporary
    directory and renamed, so a failed build leaves nothing that looks finished)."""
    out = model_dir(checkpoint, source_key, precision, found)
    if (out / "genai_config.json").is_file():
        return out
    why = _builder_ready(found)
    if why:
        raise Skip(f"{why}; {_HINT}")
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [python, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(tmp / "model"),
           "-p", precision, "-e", "cpu", "-c", str(tmp / "scratch"), "--extra_options", "hf_token=false"]
    # the checkpoint is local: forbid any hub access, so a mistake fails instead of downloading weights
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    logfile = out.with_name(out.name + ".build.log")
    log(f"building the ONNX Runtime GenAI {precision} model once with its own builder into {out}")
    with open(logfile, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0 or not (tmp / "model" / "genai_config.json").is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        lines = logfile.read_text(errors="replace").strip().splitlines() or ["no output"]
        raise Skip(f"ONNX Runtime GenAI's builder failed (exit {rc}): {lines[-1][:200]} (log: {logfile})")
    shutil.rmtree(out, ignore_errors=True)
    (tmp / "model").rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def speculative_counts(stats: dict) -> tuple[int | None, int | None, int | None]:
    """(target forward passes, drafted, accepted) of one speculative GenAI run, from the counters of
    Generator.get_speculative_stats(). Forward passes: the plain steps where no draft was found (the prefill's
    among them) plus the target's passes of the speculative rounds (verification, and the re-anchoring pass
    after a round that accepted nothing). Drafted: every token proposed for verification, as specexport counts
    its own (GenAI's acceptance_rate divides by draft_tokens_evaluated, the drafts up to the first rejected one,
    which would flatter it). None where a counter is missing."""
    steps = None
    if "standard_fallback_steps" in stats and "target_forward_passes" in stats:
        steps = int(stats["standard_fallback_steps"]) + int(stats["target_forward_passes"])
    drafted, accepted = stats.get("draft_tokens_proposed"), stats.get("draft_tokens_accepted")
    return steps, None if drafted is None else int(drafted), None if accepted is None else int(accepted)


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a running process of this machine (Linux: /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class OrtGenAISystem(System):
    """ONNX Runtime GenAI greedy decoding on its own builder's export, in a worker process: one request at a
    time (`generate`), or several together through GenAI's Engine (`generate_batch`, up to `max_batch`).
    Threads may share it; each call holds the worker until its answer is complete. `spinning` False keeps the
    decoder's idle intra-op threads from spin-waiting, as specexport's own sessions do; None leaves GenAI's
    default (spinning). `speculative` (GenAI's speculative options, such as NGRAM_OPTIONS) makes it GenAI's own
    speculative decoding, named ortgenai-ngram-PRECISION: still greedy and on the same model, with its forward
    passes, drafted and accepted tokens read from GenAI's statistics (single requests only)."""

    def __init__(self, checkpoint: Path | None, eos_ids: set[int], precision: str = "fp32",
                 threads: int | None = None, python: str | None = None, source_key: str = "",
                 log: Callable[[str], None] = print, max_batch: int = 1, spinning: bool | None = None,
                 speculative: dict | None = None) -> None:
        self.checkpoint = checkpoint
        self.eos_ids = eos_ids
        self.precision = precision
        self.threads = threads
        self.python = python
        self.source_key = source_key
        self.log = log
        self.max_batch = max_batch
        self.spinning = spinning
        self.speculative = dict(speculative) if speculative else None
        self.lock = threading.Lock()
        self.name = f"ortgenai-{precision}"
        self.label = f"ORT GenAI {precision}"
        if self.speculative:
            self.name, self.label, self.mode = f"ortgenai-ngram-{precision}", f"ORT GenAI n-gram {precision}", "ngram"
        self.proc: subprocess.Popen | None = None
        self.versions: dict | None = None

    def setup(self) -> None:
        if self.checkpoint is None or not (self.checkpoint / "config.json").is_file():
            raise no_checkpoint(self.checkpoint, self.source_key)
        python = find_python(self.python)
        found = env_versions(python)
        path = build_model(python, found, self.checkpoint, self.source_key, self.precision, self.log)
        threads = self.threads or 0  # 0: ONNX Runtime's default, one per core
        self.stderr = open(path.with_name(path.name + ".worker.log"), "w")  # closed in close()
        settings = {"max_batch": self.max_batch, **({} if self.spinning is None else {"spinning": self.spinning}),
                    **({"speculative": self.speculative} if self.speculative else {})}
        cmd = [python, str(WORKER), "serve", str(path), str(threads), json.dumps(settings)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     bufsize=1)
        hello = self._read()
        if "error" in hello:
            self.close()
            raise Skip(f"ONNX Runtime GenAI could not load {path}: {hello['error']}")
        self.versions = hello["versions"]
        spin = "" if self.spinning is None else f", spinning {'on' if self.spinning else 'off'}"
        spec = ("" if not self.speculative else ", speculative options: "
                + ", ".join(f"{k} {v}" for k, v in self.speculative.items()))
        self.note = (f"onnxruntime-genai {found['onnxruntime-genai']} (onnxruntime {found['onnxruntime']}) in"
                     f" {python}, intra-op threads: {threads or 'default'}{spin}{spec}, model {path}")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"the ONNX Runtime GenAI worker exited (code {code}); see {self.stderr.name}")
        return json.loads(line)

    def _send(self, request: dict) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
        with self.lock:
            self._send({"ids": list(prompt_ids), "max_new_tokens": max_new_tokens, "eos": sorted(self.eos_ids),
                        "ignore_eos": self.ignore_eos})
            answer = self._read()
        if "error" in answer:
            raise RuntimeError(f"ONNX Runtime GenAI failed: {answer['error']}")
        tokens, reason = answer["tokens"], answer["finish_reason"]
        if self.speculative:
            steps, drafted, accepted = speculative_counts(answer.get("speculative") or {})
            return RunResult(tokens, answer["seconds"], steps=steps, drafted=drafted, accepted=accepted,
                             finish_reason=reason)
        # plain autoregressive decoding: one forward pass per token, the EOS's included
        return RunResult(tokens, answer["seconds"], steps=len(tokens) + (reason == "eos"), finish_reason=reason)

    def generate_batch(self, jobs: list[tuple[list[int], int]],
                       finished: Callable[[int, list[int]], None]) -> None:
        """Runs `jobs` (prompt ids, max new tokens) as one batch of GenAI's Engine, calling `finished(k, tokens)`
        (tokens without the EOS) for job k as soon as the worker reports it, and returning when all are done."""
        failure: Exception | None = None
        with self.lock:
            self._send({"batch": [{"ids": list(ids), "max_new_tokens": n} for ids, n in jobs],
                        "eos": sorted(self.eos_ids)})
            while True:
                answer = self._read()
                if "error" in answer:  # the worker's last line for this batch
                    raise RuntimeError(f"ONNX Runtime GenAI failed: {answer['error']}")
                if answer.get("batch_done"):
                    break
                try:
                    finished(answer["index"], answer["tokens"])
                except Exception as exc:  # read the batch to its end first, or the next call reads its lines
                    failure = failure or exc
        if failure is not None:
            raise failure

    def cpu_s(self) -> float:
        """CPU seconds the worker process has used so far (what GenAI's decoding costs, apart from the bench's)."""
        return process_cpu_s(self.proc.pid)

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if getattr(self, "stderr", None):
            self.stderr.close()
