"""`specexport build`: model -> pieces -> parity check -> bundle."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..runtime.errors import SpecExportError
from ..runtime.manifest import (
    GenerationDefaults,
    GraphInfo,
    ModelInfo,
    Provenance,
    SpeculativeDefaults,
    TensorRTSection,
    TokenizerInfo,
    read_record,
    sha256_file,
)
from . import (
    gated_silu,
    kv_cache,
    llama_graph,
    model_source,
    multirow,
    parity,
    quantize,
    row_attention,
    row_matmul,
    tied_rows,
)
from .bundle import BundleWriter
from .chat import chat_format
from .hf_weights import extract
from .onnx_builder import OPSET
from .recipe import load_recipe, with_overrides

# precision -> the float dtype of the graph; int8/int4 are fp32 graphs whose weight MatMuls become MatMulNBits
PRECISIONS = {"fp32": np.float32, "fp16": np.float16, "int8": np.float32, "int4": np.float32}
BACKENDS = ("onnxruntime", "tensorrt")
OPSET_NOTES = {OPSET: "opset 17: parsed by TensorRT 10.3 (JetPack 6) and later",
               19: "opset 19: ModelOpt's INT8 Q/DQ graphs, parsed by TensorRT 10.3 (JetPack 6) and later",
               21: "opset 21: ModelOpt's INT4 blocked DequantizeLinear, parsed by TensorRT 10.13 (JetPack 7) and later",
               24: "opset 24: TensorScatter cache writes, which TensorRT 10.15 and later update in place"}


def portable_command(command: str) -> str:
    """The command line as the manifest records it: a path outside the working directory by its name only,
    one inside it relative to it (a bundle carries no path of the build machine)."""
    def portable(arg: str) -> str:
        opt, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        if not os.path.isabs(value):
            return arg
        try:
            value = Path(value).relative_to(Path.cwd()).as_posix()
        except ValueError:
            value = Path(value).name
        return f"{opt}{eq}{value}"

    try:
        return shlex.join(portable(a) for a in shlex.split(command))
    except ValueError:  # unbalanced quotes: keep only the subcommand
        return " ".join(command.split()[:2])


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("specexport", "torch", "transformers", "onnx", "onnxruntime", "tokenizers", "gguf", "tensorrt",
                 "cuda-python"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def _reference(model, exit_layer: int, adapter=None, vocab_map: np.ndarray | None = None, drafter=None,
               drafter_vocab: np.ndarray | None = None, adapter_head=None, head=None,
               head_vocab: np.ndarray | None = None, head_lm=None, head_embed=None):
    """`adapter_head`, `head_lm`: the weight the adapter's and the draft head's LM heads hold, where it is not
    the model's (rounded at a drafting precision of their own); `head_embed` the head's token embedding."""
    import torch

    def run(seq: list[int]) -> dict:
        with torch.inference_mode():
            out = model(torch.tensor([seq]), output_hidden_states=True)
            ref = {"input_ids": np.asarray([seq], dtype=np.int64),
                   "h_exit": out.hidden_states[exit_layer].numpy(), "logits": out.logits.numpy()}
            if adapter is not None:
                y = adapter.hidden(out.hidden_states[exit_layer])
                lm = model.lm_head.weight if adapter_head is None else adapter_head
                lm = lm if vocab_map is None else lm[vocab_map]
                ref["adapter_logits"] = (y @ lm.T).numpy()
            if head is not None:  # the head reads the target's states; the parity run feeds it the same ones
                feats = torch.cat([out.hidden_states[i] for i in head.cfg.features], -1)
                ref["features"] = feats.numpy()
                embed = model.model.embed_tokens if head_embed is None else head_embed
                states = head(feats, embed(torch.tensor([seq])))
                lm = model.lm_head.weight if head_lm is None else head_lm
                lm = lm if head_vocab is None else lm[head_vocab]
                ref["head_state"] = states.numpy()
                ref["head_logits"] = (head.output_norm(states) @ lm.T).numpy()
            if drafter is not None:  # an independent model: it reads the token ids
                logits = drafter(torch.tensor([seq])).logits
                ref["drafter_logits"] = (logits if drafter_vocab is None else logits[..., drafter_vocab]).numpy()
        return ref

    return run


def _dequantized_reference(model, exit_layer: int, adapter, vocab_map: np.ndarray | None,
                           spec: quantize.QuantSpec | None, drafter=None, drafter_vocab: np.ndarray | None = None,
                           draft_spec: quantize.QuantSpec | None = None, head=None,
                           head_vocab: np.ndarray | None = None, rows: np.ndarray | None = None,
                           drafter_in_proj: np.ndarray | None = None):
    """PyTorch running the very weights the quantized graphs hold (rounded, back in fp32): what the
    quantized pieces must match closely, whatever the rounding did to the model's quality. `spec` rounds the
    model (None: a float bundle's model, kept), `draft_spec` the drafting pieces; `rows` are the token rows
    the pieces read from deep's LM head (exporter/tied_rows.py; None where each rounds a table of its own), and
    `drafter_in_proj` the P_in of a drafter that projects those rows in its graph."""
    import copy

    import torch

    def embed(embedding, own: quantize.QuantSpec | None) -> None:
        if rows is not None:
            embedding.weight = torch.nn.Parameter(torch.from_numpy(rows.copy()), requires_grad=False)
        elif own is not None:
            quantize.fake_quantize_embedding(embedding, own)

    dq_model = model
    if spec is not None:
        dq_model = copy.deepcopy(model)
        quantize.fake_quantize_torch(dq_model, spec, lm_head=dq_model.lm_head)
        embed(dq_model.model.embed_tokens, spec)
    dq_adapter = adapter_head = None
    if adapter is not None and draft_spec is not None:
        dq_adapter = copy.deepcopy(adapter)
        quantize.fake_quantize_torch(dq_adapter, draft_spec)
        lm = copy.deepcopy(model.lm_head)  # the adapter's graph holds the LM head rounded as it is rounded
        quantize.fake_quantize_torch(lm, draft_spec, lm_head=lm)
        adapter_head = lm.weight
    dq_head = head_lm = head_embed = None
    if head is not None:
        dq_head = head
        if draft_spec is not None:
            head_embed = copy.deepcopy(model.model.embed_tokens)  # the head's own copy, at its own precision
            embed(head_embed, draft_spec)
            dq_head = copy.deepcopy(head)
            quantize.fake_quantize_torch(dq_head, draft_spec)
            lm = copy.deepcopy(model.lm_head)
            quantize.fake_quantize_torch(lm, draft_spec, lm_head=lm)
            head_lm = lm.weight
    dq_drafter = None
    if drafter is not None and draft_spec is not None:
        dq_drafter = copy.deepcopy(drafter)
        quantize.fake_quantize_torch(dq_drafter, draft_spec, lm_head=dq_drafter.lm_head)
        if drafter_in_proj is not None and rows is not None:  # the target's rows, projected in the graph
            p_in = quantize.fake_quantize(drafter_in_proj.T, draft_spec)
            folded = torch.from_numpy(rows @ p_in)
            dq_drafter.model.embed_tokens.weight = torch.nn.Parameter(folded, requires_grad=False)
        else:
            quantize.fake_quantize_embedding(dq_drafter.model.embed_tokens, draft_spec)
    return _reference(dq_model, exit_layer, dq_adapter, vocab_map, dq_drafter, drafter_vocab, adapter_head, dq_head,
                      head_vocab, head_lm, head_embed)


def _gptq_rounded(model, tokenizer, source, cfg: dict, spec: quantize.QuantSpec, context: int) -> tuple:
    """A copy of the model GPTQ-rounded at `spec` (exporter/gptq.py) and the manifest's record of how."""
    from . import gptq

    sequences, what = _calibration_sequences(cfg, source, tokenizer, context, gptq.CALIBRATION_SEQUENCES)
    bar = tqdm(total=gptq.linear_count(model), desc="GPTQ", unit="matrix", file=sys.stderr, disable=None, leave=False)
    try:
        rounded = gptq.rounded_copy(model, sequences, spec, progress=bar.update)
    finally:
        bar.close()
    return rounded, {"method": "GPTQ (exporter/gptq.py), least-squares block scales", "set": what,
                     "tokens": sum(len(s) for s in sequences), "damping": gptq.DAMPING}


def _calibration_sequences(cfg: dict, source, tokenizer, context: int, count: int) -> tuple[list[list[int]], str]:
    """Token sequences to calibrate quantization on: the recipe's corpus when it was distilled from this checkpoint
    (the target's own greedy answers), else the chat-formatted training prompts; and what they are, in words."""
    from . import gptq

    corpus = None
    if cfg.get("corpus") and cfg.get("path"):
        from .training.corpus import recipe_corpus

        corpus = recipe_corpus(cfg, Path(cfg["path"]).parent)[0]
    sequences = gptq.corpus_calibration(corpus, source.origin_sha256, count=count)
    if sequences is not None:
        return sequences, (f"the first {len(sequences)} prompts and answers of {corpus.name} (the target's own greedy"
                           " answers)")
    from .training.adapter_source import training_prompts

    prompts = training_prompts(cfg.get("adapter", {}).get("train", {}))
    sequences = kv_cache.calibration_sequences(tokenizer, prompts, context)[:count]
    return sequences, f"{len(sequences)} chat-formatted training prompts (no corpus distilled from this model)"


def _modelopt_pieces(writer, tool, how, cfg: dict, source, tokenizer, context: int) -> int:
    """The fp16 pieces in `writer` quantized by ModelOpt (exporter/tensorrt/quantize_pieces.py) in place; returns
    the opset the quantized graphs are at."""
    from .tensorrt import quantize_pieces

    sequences, what = _calibration_sequences(cfg, source, tokenizer, context,
                                             how.sequences + quantize_pieces.HELD_OUT)
    windows = quantize_pieces.calibration_windows(sequences, how.sequences + quantize_pieces.HELD_OUT, how.length)
    if len(windows) <= quantize_pieces.HELD_OUT:
        raise SpecExportError(f"ModelOpt needs more than {quantize_pieces.HELD_OUT} calibration sequences and the"
                              f" recipe gives {len(windows)}; add training prompts or a corpus")
    calibration, held_out = windows[:-quantize_pieces.HELD_OUT], windows[-quantize_pieces.HELD_OUT:]
    what = f"{len(calibration)} windows of {calibration.shape[1]} tokens from {what}"
    names = [n for n in quantize_pieces.QUANTIZED if n in writer.pieces]
    bar = tqdm(total=len(names), desc=f"ModelOpt {how.precision}", unit="piece", file=sys.stderr, disable=None,
               leave=False)
    try:
        done = quantize_pieces.quantize_all(writer.tmp, writer.pieces, tool, how, calibration, held_out, what,
                                            progress=bar.update)
    finally:
        bar.close()
    import onnx

    opset = 0
    for name, (path, record) in done.items():
        model = onnx.load(str(path))
        opset = max(opset, *(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")))
        writer.replace_graph(name, model, quantization=record)
        del model
    import shutil

    shutil.rmtree(writer.tmp / ".modelopt")
    return opset


def _check_precision(precision: str | None, flavour: str | None, backend: str | None, target: str | None) -> None:
    """Refuses a precision the backend cannot build, before anything is written: for TensorRT, one its target's
    TensorRT lacks; for ONNX Runtime, quantized weights outside the ort flavour (MatMulNBits)."""
    if backend == "tensorrt" or target:
        if precision is not None:
            from .tensorrt.targets import load_target, require_precision

            require_precision(load_target(target or "orin-nano"), precision)
        return
    if precision is None or precision not in quantize.BITS:
        return
    if flavour not in (None, "ort"):
        raise SpecExportError(f"{precision} weights need the 'ort' graph flavour (ONNX Runtime's MatMulNBits), not"
                              f" {flavour!r}; drop --flavour {flavour} or build with --precision fp32")


def parity_sequences(tokenizer, vocab: int, context: int, seed: int = 0) -> list[list[int]]:
    """A random sequence, then the parity prompts formatted and encoded as the bundle's runtime will (the
    manifest's chat format, no special tokens added). A template-less model's format is its BOS and the text,
    and a model that always sees a BOS can be far out of its range without one: Gemma 3 270M's first token
    then carries huge activations, and int4 rounding moved its logits several times further than with the BOS,
    past the bound, failing a bundle that was right (docs/journal/2026-11-25.md, "Gemma 3 270M at int4")."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, vocab, size=24).tolist()]
    fmt = chat_format(tokenizer)
    for prompt in parity.PARITY_PROMPTS:
        text = prompt if fmt is None else fmt.user_prefix + prompt + fmt.user_suffix
        seqs.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return [s[:context] for s in seqs]


def tensorrt_target(backend: str | None, target: str | None, plan_only: bool) -> dict | None:
    """The validated TensorRT target of a build (None for ONNX Runtime). Everything that can stop a TensorRT
    build before the long export runs here, so a refused build leaves nothing behind."""
    backend = backend or ("tensorrt" if target else "onnxruntime")
    if backend not in BACKENDS:
        raise SpecExportError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "onnxruntime":
        if target or plan_only:
            raise SpecExportError("--target and --plan-only are TensorRT options; add --backend tensorrt")
        return None
    from .tensorrt.targets import available_targets, load_target

    if not target:
        raise SpecExportError(f"--backend tensorrt needs --target, the device to build for; use one of"
                              f" {', '.join(available_targets())} or a target .toml file")
    spec = load_target(target)
    if not plan_only:
        from ..runtime.backends.tensorrt import cuda_runtime, device_info
        from .tensorrt.engines import tensorrt_blocker

        blocker = tensorrt_blocker()
        if blocker:
            raise SpecExportError(f"building TensorRT engines needs TensorRT and an NVIDIA GPU, but {blocker};"
                                  " add --plan-only to write the fp16 ONNX pieces, the build plan and a"
                                  " trtexec script per piece here, and build the engines on the device")
        device = device_info(cuda_runtime())
        if device["compute_capability"] != spec["tensorrt"]["compute_capability"]:
            raise SpecExportError(f"this GPU ({device['name']}) has compute capability {device['compute_capability']}"
                                  f" but target {spec['name']} is {spec['tensorrt']['compute_capability']}; pick the"
                                  " target of this GPU, or add --plan-only and build the engines on the target device")
    return spec


def _tensorrt_context(requested: int | None, recipe_context: int, target: dict) -> int:
    cap = int(target["build"]["max_context"])
    if requested is not None and requested > cap:
        raise SpecExportError(f"--context {requested} is more than target {target['name']} plans for ({cap} tokens);"
                              f" pass --context {cap} or less")
    return requested if requested is not None else min(recipe_context, cap)


def build_bundle(out: Path, recipe: str | None = None, model: str | None = None, exit_layer: int | None = None,
                 context: int | None = None, flavour: str | None = None, force: bool = False,
                 adapter: str | None = None, command: str = "", backend: str | None = None,
                 target: str | None = None, plan_only: bool = False, precision: str | None = None,
                 drafter: str | None = None, drafting_precision: str | None = None, head: str | None = None,
                 attention: str | None = None, matmul: str | None = None,
                 modelopt_python: str | None = None) -> dict:
    """Build a bundle at `out`. `adapter`: 'auto' (shipped, cached or freshly trained), 'none',
    'untrained' (tests only) or a trained adapter directory. `drafter`: 'auto' (the recipe's shipped drafter
    when it was trained for this target, else none), 'none', a `specexport train-drafter` directory or a
    Hugging Face Llama-family checkpoint directory with the target's tokenizer. With `backend='tensorrt'` and a `target`
    (name, alias or .toml): standard-flavour pieces checked against the target's TensorRT, its build
    plan and trtexec scripts, and (unless `plan_only`) the engines, built here through TensorRT.
    `precision`: fp32, or int8/int4 weight-only quantization of the ort flavour (default: the recipe's); for
    TensorRT fp16, or int8/int4 Q/DQ pieces quantized by NVIDIA ModelOpt (`modelopt_python`: the interpreter
    that imports it; exporter/tensorrt/quantize_pieces.py), as the target allows (default: the target's).
    `drafting_precision`: int8 or int4 for the adapter's, drafter's and head's weights, or 'bundle' for the
    bundle's own (default: the recipe's [export.drafting_precision] entry for the bundle's precision).
    `head`: the feature-level draft head: 'auto' (the recipe's shipped head when it was trained for this
    target, else none), 'none', 'untrained' (tests only) or a `specexport train-head` directory.
    `attention`: the `ort` pieces' attention operator, 'gqa' or 'rowwise' (exporter/row_attention.py; default:
    the recipe's [export] attention, else rowwise for the `ort` flavour where the operator is built, else gqa).
    `matmul`: the int8/int4 `ort` pieces' weight matmuls, 'mlas' or 'rowwise' (exporter/row_matmul.py; default:
    the recipe's [export] matmul, else row_matmul.DEFAULTS' for the precision where the operator is built)."""
    _check_precision(precision, flavour, backend, target)
    trt_target = tensorrt_target(backend, target, plan_only)
    if trt_target is not None:
        context = _tensorrt_context(context, int(load_recipe(recipe)["export"].get("context", 2048)), trt_target)
        flavour = flavour or "standard"
    cfg = with_overrides(load_recipe(recipe), exit_layer=exit_layer, context=context, flavour=flavour,
                         precision=precision)
    exp = cfg["export"]
    trt_precision = modelopt = modelopt_settings = None
    if trt_target is not None:
        # the pieces are exported at fp16; ModelOpt quantizes them to int8/int4 after the parity check
        trt_precision = precision or trt_target["build"]["precision"]
        exp["precision"] = "fp16"
        if trt_precision in quantize.BITS:
            from .tensorrt import quantize_pieces

            modelopt_settings = quantize_pieces.settings(trt_precision, exp.get("modelopt"))
            modelopt = quantize_pieces.find_modelopt(modelopt_python)
    flavour, precision = exp.get("flavour", "ort"), exp.get("precision", "fp32")
    if flavour not in llama_graph.FLAVOURS:
        raise SpecExportError(f"unknown graph flavour {flavour!r}; use one of {', '.join(llama_graph.FLAVOURS)}")
    if precision not in PRECISIONS:
        raise SpecExportError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if trt_target is None:
        _check_precision(precision, flavour, None, None)  # the recipe's precision and flavour, too
    # the recipe's [export.quantize] may override the measured defaults (quantize.QuantSpec's fields)
    qspec = quantize.spec_for(precision, **exp.get("quantize", {}))
    # the adapter's and drafter's weights may take a precision of their own (measured per bundle precision)
    draft_precision = quantize.drafting_precision(exp.get("drafting_precision"), precision, flavour,
                                                  drafting_precision)
    draft_spec = qspec if draft_precision == precision else quantize.spec_for(draft_precision)
    kv_choice = exp.get("quantize", {}).get("kv_cache", "float")
    kv_cache.check_choice(kv_choice, flavour, precision)  # int8 only with int8/int4 weights, so qspec is set
    kv_int8 = kv_choice == "int8"
    attention, fallback = row_attention.choose(attention or exp.get("attention"), flavour, precision, kv_choice)
    if fallback:
        print(f"note: {fallback}", file=sys.stderr)
    rowwise = attention == "rowwise"  # its one-row calls round as rows of many: no copied row
    matmul, fallback = row_matmul.choose(matmul or exp.get("matmul"), flavour, precision, (qspec, draft_spec))
    if fallback:
        print(f"note: {fallback}", file=sys.stderr)
    padding = multirow.padding_for(precision, flavour, exp.get("one_row_padding"), kv_int8 or rowwise)
    context = int(exp.get("context", 2048))
    opset = OPSET if trt_target is None else trt_target["tensorrt"]["opset"]
    stages = tqdm(total=7, desc="build", unit="stage", file=sys.stderr, disable=None)

    def for_target(graph):
        if rowwise:
            row_attention.use_rowwise(graph)
        if matmul == "rowwise":
            row_matmul.use_rowwise(graph)
        if rowwise or matmul == "rowwise":  # the library is loaded anyway: the chains the matmul left
            gated_silu.use_gated_silu(graph)
        # targets whose TensorRT updates caches in place get TensorScatter writes (exporter/tensorrt/graph.py)
        if trt_target is None or trt_target["build"]["kv_update"] != "inplace":
            return graph
        from .tensorrt.graph import inplace_kv

        return inplace_kv(graph, context)

    def stage(name: str) -> None:
        stages.set_postfix_str(name)

    def quantized(graph, output_path: bool = True, kv_scales: list | None = None,
                  spec: quantize.QuantSpec | None = qspec) -> tuple:
        """The piece with its weight MatMuls quantized (int8/int4), and the manifest's record of it. Pieces on
        the output path (shallow, deep) also run every call on at least two rows, in either flavour, so
        verifying k tokens at once gives bit for bit what k single steps give (exporter/multirow.py), unless
        their int8 caches make one-row attention round as rows of many (exporter/kv_cache.py)."""
        info: dict = {}
        if spec is not None:
            graph, info["quantization"] = quantize.quantize_model(graph, spec)
        if kv_scales is not None:
            kv_cache.quantize_kv_cache(graph, kv_scales)
        if output_path and padding == "piece" and multirow.pad_one_row_calls(graph):
            info["min_rows"], info["one_row_padding"] = 2, "piece"
        elif output_path:
            done = padding == "attention" and multirow.pad_one_row_attention(graph)
            info["one_row_padding"] = "attention" if done else "none"
        return graph, info

    def add_draft_piece(name: str, graph, vocab_map: np.ndarray | None, vocab_file: str, **fields) -> None:
        """A drafting piece (adapter, drafter): its pruned head's ids beside it, quantized at the drafting
        precision, without the output path's care (drafts only propose; verification decides)."""
        if vocab_map is not None:
            np.save(writer.tmp / vocab_file, vocab_map)
            fields["draft_vocab"] = {"file": vocab_file, "size": len(vocab_map),
                                     "note": "FR-Spec: the head keeps these token ids (ascending); logits are in"
                                             " this order, top_token is a real id"}
        graph, qinfo = quantized(graph, output_path=False, spec=draft_spec)
        writer.add_piece(name, for_target(graph), flavour, layers=None, **fields, **qinfo)

    with BundleWriter(Path(out), force=force) as writer:
        stage("locating model")
        if model is None:
            src = cfg.get("source")
            if not src:
                raise SpecExportError(f"recipe {cfg['name']} names no source model; pass --model")
            source = model_source.resolve(model_source.recipe_model_file(src))
        else:
            source = model_source.resolve(model)
        from .training.drafter_source import load_drafter_model, locate_drafter

        drafter_choice = locate_drafter(drafter, cfg, source)  # refuses before any piece is written
        stage("loading model")
        torch_model, tokenizer = model_source.load_model(source.checkpoint)
        stages.update()
        target_model = torch_model  # the weights the target's pieces are exported from
        calibration = None
        if qspec is not None and qspec.rounding == "gptq":
            stage("GPTQ rounding")
            target_model, calibration = _gptq_rounded(torch_model, tokenizer, source, cfg, qspec, context)
        weights = extract(target_model, context)
        dims = weights.dims
        row_attention.check_head_size(attention, flavour, dims.head_dim)
        ell = int(exp.get("exit_layer", 2))
        if not 1 <= ell <= dims.layers - 1:
            raise SpecExportError(f"exit layer {ell} is outside 1..{dims.layers - 1} for this"
                                  f" {dims.layers}-layer model")
        dtype = PRECISIONS[precision]
        kv_scales = None  # each layer's (k_scale, v_scale) when shallow's and deep's caches are int8
        if kv_int8:
            stage("calibrating the KV cache")
            from .training.adapter_source import training_prompts

            prompts = training_prompts(cfg.get("adapter", {}).get("train", {}))
            kv_scales = kv_cache.calibrate(torch_model, kv_cache.calibration_sequences(tokenizer, prompts, context),
                                           weights.layers, dims, weights.rope.cos.shape[1])

        stage("exporting shallow")
        shallow = llama_graph.build_shallow(dims, weights.rope, weights.embed, weights.layers[:ell], flavour, dtype,
                                            weights.arch)
        # a tied table is one tensor: the pieces that embed tokens read their rows from deep's LM head
        tied = np.array_equal(weights.embed, weights.lm_head)
        quantized_rows = tied_rows.rows_for(np.ascontiguousarray(weights.lm_head.T, dtype=np.float32) if tied
                                            else None, qspec, matmul)

        def read_tied_rows(graph) -> dict:
            """The piece's Gather of token rows rewritten onto deep's LM head; its manifest note."""
            done = tied and (quantized_rows.apply(graph) if quantized_rows is not None
                             else qspec is None and tied_rows.read_rows_from_lm_head(graph))
            return {"embedding": "rows of deep's LM head"} if done else {}

        rows_note = read_tied_rows(shallow)
        shallow, qinfo = quantized(shallow, kv_scales=kv_scales[:ell] if kv_scales else None)
        if rows_note and "quantization" in qinfo:
            qinfo["quantization"].update(rows_note)
        writer.add_piece("shallow", for_target(shallow), flavour, layers=[0, ell], **qinfo,
                         **weights.attention_fields(range(ell)))
        del shallow
        stages.update()
        from .training.head_source import resolve_head

        head_module, head_meta = resolve_head(head, torch_model, source.origin_sha256, cfg, ell)
        features = head_module.cfg.features if head_module is not None else None
        stage("exporting deep")
        deep = llama_graph.build_deep(dims, weights.rope, weights.layers[ell:], weights.final_norm,
                                      weights.lm_head, flavour, dtype, weights.arch, features=features)
        deep, qinfo = quantized(deep, kv_scales=kv_scales[ell:] if kv_scales else None)
        writer.add_piece("deep", for_target(deep), flavour, layers=[ell, dims.layers], **qinfo,
                         **weights.attention_fields(range(ell, dims.layers)))
        del deep
        stages.update()

        stage("adapter")
        from .training.adapter_source import resolve_adapter
        from .training.fit_adapter import pruned_vocab

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
            add_draft_piece("adapter", graph, vocab_map, "draft_vocab.npy", exit_layer=ell, training=summary)
        stages.update()

        head_vocab = None
        if head_module is not None:
            stage("draft head")
            size = head_meta.get("draft_vocab") or cfg.get("head", {}).get("draft_vocab")
            head_vocab = pruned_vocab(head_meta.get("token_counts"), size)
            graph = llama_graph.build_head(dims, weights.rope, head_module.graph_weights(), weights.embed,
                                           weights.lm_head, flavour, dtype, vocab_map=head_vocab)
            read_tied_rows(graph)
            summary = {k: head_meta.get(k) for k in ("source", "heldout", "tokens_seen", "train_tokens", "device")}
            add_draft_piece("head", graph, head_vocab, "head_vocab.npy", features=list(features), training=summary)

        stage("drafter")
        drafter_model = drafter_vocab = drafter_in_proj = None
        if drafter_choice is not None:
            loaded = load_drafter_model(drafter_choice, torch_model)
            drafter_model, drafter_vocab = loaded.model, loaded.vocab_map
            dw = extract(drafter_model, context)
            # a Spec-Drafter's folded table (the target's times P_in) unfolded where the target's rows are shared
            # on the CPU; a TensorRT engine holds its own weights, and there the folded table is the smaller
            unfold = tied and flavour == "ort" and (qspec is None or quantized_rows is not None)
            drafter_in_proj = loaded.in_proj if unfold else None
            graph = llama_graph.build_drafter(dw.dims, dw.rope, dw.embed if drafter_in_proj is None else weights.embed,
                                              dw.layers, dw.final_norm, dw.lm_head, flavour, dtype,
                                              vocab_map=drafter_vocab, arch=dw.arch, in_proj=drafter_in_proj)
            if drafter_in_proj is not None:
                read_tied_rows(graph)
            add_draft_piece("drafter", graph, drafter_vocab, "drafter_vocab.npy", dims=dw.dims,
                            architecture=drafter_model.config.model_type, **loaded.manifest,
                            **dw.attention_fields(range(dw.dims.layers)))
            del graph, dw
        stages.update()

        if trt_target is not None:  # before the parity check: a target TensorRT cannot parse fails fast
            from .tensorrt.opcheck import require_supported

            require_supported(writer.tmp, writer.pieces, trt_target)
        stage("checking parity")

        def hidden(r: dict) -> np.ndarray:  # fp16 pieces take their hidden states in fp16
            return r["h_exit"].astype(dtype, copy=False)

        checks = [
            parity.PieceCheck("shallow", lambda r: r["input_ids"], {"hidden": "h_exit"}),
            parity.PieceCheck("deep", hidden, {"logits": "logits", **({"features": "features"} if features else {})}),
        ]
        if head_module is not None:
            checks.append(parity.PieceCheck("head", lambda r: r["input_ids"], {"logits": "head_logits",
                                                                              "state": "head_state"},
                                            precision=draft_precision,
                                            extra=lambda r: {"features": r["features"].astype(dtype, copy=False)}))
        if adapter_module is not None:
            checks.append(parity.PieceCheck("adapter", hidden, {"logits": "adapter_logits"},
                                            precision=draft_precision))
        if drafter_model is not None:
            checks.append(parity.PieceCheck("drafter", lambda r: r["input_ids"], {"logits": "drafter_logits"},
                                            precision=draft_precision))
        dequantized = None
        if qspec is not None or draft_spec is not None:
            rows = quantized_rows.rounded() if quantized_rows is not None else weights.embed if tied else None
            dequantized = _dequantized_reference(target_model, ell, adapter_module, vocab_map, qspec, drafter_model,
                                                 drafter_vocab, draft_spec, head_module, head_vocab,
                                                 rows=rows if tied and (qspec is None or quantized_rows is not None)
                                                 else None,
                                                 drafter_in_proj=drafter_in_proj)
        report = parity.run_checks(writer.tmp, writer.pieces, checks, parity_sequences(tokenizer, dims.vocab, context),
                                   _reference(torch_model, ell, adapter_module, vocab_map, drafter_model,
                                              drafter_vocab, head=head_module, head_vocab=head_vocab),
                                   precision, context, dequantized=dequantized, attention=attention, matmul=matmul)
        for name, result in report.items():
            writer.set_parity(name, result)
        stages.update()

        if modelopt is not None:
            stage(f"quantizing to {trt_precision} (ModelOpt)")
            opset = _modelopt_pieces(writer, modelopt, modelopt_settings, cfg, source, tokenizer, context)
            from .tensorrt.opcheck import require_supported

            require_supported(writer.tmp, writer.pieces, trt_target)  # the Q/DQ nodes against TensorRT's rules
            precision = trt_precision
        trt_section: dict = {"engines": []}
        if trt_target is not None:
            from .tensorrt.plan import plan_tensorrt

            stage("planning TensorRT engines")
            trt_section = plan_tensorrt(writer.tmp, writer.pieces, trt_target, context=context, precision=precision)
            if not plan_only:
                from .tensorrt.engines import build_section

                stage("building TensorRT engines")
                trt_section = build_section(writer.tmp, trt_section, writer.pieces,
                                            log=lambda m: tqdm.write(m, file=sys.stderr))

        stage("writing bundle")
        tokenizer.save_pretrained(writer.tmp / "tokenizer")
        tok_file = writer.add_file(writer.tmp / "tokenizer" / "tokenizer.json")
        import shutil

        shutil.rmtree(writer.tmp / "tokenizer")
        eos = torch_model.generation_config.eos_token_id
        eos_ids = sorted({*(eos if isinstance(eos, list) else [eos] if eos is not None else []),
                          *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})
        manifest = writer.commit(
            name=cfg.get("name", Path(out).name),
            model=ModelInfo(torch_model.config.model_type, dims, ell, tokenizer.bos_token_id, tuple(eos_ids)),
            graph=GraphInfo(flavour, opset, precision, OPSET_NOTES.get(opset, f"opset {opset}"),
                            None if qspec is None else {**qspec.as_dict(),
                                                         **({"calibration": calibration} if calibration else {})},
                            attention, matmul),
            tokenizer=TokenizerInfo(tok_file, tuple(eos_ids), chat_format(tokenizer),
                                    getattr(tokenizer, "chat_template", None)),
            generation=read_record(GenerationDefaults, cfg["generation"], "recipe [generation]"),
            speculative=read_record(SpeculativeDefaults, cfg["speculative"], "recipe [speculative]"),
            tensorrt=read_record(TensorRTSection, trt_section, "tensorrt"),
            provenance=Provenance(
                source_name=source.origin.name, source_sha256=source.origin_sha256,
                source_description=source.description, recipe_name=Path(cfg["path"]).name,
                recipe_sha256=sha256_file(Path(cfg["path"])), versions=versions(), command=portable_command(command),
                built_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")),
        )
        stages.update()
        stages.close()
    return manifest
