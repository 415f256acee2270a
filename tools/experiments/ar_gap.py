"""What stands between specexport's AR and ONNX Runtime GenAI's, measured part by part. `calls` and `padding` time
their systems side by side in one process, token by token in lockstep, then again in a fresh process with the
sessions created in the other order, and give each system's time over the first's as the mean of the two orders
(in one process the session created first ran measurably slower, whichever it was).

    # the bundle's shallow + deep joined into one graph (one session call a token instead of two), written
    # to OUT/full.onnx; then AR through the two pieces against AR through the one graph
    # (the tokens must be the same, and are checked)
    .venv/bin/python tools/experiments/ar_gap.py merge bundles/smollm2-int4 /tmp/int4-one-graph
    taskset -c 0 .venv/bin/python tools/experiments/ar_gap.py calls bundles/smollm2-int4 /tmp/int4-one-graph
    # the cost of the one-row attention padding: AR through each bundle's own pieces, as they are (a bundle
    # built with `[export] one_row_padding = "none"` is not lossless on x86-64; the session would pad it)
    taskset -c 0 .venv/bin/python tools/experiments/ar_gap.py padding bundles/smollm2-int4 /tmp/int4-nopad
    # the padding's two parts apart: from such an unpadded bundle, OUT/copy (padded as the exporter pads) and
    # OUT/nodes (the same nodes with the copy switched off, so each attention runs its call's own rows)
    .venv/bin/python tools/experiments/ar_gap.py copy-parts /tmp/int4-nopad /tmp/int4-parts
    taskset -c 0 .venv/bin/python tools/experiments/ar_gap.py padding /tmp/int4-parts/copy /tmp/int4-parts/nodes \
        /tmp/int4-nopad
    # GroupQueryAttention at scale 1 with the queries scaled in their weights instead (exact: 1/8): one-row calls
    # of such pieces take MLAS's one-row kernel for Q x K' too; many-row calls round as before
    .venv/bin/python tools/experiments/ar_gap.py unit-scale /tmp/int4-nopad /tmp/int4-nopad-s1
    # prefill alone (the prompt and its first token), ms, random prompts of 60, 200 and 770 tokens: a bundle, or
    # (in the .venv-genai interpreter) GenAI's model directory
    taskset -c 0 .venv/bin/python tools/experiments/ar_gap.py prefill bundles/smollm2-int4
    taskset -c 0 .venv-genai/bin/python tools/experiments/ar_gap.py prefill .cache/ortgenai/<model dir>
    # teacher-forced top-1 agreement of bundles with a reference bundle's greedy answers (the 26 prompts of
    # tools/experiments/agreement_prompts.jsonl, 64 tokens each): how much a quantization choice costs
    .venv/bin/python tools/experiments/ar_gap.py agreement bundles/smollm2 bundles/smollm2-int8 /tmp/int8-b64
    # why the padding exists: MLAS's M = 1 SGEMM path (GroupQueryAttention's probabilities x V product in a
    # one-token call) against a row of a two-row call, and both against two summation orders done in numpy
    .venv/bin/python tools/experiments/ar_gap.py m1

`merge`, `copy-parts` and `m1` need the exporter's `onnx`; `prefill` of a GenAI model only onnxruntime_genai and
numpy; the rest numpy, onnxruntime and the runtime. BENCHMARKS.md ("Where AR's time goes beside GenAI") has the
figures, docs/journal/2026-11-26.md every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PROMPT = "Explain how a hash table works."
CACHE_PREFIXES = ("past_key.", "past_value.", "present_key.", "present_value.")
CONTROLS = {"position_ids", "attention_bias", "seqlens_k", "total_sequence_length", "logits_to_keep"}


def _shifted(name: str, by: int) -> str | None:
    """A cache tensor's name with its layer index moved by `by`; None for any other name."""
    for prefix in CACHE_PREFIXES:
        if name.startswith(prefix):
            return f"{prefix}{int(name[len(prefix):]) + by}"
    return None


def merge(bundle: Path, out: Path) -> None:
    """Writes OUT/full.onnx: shallow's nodes, then deep's fed shallow's `hidden`; deep's caches renumbered after
    shallow's, its other tensors and nodes prefixed, the control inputs shared."""
    import onnx
    from onnx import helper

    exit_layer = json.loads((bundle / "manifest.json").read_text())["pieces"]["shallow"]["layers"][1]
    shallow, deep = onnx.load(bundle / "shallow.onnx"), onnx.load(bundle / "deep.onnx")

    def rename(name: str) -> str:
        if not name or name in CONTROLS or name == "logits":
            return name
        if name == "hidden_in":
            return "hidden"
        return _shifted(name, exit_layer) or f"deep/{name}"

    for node in deep.graph.node:
        node.name = f"deep/{node.name}"
        node.input[:] = [rename(x) for x in node.input]
        node.output[:] = [rename(x) for x in node.output]
    for tensor in [*deep.graph.initializer, *deep.graph.value_info, *deep.graph.input, *deep.graph.output]:
        tensor.name = rename(tensor.name)
    names = {i.name for i in shallow.graph.input}
    inputs = [*shallow.graph.input, *(i for i in deep.graph.input if i.name not in names and i.name != "hidden")]
    outputs = [*(o for o in shallow.graph.output if o.name != "hidden"), *deep.graph.output]
    graph = helper.make_graph([*shallow.graph.node, *deep.graph.node], "full", inputs, outputs,
                              [*shallow.graph.initializer, *deep.graph.initializer])
    out.mkdir(parents=True, exist_ok=True)
    model = helper.make_model(graph, opset_imports=shallow.opset_import, ir_version=shallow.ir_version)
    onnx.save(model, out / "full.onnx", save_as_external_data=True, location="full.onnx.data")
    print(f"wrote {out / 'full.onnx'}: {len(graph.node)} nodes, {len(inputs)} inputs, {len(outputs)} outputs")


def refresh_checksums(bundle: Path, names: list[str], edit=None) -> None:
    """The manifest's SHA-256 of the files `names` (rewritten by an experiment), after `edit(manifest)`."""
    from specexport.runtime.manifest import sha256_file

    manifest = json.loads((bundle / "manifest.json").read_text())
    if edit is not None:
        edit(manifest)
    for name in names:
        manifest["files"][name] = sha256_file(bundle / name)
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=1))


def copy_parts(unpadded: Path, out: Path) -> None:
    """OUT/copy: the unpadded bundle's shallow and deep with each attention's copied row, as the exporter writes
    them (exporter/multirow.py); OUT/nodes: the same graphs with the copy switched off (the test for a one-row
    call made never true), so every node but the attention's second row is there."""
    import shutil

    import onnx
    from onnx import numpy_helper
    from specexport.exporter.multirow import pad_one_row_attention

    def padded(manifest: dict) -> None:
        for piece in ("shallow", "deep"):
            manifest["pieces"][piece]["one_row_padding"] = "attention"

    for name, copy in (("copy", True), ("nodes", False)):
        target = out / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(unpadded, target)
        for piece in ("shallow", "deep"):
            path = target / f"{piece}.onnx"
            model = onnx.load(str(path), load_external_data=False)  # the weights stay in the copied .data file
            if not pad_one_row_attention(model):
                sys.exit(f"{path} has no GroupQueryAttention to pad")
            if not copy:
                for init in model.graph.initializer:
                    if init.name == "mr_one64":  # the call's rows are compared with 1 to find a one-row call
                        init.CopyFrom(numpy_helper.from_array(np.array([0], np.int64), init.name))
            onnx.save(model, str(path))
        refresh_checksums(target, ["shallow.onnx", "deep.onnx"], padded)
        print(f"wrote {target}")


def unit_scale(bundle: Path, out: Path) -> None:
    """OUT: the bundle with every GroupQueryAttention's `scale` 1 and the packed QKV MatMulNBits' query scales
    times the old scale (1/8 at head size 64, a power of two, so the queries are the old ones times 1/8 to the
    bit). MLAS takes its one-row kernels only for alpha 1, so a one-row call's Q x K' then reads the keys in
    place instead of packing them for each head; in a call of two or more rows nothing changes."""
    import shutil

    import onnx
    from onnx import helper, numpy_helper

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(bundle, out)
    for piece in ("shallow", "deep"):
        path = out / f"{piece}.onnx"
        model = onnx.load(str(path))
        producers = {o: n for n in model.graph.node for o in n.output}
        inits = {i.name: i for i in model.graph.initializer}
        for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
            attrs = {a.name: a for a in node.attribute}
            qkv = producers[node.input[0]]
            while qkv.op_type in ("Gather", "Concat", "Slice"):  # the copied row's nodes, in a padded bundle
                qkv = producers[qkv.input[0]]
            if qkv.op_type != "MatMulNBits" or "scale" not in attrs or node.input[1]:
                sys.exit(f"{path}: {node.name} is not fed a packed QKV MatMulNBits with a scale")
            old = attrs["scale"].f
            if not np.log2(old).is_integer():
                sys.exit(f"{path}: {node.name}'s scale {old} is not a power of two, so moving it would round")
            heads, kv_heads = (helper.get_attribute_value(attrs[k]) for k in ("num_heads", "kv_num_heads"))
            n_out = next(helper.get_attribute_value(a) for a in qkv.attribute if a.name == "N")
            scales = numpy_helper.to_array(inits[qkv.input[2]]).copy()
            scales.reshape(n_out, -1)[:heads * n_out // (heads + 2 * kv_heads)] *= np.float32(old)  # the Q rows
            inits[qkv.input[2]].CopyFrom(numpy_helper.from_array(scales, qkv.input[2]))
            attrs["scale"].f = 1.0
        onnx.save(model, str(path), save_as_external_data=True, location=f"{piece}.onnx.data")
    refresh_checksums(out, [f"{p}.onnx{ext}" for p in ("shallow", "deep") for ext in ("", ".data")])
    print(f"wrote {out}")


def _use_one_thread() -> None:
    from specexport.runtime.backends.ort import use_shared_thread_pool

    use_shared_thread_pool(1)


def _two_calls(session):
    """`step(ids, pos) -> logits` through the session's shallow and deep pieces as built, without the wrappers
    the session may put round them (its own row padding)."""
    from specexport.runtime.decode import Pieces, target_step

    raw = Pieces(*(getattr(p, "piece", p) for p in (session.pieces.shallow, session.pieces.deep)))
    return lambda ids, pos: target_step(raw, ids[0].tolist(), pos)[1]


def _lockstep(systems: dict[str, object], prompt: list[int], rounds: int, tokens: int,
              same_tokens: bool) -> dict[str, float]:
    """Greedy AR of every system token by token in step (each its own tokens): a token's calls run one after
    another, in an order that alternates token by token, so the machine's drift from second to second falls
    on all of them alike. Returns each system's median ms a step."""
    names = list(systems)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        logits = {name: systems[name](np.asarray([prompt]), 0) for name in names}
        for k in range(tokens):
            picked = {name: int(z[0, -1].argmax()) for name, z in logits.items()}
            if same_tokens and len(set(picked.values())) != 1:
                sys.exit(f"token {k}: the systems pick {picked}")
            for name in names if k % 2 == 0 else names[::-1]:
                t0 = time.perf_counter()
                logits[name] = systems[name](np.asarray([[picked[name]]]), len(prompt) + k)
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) * 1e3 for name, v in times.items()}


def calls(bundle: str, merged: Path, rounds: int, tokens: int, reverse: bool) -> dict[str, float]:
    """AR through shallow + deep (two session calls a token) against the same layers as one graph (one call);
    `reverse` creates the one graph's session first."""
    _use_one_thread()
    import onnx
    from specexport.exporter.bundle import io_spec
    from specexport.runtime.backends.ort import OrtPiece
    from specexport.runtime.bundle import load_bundle
    from specexport.runtime.session import load

    b = load_bundle(bundle)
    graph = onnx.load(str(merged / "full.onnx"), load_external_data=False).graph
    inputs = io_spec(graph.input)  # the joined graph's own inputs and outputs, as the exporter records a piece's
    kv = dataclasses.replace(b.pieces["deep"].kv, count=sum(t.name.startswith("past_key.") for t in inputs))
    spec = dataclasses.replace(b.pieces["deep"], file="full.onnx", inputs=inputs, outputs=io_spec(graph.output), kv=kv)

    def open_full() -> OrtPiece:
        return OrtPiece("full", merged / "full.onnx", spec, b.max_context, ["CPUExecutionProvider"], 1)

    full = open_full() if reverse else None
    session = load(bundle)
    full = full or open_full()
    systems = {
        "shallow + deep (two calls)": _two_calls(session),
        "one graph (one call)": lambda ids, pos: full.run(ids, pos)["logits"],
    }
    return _lockstep(systems, session.prompt_ids(PROMPT, session.options()), rounds, tokens, same_tokens=True)


def padding(bundles: list[str], rounds: int, tokens: int, reverse: bool) -> dict[str, float]:
    """AR through each bundle's raw pieces in lockstep; the tokens may differ (an unpadded bundle is not the
    padded one's arithmetic). `reverse` opens the bundles in the other order."""
    _use_one_thread()
    from specexport.runtime.session import load

    sessions = {b: load(b) for b in (bundles[::-1] if reverse else bundles)}
    first = sessions[bundles[0]]
    return _lockstep({b: _two_calls(sessions[b]) for b in bundles}, first.prompt_ids(PROMPT, first.options()),
                     rounds, tokens, same_tokens=False)


def both_orders(args, medians: dict[str, float]) -> None:
    """The same measurement again in a fresh process with the sessions created in the other order (the
    session created first ran measurably slower, whatever it held), and each system's time over the first
    system's as the geometric mean of the two orders."""
    cmd = [sys.executable, __file__, args.what, *args.paths, "--rounds", str(args.rounds), "--tokens",
           str(args.tokens), "--reverse", "--json"]
    other = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
    names = list(medians)
    for name in names:
        ratios = [m[name] / m[names[0]] for m in (medians, other)]
        print(f"{name}: median {medians[name]:.3f} / {other[name]:.3f} ms a step (created in order / in the other"
              f" order), {math.sqrt(ratios[0] * ratios[1]):.3f}x the first ({ratios[0]:.3f}, {ratios[1]:.3f})")


def prefill(path: str, rounds: int) -> None:
    """Median ms from a prompt to its first token (the prefill call and picking the token), one thread."""
    lengths = (60, 200, 770)
    prompts = {n: [int(t) for t in np.random.default_rng(0).integers(100, 40000, n)] for n in lengths}
    if (Path(path) / "genai_config.json").exists():
        import onnxruntime_genai as og

        config = og.Config(path)
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": 1}}}}))
        model = og.Model(config)

        def first_token(ids: list[int]) -> None:
            params = og.GeneratorParams(model)
            params.set_search_options(do_sample=False, max_length=len(ids) + 129, min_length=0)
            generator = og.Generator(model, params)
            generator.append_tokens(ids)
            generator.generate_next_token()
            generator.get_next_tokens()
    else:
        _use_one_thread()
        from specexport.runtime.decode import prefill as run_prefill
        from specexport.runtime.session import load
        from specexport.runtime.stats import Stats

        pieces = load(path).pieces

        def first_token(ids: list[int]) -> None:
            int(run_prefill(pieces, ids, Stats())[1][0, -1].argmax())

    medians = {}
    for n, ids in prompts.items():
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            first_token(ids)
            times.append((time.perf_counter() - start) * 1e3)
        medians[n] = round(statistics.median(times), 1)
    print(path, "prefill ms by prompt tokens:", medians)


def agreement(reference: str, bundles: list[str], prompts: int = 26, tokens: int = 64) -> None:
    """Per bundle, the share of answer positions where its top-1 token, given the reference's answer so far,
    is the reference's own next token."""
    from specexport.runtime.decode import target_step
    from specexport.runtime.session import load

    ref = load(reference)
    cases = []
    lines = (Path(__file__).with_name("agreement_prompts.jsonl").read_text(encoding="utf-8")).splitlines()
    for item in [json.loads(line) for line in lines if line.strip()][:prompts]:
        ids = ref.prompt_ids(item["prompt"], ref.options())
        answer = ref.generate_ids(ids, max_new_tokens=tokens, mode="ar").tokens
        cases.append((ids, answer))
    for bundle in bundles:
        session = load(bundle)
        same = total = 0
        for ids, answer in cases:
            logits = target_step(session.pieces, [*ids, *answer], 0, keep=len(ids) + len(answer))[1][0]
            picks = logits[len(ids) - 1:len(ids) - 1 + len(answer)].argmax(axis=-1)
            same += int((picks == np.asarray(answer)).sum())
            total += len(answer)
        print(f"{bundle}: {same / total:.1%} of {total} positions agree with {reference}")


def m1(trials: int) -> None:
    """One SGEMM, P [rows, T] x V [T, 64] as GroupQueryAttention computes it (a MatMul of two graph inputs: no
    prepacking, alpha 1, beta 0): is a one-row call a row of a two-row call, and which summation order gives
    each? MLAS's M = 1 kernel (SgemmKernelM1Avx) multiplies and adds apart, four terms of K at a time, then
    adds the running sum; the other kernels fuse each multiply-add (FMA) along K."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MatMul", ["p", "v"], ["y"])], "pv",
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["M", "T"]),
                               helper.make_tensor_value_info("v", TensorProto.FLOAT, ["T", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 64])])
    from specexport.runtime.backends.ort import session_options

    opts = session_options(1)
    sess = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                .SerializeToString(), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    tally = {"one row == a row of two": 0, "one row == mul, add, 4 at a time": 0, "two-row call's row == FMA": 0}
    for _ in range(trials):
        total = int(rng.integers(8, 257))  # one K block of the multi-row kernel
        p = rng.random((2, total)).astype(np.float32)
        p /= p.sum(axis=1, keepdims=True)
        v = rng.standard_normal((total, 64)).astype(np.float32)
        one = sess.run(None, {"p": p[:1], "v": v})[0][0]
        two = sess.run(None, {"p": p, "v": v})[0][0]
        tally["one row == a row of two"] += bool(np.array_equal(one, two))
        tally["one row == mul, add, 4 at a time"] += bool(np.array_equal(one, _m1_order(p[0], v)))
        tally["two-row call's row == FMA"] += bool(np.array_equal(two, _fma_order(p[0], v)))
    for what, n in tally.items():
        print(f"{what}: {n}/{trials}")


def _m1_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """SgemmKernelM1Avx's order: each group of 4 (then 2, then 1) terms summed with rounded products, then
    added to the running sum."""
    widths = [4] * (len(a) // 4) + [2] * (len(a) % 4 // 2) + [1] * (len(a) % 2)
    c, k = np.zeros(b.shape[1], np.float32), 0
    for width in widths:
        group = a[k] * b[k]
        for j in range(k + 1, k + width):
            group = group + a[j] * b[j]
        c, k = group + c, k + width
    return c


def _fma_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One fused multiply-add a term, in K order: the float32 product is exact in float64, so rounding the
    float64 sum to float32 gives an FMA's result but for rare double roundings."""
    c = np.zeros(b.shape[1], np.float32)
    for k in range(len(a)):
        c = (np.float64(a[k]) * b[k].astype(np.float64) + c.astype(np.float64)).astype(np.float32)
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["merge", "copy-parts", "unit-scale", "calls", "padding", "prefill", "agreement",
                                     "m1"])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--reverse", action="store_true", help="create the sessions in the other order")
    ap.add_argument("--json", action="store_true", help="print the medians as JSON, in one order only")
    args = ap.parse_args()
    if args.what == "merge":
        merge(Path(args.paths[0]), Path(args.paths[1]))
    elif args.what == "copy-parts":
        copy_parts(Path(args.paths[0]), Path(args.paths[1]))
    elif args.what == "unit-scale":
        unit_scale(Path(args.paths[0]), Path(args.paths[1]))
    elif args.what in ("calls", "padding"):
        if args.what == "calls":
            medians = calls(args.paths[0], Path(args.paths[1]), args.rounds, args.tokens, args.reverse)
        else:
            medians = padding(args.paths, args.rounds, args.tokens, args.reverse)
        if args.json:
            print(json.dumps(medians))
        else:
            both_orders(args, medians)
    elif args.what == "prefill":
        prefill(args.paths[0], args.rounds)
    elif args.what == "agreement":
        agreement(args.paths[0], args.paths[1:])
    else:
        m1(args.trials)


if __name__ == "__main__":
    main()
