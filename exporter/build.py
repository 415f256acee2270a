"""`specexport build`: model -> pieces -> parity check -> bundle."""

from __future__ import annotations

import datetime
import platform
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..runtime.errors import SpecExportError
from . import llama_graph, model_source, parity
from .bundle import BundleWriter
from .chat import render_chat
from .hf_weights import extract
from .onnx_builder import OPSET
from .recipe import load_recipe, with_overrides

PRECISIONS = {"fp32": np.float32}


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("specexport", "torch", "transformers", "onnx", "onnxruntime", "tokenizers", "gguf"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def _reference(model, exit_layer: int, adapter=None, vocab_map: np.ndarray | None = None):
    import torch

    def run(seq: list[int]) -> dict:
        with torch.inference_mode():
            out = model(torch.tensor([seq]), output_hidden_states=True)
            ref = {"input_ids": np.asarray([seq], dtype=np.int64),
                   "h_exit": out.hidden_states[exit_layer].numpy(), "logits": out.logits.numpy()}
            if adapter is not None:
                y = adapter.hidden(out.hidden_states[exit_layer])
                head = model.lm_head.weight if vocab_map is None else model.lm_head.weight[vocab_map]
                ref["adapter_logits"] = (y @ head.T).numpy()
        return ref

    return run


def parity_sequences(tokenizer, vocab: int, context: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, vocab, size=24).tolist()]
    for prompt in parity.PARITY_PROMPTS:
        text = prompt
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
        seqs.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return [s[:context] for s in seqs]


def build_bundle(out: Path, recipe: str | None = None, model: str | None = None, exit_layer: int | None = None,
                 context: int | None = None, flavour: str | None = None, force: bool = False,
                 adapter: str | None = None, command: str = "") -> dict:
    """Build a bundle at `out`. `adapter`: 'auto' (shipped, cached or freshly trained), 'none',
    'untrained' (tests only) or a trained adapter directory."""
    cfg = with_overrides(load_recipe(recipe), exit_layer=exit_layer, context=context, flavour=flavour)
    exp = cfg["export"]
    flavour, precision = exp.get("flavour", "ort"), exp.get("precision", "fp32")
    if flavour not in llama_graph.FLAVOURS:
        raise SpecExportError(f"unknown graph flavour {flavour!r}; use one of {', '.join(llama_graph.FLAVOURS)}")
    if precision not in PRECISIONS:
        raise SpecExportError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    context = int(exp.get("context", 2048))
    stages = tqdm(total=6, desc="build", unit="stage", file=sys.stderr, disable=None)

    def stage(name: str) -> None:
        stages.set_postfix_str(name)

    with BundleWriter(Path(out), force=force) as writer:
        stage("locating model")
        if model is None:
            src = cfg.get("source")
            if not src:
                raise SpecExportError(f"recipe {cfg['name']} names no source model; pass --model")
            source = model_source.resolve(model_source.default_model_file(src["package"], src["version"],
                                                                          src["file"]))
        else:
            source = model_source.resolve(model)
        stage("loading model")
        torch_model, tokenizer = model_source.load_model(source.checkpoint)
        stages.update()
        weights = extract(torch_model, context)
        dims = weights.dims
        ell = int(exp.get("exit_layer", 2))
        if not 1 <= ell <= dims.layers - 1:
            raise SpecExportError(f"exit layer {ell} is outside 1..{dims.layers - 1} for this"
                                  f" {dims.layers}-layer model")
        dtype = PRECISIONS[precision]

        stage("exporting shallow")
        shallow = llama_graph.build_shallow(dims, weights.rope, weights.embed, weights.layers[:ell], flavour, dtype)
        writer.add_piece("shallow", shallow, flavour, layers=[0, ell])
        del shallow
        stages.update()
        stage("exporting deep")
        deep = llama_graph.build_deep(dims, weights.rope, weights.layers[ell:], weights.final_norm,
                                      weights.lm_head, flavour, dtype)
        writer.add_piece("deep", deep, flavour, layers=[ell, dims.layers])
        del deep
        stages.update()

        stage("adapter")
        from .adapter_source import resolve_adapter
        from .train_adapter import pruned_vocab

        adapter_module, adapter_meta = resolve_adapter(adapter, torch_model, source.checkpoint,
                                                       source.origin_sha256, cfg, ell)
        vocab_map = None
        if adapter_module is not None:
            adapter_w, adapter_mlp = adapter_module.graph_weights()
            # an adapter trained on a pruned head keeps that head; the recipe may prune an untrained-for one
            size = adapter_meta.get("draft_vocab") or cfg.get("adapter", {}).get("draft_vocab")
            vocab_map = pruned_vocab(adapter_meta.get("token_counts"), size)
            graph = llama_graph.build_adapter(dims, weights.rope, adapter_w, weights.lm_head, flavour, dtype,
                                              mlp=adapter_mlp, vocab_map=vocab_map)
            summary = {k: adapter_meta.get(k) for k in ("source", "arch", "heldout", "raw_exit_agreement")}
            extra = {}
            if vocab_map is not None:
                np.save(writer.tmp / "draft_vocab.npy", vocab_map)
                extra["draft_vocab"] = {"file": "draft_vocab.npy", "size": len(vocab_map),
                                        "note": "FR-Spec: the head keeps these token ids (ascending);"
                                                " logits are in this order, top_token is a real id"}
            writer.add_piece("adapter", graph, flavour, layers=None, exit_layer=ell, training=summary, **extra)
        stages.update()

        stage("checking parity")
        checks = [
            parity.PieceCheck("shallow", lambda r: r["input_ids"], {"hidden": "h_exit"}),
            parity.PieceCheck("deep", lambda r: r["h_exit"], {"logits": "logits"}),
        ]
        if adapter_module is not None:
            checks.append(parity.PieceCheck("adapter", lambda r: r["h_exit"], {"logits": "adapter_logits"}))
        report = parity.run_checks(writer.tmp, writer.pieces, checks, parity_sequences(tokenizer, dims.vocab, context),
                                   _reference(torch_model, ell, adapter_module, vocab_map), precision, context)
        for name, result in report.items():
            writer.pieces[name]["parity"] = result
        stages.update()

        stage("writing bundle")
        tokenizer.save_pretrained(writer.tmp / "tokenizer")
        tok_file = writer.add_file(writer.tmp / "tokenizer" / "tokenizer.json")
        import shutil

        shutil.rmtree(writer.tmp / "tokenizer")
        eos = torch_model.generation_config.eos_token_id
        eos_ids = sorted({*(eos if isinstance(eos, list) else [eos] if eos is not None else []),
                          *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})
        manifest = {
            "name": cfg.get("name", Path(out).name),
            "model": {"architecture": torch_model.config.model_type, "dims": dims.as_dict(), "exit_layer": ell,
                      "bos_token_id": tokenizer.bos_token_id, "eos_token_ids": eos_ids},
            "graph": {"flavour": flavour, "opset": OPSET, "precision": precision,
                      "opset_note": "opset 17: parsed by TensorRT 10.3 (JetPack 6) and later"},
            "tokenizer": {"file": tok_file, "eos_token_ids": eos_ids, "chat": render_chat(tokenizer),
                          "chat_template": getattr(tokenizer, "chat_template", None)},
            "generation": cfg["generation"],
            "speculative": cfg["speculative"],
            "tensorrt": {"engines": []},
            "provenance": {
                "source": str(source.origin), "source_sha256": source.origin_sha256,
                "source_description": source.description, "checkpoint": str(source.checkpoint),
                "recipe": cfg["path"], "versions": versions(), "command": command,
                "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            },
        }
        manifest = writer.commit(manifest)
        stages.update()
        stages.close()
    return manifest
