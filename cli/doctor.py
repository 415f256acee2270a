"""`specexport doctor`: wired into the CLI by `register(main)`; the checks live in specexport.doctor."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .options import command_line
from .process import EXIT_USAGE, fail

BACKEND_CHOICES = ("tensorrt", "ort-cuda")


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("doctor"), show_default=True,
              help="Directory for doctor.json, doctor.md and the tiny model's files (work/).")
@click.option("--bundle", type=click.Path(path_type=Path), default=None,
              help="Also check this bundle: the CPU reference, its TensorRT operator check and engines (built into"
              " the bundle, as `specexport engines build` does, unless built here before) and every mode it has on"
              " each GPU backend.")
@click.option("--no-tiny", is_flag=True, help="Skip the tiny random Llama (it needs the exporter extra: torch).")
@click.option("--backend", "backends", multiple=True, type=click.Choice(BACKEND_CHOICES),
              help="GPU backend to check (repeatable). Default: both, TensorRT and ONNX Runtime's CUDA provider.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True,
              help="Tokens per prompt and mode (the tiny model: at most 24).")
@click.option("--prompt", "prompts", multiple=True, help="Prompt to decode (repeatable). Default: three built in.")
@click.option("--json", "as_json", is_flag=True, help="Print doctor.json on stdout instead of the summary.")
def doctor(out, bundle, no_tiny, backends, max_new_tokens, prompts, as_json) -> None:
    """Check this machine for specexport's GPU paths; run it first on an NVIDIA GPU or a Jetson.

    \b
    1. Versions, each with a verdict (ok, missing, too old, incompatible, warning, n/a) and why:
       NVIDIA driver, CUDA runtime, TensorRT (10.3 or later; 8.6 is refused), cuda-python
       (12.9.2..<13 on JetPack 6, 13 needs driver 580), ONNX Runtime and its execution providers
       (onnxruntime and onnxruntime-gpu side by side hide CUDA), JetPack, power mode.
    2. A tiny random Llama: exported as fp16 pieces for TensorRT (operator check, parity with
       PyTorch, plan), then its engines built on this GPU.
    3. Token identity: ar, self, model, lookup, a token tree and PEARL on a few prompts, on ONNX
       Runtime CPU (each against AR), then on TensorRT and on ONNX Runtime CUDA (each against the
       CPU's AR tokens); the same for --bundle.
    Every check is timed; doctor.json and doctor.md go to --out. What cannot run here is named
    with the reason.

    \b
    Exit codes:
      0  every check ran and passed
      1  a check failed (on a machine with a GPU, also a version problem that blocks a GPU path)
      2  usage error
      3  every check that ran passed, but some could not run here (no GPU, no TensorRT, no torch)
    """
    from ..doctor.checks import PROMPTS
    from ..doctor.run import GPU_BACKENDS, run_doctor

    if bundle is not None and not (Path(bundle) / "manifest.json").is_file():
        fail(f"--bundle {bundle} is not a bundle (no manifest.json there); give a directory written by"
             " `specexport build`", EXIT_USAGE)
    if no_tiny and bundle is None:
        fail("--no-tiny without --bundle leaves nothing to check; give --bundle or drop --no-tiny", EXIT_USAGE)
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--out {out} cannot be made ({exc.strerror or exc}); give a directory you can write", EXIT_USAGE)
    from tqdm import tqdm

    bar = tqdm(desc="doctor", unit="check", file=sys.stderr, disable=None)

    def progress(check) -> None:
        bar.set_postfix_str(f"{check.name} {check.status}")
        bar.update()

    try:
        report = run_doctor(out, bundle=bundle, tiny=not no_tiny, backends=list(backends) or list(GPU_BACKENDS),
                            prompts=list(prompts) or list(PROMPTS), max_new_tokens=max_new_tokens,
                            on_check=progress, command=command_line())
    finally:
        bar.close()
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        for p in report["versions"]:
            click.echo(f"{p['name']:<12} {p['version'] or '-':<12} {p['verdict']:<12} {p['why']}")
        failed = [c for c in report["checks"] if c["status"] == "failed"]
        for c in failed:
            click.echo(f"FAILED {c['name']}: {c['reason']}")
        s = report["summary"]
        click.echo(f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped"
                   f" ({s['gpu_checks_run']} on a GPU); wrote {Path(out) / 'doctor.md'} and doctor.json")
    click.echo(f"exit {report['exit_code']}: {report['exit_meaning']}", err=True)
    sys.exit(report["exit_code"])


def register(main: click.Group) -> None:
    main.add_command(doctor)
