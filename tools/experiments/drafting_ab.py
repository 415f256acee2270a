"""What the drafting pieces' precision buys: a bundle's drafter re-quantized, and a mode timed across bundles.

    # OUT: BUNDLE with its drafter piece quantized as the exporter quantizes (exporter/quantize.py), int8 or int4
    .venv/bin/python tools/experiments/drafting_ab.py quantize-drafter bundles/smollm2 /tmp/fp32-d8 int8
    # MODE on the first three Spec-Bench questions of each category (chat template, 128 new tokens), every
    # bundle in one process, their order rotated question by question; each bundle's speed over the first's
    # (median of per-question ratios, and totals), mean tokens a step, and whether all gave the same tokens
    taskset -c 0 .venv/bin/python tools/experiments/drafting_ab.py time auto bundles/smollm2 /tmp/fp32-d8

BENCHMARKS.md ("The shipped draft pieces") has what it printed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections import defaultdict
from pathlib import Path

QUESTIONS = Path(__file__).resolve().parents[2].parent / "shared" / "specbench" / "question.jsonl"


def quantize_drafter(bundle: Path, out: Path, precision: str) -> None:
    import onnx
    from ar_gap import refresh_checksums  # this directory
    from specexport.exporter import quantize

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(bundle, out)
    model, info = quantize.quantize_model(onnx.load(str(bundle / "drafter.onnx")), quantize.spec_for(precision))
    if not info["matmuls_quantized"]:
        shutil.rmtree(out)
        raise SystemExit(f"{bundle}'s drafter has no float weight MatMuls left to quantize; start from a bundle"
                         " whose drafter is fp32")
    for name in ("drafter.onnx", "drafter.onnx.data"):
        (out / name).unlink()
    onnx.save(model, str(out / "drafter.onnx"), save_as_external_data=True, location="drafter.onnx.data")
    refresh_checksums(out, ["drafter.onnx", "drafter.onnx.data"],
                      lambda manifest: manifest["pieces"]["drafter"].update(quantization=info))
    print(f"wrote {out}: drafter at {precision}")


def time_mode(mode: str, bundles: list[str], per_category: int) -> None:
    from specexport.runtime.backends.ort import use_shared_thread_pool

    use_shared_thread_pool(1)
    from specexport.runtime.session import load

    sessions = {b: load(b) for b in bundles}
    seen: dict[str, int] = defaultdict(int)
    questions = []
    for line in QUESTIONS.read_text().splitlines():
        q = json.loads(line)
        if seen[q["category"]] < per_category:
            seen[q["category"]] += 1
            questions.append(q)
    for s in sessions.values():  # warm-up
        s.generate(questions[0]["turns"][0], mode=mode, max_new_tokens=8)
    seconds: dict[str, list[float]] = {b: [] for b in bundles}
    tau: dict[str, list[float]] = {b: [] for b in bundles}
    same = 0
    for i, q in enumerate(questions):
        tokens = {}
        for b in bundles[i % len(bundles):] + bundles[:i % len(bundles)]:
            t0 = time.perf_counter()
            g = sessions[b].generate(q["turns"][0], mode=mode, max_new_tokens=128)
            seconds[b].append(time.perf_counter() - t0)
            tokens[b] = g.tokens
            tau[b].append(g.stats.new_tokens / max(1, g.stats.steps))
        same += all(t == tokens[bundles[0]] for t in tokens.values())
        print(i, q["category"], *(f"{seconds[b][-1]:.2f}" for b in bundles), flush=True)
    first = seconds[bundles[0]]
    for b in bundles:
        ratios = [a / s for a, s in zip(first, seconds[b], strict=True)]
        print(f"{b}: {sum(seconds[b]):.1f} s, speed over the first {statistics.median(ratios):.3f}x (median),"
              f" {sum(first) / sum(seconds[b]):.3f}x (total), tokens a step {statistics.mean(tau[b]):.2f}")
    print(f"the same tokens from every bundle: {same}/{len(questions)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    q = sub.add_parser("quantize-drafter")
    q.add_argument("bundle", type=Path)
    q.add_argument("out", type=Path)
    q.add_argument("precision", choices=["int8", "int4"])
    t = sub.add_parser("time")
    t.add_argument("mode")
    t.add_argument("bundles", nargs="+")
    t.add_argument("--per-category", type=int, default=3)
    args = ap.parse_args()
    if args.what == "quantize-drafter":
        quantize_drafter(args.bundle, args.out, args.precision)
    else:
        time_mode(args.mode, args.bundles, args.per_category)


if __name__ == "__main__":
    main()
