"""More self-distillation data, faster: the target's responses generated 32 at a time by ONNX Runtime
GenAI (fp32: the model `make bench-env` converts for the bench baseline), written as the shards
exporter/distill_data.py writes, so `specexport train-drafter --extra-data DIR` reads them.

Why: the drafter and the adapter are data-bound (recipes/smollm2-135m.toml), and transformers' batched
generate makes ~65 response tokens/s on this 2-core machine, GenAI here ~170-250. Three subcommands,
two interpreters (G = .cache/ortgenai/<the fp32 model>, D = .cache/gen):

    # the chat-templated prompts not in the recipe's 2,400, and the template around a user's turn
    .venv/bin/python tools/experiments/genai_distill.py tokenize --start 2400 --out D/rest
    # the target's greedy responses to them (--temperature > 0 samples instead)
    .venv-genai/bin/python tools/experiments/genai_distill.py generate --genai-model G \
        --prompts D/rest/prompts.npz --out D/rest/greedy
    # Magpie: 1,536 requests the target writes itself, then its greedy responses to them
    .venv-genai/bin/python tools/experiments/genai_distill.py queries --genai-model G \
        --template D/rest/template.npz --out D/magpie --count 1536 --seed 1
    .venv-genai/bin/python tools/experiments/genai_distill.py generate --genai-model G \
        --prompts D/magpie/prompts.npz --out D/magpie/greedy
    # requests that quote a document (summarize, extract, rewrite...), the documents being the target's own
    # training-only responses, then its greedy responses: text that copies from its prompt
    .venv/bin/python tools/experiments/genai_distill.py copying --docs D/rest/greedy --docs D/magpie/greedy \
        --out D/copying --count 1024 --seed 1
    .venv-genai/bin/python tools/experiments/genai_distill.py generate --genai-model G \
        --prompts D/copying/prompts.npz --out D/copying/greedy --tolerance 16

The teacher's labels are recomputed by transformers on whatever sequences come out (train-drafter's
features), so a filler newline, a sampled token or a numerical difference between GenAI and transformers
changes which text the drafter sees, never what it is taught at a position. Unpadded greedy rows equal
transformers' greedy responses token for token (15 of 15 checked against the recipe's shards).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import numpy as np

SHARD = 256
BATCH = 32  # onnxruntime-genai's batch limit for this model


def _default_target():
    """(model, tokenizer) of the default recipe's target, as `specexport build` finds it."""
    from specexport.exporter import model_source
    from specexport.exporter.recipe import load_recipe

    src = load_recipe(None)["source"]
    source = model_source.resolve(model_source.default_model_file(src["package"], src["version"], src["file"]))
    return model_source.load_model(source.checkpoint)


def tokenize(args) -> None:
    from specexport.exporter.recipe import recipes_dir
    from specexport.exporter.training.distill_data import chat_text, eos_token_ids, read_prompts

    model, tokenizer = _default_target()
    prompts = read_prompts(recipes_dir() / "data" / "train_prompts.jsonl")[args.start:args.stop]
    ids = [tokenizer(chat_text(tokenizer, p["prompt"]), add_special_tokens=False)["input_ids"] for p in prompts]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    marker = "\u2063QUERY\u2063"
    before, after = chat_text(tokenizer, marker).split(marker)
    ids_of = lambda text: np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)  # noqa: E731
    np.savez(out / "template.npz", before=ids_of(before), after=ids_of(after),
             eos=np.array(sorted(eos_token_ids(model, tokenizer)), np.int32))
    _save_prompts(out / "prompts.npz", ids, [p["id"] for p in prompts], sorted(eos_token_ids(model, tokenizer)))
    print(f"{len(ids)} prompts, {sum(map(len, ids))} tokens -> {out / 'prompts.npz'}")


# Spec-Bench's copying categories ask this of a passage (summarization, extraction, rag); its questions are
# never read here
COPY_REQUESTS = (
    "Summarize the following text in a few sentences.\n\n{doc}",
    "{doc}\n\nSummarize the text above.",
    "Extract the main points of the following text as a bulleted list.\n\n{doc}",
    "Read the passage and say what it is mainly about, quoting it where you can.\n\nPassage:\n{doc}",
    "Rewrite the following text, fixing any mistakes and keeping its wording otherwise.\n\n{doc}",
    "Here is a document:\n{doc}\n\nUsing only the document, list the terms it explains and what it says"
    " about each.",
    "Repeat the first paragraph of the following text word for word.\n\n{doc}",
    "{doc}\n\nBased on the text above, write a short title and a one-paragraph abstract.",
)


def copying(args) -> None:
    """Requests about a document made of one to three of the target's own training-only responses."""
    from specexport.exporter.training.distill_data import chat_text, eos_token_ids, load_records

    model, tokenizer = _default_target()
    docs = [tokenizer.decode(tokens[plen:].tolist(), skip_special_tokens=True).strip()
            for d in args.docs for _, tokens, plen in load_records(d)]
    docs = [d for d in docs if len(d) > 200]
    rng = np.random.default_rng(args.seed)
    ids, names = [], []
    while len(ids) < args.count:
        doc = "\n\n".join(docs[i] for i in rng.choice(len(docs), size=int(rng.integers(1, 4)), replace=False))
        request = COPY_REQUESTS[int(rng.integers(len(COPY_REQUESTS)))].format(doc=doc)
        prompt = tokenizer(chat_text(tokenizer, request), add_special_tokens=False)["input_ids"]
        if len(prompt) <= args.max_prompt_tokens:
            ids.append(prompt)
            names.append(f"copy-s{args.seed}-{len(names):05d}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _save_prompts(out / "prompts.npz", ids, names, sorted(eos_token_ids(model, tokenizer)))
    print(f"{len(ids)} requests, {sum(map(len, ids))} tokens -> {out / 'prompts.npz'}")


def _distill_data():
    """exporter/distill_data.py, the shard format's own module, loaded by path: the GenAI interpreter has
    numpy (all that module imports) but not specexport."""
    path = Path(__file__).resolve().parents[2] / "exporter" / "distill_data.py"
    spec = importlib.util.spec_from_file_location("distill_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _save_prompts(path: Path, prompts: list, ids: list[str], eos: np.ndarray) -> None:
    np.savez(path, tokens=np.concatenate([np.asarray(p, np.int32) for p in prompts]),
             offsets=np.cumsum([0] + [len(p) for p in prompts]).astype(np.int64), ids=np.array(ids),
             eos=np.asarray(eos, np.int32))


def _run(og, model, batch: np.ndarray, **options) -> list[np.ndarray]:
    """One GenAI generation of a batch of equal-length rows; every row's tokens after the prompt."""
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=len(batch), **options)
    gen = og.Generator(model, params)
    gen.append_tokens(batch)
    while not gen.is_done():
        gen.generate_next_token()
    return [np.asarray(gen.get_sequence(r))[batch.shape[1]:] for r in range(len(batch))]


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
    dd = _distill_data()
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
            sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p,
                            random_seed=args.seed * 100003 + index * 64 + b) if args.temperature > 0 else \
                dict(do_sample=False)
            for r, tokens in enumerate(_run(og, model, batch, max_length=width + args.max_new_tokens, **sampling)):
                resp = dd.cut_after_eos(tokens.tolist(), eos)
                records.append((str(names[rows[r]]), batch[r].tolist() + resp, width))
                made += len(resp)
            bar.update(len(rows))
            bar.set_postfix(resp_tok_s=f"{made / (time.perf_counter() - start):.0f}")
        dd.write_shard(path, records)
        bar.write(f"{path.name}: {made} response tokens, {made / (time.perf_counter() - start):.0f} tok/s")
    bar.close()


def queries(args) -> None:
    """Magpie (Xu et al., 2024): an instruct model fed only the chat template up to the user's turn writes
    a user's request itself. Sampling many gives prompts in the model's own idea of what users ask,
    far more varied than the shipped prompt set, at no cost but generation."""
    import onnxruntime_genai as og
    from tqdm import tqdm

    t = np.load(args.template)
    before, after, eos = t["before"], t["after"], set(t["eos"].tolist())
    model = og.Model(og.Config(str(Path(args.genai_model).resolve())))
    kept: list[np.ndarray] = []
    bar = tqdm(total=args.count, unit="query", dynamic_ncols=True, mininterval=10.0)
    b = 0
    dd = _distill_data()
    while len(kept) < args.count:
        rows = _run(og, model, np.tile(before, (BATCH, 1)).astype(np.int32),  # one length: no padding
                    do_sample=True, temperature=args.temperature, top_p=args.top_p, random_seed=args.seed * 100003 + b,
                    max_length=len(before) + args.max_query_tokens)
        for tokens in rows:
            q = dd.cut_after_eos(tokens.tolist(), eos)
            # a request that never ended, or a near-empty one, is not a prompt
            if q and q[-1] in eos and len(q) - 1 >= 4 and len(kept) < args.count:
                kept.append(np.concatenate([before, np.asarray(q[:-1], np.int32), after]))
                bar.update()
        b += 1
    bar.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _save_prompts(out / "prompts.npz", kept, [f"magpie-s{args.seed}-{i:05d}" for i in range(len(kept))], t["eos"])
    print(f"{len(kept)} requests from {b * BATCH} samples -> {out / 'prompts.npz'}")


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
    q = sub.add_parser("queries")
    q.add_argument("--genai-model", required=True)
    q.add_argument("--template", required=True, help="template.npz written by `tokenize`")
    q.add_argument("--out", required=True)
    q.add_argument("--count", type=int, default=2048)
    q.add_argument("--max-query-tokens", type=int, default=96)
    q.add_argument("--temperature", type=float, default=1.0)
    q.add_argument("--top-p", type=float, default=1.0)
    q.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("copying")
    c.add_argument("--docs", action="append", required=True, help="shard directories whose responses are documents")
    c.add_argument("--out", required=True)
    c.add_argument("--count", type=int, default=1024)
    c.add_argument("--max-prompt-tokens", type=int, default=800)
    c.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    {"tokenize": tokenize, "generate": generate, "queries": queries, "copying": copying}[args.cmd](args)


if __name__ == "__main__":
    main()
