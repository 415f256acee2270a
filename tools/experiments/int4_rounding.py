"""How far int4 rounding moves a model's logits, matrix group by matrix group, and whether the int4 `deep`
piece computes what PyTorch computes with the same rounded weights.

    # PyTorch only: every Linear rounded as `build --precision int4` rounds it, one group of matrices at a
    # time (all, the LM head, attention, MLP, each projection, each layer), on the build's parity inputs
    # with and without the BOS; max |logits - fp32| / max |fp32| and the share of fp32 top-1 tokens kept
    .venv/bin/python tools/experiments/int4_rounding.py groups CHECKPOINT
    # ONNX Runtime: the int4 deep piece built in memory, fed the fp32 model's exit-layer hidden states, against
    # the fp32 logits and against PyTorch running the same rounded weights from the exit layer on
    .venv/bin/python tools/experiments/int4_rounding.py deep CHECKPOINT --exit-layer 3

CHECKPOINT is a converted checkpoint directory ($SPECEXPORT_CACHE/models/<sha>). Written for Gemma 3 270M
(BENCHMARKS.md, 2026-11-25, "Gemma 3 270M at int4"); any model the exporter takes works.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from specexport.exporter import llama_graph, model_source, parity, quantize
from specexport.exporter.bundle import BundleWriter
from specexport.exporter.hf_weights import extract
from specexport.runtime.backends.ort import OrtPiece

CONTEXT = 512  # the parity inputs are short; the RoPE tables need not be the recipe's length


def inputs(tokenizer, vocab: int) -> dict[str, list[int]]:
    """The build's random sequence (same seed) and its prompts, as plain text and with the tokenizer's
    special tokens (a BOS where the tokenizer adds one)."""
    seqs = {"random": np.random.default_rng(0).integers(0, vocab, size=24).tolist()}
    for prompt in parity.PARITY_PROMPTS:
        seqs[f"plain: {prompt[:14]}"] = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        seqs[f"special: {prompt[:14]}"] = tokenizer(prompt)["input_ids"]
    return seqs


def logits(model, seq: list[int]) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.tensor([seq])).logits.numpy()


def cell(got: np.ndarray, want: np.ndarray) -> str:
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    return f"{parity.relative_error(got, want):.2f} / {top1:.2f}"


def groups(args) -> None:
    model, tokenizer = model_source.load_model(Path(args.checkpoint))
    spec = quantize.spec_for("int4")
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    # a tied head is untied so rounding it leaves the embedding (a Gather, fp32 in the graphs) alone
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone(), requires_grad=False)
    exact = {n: m.weight.detach().clone() for n, m in linears.items()}
    rounded = {n: torch.from_numpy(quantize.fake_quantize(w.numpy().T, spec).T.copy()) for n, w in exact.items()}
    seqs = inputs(tokenizer, model.config.vocab_size)
    want = {k: logits(model, s) for k, s in seqs.items()}
    chosen = {"all": set(linears), "lm_head": {"lm_head"}, "attention": {n for n in linears if ".self_attn." in n},
              "mlp": {n for n in linears if ".mlp." in n}}
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        chosen[proj] = {n for n in linears if n.endswith(proj)}
    for i in range(model.config.num_hidden_layers):
        chosen[f"layer {i}"] = {n for n in linears if f".layers.{i}." in n}
    print("| rounded | " + " | ".join(seqs) + " |")
    print("|---" * (len(seqs) + 1) + "|")
    for name, names in chosen.items():
        for n, m in linears.items():
            m.weight.data = rounded[n] if n in names else exact[n]
        row = [cell(logits(model, s), want[k]) for k, s in seqs.items()]
        print(f"| {name} | " + " | ".join(row) + " |", flush=True)


def deep(args) -> None:
    model, tokenizer = model_source.load_model(Path(args.checkpoint))
    spec = quantize.spec_for("int4")
    ell = args.exit_layer
    w = extract(model, CONTEXT)
    graph = llama_graph.build_deep(w.dims, w.rope, w.layers[ell:], w.final_norm, w.lm_head, "ort", np.float32,
                                   w.arch)
    graph, _ = quantize.quantize_model(graph, spec)
    rounded = copy.deepcopy(model)
    quantize.fake_quantize_torch(rounded, spec)
    with tempfile.TemporaryDirectory() as tmp, BundleWriter(Path(tmp) / "deep") as writer:
        piece_spec = writer.add_piece("deep", graph, "ort", layers=[ell, w.dims.layers])
        del graph
        piece = OrtPiece("deep", writer.tmp / piece_spec.file, piece_spec, CONTEXT, ["CPUExecutionProvider"], None)
        print("| input | ORT vs fp32 | PyTorch rounded from the exit layer vs fp32 | ORT vs PyTorch rounded |")
        print("|---|---|---|---|")
        for name, seq in inputs(tokenizer, model.config.vocab_size).items():
            with torch.inference_mode():
                out = model(torch.tensor([seq]), output_hidden_states=True)
            h, want = out.hidden_states[ell].numpy(), out.logits.numpy()
            # the rounded model from the exit layer on: its layer ell - 1 hands on the fp32 model's state
            hook = rounded.model.layers[ell - 1].register_forward_hook(lambda m, i, o, h=h: torch.from_numpy(h))
            try:
                same_weights = logits(rounded, seq)
            finally:
                hook.remove()
            cut = max(1, len(seq) // 2)  # prefill, then continuation against the cache, as the build checks
            got = np.concatenate([piece.run(h[:, lo:hi], lo, keep=hi - lo)["logits"]
                                  for lo, hi in ((0, cut), (cut, len(seq)))], axis=1)
            print(f"| {name} | {cell(got, want)} | {cell(same_weights, want)} | {cell(got, same_weights)} |",
                  flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("groups")
    g.add_argument("checkpoint")
    d = sub.add_parser("deep")
    d.add_argument("checkpoint")
    d.add_argument("--exit-layer", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    {"groups": groups, "deep": deep}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
