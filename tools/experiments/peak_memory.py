"""Peak resident memory of one generation per mode, each in a fresh process, beside ONNX Runtime GenAI's generation
of the same checkpoint (its own builder's model, run by the GenAI venv's interpreter):

    .venv/bin/python tools/experiments/peak_memory.py --bundle bundles/smollm2 --genai-model GENAI_FP32_DIR \
        --genai-python .venv-genai/bin/python

The figure is the child's `ru_maxrss` (the most resident memory it held), in MB of 10^6 bytes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

PROMPT = "Explain how a hash table works."
GENAI = """
import sys, onnxruntime_genai as og
model = og.Model(sys.argv[1]); tok = og.Tokenizer(model)
ids = tok.encode("<|im_start|>user\\n" + sys.argv[2] + "<|im_end|>\\n<|im_start|>assistant\\n")
params = og.GeneratorParams(model); params.set_search_options(max_length=len(ids) + int(sys.argv[3]), do_sample=False)
g = og.Generator(model, params); g.append_tokens(ids)
for _ in range(int(sys.argv[3])):
    if g.is_done():
        break
    g.generate_next_token()
"""
PEAK = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL,"
        " stderr=subprocess.DEVNULL); print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_mb(cmd: list[str]) -> float:
    """The peak RSS of `cmd`, run as the only child of a fresh interpreter (so no other child's peak counts)."""
    out = subprocess.run([sys.executable, "-c", PEAK, *cmd], capture_output=True, text=True, check=True).stdout.split()
    if out[0] != "0":
        raise SystemExit(f"{' '.join(cmd[:4])} ... exited {out[0]}")
    return int(out[1]) * 1024 / 1e6  # ru_maxrss is in KiB on Linux


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--genai-model", required=True)
    ap.add_argument("--genai-python", default=".venv-genai/bin/python")
    ap.add_argument("--modes", default="ar,self,model,lookup,auto")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    n = str(args.max_new_tokens)
    genai = peak_mb([args.genai_python, "-c", GENAI, args.genai_model, PROMPT, n])
    row = {"GenAI": genai}
    for mode in args.modes.split(","):
        row[mode] = peak_mb([sys.executable, "-m", "specexport.cli.main", "generate", "--bundle", args.bundle,
                             "--max-new-tokens", n, "--mode", mode, PROMPT])
    print(" | ".join(f"{k} {v:.1f}" for k, v in row.items()), f"| auto ÷ GenAI {row.get('auto', 0) / genai:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
