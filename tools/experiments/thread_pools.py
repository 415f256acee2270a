"""ms per new token with three ways of giving ONNX Runtime's intra-op threads to a bundle's pieces, each in a
process of its own, alternating, so machine drift hits all three alike:

- sleeping: a pool per piece whose threads sleep between operators (the runtime's pools before 2026-11-27);
- per-run: a pool per piece whose threads spin within a run and stop at its end (what `load` opens);
- process-wide: ONNX Runtime's one global pool (`use_shared_thread_pool`, which the `specexport` commands call; it
  must then be used by every session of the process, an application's own included).

    .venv/bin/python tools/experiments/thread_pools.py bundles/smollm2-int4 --modes ar,auto --rounds 3

Each run: the first `--prompts` shipped prompts, 128 new tokens each (EOS ignored), the median over prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = Path(__file__).resolve().parents[2] / "recipes" / "data" / "bench_prompts.jsonl"
WAYS = ("sleeping", "per-run", "process-wide")


def child(bundle: str, way: str, mode: str, threads: int, prompts: int) -> float:
    import onnxruntime as ort
    from specexport.runtime.backends import ort as backend

    if way == "process-wide":
        ort.set_global_thread_pool_sizes(threads, 1)
    opened = backend.session_options

    def options(*args, **kwargs):
        opts = opened(*args, **kwargs)
        if way == "process-wide":
            opts.use_per_session_threads = False
        elif way == "sleeping":
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return opts

    backend.session_options = options
    from specexport.runtime import load

    texts = [json.loads(line)["turns"][0] for line in PROMPTS.read_text().splitlines()[:prompts]]
    session = load(bundle, threads=threads)
    session.generate(texts[0], max_new_tokens=16, mode=mode)  # warm-up
    per_token = []
    for text in texts:
        t0 = time.perf_counter()
        result = session.generate(text, max_new_tokens=128, mode=mode, ignore_eos=True)
        per_token.append((time.perf_counter() - t0) / len(result.tokens) * 1e3)
    return statistics.median(per_token)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--modes", default="ar,auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("WAY", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(child(args.bundle, *args.child, args.threads, args.prompts))
        return
    results: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for mode in args.modes.split(","):
            for way in WAYS[r % 3:] + WAYS[:r % 3]:
                run = subprocess.run([sys.executable, __file__, args.bundle, "--threads", str(args.threads),
                                      "--prompts", str(args.prompts), "--child", way, mode],
                                     capture_output=True, text=True, check=True)
                results.setdefault((mode, way), []).append(float(run.stdout.split()[-1]))
    print(f"| mode | {' | '.join(WAYS)} | sleeping ÷ per-run |\n|---|---|---|---|---|")
    for mode in args.modes.split(","):
        med = {way: statistics.median(results[(mode, way)]) for way in WAYS}
        print(f"| {mode} | " + " | ".join(f"{med[w]:.2f} ms" for w in WAYS)
              + f" | {med['sleeping'] / med['per-run']:.2f}× |")


if __name__ == "__main__":
    main()
