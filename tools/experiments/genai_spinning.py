"""ONNX Runtime GenAI with its decoder's idle intra-op threads spinning (its default) and not spinning (as
specexport's sessions run), side by side: tokens per wall second and per CPU second of this process, one request
at a time (Generator) and a static batch of all prompts (Engine), the two settings taking turns round by round.

    .venv-genai/bin/python tools/experiments/genai_spinning.py .cache/ortgenai/<model dir> --threads 2 --rounds 3

Runs in the GenAI interpreter alone (onnxruntime_genai and the standard library). The prompts are plain text
through GenAI's tokenizer: what is compared is the thread setting, on the same requests.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

PROMPTS = ["Explain how a hash table works.", "Write a haiku about the sea.", "List three uses of copper.",
           "Why is the sky blue?"]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def open_model(og, model_dir: str, threads: int, spinning: bool, batch: int):
    config = og.Config(model_dir)
    config.overlay(json.dumps({
        "model": {"decoder": {"session_options": {"intra_op_num_threads": threads,
                                                  "session.intra_op.allow_spinning": "1" if spinning else "0"}}},
        "engine": {"static_batching": {"max_batch_size": batch}}}))
    return og.Model(config)


def one_at_a_time(og, model, prompts: list[list[int]], n: int) -> int:
    made = 0
    for ids in prompts:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + n, min_length=0)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        for _ in range(n):
            if generator.is_done():
                break
            generator.generate_next_token()
            made += 1
    return made


def batched(og, model, prompts: list[list[int]], n: int) -> int:
    engine = og.Engine(model)
    requests = []
    for ids in prompts:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_do_sample(False)
        options.set_max_generated_tokens(n)
        request.begin_turn(ids, options)
        requests.append(request)
    buffer, token = engine.create_event_buffer(64), og.EngineEventFlags.TOKEN.value
    made = 0
    while engine.has_pending_requests():
        made += sum(1 for event in engine.run(buffer) if event.flags.value & token)
    return made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    import onnxruntime_genai as og

    models = {spin: open_model(og, args.model_dir, args.threads, spin, len(PROMPTS)) for spin in (True, False)}
    tokenizer = og.Tokenizer(models[True])
    prompts = [[int(t) for t in tokenizer.encode(p)] for p in PROMPTS]
    figures: dict[tuple[bool, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for spin in (True, False) if r % 2 == 0 else (False, True):  # alternate who goes first
            for name, run in (("one at a time", one_at_a_time), (f"batch of {len(PROMPTS)}", batched)):
                t0, c0 = time.perf_counter(), cpu_s()
                made = run(og, models[spin], prompts, args.tokens)
                wall, cpu = time.perf_counter() - t0, cpu_s() - c0
                figures.setdefault((spin, name), []).append((made / wall, made / cpu))
                print(f"round {r} spinning {'on ' if spin else 'off'} {name}: {made / wall:.1f} tokens/s,"
                      f" {made / cpu:.1f} per CPU s", flush=True)
    print("\n| GenAI decoder | tokens/s (median) | per CPU s (median) |\n|---|---|---|")
    for (spin, name), runs in figures.items():
        print(f"| spinning {'on' if spin else 'off'}, {name} | {statistics.median(w for w, _ in runs):.1f} |"
              f" {statistics.median(c for _, c in runs):.1f} |")


if __name__ == "__main__":
    main()
