"""Experiment (issue 3): the raw early exit as a self-draft, so that it can be built and benched.

The raw early exit drafts with h_l straight into the target's final norm and LM head. That is an
attention-only adapter whose output projection is zero: the residual passes h_l through unchanged
and the adapter's output norm is the target's. This writes such an adapter directory (full
vocabulary head, nothing trained), which `specexport build --adapter DIR` takes like any other:

    .venv/bin/python tools/experiments/raw_exit_adapter.py --exit-layer 2 --out .cache/variants/raw-l2
    .venv/bin/specexport build --adapter .cache/variants/raw-l2 --drafter none --out bundles/raw-l2

Nothing here ships: it gives the variant table's first row a tau and a speedup.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from specexport.exporter import model_source
from specexport.exporter.hf_weights import dims_of
from specexport.exporter.recipe import load_recipe
from specexport.exporter.training.adapter import Adapter, AdapterConfig
from specexport.exporter.training.fit_adapter import save_adapter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exit-layer", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    src = load_recipe(None)["source"]
    source = model_source.resolve(model_source.default_model_file(src["package"], src["version"], src["file"]))
    model, _ = model_source.load_model(source.checkpoint)
    rotary = model.model.rotary_emb
    adapter = Adapter(AdapterConfig.for_target(dims_of(model.config, 16), args.exit_layer, "attention"),
                      rotary.inv_freq.numpy(), float(getattr(rotary, "attention_scaling", 1.0)))
    adapter.init_from_target(model)
    with torch.no_grad():
        adapter.o_proj.weight.zero_()
        h = torch.randn(1, 5, adapter.cfg.hidden)
        # the whole point: the adapter's output is exactly the raw exit's normed state
        assert torch.allclose(adapter.hidden(h), model.model.norm(h), atol=1e-5)
    args.out.mkdir(parents=True, exist_ok=True)
    save_adapter(adapter, args.out, {
        "target_sha256": source.origin_sha256, "exit_layer": args.exit_layer, "arch": "attention",
        "draft_vocab": None, "command": f"tools/experiments/raw_exit_adapter.py --exit-layer {args.exit_layer}",
        "note": "the raw early exit (zero output projection), not trained",
    })
    print(f"wrote {args.out}: the raw early exit at l={args.exit_layer} as an adapter")


if __name__ == "__main__":
    main()
