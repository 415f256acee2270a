"""Where an autoregressive token's time goes: specexport's pieces against ONNX Runtime GenAI's own model.

    # specexport (the .venv): ms per token by part, several bundles interleaved round by round
    .venv/bin/python tools/experiments/ar_profile.py ours bundles/smollm2 bundles/smollm2-int4 --tokens 128
    # GenAI (the .venv-genai interpreter): generate_next_token per token, and its model.onnx alone in ONNX
    # Runtime (one IOBinding call per token, the graph's own cost)
    .venv-genai/bin/python tools/experiments/ar_profile.py genai .cache/ortgenai/<model dir> --tokens 128
    # op histogram of a graph after ONNX Runtime's optimizer, and its MatMulNBits attributes
    python tools/experiments/ar_profile.py ops MODEL.onnx
    # ms per decode token by op type, from ONNX Runtime's own profiler (one intra-op thread): a bundle's
    # shallow + deep pieces, or (a directory with genai_config.json) GenAI's model.onnx in plain ORT
    python tools/experiments/ar_profile.py kernels bundles/smollm2-int4 .cache/ortgenai/<model dir>
    # the same through the bundles' pieces as built, without the row padding a session adds where its load-time
    # check fails (for variants that are not lossless, e.g. ar_gap.py copy-parts)
    python tools/experiments/ar_profile.py kernels /tmp/int4-parts/copy /tmp/int4-parts/nodes --raw
    # one decoder layer's four int4 MatMulNBits (SmolLM2-135M shapes): one row against two, symmetric
    # against asymmetric, gate/up packed against two; and whether a one-row call equals a row of a
    # five-row call bit for bit, per block size
    python tools/experiments/ar_profile.py matmulnbits

Each figure is a median over rounds; run the systems you compare in one go, the machine is shared.
The `ours` part imports only numpy and onnxruntime from outside the repository; `genai` only
onnxruntime(_genai) and numpy, so it runs in either interpreter.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

PROMPT = "Explain how a hash table works."


def _median_table(rows: dict[str, list[float]]) -> dict[str, float]:
    return {k: round(statistics.median(v), 3) for k, v in rows.items()}


def ours(bundles: list[str], tokens: int, rounds: int, threads: int | None) -> None:
    from specexport.runtime.backends.ort import use_shared_thread_pool
    from specexport.runtime.decode import autoregressive
    from specexport.runtime.sampling import SamplingParams
    from specexport.runtime.session import load
    from specexport.runtime.stats import Stats

    use_shared_thread_pool(threads)
    # BUNDLE@legacy: the same bundle driven by the binding of a97d363 and before (every cache rebound and
    # every output read back through get_outputs on each call), for a before/after in one process
    sessions = {b: load(b.split("@")[0]) for b in bundles}
    for b, session in sessions.items():
        if b.endswith("@legacy"):
            for name in ("shallow", "deep"):
                piece = getattr(session.pieces, name)
                piece.run = functools.partial(_legacy_run, piece)
    results: dict[str, dict[str, list[float]]] = {b: collections.defaultdict(list) for b in bundles}
    for _ in range(rounds):
        for b, session in sessions.items():
            ids = session.prompt_ids(PROMPT, session.options())
            pieces = session.pieces
            timers: dict[str, float] = collections.defaultdict(float)
            originals = []
            for name in ("shallow", "deep"):
                piece = getattr(pieces, name)
                run, ort_run = piece.run, piece.session.run_with_iobinding

                def timed(fn, label: str, _timers=timers):
                    def wrapper(*a, **k):
                        t, c = time.perf_counter(), time.thread_time()
                        out = fn(*a, **k)
                        _timers[label] += time.perf_counter() - t
                        _timers[f"{label} cpu"] += time.thread_time() - c
                        return out
                    return wrapper

                timed_run, timed_ort = timed(run, f"{name} run()"), timed(ort_run, f"{name} ORT")
                piece.run, piece.session.run_with_iobinding = timed_run, timed_ort
                originals.append((piece, run, ort_run))
            stats = Stats()
            loop = autoregressive(pieces, ids, SamplingParams(), np.random.default_rng(0), stats)
            t0 = time.perf_counter()
            n = 0
            for _ in loop:
                n += 1
                if n == 1:  # the prefill's token: time decode steps only
                    timers.clear()
                    t0, c0 = time.perf_counter(), time.thread_time()
                if n > tokens:
                    break
            loop.close()
            total, total_cpu = time.perf_counter() - t0, time.thread_time() - c0
            for piece, run, ort_run in originals:
                piece.run, piece.session.run_with_iobinding = run, ort_run
            steps = n - 1
            row = results[b]
            row["total"].append(total / steps * 1e3)
            # with --threads 1 every ORT kernel runs on this thread: CPU time is the work, whatever the machine's load
            row["total, CPU time of this thread"].append(total_cpu / steps * 1e3)
            for name in ("shallow", "deep"):
                row[f"{name} ORT, CPU time"].append(timers[f"{name} ORT cpu"] / steps * 1e3)
            for name in ("shallow", "deep"):
                row[f"{name} ORT"].append(timers[f"{name} ORT"] / steps * 1e3)
                row[f"{name} Python (binding, feeds, outputs)"].append(
                    (timers[f"{name} run()"] - timers[f"{name} ORT"]) / steps * 1e3)
                # the same in this thread's CPU time: what a busy machine's preemption does not inflate
                row[f"{name} Python, CPU time"].append(
                    (timers[f"{name} run() cpu"] - timers[f"{name} ORT cpu"]) / steps * 1e3)
            row["loop Python (pick, generator)"].append(
                (total - timers["shallow run()"] - timers["deep run()"]) / steps * 1e3)
            row["tokens/s (decode)"].append(steps / total)
    print(json.dumps({b: _median_table(r) for b, r in results.items()}, indent=1))


def _legacy_run(piece, x, start, keep=1, tree=None):
    from specexport.runtime.backends.common import bias_spec, control_feeds

    n = x.shape[1]
    piece.binding.clear_binding_outputs()
    for past, present, buffers in piece._caches:
        piece.binding.bind_ortvalue_input(past, buffers[0])
        piece.binding.bind_ortvalue_output(present, buffers[-1])
    for name in piece.result_names:
        piece.binding.bind_output(name, "cpu")
    piece.binding.bind_cpu_input(piece.primary, x)
    bias = bias_spec(piece.bias_input, start, n, piece.max_context)
    for name, value in control_feeds(piece.input_names, start, n, keep, tree, bias).items():
        piece.binding.bind_cpu_input(name, value)
    piece.session.run_with_iobinding(piece.binding)
    values = piece.binding.get_outputs()
    return dict(zip(piece.result_names, (v.numpy() for v in values[-len(piece.result_names):]), strict=True))


def genai(model_dirs: list[str], tokens: int, rounds: int, threads: int | None) -> None:
    import onnxruntime as ort
    import onnxruntime_genai as og

    models = {}
    for d in model_dirs:
        config = og.Config(d)
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads or 0}}}}))
        models[d] = og.Model(config)
    results: dict[str, dict[str, list[float]]] = {d: collections.defaultdict(list) for d in model_dirs}
    tok = og.Tokenizer(models[model_dirs[0]])
    ids = list(tok.encode(f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"))
    for _ in range(rounds):
        for d, model in models.items():
            params = og.GeneratorParams(model)
            params.set_search_options(do_sample=False, max_length=len(ids) + tokens + 1, min_length=0)
            gen = og.Generator(model, params)
            gen.append_tokens(ids)
            gen.generate_next_token()  # the prefill's token
            t0, c0 = time.perf_counter(), time.process_time()
            n = 0
            while n < tokens and not gen.is_done():
                gen.generate_next_token()
                gen.get_next_tokens()
                n += 1
            total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
            results[d]["GenAI generate_next_token"].append(total / n * 1e3)
            results[d]["GenAI generate_next_token, CPU time of the process"].append(total_cpu / n * 1e3)
            del gen
            wall, cpu = _bare_graph_ms(ort, d, len(ids), n, threads)
            results[d]["model.onnx alone in ORT (one IOBinding call)"].append(wall)
            results[d]["model.onnx alone in ORT, CPU time of the process"].append(cpu)
    print(json.dumps({d: _median_table(r) for d, r in results.items()}, indent=1))


def _bare_graph_ms(ort, model_dir: str, prompt_len: int, steps: int, threads: int | None) -> tuple[float, float]:
    """GenAI's model.onnx driven by plain ONNX Runtime: decode steps at the same positions, fed the argmax,
    caches as OrtValues rebound each call (GenAI's CPU default: past and present separate)."""
    cfg = json.loads((Path(model_dir) / "genai_config.json").read_text())
    dec = cfg["model"]["decoder"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or 0
    sess = ort.InferenceSession(str(Path(model_dir) / dec["filename"]), so, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    kv = [n for n in inputs if n.startswith("past_key_values")]
    heads, hd = dec["num_key_value_heads"], dec["head_size"]
    f = np.float32 if "float16" not in inputs[kv[0]].type else np.float16
    past = {n: np.zeros((1, heads, prompt_len, hd), dtype=f) for n in kv}
    ids = np.full((1, prompt_len), 1, dtype=np.int64)
    binding = sess.io_binding()
    outputs = [o.name for o in sess.get_outputs()]

    def step(ids, past, total):
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", np.ones((1, total), dtype=np.int64))
        if "position_ids" in inputs:
            binding.bind_cpu_input("position_ids", np.arange(total - ids.shape[1], total, dtype=np.int64)[None])
        for n, v in past.items():
            binding.bind_ortvalue_input(n, v)
        for o in outputs:
            binding.bind_output(o, "cpu")
        sess.run_with_iobinding(binding)
        vals = dict(zip(outputs, binding.get_outputs(), strict=True))
        new = {n: vals[n.replace("past_key_values", "present")] for n in past}
        return vals["logits"].numpy(), new

    empty = {n: ort.OrtValue.ortvalue_from_numpy(np.zeros((1, heads, 0, hd), dtype=f)) for n in kv}
    logits, past = step(ids, empty, prompt_len)
    total = prompt_len
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        token = np.array([[int(np.argmax(logits[0, -1]))]], dtype=np.int64)
        total += 1
        logits, past = step(token, past, total)
    return (time.perf_counter() - t0) / steps * 1e3, (time.process_time() - c0) / steps * 1e3


def ops(path: str) -> None:
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "optimized.onnx")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = out
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.onnx.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        so.log_severity_level = 3
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        model = onnx.load(out, load_external_data=False)
    hist = collections.Counter(f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in model.graph.node)
    print(f"{path}: {sum(hist.values())} nodes after ORT_ENABLE_ALL")
    print(json.dumps(dict(hist.most_common())))
    attrs = collections.Counter()
    for n in model.graph.node:
        if n.op_type in ("MatMulNBits", "GroupQueryAttention"):
            a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
            a = {k: v.decode() if isinstance(v, bytes) else v for k, v in a.items()}
            attrs[f"{n.op_type} {json.dumps(a, sort_keys=True)}"] += 1
    for k, v in attrs.most_common():
        print(f"  {v} x {k}")


def kernels(paths: list[str], tokens: int, raw: bool = False) -> None:
    import onnxruntime as ort

    for path in paths:
        prefix = str(Path(tempfile.mkdtemp()) / "profile")
        if (Path(path) / "genai_config.json").exists():
            files = [_profile_genai_graph(ort, path, tokens, prefix)]
        else:
            files = _profile_bundle(path, tokens, prefix, raw)
        table: collections.Counter = collections.Counter()
        for f in files:
            table.update(_ms_per_run_by_op(f, tokens - 1))
        print(path, json.dumps({k: round(v, 3) for k, v in table.most_common()}))


def _ms_per_run_by_op(profile_file: str, steps: int) -> dict[str, float]:
    events = json.loads(Path(profile_file).read_text())
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    # the last `steps` runs are one-token decode steps; before them come the prefill and, in a bundle's
    # session, the load-time probe of one-row calls (runtime/row_padding.py)
    decode = runs[-steps]
    by_op: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= decode:
            by_op[e["args"]["op_name"]] += e["dur"]
    by_op["(whole run)"] = sum(e["dur"] for e in events if e.get("cat") == "Session"
                               and e["name"] == "model_run" and e["ts"] >= decode)
    return {k: v / steps / 1e3 for k, v in by_op.items()}


def _profile_bundle(bundle: str, tokens: int, prefix: str, raw: bool = False) -> list[str]:
    from specexport.runtime.backends import ort as ort_backend
    from specexport.runtime.session import load

    plain = ort_backend.session_options

    def profiled(threads=None):
        opts = plain(1)
        opts.enable_profiling = True
        opts.profile_file_prefix = prefix
        return opts

    ort_backend.session_options = profiled
    try:
        session = load(bundle)
    finally:
        ort_backend.session_options = plain
    if raw:  # greedy AR through the pieces themselves (ar_gap.py's step, in this directory)
        from ar_gap import _two_calls

        step = _two_calls(session)
        prompt = session.prompt_ids(PROMPT, session.options())
        logits = step(np.asarray([prompt]), 0)
        for k in range(tokens - 1):
            logits = step(np.asarray([[int(logits[0, -1].argmax())]]), len(prompt) + k)
    else:
        session.generate(PROMPT, max_new_tokens=tokens, mode="ar")
    # a wrapped piece passes attribute reads through to the piece it wraps (runtime/backends/common.py)
    return [getattr(session.pieces, name).session.end_profiling() for name in ("shallow", "deep")]


def _profile_genai_graph(ort, model_dir: str, tokens: int, prefix: str) -> str:
    dec = json.loads((Path(model_dir) / "genai_config.json").read_text())["model"]["decoder"]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.enable_profiling = True
    opts.profile_file_prefix = prefix
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(Path(model_dir) / dec["filename"]), opts, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in sess.get_inputs()}
    kv = [n for n in inputs if n.startswith("past_key_values")]
    past = {n: np.zeros((1, dec["num_key_value_heads"], 0, dec["head_size"]), np.float32) for n in kv}
    ids, total = np.ones((1, 40), np.int64), 40
    outputs = [o.name for o in sess.get_outputs()]
    for _ in range(tokens + 1):
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **past}
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(total - ids.shape[1], total)[None]
        result = dict(zip(outputs, sess.run(None, feeds), strict=True))
        past = {n: result[n.replace("past_key_values", "present")] for n in kv}
        ids, total = np.array([[int(np.argmax(result["logits"][0, -1]))]]), total + 1
    return sess.end_profiling()


def matmulnbits(rounds: int) -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    packed = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # qkv, o, gate+up, down
    split = [(576, 960), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
    for block in (16, 32):
        same = all(_one_row_is_a_row_of_many(ort, rng, k, n, block) for k, n in packed)
        print(f"block {block}: one-row calls equal a row of a five-row call bit for bit: {same}")
    sessions = {(sym, k, n): _matmulnbits_session(ort, rng, k, n, sym, 32)
                for sym in (False, True) for k, n in packed + split}
    times: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        for sym in (False, True):
            for layout, shapes in (("gate/up packed", packed), ("gate, up apart", split)):
                for rows in (1, 2):
                    us = sum(_cpu_ms_per_call(sessions[(sym, k, n)], rng, rows, k) for k, n in shapes) * 1e3
                    times[f"{'symmetric' if sym else 'asymmetric'}, {layout}, {rows} row(s)"].append(us)
    print("CPU microseconds per decoder layer's MatMulNBits (int4, block 32, accuracy_level 4), median:")
    print(json.dumps(_median_table(times), indent=1))


def _matmulnbits_session(ort, rng, k: int, n: int, symmetric: bool, block: int):
    from onnx import TensorProto, helper, numpy_helper

    blocks = k // block
    inits = [numpy_helper.from_array(rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8), "w"),
             numpy_helper.from_array((rng.random(n * blocks) * 0.01).astype(np.float32), "scales")]
    if not symmetric:
        inits.append(numpy_helper.from_array(rng.integers(0, 256, n * ((blocks + 1) // 2), dtype=np.uint8), "zp"))
    node = helper.make_node("MatMulNBits", ["a", *[i.name for i in inits]], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block, accuracy_level=4)
    graph = helper.make_graph([node], "mnb", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _one_row_is_a_row_of_many(ort, rng, k: int, n: int, block: int) -> bool:
    sess = _matmulnbits_session(ort, rng, k, n, False, block)
    a = rng.standard_normal((5, k)).astype(np.float32)
    one = np.concatenate([sess.run(None, {"a": a[i:i + 1]})[0] for i in range(5)])
    return bool(np.array_equal(one, sess.run(None, {"a": a})[0]))


def _cpu_ms_per_call(sess, rng, rows: int, k: int, calls: int = 300) -> float:
    a = rng.standard_normal((rows, k)).astype(np.float32)
    for _ in range(10):
        sess.run(None, {"a": a})
    start = time.thread_time()
    for _ in range(calls):
        sess.run(None, {"a": a})
    return (time.thread_time() - start) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["ours", "genai", "ops", "kernels", "matmulnbits"])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--raw", action="store_true",
                    help="kernels: the pieces as built, without the session's row padding")
    args = ap.parse_args()
    if args.what == "ours":
        ours(args.paths, args.tokens, args.rounds, args.threads)
    elif args.what == "genai":
        genai(args.paths, args.tokens, args.rounds, args.threads)
    elif args.what == "kernels":
        kernels(args.paths, args.tokens, args.raw)
    elif args.what == "matmulnbits":
        matmulnbits(args.rounds)
    else:
        for p in args.paths:
            ops(p)


if __name__ == "__main__":
    main()
