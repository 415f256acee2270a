"""The three draft heads on equal data: held-out first-draft agreement as a curve over training tokens.

The adapter, the Spec-Drafter and the feature-level head each train on the same self-distilled corpus
(`specexport distill`'s: the shipped prompts' responses, then the target's own Magpie requests'), with the same
held-out sequences (one seed, one split), the same optimizer steps and tokens per step; each evaluates every
`--steps / --points` steps. Writes OUT/curve.json and OUT/curve.md (the table BENCHMARKS.md quotes) and the
three trained directories (OUT/adapter, OUT/drafter, OUT/head), which `specexport build --adapter/--drafter/--head`
take.

    .venv/bin/python tools/experiments/heads_curve.py --tokens 200000 --steps 400 --out reports/heads-curve
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from specexport.exporter import model_source
from specexport.exporter.recipe import load_recipe
from specexport.exporter.training.adapter_source import train_settings
from specexport.exporter.training.commands import drafter_settings, head_settings
from specexport.exporter.training.corpus import CorpusSettings, corpus_sequences
from specexport.exporter.training.fit_adapter import TrainConfig, train
from specexport.exporter.training.fit_drafter import train_drafter
from specexport.exporter.training.fit_head import train_head


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, required=True, help="response tokens of the corpus to train on")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--points", type=int, default=5, help="evaluations along the way")
    ap.add_argument("--pieces", default="adapter,drafter,head")
    ap.add_argument("--model", default=None, help="target (default: the recipe's)")
    ap.add_argument("--exit-layer", type=int, default=None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = load_recipe(None)
    source = model_source.resolve(args.model or model_source.recipe_model_file(recipe["source"]))
    exit_layer = args.exit_layer or int(recipe["export"].get("exit_layer", 2))
    max_new = int(recipe["adapter"]["train"].get("max_new_tokens", 128))
    sequences = corpus_sequences(source.checkpoint, source.origin_sha256, args.tokens,
                                 CorpusSettings(max_new_tokens=max_new), device=args.device)
    model, _ = model_source.load_model(source.checkpoint)
    common = {"steps": args.steps, "tokens_per_batch": args.tokens_per_batch,
              "eval_every": max(1, args.steps // args.points)}
    data = f"{len(sequences)} sequences, {sum(len(s) - p for s, p in sequences)} response tokens"
    results = {}
    for piece in args.pieces.split(","):
        out = args.out / piece
        if piece == "adapter":
            settings = {**train_settings(recipe), **common, "exit_layer": exit_layer}
            fields = TrainConfig.__dataclass_fields__
            meta = train(model, sequences, TrainConfig(**{k: v for k, v in settings.items() if k in fields}), out,
                         source.origin_sha256, data=data, device=args.device)
        elif piece == "drafter":
            _, cfg = drafter_settings(recipe, {**common, "threads": args.threads})
            meta = train_drafter(model, sequences, cfg, out, source.origin_sha256, feature_layer=exit_layer,
                                 data=data, device=args.device)
        else:
            _, cfg = head_settings(recipe, {**common, "exit_layer": exit_layer, "threads": args.threads})
            meta = train_head(model, sequences, cfg, out, source.origin_sha256, data=data, device=args.device)
        results[piece] = [{"step": h["step"], "train_tokens": h.get("train_tokens", 0),
                           "agreement": h["eval"]["agreement"],
                           **({"by_position": h["eval"]["agreement_by_position"],
                               "chain_tokens_per_step": h["eval"]["chain_tokens_per_step"]}
                              if "agreement_by_position" in h["eval"] else {})} for h in meta["history"]]
        results[piece + "_seconds"] = meta.get("train_seconds")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "curve.json").write_text(json.dumps({"data": data, "args": {k: str(v) for k, v in vars(args).items()},
                                                     "curves": results}, indent=2) + "\n")
    pieces = args.pieces.split(",")
    lines = [f"Data: {data}; {args.steps} steps of {args.tokens_per_batch} tokens each.", "",
             "| step | training tokens | " + " | ".join(f"{p} first draft" for p in pieces) + " |",
             "|---|---|" + "---|" * len(pieces)]
    for i, row in enumerate(results[pieces[0]]):
        cells = [f"{results[p][i]['agreement']:.1%}" if i < len(results[p]) else "" for p in pieces]
        lines.append(f"| {row['step']} | {row['train_tokens']} | " + " | ".join(cells) + " |")
    if "head" in results:
        last = results["head"][-1]
        lines += ["", "Head, held-out agreement by draft position: " + ", ".join(f"{a:.1%}" for a in
                  last["by_position"]) + f"; a chain of {len(last['by_position'])} drafts: "
                  f"{last['chain_tokens_per_step']:.2f} tokens a step."]
    (args.out / "curve.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
