"""Does a bundle decode exactly like transformers? Greedy output of the bundle's AR against transformers'
`generate` on the fp32 checkpoint the bundle was built from (its manifest's provenance), on the twenty
prompts of tests/real_prompts.py, and every lossless mode asked for against AR:

    .venv/bin/python tools/match_transformers.py --bundle bundles/gemma3 --prompts 20 --max-new-tokens 64 \\
        --modes lookup,self

The tests run a few of these prompts (tests/test_gemma_real.py); this is the full-size check, too slow for
CI on two cores with a 262k-token vocabulary. Exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from specexport.runtime import load
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.real_prompts import PROMPTS


def hf_greedy(model, ids: list[int], new_tokens: int, eos: set[int]) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=new_tokens, do_sample=False, pad_token_id=min(eos))
    new = out[0, len(ids):].tolist()
    for i, t in enumerate(new):
        if t in eos:  # the runtime stops before an end token; transformers keeps it
            return new[:i]
    return new


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--prompts", type=int, default=20, help="the first N of tests/real_prompts.py (at most 20)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--modes", default="lookup", help="lossless modes compared with AR, comma-separated ('' for none)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from specexport.exporter.model_source import find_checkpoint
    from specexport.runtime.bundle import read_manifest
    from transformers import AutoModelForCausalLM

    bundle = Path(args.bundle)
    checkpoint = find_checkpoint(read_manifest(bundle).provenance.source_sha256)
    if checkpoint is None:  # the manifest names the source by its hash only
        sys.exit(f"error: the checkpoint {bundle} was built from is not in this machine's cache; build it here")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    session = load(bundle)
    eos = session.codec.eos_ids
    modes = [m for m in args.modes.split(",") if m]
    mismatches: list[str] = []
    seconds = {"transformers": 0.0, "ar": 0.0, **{m: 0.0 for m in modes}}
    tokens = 0
    for prompt in tqdm(PROMPTS[:args.prompts], desc="prompts", file=sys.stderr):
        ids = session.prompt_ids(prompt, session.options())
        t = time.perf_counter()
        theirs = hf_greedy(model, ids, args.max_new_tokens, eos)
        seconds["transformers"] += time.perf_counter() - t
        t = time.perf_counter()
        ours = session.generate_ids(ids, max_new_tokens=args.max_new_tokens, mode="ar").tokens
        seconds["ar"] += time.perf_counter() - t
        tokens += len(ours)
        if ours != theirs:
            mismatches.append(f"ar vs transformers on {prompt!r}")
        for mode in modes:
            t = time.perf_counter()
            got = session.generate_ids(ids, max_new_tokens=args.max_new_tokens, mode=mode).tokens
            seconds[mode] += time.perf_counter() - t
            if got != ours:
                mismatches.append(f"{mode} vs ar on {prompt!r}")
    n = min(args.prompts, len(PROMPTS))
    print(f"{n} prompts x {args.max_new_tokens} new tokens ({tokens} generated): "
          f"{n * (1 + len(modes)) - len(mismatches)}/{n * (1 + len(modes))} comparisons identical; seconds "
          + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    for m in mismatches:
        print("MISMATCH", m)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
