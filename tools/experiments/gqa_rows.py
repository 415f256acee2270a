"""Does a row of ONNX Runtime's GroupQueryAttention (CPU) depend on how many rows its call has?

    # one GQA node, random inputs and a consistent cache: for each head size, the call totals
    # (total_sequence_length) at which the output of a fixed row changes as rows are added after it
    .venv/bin/python tools/experiments/gqa_rows.py totals --head-sizes 64,128,256
    ORT_GQA_DISABLE_FLASH_ATTENTION=1 .venv/bin/python tools/experiments/gqa_rows.py totals
    # a bundle: greedy AR against lookup on Spec-Bench questions, as the pieces run them and with every
    # multi-row call cut at the totals given (the first row after each cut starts a new call)
    .venv/bin/python tools/experiments/gqa_rows.py bundle bundles/gemma3-int4 --questions 81,131,241,481
    .venv/bin/python tools/experiments/gqa_rows.py bundle bundles/gemma3-int4 --questions 81,131,241,481 \\
        --cut-after 64,192,320,448,576,704,832,960

Written for Gemma 3 270M (head size 256; BENCHMARKS.md, 2026-11-25, "Gemma 3 270M at int4"). The `totals`
part needs the exporter's `onnx`; the `bundle` part only the runtime.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import onnxruntime as ort


def gqa_session(heads: int, kv_heads: int, head_size: int):
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    io = [("query", f, [1, None, heads * head_size]), ("key", f, [1, None, kv_heads * head_size]),
          ("value", f, [1, None, kv_heads * head_size]), ("past_key", f, [1, kv_heads, None, head_size]),
          ("past_value", f, [1, kv_heads, None, head_size]), ("seqlens_k", TensorProto.INT32, [1]),
          ("total_sequence_length", TensorProto.INT32, []), ("cos_cache", f, [None, head_size // 2]),
          ("sin_cache", f, [None, head_size // 2]), ("position_ids", TensorProto.INT64, [1, None])]
    node = helper.make_node("GroupQueryAttention", [name for name, _, _ in io], ["out", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads, do_rotary=1,
                            scale=head_size ** -0.5)
    graph = helper.make_graph([node], "gqa", [helper.make_tensor_value_info(*spec) for spec in io],
                              [helper.make_tensor_value_info(n, f, None) for n in node.output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def changes(head_size: int, context: int, rng: np.random.Generator, heads: int = 4,
            kv_heads: int = 1) -> tuple[list[int], int, int]:
    """The call totals after which one head size's GQA gives a fixed row another output; then, across calls of
    every start and size that hold a row, how many pairs with no such total between theirs were compared and
    how many of them differ."""
    session = gqa_session(heads, kv_heads, head_size)
    angles = np.outer(np.arange(context), 1e-4 ** (np.arange(head_size // 2) / (head_size // 2)))
    q = rng.standard_normal((1, context, heads * head_size), dtype=np.float32) * 3
    k = rng.standard_normal((1, context, kv_heads * head_size), dtype=np.float32) * 3
    v = rng.standard_normal((1, context, kv_heads * head_size), dtype=np.float32)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def call(start: int, rows: int, past_k: np.ndarray, past_v: np.ndarray) -> list[np.ndarray]:
        end = start + rows
        return session.run(None, {
            "query": q[:, start:end], "key": k[:, start:end], "value": v[:, start:end],
            "past_key": past_k[:, :, :start], "past_value": past_v[:, :, :start],
            "seqlens_k": np.array([end - 1], np.int32), "total_sequence_length": np.array(end, np.int32),
            "cos_cache": cos, "sin_cache": sin, "position_ids": np.arange(start, end)[None]})

    empty = np.zeros((1, kv_heads, 0, head_size), np.float32)
    _, cache_k, cache_v = call(0, context, empty, empty)  # every position's rotated key, as later calls see it
    found = set()
    for start in range(0, context - 40, 3):
        previous = None
        for rows in range(2, 34):  # one-row calls take another path; the runtime never makes them
            row = call(start, rows, cache_k, cache_v)[0][0, 0]
            if previous is not None and not np.array_equal(row, previous):
                found.add(start + rows - 1)  # the last total before the row changed
            previous = row
    bounds = sorted(found)
    pairs = unequal = 0
    for r in range(40, context - 14, 97):
        seen: dict[int, np.ndarray] = {}
        for start in range(max(0, r - 12), r + 1):
            for rows in range(max(2, r - start + 1), r - start + 14):
                out = call(start, rows, cache_k, cache_v)[0][0, r - start]
                side = sum(b < start + rows for b in bounds)  # which range the call's total falls in
                if side in seen:
                    pairs += 1
                    unequal += not np.array_equal(seen[side], out)
                else:
                    seen[side] = out
    return bounds, pairs, unequal


def totals(args) -> None:
    rng = np.random.default_rng(0)
    for head_size in (int(h) for h in args.head_sizes.split(",")):
        bounds, pairs, unequal = changes(head_size, args.context, rng)
        print(f"head size {head_size}: a row's output changes when the call's total passes {bounds or 'nothing'}"
              f" (totals up to {args.context}); between those, {unequal} of {pairs} pairs of calls holding the same"
              " row differ", flush=True)


def bundle(args) -> None:
    from specexport.bench.questions import load_questions, resolve_questions
    from specexport.bench.runner import prepare_prompts
    from specexport.runtime import load
    from specexport.runtime.backends.ort import OrtPiece

    cuts = sorted(int(c) for c in args.cut_after.split(",")) if args.cut_after else []
    run = OrtPiece.run

    def cut_run(self, x, start, keep=1, tree=None):
        """A multi-row chain call whose rows straddle a cut runs as two calls: the rows whose one-token AR call
        (two rows with the multi-row copy) totals at most the cut, then the rest."""
        n = x.shape[1]
        cut = next((c for c in cuts if start + 2 <= c <= start + n), None) if tree is None and n > 1 else None
        if cut is None:
            return run(self, x, start, keep, tree)
        first = cut - 1 - start
        second = n - first
        a = run(self, x[:, :first], start, max(1, min(first, keep - second)), None)
        b = run(self, x[:, first:], start + first, min(keep, second), None)
        out = {}
        for name, value in b.items():
            if name == "hidden":
                out[name] = np.concatenate([a[name], value], axis=1)
            elif name == "logits":
                out[name] = np.concatenate([a[name][:, second - keep:], value], axis=1) if keep > second else value
            else:
                raise SystemExit(f"piece output {name!r} is not handled here")
        return out

    OrtPiece.run = cut_run
    session = load(args.bundle, threads=2)
    wanted = {int(q) for q in args.questions.split(",")}
    questions = [q for q in load_questions(resolve_questions(None)) if q.question_id in wanted]
    for q, (ids, _) in zip(questions, prepare_prompts(session, questions, 100000), strict=True):
        seconds: dict[str, float] = {}
        out: dict[str, list[int]] = {}
        for mode in ("ar", "lookup") * (1 + args.warm):  # the last round's times are printed
            t0 = time.perf_counter()
            out[mode] = session.generate_ids(ids, max_new_tokens=args.max_new_tokens, mode=mode).tokens
            seconds[mode] = time.perf_counter() - t0
        ar, lookup = out["ar"], out["lookup"]
        first = next((i for i, (a, b) in enumerate(zip(ar, lookup, strict=False)) if a != b), None)
        verdict = "equals AR" if ar == lookup else f"differs from AR from new token {first} on"
        print(f"question {q.question_id} ({len(ids)} prompt tokens): lookup {verdict}; AR {seconds['ar']:.2f} s,"
              f" lookup {seconds['lookup']:.2f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("totals")
    t.add_argument("--head-sizes", default="64,128,256")
    t.add_argument("--context", type=int, default=1100)
    b = sub.add_parser("bundle")
    b.add_argument("bundle")
    b.add_argument("--questions", default="81,131,241,481")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--warm", type=int, default=0, help="rounds run before the timed one")
    b.add_argument("--cut-after", default="", help="call totals to cut multi-row calls at, comma-separated")
    args = ap.parse_args()
    {"totals": totals, "bundle": bundle}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
