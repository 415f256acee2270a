"""ONNX Runtime GenAI worker for `specexport bench`, run as a script by the interpreter that has
onnxruntime-genai (usually the Makefile's .venv-genai, whose transformers and onnxruntime need not match
ours). It imports only the standard library and onnxruntime_genai, never specexport.

    python ortgenai_worker.py versions
        prints one JSON object: the versions of the packages that matter in this interpreter
    python ortgenai_worker.py serve MODEL_DIR THREADS
        prints {"ready": ...} (or {"error": ...}), then answers one JSON request per stdin line,
        {"ids": [...], "max_new_tokens": N, "eos": [...]}, with
        {"tokens": [...], "seconds": S, "finish_reason": "eos"|"length"} (or {"error": ...})

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


def versions() -> dict:
    out = {"python": sys.version.split()[0], "executable": sys.executable}
    for dist in PACKAGES:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def generate(og, model, ids: list[int], max_new_tokens: int, eos: set[int]) -> dict:
    t0 = time.perf_counter()
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + max_new_tokens, min_length=0)
    gen = og.Generator(model, params)
    gen.append_tokens(list(ids))
    tokens: list[int] = []
    reason = "length"
    while not gen.is_done() and len(tokens) < max_new_tokens:
        gen.generate_next_token()
        token = int(gen.get_next_tokens()[0])
        if token in eos:
            reason = "eos"
            break
        tokens.append(token)
    seconds = time.perf_counter() - t0
    del gen
    return {"tokens": tokens, "seconds": seconds, "finish_reason": reason}


def serve(model_dir: str, threads: int) -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the library's own prints must not corrupt the protocol

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")

    try:
        import onnxruntime_genai as og

        config = og.Config(model_dir)
        # left alone, onnxruntime-genai runs the decoder on one intra-op thread: set it like every other
        # system's so the comparison is of code, not of thread counts
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        model = og.Model(config)
    except Exception as exc:  # reported to the bench, which turns it into a skip reason
        send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    send({"ready": True, "versions": versions()})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            send(generate(og, model, req["ids"], int(req["max_new_tokens"]), set(req["eos"])))
        except Exception as exc:
            send({"error": f"{type(exc).__name__}: {exc}"})
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["versions"]:
        print(json.dumps(versions()))
        return 0
    if argv[:1] == ["serve"] and len(argv) == 3:
        return serve(argv[1], int(argv[2]))
    print("usage: ortgenai_worker.py versions | serve MODEL_DIR THREADS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
