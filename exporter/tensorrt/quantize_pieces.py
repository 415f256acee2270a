"""TensorRT's INT4 and INT8 pieces: the fp16 standard pieces quantized by NVIDIA ModelOpt's ONNX quantizer.

ModelOpt (`nvidia-modelopt`) writes Q/DQ graphs that follow TensorRT's explicit-quantization rules and calibrates
through ONNX Runtime's CPU provider, so it all runs without a GPU. Its `[onnx]` extra pins an onnxruntime-gpu and an
onnx that would replace the runtime's own, so it lives in an interpreter of its own (`make .venv-modelopt/.installed`,
or any Python that imports `modelopt.onnx.quantization`), driven through a subprocess; this module only prepares
its inputs and reads its outputs.

INT4 is weight-only (AWQ-clip by default, blocks of 128: TensorRT takes 64 or 128), INT8 quantizes weights and
activations (max calibration). As TensorRT Edge-LLM ships its INT4 models, the LM heads and the token embeddings
stay fp16 (the LM head's MatMul is excluded by name; ModelOpt quantizes no Gather), and the KV caches too. The
calibration set is the recipe's distilled corpus when it was distilled from this checkpoint (the target's own
greedy answers), else the chat-formatted training prompts; never Spec-Bench's or the bench prompts. Hidden-state
pieces are calibrated on what the fp16 pieces before them produce.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ...runtime.backends.common import attention_bias
from ...runtime.errors import SpecExportError
from ...runtime.manifest import Piece
from ..onnx_builder import save_model

MODES = {"int4": "int4", "int8": "int8"}  # bundle precision -> ModelOpt's quantize_mode
METHODS = {"int4": ("awq_clip", "awq_lite", "rtn_dq"), "int8": ("max", "entropy")}
BLOCK_SIZES = (64, 128)  # the INT4 block sizes TensorRT builds (recipes/data/trt_ops.json)
# block_size None: the largest of BLOCK_SIZES that divides every quantized matrix's input size (SmolLM2's 576: 64)
DEFAULTS = {"method": {"int4": "awq_clip", "int8": "max"}, "block_size": None, "sequences": 8, "length": 128}
HELD_OUT = 4  # calibration-free windows the agreement with the fp16 pieces is measured on
# a sanity floor on agreement with the fp16 pieces: int4 as the ort flavour's (exporter/parity.py); int8 lower than
# its 0.85, since ModelOpt's INT8 quantizes the activations too, not the weights alone
MIN_TOP1 = {"int8": 0.5, "int4": 0.35}
# the pieces ModelOpt quantizes; the adapter (one layer and the LM head, which stays fp16) is left fp16
QUANTIZED = ("shallow", "deep", "drafter", "head")
ENV = "SPECEXPORT_MODELOPT_PYTHON"
FIND = "import modelopt, modelopt.onnx.quantization; print(modelopt.__version__)"
HOW_TO_INSTALL = (f"run `make .venv-modelopt/.installed` in a specexport checkout and build from there, or set {ENV}"
                  " to a Python that imports modelopt.onnx.quantization (nvidia-modelopt without its [onnx] extra,"
                  " which would replace this environment's onnxruntime)")

QUANTIZE = """
import json, sys, time, numpy as np
from modelopt.onnx.quantization import quantize
job = json.load(open(sys.argv[1]))
calib = dict(np.load(job["calibration"]))
t0 = time.time()
kwargs = {"block_size": job["block_size"]} if job["mode"] == "int4" else {}
quantize(job["source"], quantize_mode=job["mode"], calibration_method=job["method"], calibration_data=calib,
         calibration_shapes=job["shapes"], calibration_eps=["cpu"], output_path=job["output"],
         use_external_data_format=True, nodes_to_exclude=job["exclude"] or None, log_level="ERROR", **kwargs)
print(json.dumps({"seconds": round(time.time() - t0, 1)}))
"""


@dataclass(frozen=True)
class ModelOpt:
    python: str
    version: str


@dataclass(frozen=True)
class Settings:
    precision: str
    method: str
    block_size: int | None
    sequences: int
    length: int


def settings(precision: str, table: dict | None) -> Settings:
    """The recipe's `[export.modelopt]` for a precision, validated (one sentence per wrong key)."""
    table = dict(table or {})
    unknown = sorted(set(table) - {"method", "block_size", "sequences", "length"})
    if unknown:
        raise SpecExportError(f"recipe [export.modelopt] has no key {unknown[0]!r}; it takes method, block_size,"
                              " sequences and length")
    method = table.get("method", DEFAULTS["method"][precision])
    if method not in METHODS[precision]:
        raise SpecExportError(f"recipe [export.modelopt] method = {method!r} is not a ModelOpt {precision} method;"
                              f" use {' or '.join(METHODS[precision])}")
    block = table.get("block_size", DEFAULTS["block_size"])
    if block is not None and block not in BLOCK_SIZES:
        raise SpecExportError(f"recipe [export.modelopt] block_size = {block!r}; TensorRT's INT4 blocks are"
                              f" {' or '.join(map(str, BLOCK_SIZES))}")
    counts = {k: table.get(k, DEFAULTS[k]) for k in ("sequences", "length")}
    for key, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecExportError(f"recipe [export.modelopt] {key} = {value!r} is not a positive whole number")
    return Settings(precision, method, block, counts["sequences"], counts["length"])


def find_modelopt(python: str | None = None) -> ModelOpt:
    """The interpreter that runs ModelOpt: `python`, else $SPECEXPORT_MODELOPT_PYTHON, else .venv-modelopt in the
    working directory, else this one; refused in one sentence when none imports it."""
    candidates = [python] if python else [os.environ.get(ENV)] if os.environ.get(ENV) else [
        str(Path.cwd() / ".venv-modelopt" / "bin" / "python"), sys.executable]
    for candidate in candidates:
        if not candidate or not Path(candidate).exists():
            continue
        try:
            run = subprocess.run([candidate, "-c", FIND], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if run.returncode == 0 and run.stdout.strip():
            return ModelOpt(candidate, run.stdout.split()[-1])
    where = python or os.environ.get(ENV)
    if where:
        raise SpecExportError(f"{where} does not import NVIDIA ModelOpt's ONNX quantizer, which quantizes TensorRT's"
                              f" INT4 and INT8 pieces; {HOW_TO_INSTALL}")
    raise SpecExportError(f"TensorRT's INT4 and INT8 pieces are quantized by NVIDIA ModelOpt, which this build cannot"
                          f" find; {HOW_TO_INSTALL}")


def calibration_windows(sequences: list[list[int]], count: int, length: int) -> np.ndarray:
    """`count` windows of `length` tokens, one per sequence long enough (shorter ones are cut to the shortest when
    too few are), as one [count, length] array: ModelOpt calibrates on equal shapes."""
    long = [s for s in sequences if len(s) >= length][:count]
    if len(long) < count:
        picked = sorted(sequences, key=len, reverse=True)[:count]
        length = min(len(s) for s in picked)
        long = picked
    if not long or length < 2:
        raise SpecExportError("no calibration sequence of two tokens or more for ModelOpt; give the recipe a corpus"
                              " or training prompts")
    return np.array([s[:length] for s in long], dtype=np.int64)


def _feeds(spec: Piece, primary: np.ndarray, extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A prefill call's inputs for `spec` from position 0, every row of the batch at once, caches empty and as long
    as the call (the standard flavour's cache length is dynamic)."""
    batch, n = primary.shape[:2]
    feeds: dict[str, np.ndarray] = {}
    for t in spec.inputs:
        if t.name in ("input_ids", "hidden_in"):
            feeds[t.name] = primary
        elif extra and t.name in extra:
            feeds[t.name] = extra[t.name]
        elif t.name == "position_ids":
            feeds[t.name] = np.broadcast_to(np.arange(n, dtype=np.int64), (batch, n)).copy()
        elif t.name == "attention_bias":
            bias = attention_bias(0, n, n, t.dtype, None)
            feeds[t.name] = np.broadcast_to(bias, (batch, *bias.shape[1:])).copy() if t.shape[0] == "batch" else bias
        elif t.name == "logits_to_keep":
            feeds[t.name] = np.array([n], dtype=np.int64)
        elif t.name.startswith("past_"):
            shape = [batch if d == "batch" else n if d == "cache_len" else d for d in t.shape]
            feeds[t.name] = np.zeros(shape, dtype=t.dtype)
        else:
            raise SpecExportError(f"piece input {t.name!r} has no calibration feed; ModelOpt cannot calibrate this"
                                  " piece (rebuild at fp16)")
    return feeds


def _run(path: Path, feeds: dict[str, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
    """One call of the graph at `path` on ONNX Runtime's CPU provider."""
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(outputs, feeds)


def calibration_feeds(bundle_dir: Path, pieces: dict[str, Piece], windows: np.ndarray) -> dict[str, dict]:
    """Each quantized piece's calibration inputs: token windows for the pieces that read ids, and for deep and the
    head what the fp16 pieces before them compute on those windows."""
    out: dict[str, dict] = {}
    for name in ("shallow", "drafter"):
        if name in pieces:
            out[name] = _feeds(pieces[name], windows)
    hidden = _run(bundle_dir / pieces["shallow"].file, out["shallow"], ["hidden"])[0]
    out["deep"] = _feeds(pieces["deep"], hidden)
    if "head" in pieces:
        names = [t.name for t in pieces["deep"].outputs]
        if "features" not in names:
            raise SpecExportError("the draft head reads deep's features, which this deep piece does not return")
        features = _run(bundle_dir / pieces["deep"].file, out["deep"], ["features"])[0]
        out["head"] = _feeds(pieces["head"], windows, {"features": features})
    return out


def _lm_head_nodes(model: onnx.ModelProto) -> list[str]:
    """The nodes that read an LM head, which stay fp16."""
    from ..quantize import LM_HEAD

    return [n.name for n in model.graph.node if LM_HEAD in n.input and n.name]


def quantize_piece(tool: ModelOpt, bundle_dir: Path, name: str, spec: Piece, feeds: dict[str, np.ndarray],
                   how: Settings) -> tuple[onnx.ModelProto, float]:
    """The piece quantized by ModelOpt (loaded with its weights) and the seconds ModelOpt took."""
    model = onnx.load(str(bundle_dir / spec.file))  # its weights may lie in another piece's file: one copy of its own
    exclude = [f"^{re.escape(n)}$" for n in _lm_head_nodes(model)]  # ModelOpt reads patterns
    with tempfile.TemporaryDirectory(prefix=f"modelopt-{name}-") as tmp:
        work = Path(tmp)
        save_model(model, work / spec.file)
        del model
        np.savez(work / "calibration.npz", **feeds)
        job = {"source": str(work / spec.file), "calibration": str(work / "calibration.npz"),
               "output": str(work / "out" / f"{name}.onnx"), "mode": MODES[how.precision], "method": how.method,
               "block_size": how.block_size, "exclude": exclude,
               # the whole batch as one step: ModelOpt would otherwise split every input along its first axis,
               # logits_to_keep's too
               "shapes": ",".join(f"{k}:{'x'.join(map(str, v.shape))}" for k, v in feeds.items())}
        (work / "out").mkdir()
        (work / "job.json").write_text(json.dumps(job))
        run = subprocess.run([tool.python, "-c", QUANTIZE, str(work / "job.json")], capture_output=True, text=True)
        if run.returncode:
            lines = [line.strip() for line in run.stderr.strip().splitlines() if line.strip()]
            tail = " ".join(lines[-3:]) or f"exit status {run.returncode}"
            raise SpecExportError(f"ModelOpt {tool.version} could not quantize piece {name!r} to {how.precision}"
                                  f" ({tail}); build it at fp16 or report it with the piece attached")
        seconds = json.loads(run.stdout.strip().splitlines()[-1])["seconds"]
        quantized = onnx.load(job["output"], load_external_data=True)
    return quantized, seconds


def record(tool: ModelOpt, how: Settings, calibration: str, tokens: int, seconds: float, lm_head: bool) -> dict:
    """The piece's manifest `quantization` for a ModelOpt graph."""
    out = {"op": "QuantizeLinear/DequantizeLinear", "tool": f"nvidia-modelopt {tool.version}",
           "precision": how.precision, "method": how.method,
           "weights": "int4 weight-only, symmetric" if how.precision == "int4" else "int8 weights and activations",
           "embedding": "fp16", "kv_cache": "fp16",
           "calibration": {"set": calibration, "tokens": tokens}, "seconds": seconds}
    if how.precision == "int4":
        out["block_size"] = how.block_size
    if lm_head:
        out["lm_head"] = "fp16"
    return out


def teacher_forced_agreement(reference: list[np.ndarray], quantized: list[np.ndarray]) -> float:
    """The share of positions whose top-1 token the quantized logits keep."""
    same = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(reference, quantized, strict=True))
    return same / sum(a.shape[0] * a.shape[1] for a in reference)


def _weight_inputs(model: onnx.ModelProto, skip: list[str]) -> set[int]:
    """The input sizes of the MatMuls whose second input is a 2-D initializer (the weights ModelOpt quantizes)."""
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    return {shapes[n.input[1]][0] for n in model.graph.node
            if n.op_type == "MatMul" and n.name not in skip and len(shapes.get(n.input[1], [])) == 2}


def block_for(models: list[onnx.ModelProto], how: Settings) -> int:
    """The INT4 block size: the recipe's, else the largest TensorRT block that divides every weight's input size."""
    if how.block_size is not None:
        return how.block_size
    sizes = set().union(*(_weight_inputs(m, _lm_head_nodes(m)) for m in models))
    fits = [b for b in sorted(BLOCK_SIZES, reverse=True) if all(k % b == 0 for k in sizes)]
    if not fits:
        raise SpecExportError(f"no INT4 block size TensorRT takes ({' or '.join(map(str, BLOCK_SIZES))}) divides every"
                              f" weight's input size ({', '.join(map(str, sorted(sizes)))}); build int8 or fp16")
    return fits[0]


def _logits(pieces: dict[str, Piece], files: dict[str, Path], windows: np.ndarray) -> dict:
    """Each logits piece's logits at every position of `windows` (the feeds keep every row), through the files
    given (fp16 or quantized), deep and the head fed by the shallow and deep among them."""
    hidden = _run(files["shallow"], _feeds(pieces["shallow"], windows), ["hidden"])[0]
    deep = _run(files["deep"], _feeds(pieces["deep"], hidden), ["logits"] + (["features"] if "head" in pieces else []))
    out = {"deep": deep[0]}
    if "drafter" in pieces:
        out["drafter"] = _run(files["drafter"], _feeds(pieces["drafter"], windows), ["logits"])[0]
    if "head" in pieces:
        out["head"] = _run(files["head"], _feeds(pieces["head"], windows, {"features": deep[1]}), ["logits"])[0]
    return out


def quantize_all(bundle_dir: Path, pieces: dict[str, Piece], tool: ModelOpt, how: Settings, windows: np.ndarray,
                 held_out: np.ndarray, calibration: str, progress=None) -> dict[str, tuple[Path, dict]]:
    """Every quantizable piece of the fp16 bundle in `bundle_dir` quantized by ModelOpt, saved under
    `bundle_dir`/.modelopt/, and checked: the top-1 agreement of the quantized logits pieces (deep through the
    quantized shallow, the drafter, the head) with the fp16 ones on held-out windows must reach MIN_TOP1. Returns
    each piece's quantized file and its manifest record."""
    names = [n for n in QUANTIZED if n in pieces]
    graphs = {n: onnx.load(str(bundle_dir / pieces[n].file), load_external_data=False) for n in names}
    if how.precision == "int4":
        how = dataclasses.replace(how, block_size=block_for(list(graphs.values()), how))
    lm_heads = {n: bool(_lm_head_nodes(g)) for n, g in graphs.items()}
    del graphs
    feeds = calibration_feeds(bundle_dir, pieces, windows)
    staged = bundle_dir / ".modelopt"
    staged.mkdir(exist_ok=True)
    done: dict[str, tuple[Path, dict]] = {}
    for name in names:
        model, seconds = quantize_piece(tool, bundle_dir, name, pieces[name], feeds[name], how)
        save_model(model, staged / f"{name}.onnx")
        del model
        done[name] = (staged / f"{name}.onnx", record(tool, how, calibration, int(windows.size), seconds,
                                                     lm_heads[name]))
        if progress is not None:
            progress()
    fp16 = {n: bundle_dir / p.file for n, p in pieces.items()}
    reference = _logits(pieces, fp16, held_out)
    quantized = _logits(pieces, {**fp16, **{n: path for n, (path, _) in done.items()}}, held_out)
    for name, logits in reference.items():
        share = teacher_forced_agreement([logits], [quantized[name]])
        if share < MIN_TOP1[how.precision]:
            floor, instead = MIN_TOP1[how.precision], "fp16 or int8" if how.precision == "int4" else "fp16"
            raise SpecExportError(f"piece {name!r} quantized to {how.precision} by ModelOpt keeps the fp16 pieces'"
                                  f" top token at {share:.0%} of held-out positions, under the {floor:.0%} a"
                                  f" quantized piece must keep; build it at {instead}, or calibrate on more text"
                                  " ([export.modelopt] sequences)")
        done[name][1]["agreement_with_fp16"] = {"top1": round(share, 4), "positions": int(held_out.size),
                                                "through": "the quantized shallow" if name == "deep" else "itself"}
    return done
