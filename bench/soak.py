"""A long run in one process: many generations across every mode, sampling and greedy, stop strings and trees,
with the process's resident memory and open file descriptors recorded every `every` generations.

    .venv/bin/python -m specexport.bench.soak --bundle bundles/smollm2 --generations 1000 --out reports/soak.json

A benchmark, not a test: it takes a while and its figures go in BENCHMARKS.md. It passes when, after the
first `every` generations (warm-up: ONNX Runtime's arenas and caches fill), resident memory grows by at most
`--max-growth` and the open file descriptors stay where they were.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

PROMPTS = ["Explain how a hash table works.", "Write a haiku about the sea.", "What is 17 times 23?",
           "List three uses of copper.", "Translate 'good morning' into French and Spanish.",
           "Summarize: the cat sat on the mat because the mat was warm.", "Write a Python function that reverses"
           " a string.", "Why is the sky blue?"]
# (options) in turn: every mode, greedy and sampling, stop strings, trees, draft-length policies, PEARL
VARIANTS = [
    {"mode": "ar"}, {"mode": "self"}, {"mode": "model"}, {"mode": "lookup"}, {"mode": "hier"}, {"mode": "auto"},
    {"mode": "auto", "temperature": 0.8, "top_p": 0.9}, {"mode": "self", "temperature": 0.7, "top_k": 40},
    {"mode": "auto", "stop": ["\n\n", "."]}, {"mode": "model", "tree": "4:3:2:10:0.08:0.3"},
    {"mode": "model", "tree": "8:4:2"},
    {"mode": "self", "policy": "entropy"}, {"mode": "model", "policy": "goodput"},
    {"mode": "model", "schedule": "pearl"},
]


def rss_mb(field: str = "VmRSS") -> float:
    """Resident memory in MB: all of it (VmRSS), anonymous (RssAnon) or file pages (RssFile: the mapped weights'
    pages a run has touched, such as the embedding rows of the tokens seen so far)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def heap_in_use_mb() -> float:
    """Bytes glibc's malloc has handed out and not had back (its arenas' in-use total), or nan elsewhere."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return float("nan")
    return (info.uordblks + info.hblkhd) / 2**20


def sample(generations: int, seconds: float) -> dict:
    return {"generations": generations, "rss_mb": round(rss_mb(), 1), "anon_mb": round(rss_mb("RssAnon"), 1),
            "file_mb": round(rss_mb("RssFile"), 1), "heap_mb": round(heap_in_use_mb(), 1), "open_fds": open_fds(),
            "seconds": round(seconds, 1)}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def soak(bundle: str, generations: int, every: int, max_new_tokens: int, threads: int | None) -> dict:
    from specexport.runtime import load

    session = load(bundle, threads=threads)
    variants = [v for v in VARIANTS if _runs(session, v)]
    left_out = [v for v in VARIANTS if v not in variants]
    if left_out:
        print(f"left out (the bundle cannot run them): {left_out}", file=sys.stderr)
    samples = [sample(0, 0.0)]
    t0 = time.perf_counter()
    tokens = 0
    for i in tqdm(range(1, generations + 1), desc="soak", unit="gen", file=sys.stderr, disable=None):
        options = {"max_new_tokens": max_new_tokens, "seed": i, **variants[i % len(variants)]}
        tokens += len(session.generate(PROMPTS[i % len(PROMPTS)], **options).tokens)
        if i % every == 0:
            samples.append(sample(i, time.perf_counter() - t0))
    warm = samples[1] if len(samples) > 1 else samples[0]
    last = samples[-1]
    half = samples[len(samples) // 2]
    return {"bundle": bundle, "generations": generations, "every": every, "max_new_tokens": max_new_tokens,
            "variants": variants, "left_out": left_out, "tokens": tokens, "samples": samples,
            "rss_growth_after_warmup": round(last["rss_mb"] / warm["rss_mb"] - 1, 4),
            # over the last half of the run: all of it, and what of it malloc holds (flat where nothing leaks)
            "rss_growth_last_half": round(last["rss_mb"] / half["rss_mb"] - 1, 4),
            "heap_growth_last_half_mb": round(last["heap_mb"] - half["heap_mb"], 1),
            "file_growth_last_half_mb": round(last["file_mb"] - half["file_mb"], 1),
            "fds_after_warmup": [s["open_fds"] for s in samples[1:]]}


def _runs(session, options: dict) -> bool:
    """Whether the bundle has what `options` needs (a bundle without a drafter cannot run `model`)."""
    from specexport.runtime import SpecExportError

    try:
        session.generate("hi", max_new_tokens=2, **options)
    except SpecExportError:
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--generations", type=int, default=1000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-growth", type=float, default=0.05)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    report = soak(args.bundle, args.generations, args.every, args.max_new_tokens, args.threads)
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(text + "\n")
        tmp.rename(args.out)
    print(json.dumps({k: report[k] for k in ("rss_growth_after_warmup", "rss_growth_last_half",
                                             "heap_growth_last_half_mb", "file_growth_last_half_mb",
                                             "fds_after_warmup", "tokens")}))
    fds = report["fds_after_warmup"]
    ok = report["rss_growth_after_warmup"] <= args.max_growth and len(set(fds)) <= 1
    print(f"soak {'passed' if ok else 'FAILED'}: memory {report['rss_growth_after_warmup']:+.1%} after warm-up"
          f" (at most {args.max_growth:.0%}), open fds {sorted(set(fds))}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
