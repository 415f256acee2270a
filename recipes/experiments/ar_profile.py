"""Where an autoregressive token's time goes: specexport's pieces against ONNX Runtime GenAI's own model.

    # specexport (the .venv): ms per token by part, several bundles interleaved round by round
    .venv/bin/python recipes/experiments/ar_profile.py ours bundles/smollm2 bundles/smollm2-int4 --tokens 128
    # GenAI (the .venv-genai interpreter): generate_next_token per token, and its model.onnx alone in ONNX
    # Runtime (one IOBinding call per token, the graph's own cost)
    .venv-genai/bin/python recipes/experiments/ar_profile.py genai .cache/ortgenai/<model dir> --tokens 128
    # op histogram of a graph after ONNX Runtime's optimizer, and its MatMulNBits attributes
    python recipes/experiments/ar_profile.py ops MODEL.onnx [--profile]

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
    from specexport.runtime.decode import autoregressive
    from specexport.runtime.ort_backend import use_shared_thread_pool
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
    from specexport.runtime.backend import bias_spec, control_feeds

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


def ops(path: str, profile: bool) -> None:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["ours", "genai", "ops"])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.what == "ours":
        ours(args.paths, args.tokens, args.rounds, args.threads)
    elif args.what == "genai":
        genai(args.paths, args.tokens, args.rounds, args.threads)
    else:
        for p in args.paths:
            ops(p, args.profile)


if __name__ == "__main__":
    main()
