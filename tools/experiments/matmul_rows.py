"""ONNX Runtime's MatMulNBits (MLAS) against specexport.RowInvariantMatMulNBits on SmolLM2-135M's matmul shapes.

One decoder layer's weight matmuls (K=576: N=960 q|k|v, 576 o, 3072 gate and 3072 up; K=1536: N=576 down) and the
LM head (K=576, N=49152), each a one-node model of random weights quantized as the recipe quantizes them (int4:
blocks of 32 with zero points; --bits 8: blocks of 64), timed at 1, 2 and 8 rows with 1 and 2 intra-op threads
(pools that do not spin, as the runtime opens them). A figure is the median over --rounds rounds of the mean of
--calls calls, in microseconds. A one-token AR step on a CPU whose MatMulNBits rounds a one-row call otherwise
costs MLAS's 2-row figure (the session pads it: runtime/row_padding.py), and the operator's 1-row one.

    .venv/bin/python tools/experiments/matmul_rows.py [--bits 4] [--rounds 7] [--calls 20]

Prints a Markdown table and the load average before and after (the figures mean little on a busy machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from specexport.exporter import quantize, row_matmul
from specexport.runtime import attention_op

SHAPES = [("q|k|v", 576, 960), ("o", 576, 576), ("gate", 576, 3072), ("up", 576, 3072), ("down", 1536, 576),
          ("lm head", 576, 49152)]


def model(k: int, n: int, bits: int) -> onnx.ModelProto:
    w = np.random.default_rng(k * n).standard_normal((k, n)).astype(np.float32) * 0.05
    spec = quantize.spec_for(f"int{bits}", search=False)
    pw = quantize.quantize_weight(w, spec)
    inits = [numpy_helper.from_array(pw.packed, "B"), numpy_helper.from_array(pw.scales, "S"),
             numpy_helper.from_array(pw.zero_points, "Z")]
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=spec.block_size, accuracy_level=spec.accuracy_level)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def session(m: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    attention_op.register(opts)
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def timed(s: ort.InferenceSession, a: np.ndarray, rounds: int, calls: int) -> float:
    s.run(None, {"A": a})
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            s.run(None, {"A": a})
        means.append((time.perf_counter() - t0) / calls)
    return statistics.median(means) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, choices=(4, 8), default=4)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}; operator path: {attention_op.matmul_isa()}")
    print("| matmul | K | N | threads | rows | MLAS us | ours us | ours / MLAS |")
    print("|---|---|---|---|---|---|---|---|")
    totals: dict[tuple[int, int], list[float]] = {}
    for name, k, n in SHAPES:
        mlas = model(k, n, args.bits)
        ours = onnx.ModelProto()
        ours.CopyFrom(mlas)
        row_matmul.use_rowwise(ours)
        calls = max(2, args.calls // 10) if n > 10000 else args.calls
        for threads in (1, 2):
            a_sess, b_sess = session(mlas, threads), session(ours, threads)
            for rows in (1, 2, 8):
                a = np.random.default_rng(rows).standard_normal((1, rows, k)).astype(np.float32)
                t_mlas, t_ours = timed(a_sess, a, args.rounds, calls), timed(b_sess, a, args.rounds, calls)
                got = totals.setdefault((threads, rows), [0.0, 0.0])
                got[0] += t_mlas
                got[1] += t_ours
                print(f"| {name} | {k} | {n} | {threads} | {rows} | {t_mlas:.0f} | {t_ours:.0f} |"
                      f" {t_ours / t_mlas:.2f} |", flush=True)
    print("\nsums over the six matmuls (one layer's plus the LM head):")
    for (threads, rows), (m, o) in sorted(totals.items()):
        print(f"  threads {threads}, rows {rows}: MLAS {m:.0f} us, ours {o:.0f} us ({o / m:.2f})")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
