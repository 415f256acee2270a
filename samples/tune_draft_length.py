"""Sweep Kangaroo's draft-stopping settings (eta, gamma) of a bundle on your own prompts.

    python samples/tune_draft_length.py bundles/smollm2 --eta 0.3,0.5,0.7 --gamma 4,6 [--prompts FILE]

Each setting runs greedy self-speculative decoding on every prompt, interleaved with autoregressive
runs of the same prompts, and prints tau, the acceptance rate and the median speedup over AR measured
side by side. Tune on your own prompts (default: the test suite's twenty chat prompts), never on the
benchmark you report. Needs only the base install.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from specexport.runtime import load

REPO = Path(__file__).resolve().parents[1]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--eta", default="0.3,0.4,0.5,0.6,0.7", help="comma-separated confidence thresholds")
    ap.add_argument("--gamma", default="4,6,8", help="comma-separated most drafts per step")
    ap.add_argument("--prompts", default=None, help="a text file, one prompt a line")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=10, help="use the first N prompts")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    if args.prompts:
        prompts = [line.strip() for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    else:
        sys.path.insert(0, str(REPO))
        from tests.real_prompts import PROMPTS as prompts
    prompts = prompts[: args.limit]
    session = load(args.bundle, threads=args.threads)
    ids = [session.prompt_ids(p, session.options()) for p in prompts]
    for x in ids[:2]:  # warm-up: first calls allocate
        session.generate_ids(x, max_new_tokens=8, mode="ar")
        session.generate_ids(x, max_new_tokens=8, mode="self")

    print("eta   gamma  tau   accept  tokens/s  speedup (median vs AR, side by side)")
    for gamma in [int(g) for g in _floats(args.gamma)]:
        for eta in _floats(args.eta):
            ratios, tps, new, steps, drafted, accepted = [], [], 0, 0, 0, 0
            for x in ids:
                ar = session.generate_ids(x, max_new_tokens=args.max_new_tokens, mode="ar")
                spec = session.generate_ids(x, max_new_tokens=args.max_new_tokens, mode="self", gamma=gamma, eta=eta)
                if spec.tokens != ar.tokens:
                    print(f"error: eta {eta} gamma {gamma} changed the output; the loop is not lossless",
                          file=sys.stderr)
                    return 1
                ratios.append(spec.stats.tokens_per_s / ar.stats.tokens_per_s)
                tps.append(spec.stats.tokens_per_s)
                new, steps = new + spec.stats.new_tokens, steps + spec.stats.steps
                drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
            print(f"{eta:<5} {gamma:<6} {new / steps:.2f}  {accepted / max(drafted, 1):6.1%}  "
                  f"{statistics.median(tps):8.1f}  {statistics.median(ratios):.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
