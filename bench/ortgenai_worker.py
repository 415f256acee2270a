"""ONNX Runtime GenAI worker for `specexport bench`, run as a script by the interpreter that has
onnxruntime-genai (usually the Makefile's .venv-genai, whose transformers and onnxruntime need not match
ours). It imports only the standard library and onnxruntime_genai, never specexport.

    python ortgenai_worker.py versions
        prints one JSON object: the versions of the packages that matter in this interpreter
    python ortgenai_worker.py serve MODEL_DIR THREADS [SETTINGS]
        SETTINGS, JSON: {"max_batch": N} sizes the Engine's static batches, {"spinning": false} keeps the
        decoder's idle intra-op threads from spinning, {"speculative": {"ngram_size": 4, ...}} turns on
        GenAI's own speculation for single requests (GeneratorParams.set_speculative_options; n-gram lookup
        over the sequence when no draft model is configured)
        prints {"ready": ...} (or {"error": ...}), then answers one JSON request per stdin line,
        {"ids": [...], "max_new_tokens": N, "eos": [...], "ignore_eos": false}, with
        {"tokens": [...], "seconds": S, "finish_reason": "eos"|"length"} (or {"error": ...}), plus
        "speculative": the counters of Generator.get_speculative_stats() named in SPECULATIVE_COUNTERS when
        speculation is on;
        and a batch, {"batch": [{"ids": [...], "max_new_tokens": N}, ...], "eos": [...]}, run together through
        GenAI's Engine, with one line per request as it finishes, {"index": K, "tokens": [...], "seconds": S,
        "finish_reason": ...} (S from the batch's start), then {"batch_done": true, "seconds": S}
        (or {"error": ...} in place of either)

Timing happens here, around the generation alone, so the pipe to the bench process costs nothing that
is measured. The protocol has its own file descriptor: whatever the library prints goes to stderr.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time

PACKAGES = ("onnxruntime-genai", "onnxruntime", "transformers", "torch", "onnx", "onnx-ir", "numpy")
# what the bench turns into forward passes, drafted and accepted tokens (bench/ortgenai.py speculative_counts);
# the rest of GenAI's statistics (timings, histograms) stay in the worker
SPECULATIVE_COUNTERS = ("rounds", "standard_fallback_steps", "target_forward_passes", "draft_tokens_proposed",
                        "draft_tokens_evaluated", "draft_tokens_accepted", "tokens_emitted")


def versions() -> dict:
    out = {"python": sys.version.split()[0], "executable": sys.executable}
    for dist in PACKAGES:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def generate(og, model, ids: list[int], max_new_tokens: int, eos: set[int], ignore_eos: bool = False,
             speculative: dict | None = None) -> dict:
    """Greedy from `ids`; with `ignore_eos`, EOS is held off (GenAI's min_length) so the run is max_new_tokens.
    With `speculative`, GenAI drafts and verifies on its own: the generator still hands out one token per
    generate_next_token call (the accepted ones are buffered), so the loop is the same, and its statistics are
    read once the clock has stopped."""
    t0 = time.perf_counter()
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + max_new_tokens,
                              min_length=len(ids) + max_new_tokens if ignore_eos else 0)
    if speculative:
        params.set_speculative_options(**speculative)
    gen = og.Generator(model, params)
    gen.append_tokens(list(ids))
    tokens: list[int] = []
    reason = "length"
    while not gen.is_done() and len(tokens) < max_new_tokens:
        gen.generate_next_token()
        token = int(gen.get_next_tokens()[0])
        if token in eos and not ignore_eos:
            reason = "eos"
            break
        tokens.append(token)
    seconds = time.perf_counter() - t0
    out = {"tokens": tokens, "seconds": seconds, "finish_reason": reason}
    if speculative:
        stats = gen.get_speculative_stats()
        out["speculative"] = {k: stats[k] for k in SPECULATIVE_COUNTERS if k in stats}
    del gen
    return out


def generate_batch(og, engine, batch: list[dict], eos: set[int], send) -> None:
    """Every request of `batch` submitted to the Engine at once, then the Engine run until all have finished,
    each reported as soon as it finishes. With the builder's CPU export (GroupQueryAttention, no paged cache)
    0.18's Engine batches statically: it runs what was submitted together until the last row finishes."""
    t0 = time.perf_counter()
    requests, index = [], {}
    for k, job in enumerate(batch):
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_do_sample(False)
        options.set_max_generated_tokens(int(job["max_new_tokens"]))
        request.begin_turn([int(t) for t in job["ids"]], options)
        requests.append(request)
        index[id(request)] = k
    tokens: list[list[int]] = [[] for _ in batch]
    buffer = engine.create_event_buffer(max(64, 2 * len(batch)))
    token_flag, finished_flag = og.EngineEventFlags.TOKEN.value, og.EngineEventFlags.TURN_FINISHED.value
    failed_flag = og.EngineEventFlags.FAILED.value
    pending = len(batch)
    while pending and engine.has_pending_requests():
        for event in engine.run(buffer):
            k, flags = index[id(event.request)], event.flags.value
            if flags & failed_flag:
                raise RuntimeError(f"the Engine failed request {k}: {event.error_code}")
            if flags & token_flag:
                tokens[k].append(int(event.token))
            if flags & finished_flag:
                pending -= 1
                out, reason = tokens[k], "eos" if event.finish_reason == og.FinishReason.EOS else "length"
                # the Engine stops at the model's own EOS; a bundle may name others, which end the answer here
                cut = next((i for i, t in enumerate(out) if t in eos), None)
                if cut is not None:
                    out, reason = out[:cut], "eos"
                send({"index": k, "tokens": out, "seconds": time.perf_counter() - t0, "finish_reason": reason})
    if pending:
        raise RuntimeError(f"the Engine stopped with {pending} of {len(batch)} requests unfinished")
    for request in requests:
        request.close()
    send({"batch_done": True, "seconds": time.perf_counter() - t0})


def serve(model_dir: str, threads: int, settings: dict | None = None) -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the library's own prints must not corrupt the protocol

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")

    try:
        import onnxruntime_genai as og

        config = og.Config(model_dir)
        # left alone, onnxruntime-genai runs the decoder on one intra-op thread: set it like every other
        # system's so the comparison is of code, not of thread counts
        settings = settings or {}
        session: dict = {"intra_op_num_threads": threads}
        if "spinning" in settings:  # a session option GenAI passes on to ONNX Runtime as a config entry
            session["session.intra_op.allow_spinning"] = "1" if settings["spinning"] else "0"
        overlay: dict = {"model": {"decoder": {"session_options": session}}}
        if settings.get("max_batch", 1) > 1:  # the Engine's static batches hold 4 requests unless told otherwise
            overlay["engine"] = {"static_batching": {"max_batch_size": int(settings["max_batch"])}}
        config.overlay(json.dumps(overlay))
        if settings.get("speculative") and not hasattr(og.GeneratorParams, "set_speculative_options"):
            raise RuntimeError("this onnxruntime-genai has no GeneratorParams.set_speculative_options (0.18 has)")
        model = og.Model(config)
    except Exception as exc:  # reported to the bench, which turns it into a skip reason
        send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    send({"ready": True, "versions": versions()})
    engine = None
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if "batch" in req:
                if settings.get("speculative"):  # the Engine takes its drafts per request, not from these settings
                    raise ValueError("this worker speculates on single requests only; start one without"
                                     " 'speculative' for batches")
                engine = engine or og.Engine(model)
                try:
                    generate_batch(og, engine, req["batch"], set(req["eos"]), send)
                except Exception:
                    engine = None  # whatever the failed batch left in it must not meet the next one
                    raise
            else:
                send(generate(og, model, req["ids"], int(req["max_new_tokens"]), set(req["eos"]),
                              bool(req.get("ignore_eos")), settings.get("speculative")))
        except Exception as exc:
            send({"error": f"{type(exc).__name__}: {exc}"})
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["versions"]:
        print(json.dumps(versions()))
        return 0
    if argv[:1] == ["serve"] and len(argv) in (3, 4):
        return serve(argv[1], int(argv[2]), json.loads(argv[3]) if len(argv) == 4 else None)
    print("usage: ortgenai_worker.py versions | serve MODEL_DIR THREADS [SETTINGS]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
