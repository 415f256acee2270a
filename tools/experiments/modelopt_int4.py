"""INT4 weight-only AWQ of one TensorRT standard-flavour piece through NVIDIA ModelOpt's ONNX quantizer, on the CPU,
then TensorRT's rules and the agreement with the fp16 piece. Two interpreters: ModelOpt lives in an environment of
its own (`make .venv-modelopt/.installed`: torch CPU and nvidia-modelopt without its `[onnx]` extra, whose
onnxruntime-gpu would replace the runtime's onnxruntime, plus the few packages its ONNX quantizer imports).

    specexport build --backend tensorrt --target thor --plan-only --out bundles/smollm2-thor
    .venv/bin/python tools/experiments/modelopt_int4.py --bundle bundles/smollm2-thor --piece drafter \
        --modelopt-python .venv-modelopt/bin/python --out reports/modelopt-int4

Calibration: prefill calls over the target's own distilled responses (the committed corpus, recipes/data/), never
Spec-Bench's or the bench prompts. It reports the quantized graph's Q/DQ nodes, the operator check against each
shipped target's TensorRT, and the teacher-forced top-1 agreement of the quantized piece with the fp16 one over
the calibration-free positions of other responses, both run by ONNX Runtime's CPU provider. No engine is built.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
QUANTIZE = """
import sys, time, numpy as np
from modelopt.onnx.quantization import quantize
src, calib, out, method, block = sys.argv[1:6]
t0 = time.time()
quantize(src, quantize_mode="int4", calibration_method=method, calibration_data=dict(np.load(calib)),
         calibration_eps=["cpu"], output_path=out, use_external_data_format=True, block_size=int(block),
         log_level="WARNING")
print(round(time.time() - t0, 1))
"""


def responses(n: int, count: int, skip: int = 0) -> list[np.ndarray]:
    """`count` windows of `n` tokens from the committed corpus's responses (after the first `skip` of them)."""
    pack = np.load(REPO / "recipes" / "data" / "corpus-smollm2-135m.npz")
    out: list[np.ndarray] = []
    shards = sorted({k.rsplit("/", 1)[0] for k in pack.files})
    for shard in shards:
        tokens, offsets = pack[f"{shard}/tokens"], pack[f"{shard}/offsets"]
        for i in range(len(offsets) - 1):
            if offsets[i + 1] - offsets[i] >= n:
                if skip:
                    skip -= 1
                    continue
                out.append(tokens[offsets[i]:offsets[i] + n].astype(np.int64))
                if len(out) == count:
                    return out
    return out


def feeds(spec: dict, ids: np.ndarray, context: int) -> dict[str, np.ndarray]:
    """A prefill call's inputs for a piece that reads token ids, from position 0 with empty caches."""
    n = ids.shape[-1]
    out = {}
    for t in spec["inputs"]:
        name, dtype, shape = t["name"], t["dtype"], t["shape"]
        if name == "input_ids":
            out[name] = ids[None, :]
        elif name == "position_ids":
            out[name] = np.arange(n, dtype=np.int64)[None, :]
        elif name == "attention_bias":
            out[name] = np.zeros((1, 1, n, context), dtype=dtype)
        elif name.startswith("past_"):
            out[name] = np.zeros((1, shape[1], context, shape[3]), dtype=dtype)
        elif name == "logits_to_keep":
            out[name] = np.array([n], dtype=np.int64)
        else:
            raise SystemExit(f"piece input {name!r}: this experiment feeds pieces that read token ids"
                             " (shallow, drafter), not hidden states")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--piece", default="drafter")
    ap.add_argument("--modelopt-python", required=True)
    ap.add_argument("--method", default="awq_clip", choices=["awq_clip", "awq_lite", "rtn_dq"])
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--eval", type=int, default=8, help="Held-out responses the agreement is measured on.")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import onnx
    import onnxruntime as ort
    from specexport.exporter.tensorrt.opcheck import check_model
    from specexport.exporter.tensorrt.targets import available_targets, load_target, matrix_version

    manifest = json.loads((args.bundle / "manifest.json").read_text())
    spec, context = manifest["pieces"][args.piece], manifest["model"]["dims"]["max_context"]
    if not any(t["name"] == "logits" for t in spec["outputs"]):
        raise SystemExit(f"piece {args.piece!r} has no logits to measure agreement on; take the drafter (or the"
                         " adapter, whose input is hidden states, once this experiment feeds those)")
    work = args.out / args.piece
    shutil.rmtree(work, ignore_errors=True)
    (work / "fp16").mkdir(parents=True)
    for name in (spec["file"], spec.get("data")):
        if name:
            shutil.copy(args.bundle / name, work / "fp16" / name)
    calib = work / "calibration.npz"
    np.savez(calib, **feeds(spec, responses(args.tokens, 1)[0], context))
    quantized = work / f"{args.piece}.int4.onnx"
    run = subprocess.run([args.modelopt_python, "-c", QUANTIZE, str(work / "fp16" / spec["file"]), str(calib),
                          str(quantized), args.method, str(args.block)], capture_output=True, text=True)
    if run.returncode:
        print(run.stderr[-3000:], file=sys.stderr)
        return 1
    seconds = float(run.stdout.split()[-1])

    model = onnx.load(str(quantized), load_external_data=False)
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    checks = {}
    for target in available_targets():
        t = load_target(target)
        errors, _, _ = check_model(model, matrix_version(t["tensorrt"]["version"]), args.piece, work)
        checks[target] = sorted({e.reason for e in errors})
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                for p in (work / "fp16" / spec["file"], quantized)]
    agree = total = 0
    for ids in responses(args.tokens, args.eval, skip=1):
        f = feeds(spec, ids, context)
        ref, q = (s.run(["logits"], {i.name: f[i.name] for i in s.get_inputs()})[0][0] for s in sessions)
        agree += int((ref.argmax(-1) == q.argmax(-1)).sum())
        total += len(ids)
    fp16_bytes = sum(p.stat().st_size for p in (work / "fp16").iterdir())
    int4_bytes = sum(p.stat().st_size for p in work.glob(f"{args.piece}.int4.onnx*"))
    report = {"piece": args.piece, "method": args.method, "block": args.block, "quantize_seconds": seconds,
              "calibration": f"1 distilled response, {args.tokens} tokens (recipes/data/corpus-smollm2-135m.npz)",
              "ops": {k: v for k, v in ops.items() if k in ("DequantizeLinear", "QuantizeLinear", "MatMul", "Gather")},
              "opset": [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")],
              "bytes": {"fp16": fp16_bytes, "int4": int4_bytes},
              "tensorrt_check": {t: (e or "passes") for t, e in checks.items()},
              "agreement_with_fp16": round(agree / total, 4), "positions": total}
    (args.out / f"{args.piece}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
