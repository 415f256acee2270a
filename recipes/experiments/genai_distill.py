"""More self-distillation data, faster: the target's responses generated 32 at a time by ONNX Runtime
GenAI (fp32: the model `make bench-env` converts for the bench baseline), written as the shards
exporter/distill_data.py writes, so `specexport train-drafter --extra-data DIR` reads them.

Why: the drafter and the adapter are data-bound (recipes/smollm2-135m.toml), and transformers' batched
generate makes ~65 response tokens/s on this 2-core machine. Two steps, two interpreters:

    # 1. chat-template the prompts with the exporter's tokenizer (the project's venv)
    .venv/bin/python recipes/experiments/genai_distill.py tokenize --start 2400 --out DIR
    # 2. generate with onnxruntime-genai (.venv-genai); --temperature 0 is greedy, > 0 samples
    .venv-genai/bin/python recipes/experiments/genai_distill.py generate --genai-model GENAI_DIR \
        --prompts DIR/prompts.npz --out DIR/greedy [--temperature 0.7 --seed 1] [--minutes 60]

The teacher's labels are recomputed by transformers on whatever sequences come out (train-drafter's
features), so a sampled response, or a numerical difference between GenAI and transformers, changes which
text the drafter sees, never what it is taught at a position.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

SHARD = 256
BATCH = 32  # onnxruntime-genai's batch limit for this model


def tokenize(args) -> None:
    from specexport.exporter import model_source
    from specexport.exporter.distill_data import _chat_text, _eos_ids, read_prompts
    from specexport.exporter.recipe import load_recipe, recipes_dir
    src = load_recipe(None)["source"]
    source = model_source.resolve(model_source.default_model_file(src["package"], src["version"], src["file"]))
    model, tokenizer = model_source.load_model(source.checkpoint)
    prompts = read_prompts(recipes_dir() / "data" / "train_prompts.jsonl")[args.start:args.stop]
    ids = [tokenizer(_chat_text(tokenizer, p["prompt"]), add_special_tokens=False)["input_ids"] for p in prompts]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "prompts.npz", tokens=np.concatenate([np.asarray(i, np.int32) for i in ids]),
             offsets=np.cumsum([0] + [len(i) for i in ids]).astype(np.int64),
             ids=np.array([p["id"] for p in prompts]), eos=np.array(sorted(_eos_ids(model, tokenizer)), np.int32))
    print(f"{len(ids)} prompts, {sum(map(len, ids))} tokens -> {out / 'prompts.npz'}")


def _cut(row: np.ndarray, eos: set[int]) -> list[int]:
    out = []
    for t in row.tolist():
        out.append(t)
        if t in eos:
            break
    return out


def _buckets(lengths: np.ndarray, tolerance: int) -> list[list[int]]:
    """Batches of up to BATCH prompts whose lengths differ by at most `tolerance` tokens, shortest first."""
    out: list[list[int]] = []
    for i in np.argsort(lengths, kind="stable").tolist():
        if not out or len(out[-1]) == BATCH or lengths[i] - lengths[out[-1][0]] > tolerance:
            out.append([])
        out[-1].append(i)
    return out


def generate(args) -> None:
    import onnxruntime_genai as og
    from tqdm import tqdm

    z = np.load(args.prompts)
    prompts = [z["tokens"][a:b] for a, b in zip(z["offsets"][:-1], z["offsets"][1:], strict=True)]
    names, eos = z["ids"], set(z["eos"].tolist())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").write_text(json.dumps({"prompts": str(args.prompts), "temperature": args.temperature,
                                               "top_p": args.top_p, "seed": args.seed, "pad": args.pad,
                                               "max_new_tokens": args.max_new_tokens, "engine": "onnxruntime-genai"}))
    # GenAI 0.18 garbles a left-padded row of this model (its pad positions are not masked: checked against
    # transformers), so a batch holds prompts of nearly equal length and the few missing tokens are real
    # newlines in front of the chat template, stored with the prompt: every sequence is exactly the one the
    # model continued
    buckets = _buckets(np.array([len(p) for p in prompts]), args.tolerance)
    shards = [buckets[i:i + SHARD // BATCH] for i in range(0, len(buckets), SHARD // BATCH)]
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    model = og.Model(og.Config(str(Path(args.genai_model).resolve())))
    bar = tqdm(total=len(prompts), unit="prompt", dynamic_ncols=True, mininterval=10.0)
    made, start = 0, time.perf_counter()
    for index, shard in enumerate(shards):
        path = out / f"shard_{index:05d}.npz"
        if path.exists():
            bar.update(sum(map(len, shard)))
            continue
        if deadline and time.monotonic() > deadline:
            break
        records = []
        for b, rows in enumerate(shard):
            width = max(len(prompts[i]) for i in rows)
            batch = np.array([np.concatenate([np.full(width - len(prompts[i]), args.pad, np.int32), prompts[i]])
                              for i in rows], np.int32)
            params = og.GeneratorParams(model)
            opts = dict(max_length=width + args.max_new_tokens, batch_size=len(rows))
            if args.temperature > 0:
                opts.update(do_sample=True, temperature=args.temperature, top_p=args.top_p,
                            random_seed=args.seed * 100003 + index * 64 + b)
            else:
                opts.update(do_sample=False)
            params.set_search_options(**opts)
            gen = og.Generator(model, params)
            gen.append_tokens(batch)
            while not gen.is_done():
                gen.generate_next_token()
            for r, i in enumerate(rows):
                resp = _cut(np.asarray(gen.get_sequence(r))[width:], eos)
                records.append((str(names[i]), batch[r].tolist() + resp, width))
                made += len(resp)
            del gen
            bar.update(len(rows))
            bar.set_postfix(resp_tok_s=f"{made / (time.perf_counter() - start):.0f}")
        tmp_path = out / f"partial_{index:05d}.npz"
        np.savez(tmp_path, tokens=np.concatenate([np.asarray(s, np.int32) for _, s, _ in records]),
                 offsets=np.cumsum([0] + [len(s) for _, s, _ in records]).astype(np.int64),
                 prompt_lens=np.array([n for _, _, n in records], np.int32),
                 ids=np.array([name for name, _, _ in records]))
        tmp_path.rename(path)
        bar.write(f"{path.name}: {made} response tokens, {made / (time.perf_counter() - start):.0f} tok/s")
    bar.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenize")
    t.add_argument("--start", type=int, default=0)
    t.add_argument("--stop", type=int, default=None)
    t.add_argument("--out", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--genai-model", required=True)
    g.add_argument("--prompts", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=0.9)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--pad", type=int, default=198, help="the filler token in front of shorter prompts (\\n)")
    g.add_argument("--tolerance", type=int, default=4, help="most filler tokens a prompt gets")
    g.add_argument("--minutes", type=float, default=0, help="stop starting shards after this long; 0 = all")
    args = ap.parse_args()
    tokenize(args) if args.cmd == "tokenize" else generate(args)


if __name__ == "__main__":
    main()
