"""fp16 export of the standard flavour (what TensorRT builds, strongly typed) against the fp32 PyTorch model.

Two executions of the same fp16 ONNX graphs, because neither alone says everything:

* ONNX Runtime CPU, the runtime the tests and the CPU default use. It has no fp16 kernels for most of
  these ops (MatMul, Mul, Add, ...) and inserts Casts to fp32 around them, so this checks the graph's
  semantics, the fp16 rounding of weights, caches and hidden states, and that ORT can run the bundle.
* onnx.reference (numpy), which computes every op in the tensor's own dtype: fp16 arithmetic, as
  TensorRT will. Slow, so only on the tiny model.

The in-place form (TensorScatter cache writes, for TensorRT 10.15+) is checked the same two ways.

Also home of `make_tiny_bundle`, which the other TensorRT tests import: it builds the pieces straight
from llama_graph (no adapter training, no build pipeline) so these tests stay fast and independent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator
from specexport.exporter import llama_graph
from specexport.exporter.bundle import BundleWriter
from specexport.exporter.hf_weights import extract
from specexport.exporter.llama_graph import AdapterWeights
from specexport.exporter.parity import TOLERANCE, relative_error
from specexport.exporter.tensorrt.graph import inplace_kv
from specexport.runtime.backends.common import bias_input, bias_spec, control_feeds
from specexport.runtime.backends.ort import OrtPiece
from specexport.runtime.bundle import read_manifest
from specexport.runtime.manifest import (
    GenerationDefaults,
    GraphInfo,
    ModelInfo,
    Piece,
    Provenance,
    SpeculativeDefaults,
    TensorRTSection,
    TokenizerInfo,
)
from transformers import AutoModelForCausalLM

EXIT = 2
CONTEXT = 128
TOL = TOLERANCE["fp16"]


def make_tiny_bundle(out: Path, checkpoint: Path, flavour: str = "standard", precision: str = "fp16",
                     exit_layer: int = EXIT, context: int = CONTEXT, adapter: bool = True,
                     inplace: bool = False) -> Path:
    """shallow + deep (+ an adapter made of layer `exit_layer`'s attention) of the tiny model, as a bundle;
    `inplace`: with TensorScatter cache writes (opset 24), as built for TensorRT 10.15+ targets."""
    dtype = {"fp16": np.float16, "fp32": np.float32}[precision]
    form = (lambda g: inplace_kv(g, context)) if inplace else (lambda g: g)
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    w = extract(model, context)
    d = w.dims
    with BundleWriter(Path(out), force=True) as writer:
        writer.add_piece("shallow", form(llama_graph.build_shallow(d, w.rope, w.embed, w.layers[:exit_layer],
                                                                   flavour, dtype)), flavour, layers=[0, exit_layer])
        writer.add_piece("deep", form(llama_graph.build_deep(d, w.rope, w.layers[exit_layer:], w.final_norm,
                                                             w.lm_head, flavour, dtype)), flavour,
                         layers=[exit_layer, d.layers])
        if adapter:
            layer = w.layers[exit_layer]
            weights = AdapterWeights(input_norm=layer.input_norm, attn=layer.attn, output_norm=w.final_norm)
            writer.add_piece("adapter", form(llama_graph.build_adapter(d, w.rope, weights, w.lm_head, flavour,
                                                                       dtype)), flavour)
        tokenizer = writer.add_file(Path(checkpoint) / "tokenizer.json")
        eos = [int(model.config.eos_token_id)]
        writer.commit(name="tiny", model=ModelInfo("llama", d, exit_layer, None, tuple(eos)),
                      graph=GraphInfo(flavour, 24 if inplace else 17, precision),
                      tokenizer=TokenizerInfo(tokenizer, tuple(eos)), generation=GenerationDefaults(),
                      speculative=SpeculativeDefaults(), tensorrt=TensorRTSection(),
                      provenance=Provenance("tiny", "0" * 64, "tiny random Llama", None, None, {}, "", ""))
    return Path(out)


def torch_reference(checkpoint: Path, ids: list[int], exit_layer: int = EXIT) -> dict:
    """fp32 PyTorch: h at the exit layer, final logits, and the tiny adapter's logits (layer `exit_layer`'s
    attention over h, residual, final norm, LM head: what make_tiny_bundle's adapter computes)."""
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    with torch.inference_mode():
        x = torch.tensor([ids])
        out = model(x, output_hidden_states=True)
        h = out.hidden_states[exit_layer]
        layer = model.model.layers[exit_layer]
        pos = torch.arange(len(ids))[None]
        cos_sin = model.model.rotary_emb(h, pos)
        attn = layer.self_attn(layer.input_layernorm(h), position_embeddings=cos_sin, attention_mask=None)[0]
        adapter_logits = model.lm_head(model.model.norm(h + attn))
    return {"h": h.numpy()[0], "logits": out.logits.numpy()[0], "adapter_logits": adapter_logits.numpy()[0]}


@pytest.fixture(scope="module", params=["swap", "inplace"])
def fp16_bundle(request, tmp_path_factory, tiny_checkpoint) -> Path:
    """The fp16 standard bundle in both KV forms: ScatterElements (swap) and TensorScatter (in place)."""
    return make_tiny_bundle(tmp_path_factory.mktemp("fp16") / request.param, tiny_checkpoint,
                            inplace=request.param == "inplace")


@pytest.fixture(scope="module")
def sequence(tiny_checkpoint) -> tuple[list[int], dict]:
    ids = np.random.default_rng(7).integers(0, 300, size=40).tolist()
    return ids, torch_reference(tiny_checkpoint, ids)


# the call pattern of a speculative run: prefill, decode, a rejected verification, rollback, continue
STEPS = [(0, 20, 20), (20, 21, 1), ("garbage", 21, 6), (21, 30, 9), (30, 40, 1)]


def test_fp16_graphs_are_typed_as_tensorrt_needs(fp16_bundle):
    manifest = read_manifest(fp16_bundle)
    for name, spec in manifest.pieces.items():
        onnx.checker.check_model(str(fp16_bundle / spec.file))
        model = onnx.load(str(fp16_bundle / spec.file), load_external_data=False)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)  # strongly typed: no mixups
        writes = {n.op_type for n in model.graph.node if n.op_type in ("ScatterElements", "TensorScatter")}
        assert writes == ({"TensorScatter"} if fp16_bundle.name == "inplace" else {"ScatterElements"}), name
        floats = {t.data_type for t in model.graph.initializer if t.data_type in (1, 10)}
        big = [t for t in model.graph.initializer if np.prod(t.dims) > 64]
        assert all(t.data_type == onnx.TensorProto.FLOAT16 for t in big if t.data_type in (1, 10)), name
        assert onnx.TensorProto.FLOAT16 in floats
        io = {t.name: t.dtype for t in spec.inputs + spec.outputs}
        assert io["past_key.0"] == io["present_key.0"] == "float16"
        if "logits" in io:
            assert io["logits"] == "float32"  # logits leave the graph in fp32
        for hidden in ("hidden", "hidden_in"):
            if hidden in io:
                assert io[hidden] == "float16"
        assert spec.kv.mode == "swap"


def test_fp16_onnxruntime_cpu_parity_across_cache_use(fp16_bundle, sequence):
    ids, ref = sequence
    manifest = read_manifest(fp16_bundle)
    pieces = {n: OrtPiece(n, fp16_bundle / s.file, s, CONTEXT, ["CPUExecutionProvider"], 1)
              for n, s in manifest.pieces.items()}
    rng = np.random.default_rng(1)
    worst: dict[str, float] = {}
    for lo, hi, keep in STEPS:
        if lo == "garbage":
            tokens = rng.integers(0, 300, size=keep)[None]
            h = pieces["shallow"].run(tokens, hi)["hidden"]
            pieces["deep"].run(h, hi, keep=keep)
            pieces["adapter"].run(h, hi, keep=keep)
            continue
        h = pieces["shallow"].run(np.asarray([ids[lo:hi]]), lo)["hidden"]
        assert h.dtype == np.float16
        logits = pieces["deep"].run(h, lo, keep=keep)["logits"]
        draft = pieces["adapter"].run(h, lo, keep=keep)
        for key, got, want in (("h", h[0], ref["h"][lo:hi]), ("logits", logits[0], ref["logits"][hi - keep:hi]),
                               ("adapter", draft["logits"][0], ref["adapter_logits"][hi - keep:hi])):
            worst[key] = max(worst.get(key, 0.0), relative_error(got, want))
        assert draft["top_token"][0, -1] == int(np.argmax(draft["logits"][0, -1]))
    assert all(err <= TOL for err in worst.values()), worst


class ReferencePiece:
    """One piece run by onnx.reference: numpy computes each op in its tensor's dtype (real fp16 math);
    caches carried as the swap binding does (present of one call is the past of the next)."""

    def __init__(self, path: Path, spec: Piece) -> None:
        self.model = onnx.load(str(path))
        self.evaluator = ReferenceEvaluator(self.model)
        self.names = [o.name for o in self.model.graph.output]
        self.inputs = {t.name for t in spec.inputs}
        self.bias = bias_input(list(spec.inputs))
        self.cache = {t.name: np.zeros([1 if d == "batch" else CONTEXT if d == "cache_len" else d
                                        for d in t.shape], dtype=t.dtype)
                      for t in spec.inputs if t.name.startswith("past_")}

    def run(self, x: np.ndarray, start: int, keep: int = 1) -> dict:
        bias = bias_spec(self.bias, start, x.shape[1], CONTEXT)
        feeds = {**control_feeds(self.inputs, start, x.shape[1], keep, bias=bias), **self.cache}
        feeds["input_ids" if "input_ids" in self.inputs else "hidden_in"] = x
        out = dict(zip(self.names, self.evaluator.run(None, feeds), strict=True))
        for past in self.cache:
            self.cache[past] = out[past.replace("past_", "present_", 1)]
        return out


def test_fp16_arithmetic_parity_with_onnx_reference(fp16_bundle, sequence):
    ids, ref = sequence
    manifest = read_manifest(fp16_bundle)
    pieces = {n: ReferencePiece(fp16_bundle / s.file, s) for n, s in manifest.pieces.items()}
    h = pieces["shallow"].run(np.asarray([ids[:24]]), 0)["hidden"]
    assert h.dtype == np.float16
    logits = pieces["deep"].run(h, 0, keep=24)["logits"]
    draft = pieces["adapter"].run(h, 0, keep=24)["logits"]
    h2 = pieces["shallow"].run(np.asarray([ids[24:25]]), 24)["hidden"]
    step = pieces["deep"].run(h2, 24, keep=1)["logits"]
    errors = {"h": relative_error(h[0], ref["h"][:24]), "logits": relative_error(logits[0], ref["logits"][:24]),
              "adapter": relative_error(draft[0], ref["adapter_logits"][:24]),
              "decode": relative_error(step[0], ref["logits"][24:25])}
    assert all(err <= TOL for err in errors.values()), errors


def test_fp16_bundle_generates_through_the_session(fp16_bundle, tiny_checkpoint):
    """The fp16 standard bundle through the real Session on ONNX Runtime CPU, greedy: the same tokens as
    PyTorch fp32 greedy decoding of the tiny model (its distributions are peaked, so fp16 noise does not
    flip them)."""
    from specexport.runtime.session import load

    prompt = [5, 17, 42, 99, 7]
    got = load(fp16_bundle).generate_ids(prompt, max_new_tokens=12, chat=False, mode="ar").tokens
    model = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), dtype=torch.float32).eval()
    with torch.inference_mode():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=len(got), do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert got and got == want
