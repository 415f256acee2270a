"""Where a decode token's time goes in greedy AR: specexport's bundles beside ONNX Runtime GenAI, part by part and
ONNX Runtime op type by op type, in ms per decode token (the prompt's prefill and the load-time probe calls left out).

    # specexport's bundles (one or more), in its own interpreter
    .venv/bin/python tools/experiments/ar_profile.py ours bundles/smollm2-int4 bundles/smollm2-int4-rowwise \
        --tokens 64 --threads 1 --rounds 3 --json /tmp/ar-profile-ours.json
    # GenAI's model directory, in GenAI's interpreter (imports only onnxruntime_genai, numpy and the stdlib)
    .venv-genai/bin/python tools/experiments/ar_profile.py genai .cache/ortgenai/<hash>-int4-og0.18.0 \
        --tokens 64 --threads 1 --rounds 3 --json /tmp/ar-profile-genai.json

Both decode the same chat prompt (the model's chat template round PROMPT) for `--tokens` tokens whatever comes,
EOS included, after one uncounted warm-up generation. Each system runs twice in one process, `--rounds`
generations each time:

- plain: wall ms per decode token; for a bundle also the time inside each piece's ONNX Runtime call
  (`run_with_iobinding`, timed from outside), the binding round it (OrtPiece.run), the session's own row
  padding (the two-row wrapper, present when `one_row_calls` is `session`) and the rest (the decode loop,
  sampling, detokenizing). GenAI's wall is per `generate_next_token`, its first call (which only picks the
  prefill's token) left out.
- profiled: ONNX Runtime's profiler on (the runtime's `session_options` patched here for a bundle; a copy of
  GenAI's config with `enable_profiling` in a temporary directory, the model's files linked), the decode runs'
  node times summed by op type, the run's time outside its nodes, and the part of the profiled wall outside
  ONNX Runtime's runs. The profiler adds its own cost per node, so compare op types, not these walls with the
  plain ones.

The machine's load average is printed with each system: on a shared machine the figures are indicative.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

PROMPT = "Explain how a hash table works."
PIECES = ("shallow", "deep")


# -- ONNX Runtime's profile ------------------------------------------------------------------------------------

def read_profile(path: str, decode: list[bool]) -> tuple[dict[str, float], float]:
    """(µs by op type, µs inside model_run) summed over the runs flagged True in `decode`, the flags being the
    file's last len(decode) runs in order (earlier runs, the load's probe calls, are skipped)."""
    events = json.loads(Path(path).read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    if len(runs) < len(decode):
        sys.exit(f"{path} holds {len(runs)} runs, fewer than the {len(decode)} made after the load")
    runs = runs[len(runs) - len(decode):]
    spans = [(r["ts"], r["ts"] + r["dur"]) for r, keep in zip(runs, decode, strict=True) if keep]
    by_op: dict[str, float] = defaultdict(float)
    nodes = sorted((e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")),
                   key=lambda e: e["ts"])
    k = 0
    for start, end in spans:  # both sorted: one sweep
        while k < len(nodes) and nodes[k]["ts"] < start:
            k += 1
        while k < len(nodes) and nodes[k]["ts"] <= end:
            by_op[nodes[k]["args"].get("op_name", "?")] += nodes[k]["dur"]
            k += 1
    return dict(by_op), float(sum(end - start for start, end in spans))


def op_rows(columns: dict[str, tuple[dict[str, float], float]], per: int) -> list[tuple[str, list[float]]]:
    """Table rows (op type, ms per token by column), the largest first, then the run's time outside its nodes
    and the runs' whole time."""
    ops = sorted({op for by_op, _ in columns.values() for op in by_op},
                 key=lambda op: -sum(by_op.get(op, 0.0) for by_op, _ in columns.values()))
    rows = [(op, [by_op.get(op, 0.0) / per / 1e3 for by_op, _ in columns.values()]) for op in ops]
    rows.append(("(run outside its nodes)", [(run - sum(by_op.values())) / per / 1e3
                                            for by_op, run in columns.values()]))
    rows.append(("model_run, all", [run / per / 1e3 for _, run in columns.values()]))
    return rows


def markdown(title: str, header: list[str], rows: list[tuple[str, list[float]]]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [f"| {name} | " + " | ".join("-" if math.isnan(v) else f"{v:.3f}" for v in values) + " |"
              for name, values in rows]
    return "\n".join(lines)


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} CPUs"


# -- specexport ------------------------------------------------------------------------------------------------

class _TimedSession:
    """An InferenceSession whose run_with_iobinding adds its seconds to `spent`; the rest is the session's."""

    def __init__(self, session, spent: list[float]) -> None:
        self._session, self._spent = session, spent

    def run_with_iobinding(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self._session.run_with_iobinding(*args, **kwargs)
        finally:
            self._spent.append(time.perf_counter() - t0)

    def __getattr__(self, name: str):
        return getattr(self._session, name)


def _timed_run(run, spent: list[float]):
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)
    return timed


def _instrument(session) -> tuple[dict[str, dict[str, list[float]]], dict[str, object]]:
    """Per piece, the seconds of each call at three depths: `outer` (the piece the decoder calls, the session's
    wrappers included), `piece` (the backend's OrtPiece.run) and `ort` (ONNX Runtime's run alone); and the raw
    OrtPieces."""
    from specexport.runtime.backends.common import WrappedPiece

    times: dict[str, dict[str, list[float]]] = {}
    raw: dict[str, object] = {}
    for name in PIECES:
        outer = getattr(session.pieces, name)
        piece = outer
        while isinstance(piece, WrappedPiece):
            piece = piece.piece
        t = times[name] = {"outer": [], "piece": [], "ort": []}
        piece.session = _TimedSession(piece.session, t["ort"])
        piece.run = _timed_run(piece.run, t["piece"])
        outer.run = _timed_run(outer.run, t["outer"]) if outer is not piece else piece.run
        if outer is piece:  # no wrapper: the same calls
            t["outer"] = t["piece"]
        raw[name] = piece
    return times, raw


def _generate(session, prompt: list[int], tokens: int):
    return session.generate_ids(prompt, mode="ar", max_new_tokens=tokens, ignore_eos=True, temperature=0.0)


def _plain(bundle: str, tokens: int, threads: int, rounds: int) -> tuple[dict, list[tuple[str, list[float]]]]:
    from specexport.runtime.session import load

    session = load(bundle, threads=threads)
    prompt = session.prompt_ids(PROMPT, session.options())
    times, _ = _instrument(session)
    _generate(session, prompt, tokens)
    sums = {(name, depth): 0.0 for name in PIECES for depth in ("outer", "piece", "ort")}
    wall, steps = 0.0, 0
    for _ in range(rounds):
        for t in times.values():
            for calls in t.values():
                calls.clear()
        stats = _generate(session, prompt, tokens).stats
        wall += stats.decode_s
        steps += stats.steps - 1  # the prefill's call is the first step
        for name, t in times.items():
            if len(t["outer"]) != stats.steps:
                sys.exit(f"{bundle}: {name} ran {len(t['outer'])} times for {stats.steps} target steps")
            for depth, calls in t.items():
                sums[name, depth] += sum(calls[1:])  # the first call is the prefill's
    outer = sum(sums[name, "outer"] for name in PIECES)
    parts = [(f"ONNX Runtime run: {name}", sums[name, "ort"]) for name in PIECES]
    parts.append(("binding round the run (OrtPiece.run)", sum(sums[n, "piece"] - sums[n, "ort"] for n in PIECES)))
    parts.append(("session's row padding (two-row wrapper)", sum(sums[n, "outer"] - sums[n, "piece"] for n in PIECES)))
    parts.append(("rest (decode loop, sampling, detokenizing)", wall - outer))
    parts.append(("wall, all", wall))
    info = {"prompt_tokens": len(prompt), "decode_tokens": steps, "one_row_calls": session.one_row_calls,
            "one_row_calls_note": session.one_row_calls_note}
    del session
    gc.collect()
    return info, [(name, [s / steps * 1e3]) for name, s in parts]


def _profiled(bundle: str, tokens: int, threads: int, rounds: int, tmp: Path) -> tuple[float, int, dict]:
    """The profiled generations: (wall s, decode tokens, {piece: (µs by op, µs in runs)})."""
    from specexport.runtime.backends import ort as ort_backend
    from specexport.runtime.session import load

    plain_options = ort_backend.session_options

    def profiling_options(*args, **kwargs):
        opts = plain_options(*args, **kwargs)
        opts.enable_profiling = True
        opts.profile_file_prefix = str(tmp / "piece")
        return opts

    ort_backend.session_options = profiling_options
    try:
        session = load(bundle, threads=threads)
    finally:
        ort_backend.session_options = plain_options
    prompt = session.prompt_ids(PROMPT, session.options())
    times, raw = _instrument(session)
    decode: list[bool] = []  # per call after the load: a counted decode call
    wall, steps = 0.0, 0
    for round_ in range(rounds + 1):  # the first, a warm-up
        stats = _generate(session, prompt, tokens).stats
        decode += [round_ > 0 and k > 0 for k in range(stats.steps)]
        if round_ > 0:
            wall += stats.decode_s
            steps += stats.steps - 1
    for name in PIECES:
        if len(times[name]["piece"]) != len(decode):
            sys.exit(f"{bundle}: {name} ran {len(times[name]['piece'])} times for {len(decode)} target steps")
    profiles = {name: read_profile(raw[name].session.end_profiling(), decode) for name in PIECES}
    del session, raw
    gc.collect()
    return wall, steps, profiles


def ours(bundles: list[str], tokens: int, threads: int, rounds: int) -> list[dict]:
    try:
        from specexport.runtime.backends.ort import use_shared_thread_pool
        from specexport.runtime.errors import SpecExportError
    except ImportError:
        sys.exit(f"{sys.executable} has no specexport: run the ours mode in .venv/bin/python")

    use_shared_thread_pool(threads)  # as the specexport commands run: one warm pool for every piece
    results = []
    for bundle in bundles:
        if not (Path(bundle) / "manifest.json").is_file():
            sys.exit(f"{bundle} is not a specexport bundle (no manifest.json)")
        note = load_note()
        try:
            info, parts = _plain(bundle, tokens, threads, rounds)
            with tempfile.TemporaryDirectory(prefix="ar-profile-") as tmp:
                wall, steps, profiles = _profiled(bundle, tokens, threads, rounds, Path(tmp))
        except SpecExportError as exc:  # the runtime's own sentence (a bundle it refuses, a bad option)
            sys.exit(f"{bundle}: {exc}")
        ops = op_rows(profiles, steps)
        in_runs = sum(run for _, run in profiles.values()) / 1e3
        ops_total = [(name, [*values, sum(values)]) for name, values in ops]
        ops_total.append(("profiled wall, all", [float("nan"), float("nan"), wall / steps * 1e3]))
        ops_total.append(("profiled wall outside the runs", [float("nan"), float("nan"), (wall * 1e3 - in_runs)
                                                              / steps]))
        title = f"specexport {bundle}"
        print(f"\n{title}: {threads} thread(s), {info['prompt_tokens']} prompt tokens, {steps // rounds} decode"
              f" tokens x {rounds} round(s); one_row_calls = {info['one_row_calls']} (one-token calls are"
              f" {info['one_row_calls_note']}); {note}\n")
        print(markdown(f"{title}: parts, ms per decode token", ["part", "ms"], parts), "\n")
        print(markdown(f"{title}: ONNX Runtime profile by op type, ms per decode token",
                       ["op type", *PIECES, "all"], ops_total))
        results.append({"system": "specexport", "path": bundle, "threads": threads, "rounds": rounds,
                        "tokens": tokens, "load": note, **info,
                        "parts_ms": {name: values[0] for name, values in parts},
                        "ops_ms": {name: dict(zip([*PIECES, "all"], values, strict=True))
                                   for name, values in ops_total}})
    return results


# -- ONNX Runtime GenAI ----------------------------------------------------------------------------------------

def _genai_dir(model_dir: Path, tmp: Path, threads: int, profile: str | None) -> Path:
    """A directory like `model_dir`, its files linked, with a config whose session runs on `threads` and
    writes ONNX Runtime's profile to `profile` (a path prefix): the cache's own directory stays as it is."""
    config = json.loads((model_dir / "genai_config.json").read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = threads
    options["inter_op_num_threads"] = 1
    if profile:
        options["enable_profiling"] = profile
    out = tmp / ("profiled" if profile else "plain")
    out.mkdir()
    for f in model_dir.iterdir():
        if f.name != "genai_config.json":
            (out / f.name).symlink_to(f.resolve())
    (out / "genai_config.json").write_text(json.dumps(config, indent=2))
    return out


def _genai_rounds(og, path: Path, tokens: int, rounds: int) -> tuple[float, int, int]:
    """(wall s of the counted generate_next_token calls, their count, the prompt's tokens), after a warm-up."""
    model = og.Model(str(path))
    tokenizer = og.Tokenizer(model)
    text = tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": PROMPT}]),
                                         add_generation_prompt=True)
    prompt = [int(t) for t in tokenizer.encode(text)]
    wall, steps = 0.0, 0
    for round_ in range(rounds + 1):
        params = og.GeneratorParams(model)
        # min_length: EOS is never picked, so every round decodes `tokens` tokens
        params.set_search_options(do_sample=False, max_length=len(prompt) + tokens, min_length=len(prompt) + tokens)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        for k in range(tokens):
            t0 = time.perf_counter()
            generator.generate_next_token()
            if round_ > 0 and k > 0:  # the first picks the prefill's token
                wall += time.perf_counter() - t0
                steps += 1
        del generator
    del tokenizer, model
    gc.collect()
    return wall, steps, len(prompt)


def genai(model_dir: str, tokens: int, threads: int, rounds: int) -> list[dict]:
    try:
        import onnxruntime_genai as og
    except ImportError:
        sys.exit(f"{sys.executable} has no onnxruntime_genai: run the genai mode in .venv-genai/bin/python")

    src = Path(model_dir)
    if not (src / "genai_config.json").is_file():
        sys.exit(f"{model_dir} is not an ONNX Runtime GenAI model directory (no genai_config.json)")
    note = load_note()
    with tempfile.TemporaryDirectory(prefix="ar-profile-genai-") as name:
        tmp = Path(name)
        wall, steps, prompt_tokens = _genai_rounds(og, _genai_dir(src, tmp, threads, None), tokens, rounds)
        prefix = tmp / "profile"
        pwall, psteps, _ = _genai_rounds(og, _genai_dir(src, tmp, threads, str(prefix)), tokens, rounds)
        files = sorted(tmp.glob("profile*.json"))
        if len(files) != 1:
            sys.exit(f"GenAI left {len(files)} profiles, not one (the session writes it when it closes)")
        # per round: the prefill run, then one run per counted decode token
        decode = [r > 0 and k > 0 for r in range(rounds + 1) for k in range(tokens)]
        by_op, in_runs = read_profile(str(files[0]), decode)
        saved = Path(tempfile.gettempdir()) / f"ar-profile-genai-{os.getpid()}.json"
        shutil.copy(files[0], saved)
    parts = [("ONNX Runtime run (profiled model_run)", [in_runs / psteps / 1e3]),
             ("outside the run (profiled wall - run)", [(pwall * 1e6 - in_runs) / psteps / 1e3]),
             ("profiled wall, all", [pwall / psteps * 1e3]),
             ("wall, all (not profiled)", [wall / steps * 1e3])]
    ops = op_rows({"model": (by_op, in_runs)}, psteps)
    title = f"GenAI {model_dir}"
    print(f"\n{title}: {threads} thread(s), {prompt_tokens} prompt tokens, {steps // rounds} decode tokens x {rounds}"
          f" round(s); {note}; profile kept at {saved}\n")
    print(markdown(f"{title}: parts, ms per decode token", ["part", "ms"], parts), "\n")
    print(markdown(f"{title}: ONNX Runtime profile by op type, ms per decode token", ["op type", "ms"], ops))
    return [{"system": "genai", "path": model_dir, "threads": threads, "rounds": rounds, "tokens": tokens,
             "load": note, "prompt_tokens": prompt_tokens, "decode_tokens": steps,
             "parts_ms": {name: values[0] for name, values in parts},
             "ops_ms": {name: {"all": values[0]} for name, values in ops}}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("ours", "genai"))
    parser.add_argument("paths", nargs="+", help="bundles (ours) or one GenAI model directory (genai)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per round (prefill's included)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="counted generations, after one warm-up")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    if args.tokens < 2 or args.threads < 1 or args.rounds < 1:
        sys.exit("--tokens must be 2 or more, --threads and --rounds 1 or more")
    if args.what == "genai":
        if len(args.paths) != 1:
            sys.exit("genai takes one model directory")
        results = genai(args.paths[0], args.tokens, args.threads, args.rounds)
    else:
        results = ours(args.paths, args.tokens, args.threads, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
