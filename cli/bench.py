"""`specexport bench`: wired into the CLI by `register(main)` (see cli/main.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .options import EXPECT_DIGEST, command_line


def _csv(value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    return [] if items in ([], ["none"]) else items


def register(main: click.Group) -> None:
    @main.command()
    @click.option("--bundle", required=True, type=click.Path(path_type=Path), help="Bundle directory.")
    @click.option("--questions", default=None, help="Questions in Spec-Bench's jsonl shape, such as Spec-Bench's"
                  " data/spec_bench/question.jsonl. Default: the shipped prompt set, recipes/data/bench_prompts.jsonl"
                  " (13 categories, 3 chat prompts each).")
    @click.option("--categories", default=None, help="Comma-separated categories (default: all of the file's).")
    @click.option("--limit", type=int, default=None, help="First N questions of each category (default: all).")
    @click.option("--max-new-tokens", type=int, default=128, show_default=True)
    @click.option("--max-prompt-tokens", type=int, default=1500, show_default=True,
                  help="Cut each question to its last N tokens before the chat template.")
    @click.option("--modes", default=None, help="specexport modes, comma-separated (ar always runs, as the"
                  " reference). Default: every mode the runtime has; those the bundle lacks are skipped.")
    @click.option("--schedule", "schedules", default=None, help="Schedules, comma-separated: sequential (draft, then"
                  " verify) and pearl (drafter and verifier side by side on two threads, PEARL). With --policy, each"
                  " speculative mode runs under every schedule x policy, named specexport-MODE-SCHEDULE-POLICY."
                  " Default: the session's (sequential), names as specexport-MODE. PEARL makes the whole run use"
                  " per-session thread pools.")
    @click.option("--policy", "policies", default=None, help="Draft-length policies, comma-separated: fixed[:GAMMA],"
                  " confidence[:ETA], entropy[:LAMBDA], goodput[:GAMMA_MAX] (see `specexport generate --help`).")
    @click.option("--tree", "trees", default=None, help="Token-tree shapes, comma-separated"
                  " (NODES[:DEPTH[:WIDTH[:LOOKUP[:KEEP[:EXPAND]]]]], see `specexport generate --help`): each runs"
                  " the drafter piece with token trees, named specexport-model-treeSHAPE (and from the draft head"
                  " where the bundle has one, specexport-head-treeSHAPE).")
    @click.option("--baselines", default="hf,hf-lookup,ortgenai", show_default=True,
                  help="Peers to run in the same pass: hf (transformers generate, PyTorch fp32), hf-lookup"
                  " (its prompt lookup, 10 tokens), ortgenai (ONNX Runtime GenAI fp32 through its own model"
                  " builder, plus int4/int8 when the bundle is), ortgenai-fp32, ortgenai-int4, ortgenai-int8,"
                  " ortgenai-ngram-fp32, ortgenai-ngram-int4, ortgenai-ngram-int8 (GenAI's own n-gram speculation,"
                  " ngram_size 4, up to 8 drafts; beside ortgenai-P the report adds each mode against the faster of"
                  " the two per question); 'none' for none.")
    @click.option("--out", type=click.Path(path_type=Path), default=None,
                  help="Report directory (default: reports/<bundle directory name>).")
    @click.option("--threads", type=int, default=None, help="Intra-op threads of every system alike (the bundle's"
                  " ONNX Runtime sessions, ORT GenAI, PyTorch). Default: $OMP_NUM_THREADS if set, else one per core.")
    @click.option("--genai-python", default=None, envvar="SPECEXPORT_ORTGENAI_PYTHON",
                  help="Interpreter with onnxruntime-genai (and transformers >= 5 for its builder) that builds and"
                  " runs the ortgenai baselines. Default: .venv-genai/bin/python (made by `make bench-env`) when"
                  " present, else this interpreter.")
    @click.option("--repeats", type=int, default=1, show_default=True, help="Rounds per question; each system's"
                  " figure for a question is its run of median time (a shared machine's busy moments drop out).")
    @click.option("--no-warmup", is_flag=True, help="Skip each system's untimed warm-up run.")
    @click.option("--no-memory", is_flag=True, help="Skip the peak-memory probe of `specexport generate`.")
    @click.option("--ignore-eos", is_flag=True, help="Every system generates exactly --max-new-tokens, past EOS"
                  " (peers: EOS held off), so systems whose answers differ are timed over runs of equal length.")
    @click.option("--json", "as_json", is_flag=True, help="Print report.json on stdout.")
    @EXPECT_DIGEST
    def bench(bundle, questions, categories, limit, max_new_tokens, max_prompt_tokens, modes, schedules, policies,
              trees, baselines, out, threads, genai_python, repeats, no_warmup, no_memory, ignore_eos, as_json,
              expect_digest) -> None:
        """The shipped prompt set (or Spec-Bench with --questions) through the bundle's modes and its peers,
        interleaved per question; writes
        report.json, report.md and report.png. Baselines whose package is missing are skipped with the
        reason (`make bench-env` installs them).

        \b
        specexport bench --bundle bundles/smollm2 --limit 2
        specexport bench --bundle bundles/smollm2 --categories qa,rag --baselines hf --max-new-tokens 32
        specexport bench --bundle bundles/smollm2 --limit 2 --baselines none --schedule sequential,pearl \\
            --policy confidence,entropy,goodput
        """
        from tqdm import tqdm

        from ..bench.metrics import lossless_failure_sentence
        from ..bench.report import write_report
        from ..bench.runner import BenchConfig, run_bench

        out = out or Path("reports") / Path(bundle).resolve().name
        cfg = BenchConfig(bundle=bundle, questions=questions, categories=_csv(categories), limit=limit,
                          max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens, modes=_csv(modes),
                          schedules=_csv(schedules), policies=_csv(policies), trees=_csv(trees),
                          baselines=_csv(baselines) or [], warmup=not no_warmup, repeats=repeats, memory=not no_memory,
                          threads=threads, genai_python=genai_python, command=command_line(),
                          expect_digest=expect_digest, ignore_eos=ignore_eos)
        bar = tqdm(total=0, unit="run", file=sys.stderr, dynamic_ncols=True, disable=None)

        def log(message: str) -> None:
            bar.write(message, file=sys.stderr)

        counts = {"done": 0, "total": 0}

        def total(n: int) -> None:
            counts["total"] = bar.total = n
            bar.refresh()

        def progress(system: str, question, record: dict | None) -> None:
            counts["done"] += 1
            bar.set_postfix_str(f"{question.category} {question.question_id} {system}", refresh=False)
            bar.update(1)
            if bar.disable and record:  # no terminal (CI, a log file): one line per run instead
                tps = record["tokens_per_s"]
                click.echo(f"[{counts['done']}/{counts['total']}] {question.category} {question.question_id}"
                           f" {system}: {record['new_tokens']} tokens"
                           + (f", {tps:.1f} tokens/s" if tps is not None else ""), err=True)

        from ..bench.machine import default_threads
        from ..bench.runner import uses_pearl
        from ..runtime.backends.ort import use_shared_thread_pool
        from . import process

        # see cli/process.py: only a process of its own may share one thread pool, and PEARL's two threads
        # need pools of their own (ONNX Runtime would impose the shared one on every session)
        if process.OWNS_PROCESS and not uses_pearl(cfg):
            use_shared_thread_pool(cfg.threads or default_threads())
        try:
            report = run_bench(cfg, progress=progress, log=log, total_hook=total)
        finally:
            bar.close()
        paths = write_report(report, out)
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            click.echo(Path(paths["md"]).read_text())
        chart = str(paths["png"]) if isinstance(paths["png"], Path) else f"no chart ({paths['png']})"
        click.echo(f"wrote {paths['json']}, {paths['md']}, {chart} in {report['elapsed_s']:.0f} s", err=True)
        # a lossless mode that is not token-identical to AR is a bug: the run fails (after the report is
        # written), so `make bench` or CI cannot pass with a broken mode in a green-looking table
        broken = lossless_failure_sentence(report)
        if broken:
            process.fail(broken)
