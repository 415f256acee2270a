"""The TensorRT build plan of a bundle: per piece, the optimization profiles and builder settings, written
into the manifest (section ``tensorrt``) and as one ``trtexec`` script per piece under ``tensorrt/``.

Three profiles per piece, because the runtime calls every piece in three shape regimes:

* ``prefill``: the prompt, 1..context tokens (tuned for the target's ``prefill_opt``), batch 1;
* ``decode``: one token, batch 1..max_batch (the latency-critical call);
* ``verify``: a speculative step, 1..verify_max tokens (tuned for gamma + 1), batch 1..max_batch.

The KV cache inputs are preallocated at the full context, so ``cache_len`` is the same fixed value in
every profile. ``logits_to_keep`` feeds a Slice's start, which makes it a *shape tensor* for TensorRT:
its profile gives values, not dimensions, and the most logits rows any call may ask for is
``verify_max`` (a prefill needs one row; a 2,048-row fp32 logits buffer would cost 400 MB).

Each piece's KV binding follows its graph: ``swap`` (ScatterElements, two buffers per cache, never one
buffer bound as both input and output, which TensorRT computes wrong) or ``inplace`` (TensorScatter, which TensorRT
10.15+ imports as an in-place KV-cache update: one buffer, bound as both).

The engine build itself runs on the device (``specexport engines build`` or the scripts): TensorRT
engines are tied to the TensorRT version and the GPU they were built with.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path

import onnx

from ...runtime.backends.buckets import BUCKET_MIN, bucket
from ...runtime.bundle import read_manifest
from ...runtime.errors import SpecExportError
from ...runtime.manifest import MANIFEST, Piece
from .graph import is_inplace
from .memory import plan_memory
from .opcheck import require_supported
from .targets import load_target, require_precision

TRT_DIR = "tensorrt"
TIMING_CACHE = f"{TRT_DIR}/timing.cache"

# operator input slots TensorRT needs as shape tensors (values known when shapes are)
_SHAPE_SLOTS = {"Reshape": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4), "Range": (0, 1, 2),
                "ConstantOfShape": (0,), "Tile": (1,), "TopK": (1,), "Pad": (1, 3), "Unsqueeze": (1,),
                "Squeeze": (1,), "Split": (1,), "OneHot": (1,), "Resize": (2, 3)}


def shape_tensor_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs whose *values* decide a shape (TensorRT's shape tensors), by walking back from the
    shape slots of Reshape, Slice, Expand, ... through the integer arithmetic that feeds them."""
    producers = {o: n for n in model.graph.node for o in n.output}
    wanted: list[str] = [n.input[i] for n in model.graph.node for i in _SHAPE_SLOTS.get(n.op_type, ())
                         if i < len(n.input) and n.input[i]]
    seen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producers.get(name)
        if node is not None and node.op_type not in ("Shape", "Size"):  # their input is a data tensor
            wanted += [i for i in node.input if i]
    return [v.name for v in model.graph.input if v.name in seen]


def _dims(shape: list, regime: dict[str, tuple[int, int, int]], what: str) -> tuple[list, list, list]:
    out: tuple[list, list, list] = ([], [], [])
    for d in shape:
        if isinstance(d, int) and d > 0:
            triple = (d, d, d)
        elif d in regime:
            triple = regime[d]
        else:
            raise SpecExportError(f"{what} has a dimension {d!r} the TensorRT plan does not know; the piece"
                                  " was exported with a layout this specexport cannot plan")
        for k in range(3):
            out[k].append(int(triple[k]))
    return out


def regimes(build: dict, context: int, bucketed: bool = False) -> dict[str, dict]:
    """Per profile: (min, opt, max) of every named dimension, and of the logits_to_keep value. `bucketed`
    (swap mode): the runtime binds a cache length that follows the used length (runtime/backends/buckets.py),
    so `cache_len` spans the smallest bucket to the context, tuned for the middle bucket."""
    vmax, vopt, batch = min(build["verify_max"], context), min(build["verify_opt"], context), build["max_batch"]
    cache = (context,) * 3
    if bucketed:
        least = min(BUCKET_MIN, context)
        cache = (least, bucket(context // 2 or 1, context), context)
    return {
        "prefill": {"dims": {"batch": (1, 1, 1), "seq": (1, min(build["prefill_opt"], context), context),
                             "cache_len": cache}, "keep": (1, 1, vmax)},
        "decode": {"dims": {"batch": (1, 1, batch), "seq": (1, 1, 1), "cache_len": cache}, "keep": (1, 1, 1)},
        "verify": {"dims": {"batch": (1, 1, batch), "seq": (1, vopt, vmax), "cache_len": cache},
                   "keep": (1, vopt, vmax)},
    }


def piece_profiles(name: str, spec: Piece, shape_inputs: list[str], build: dict, context: int,
                   bucketed: bool = False) -> list[dict]:
    """The three optimization profiles of one piece, in engine profile order."""
    profiles = []
    for pname, regime in regimes(build, context, bucketed).items():
        shapes, values = {}, {}
        for t in spec.inputs:
            if t.name in shape_inputs:
                lo, opt, hi = regime["keep"] if t.name == "logits_to_keep" else (None, None, None)
                if lo is None:
                    raise SpecExportError(f"piece {name!r}: input {t.name!r} is a TensorRT shape tensor this"
                                          " plan has no value range for")
                n = 1 if not t.shape else int(t.shape[0])
                values[t.name] = {"min": [lo] * n, "opt": [opt] * n, "max": [hi] * n}
                continue
            lo, opt, hi = _dims(list(t.shape), regime["dims"], f"piece {name!r} input {t.name!r}")
            shapes[t.name] = {"min": lo, "opt": opt, "max": hi}
        profiles.append({"name": pname, "shapes": shapes, "values": values})
    return profiles


def _spec(d: dict) -> str:
    return "x".join(str(v) for v in d) if d else "scalar"


def trtexec_args(piece: dict, builder: dict) -> list[str]:
    """trtexec arguments equivalent to the Python-API build of one piece (run from the bundle root)."""
    args = ["--onnx=" + piece["onnx"], "--saveEngine=" + piece["engine"], "--stronglyTyped",
            f"--memPoolSize=workspace:{builder['workspace_mib']}M",
            f"--builderOptimizationLevel={builder['builder_optimization_level']}",
            "--timingCacheFile=" + builder["timing_cache"], "--skipInference"]
    if builder["hardware_compatibility"] != "none":
        args.append(f"--hardwareCompatibilityLevel={builder['hardware_compatibility']}")
    if builder["version_compatible"]:
        args.append("--versionCompatible")
    for i, prof in enumerate(piece["profiles"]):
        args.append(f"--profile={i}")
        for which in ("min", "opt", "max"):
            # shape tensors take their values in the same option (trtexec calls setShapeValues for them)
            specs = [f"{n}:{_spec(s[which])}" for n, s in prof["shapes"].items()]
            specs += [f"{n}:{_spec(v[which])}" for n, v in prof["values"].items()]
            args.append(f"--{which}Shapes=" + ",".join(specs))
    return args


def script_text(name: str, piece: dict, builder: dict, target: dict) -> str:
    t = target["tensorrt"]
    lines = [
        "#!/bin/sh",
        f"# Build the TensorRT engine of piece '{name}' with trtexec, for target {target['name']}",
        f"# (TensorRT {t['version']}, compute capability {t['compute_capability']}). Written by specexport.",
        "# Profiles: " + ", ".join(f"{i} = {p['name']}" for i, p in enumerate(piece["profiles"])) + ".",
        "# `specexport engines build BUNDLE` does the same through the Python API and records the engine in",
        "# manifest.json; after running this script, `specexport engines build --adopt BUNDLE` records it.",
        "set -eu",
        'cd "$(dirname "$0")/.."',
        'TRTEXEC="${TRTEXEC:-trtexec}"  # JetPack: /usr/src/tensorrt/bin/trtexec',
        f"mkdir -p {TRT_DIR}",
        '"$TRTEXEC" \\',
    ]
    args = trtexec_args(piece, builder)
    lines += [f"  {shlex.quote(a)} \\" for a in args[:-1]] + [f"  {shlex.quote(args[-1])}", ""]
    return "\n".join(lines)


def _write(path: Path, text: str, executable: bool = False) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    if executable:
        tmp.chmod(0o755)
    os.replace(tmp, path)
    return hashlib.sha256(text.encode()).hexdigest()


def _piece_precision(spec: Piece) -> str | None:
    floats = {t.dtype for t in spec.inputs if t.dtype.startswith("float")}
    return "fp16" if floats == {"float16"} else "fp32" if "float32" in floats else None


def kv_binding(name: str, model: onnx.ModelProto, spec: Piece, context: int) -> str:
    """How TensorRT must bind this piece's caches, read from its graph: 'inplace' (TensorScatter: one buffer,
    static cache length) or 'swap' (ScatterElements: two buffers)."""
    if not is_inplace(model):
        return "swap"
    for t in spec.inputs:
        if t.name.startswith("past_") and t.shape[2] != context:
            raise SpecExportError(f"piece {name!r} updates a {t.shape[2]}-position cache in place but the plan is"
                                  f" for {context} positions; rebuild the bundle with --context {context}")
    return "inplace"


def _bundle_precision(bundle_dir: Path) -> str | None:
    if (Path(bundle_dir) / MANIFEST).is_file():
        return read_manifest(bundle_dir).precision
    return None


def _bundle_context(bundle_dir: Path) -> int | None:
    if (Path(bundle_dir) / MANIFEST).is_file():
        return read_manifest(bundle_dir).max_context
    return None


def plan_tensorrt(bundle_dir: Path, pieces: dict[str, Piece], target: str | dict, context: int | None = None,
                  precision: str | None = None) -> dict:
    """Op check (raises naming the failing nodes), then the per-piece plan and trtexec scripts written
    under ``bundle_dir/tensorrt/``; returns the manifest's ``tensorrt`` section (``engines`` empty).

    ``context`` is the bundle's KV cache length (its ``dims.max_context``); by default it is read from
    ``bundle_dir/manifest.json`` when there is one, else the target's ``max_context``. ``precision``: the
    bundle's (fp16, or int8/int4 for ModelOpt's Q/DQ pieces, whose inputs and outputs are fp16 too); by default
    the manifest's, else the target's."""
    bundle_dir = Path(bundle_dir)
    target = load_target(target)
    build = target["build"]
    context = int(context or _bundle_context(bundle_dir) or build["max_context"])
    if context > build["max_context"]:
        raise SpecExportError(f"the bundle's context is {context} tokens but target {target['name']} plans at most"
                              f" {build['max_context']}; rebuild with --context {build['max_context']} or less")
    report = require_supported(bundle_dir, pieces, target)
    for name, spec in pieces.items():
        io = _piece_precision(spec)
        if io != "fp16":
            raise SpecExportError(f"piece {name!r} is {io}, target {target['name']} builds fp16 pieces and their"
                                  " Q/DQ forms (strongly typed: the precision comes from the ONNX file); rebuild"
                                  " the bundle with --backend tensorrt")
        if spec.kv.count and spec.kv.mode != "swap":
            raise SpecExportError(f"piece {name!r} binds its KV cache in {spec.kv.mode!r} mode; TensorRT"
                                  " needs the standard flavour's cache outputs; rebuild the"
                                  " bundle with --backend tensorrt")

    precision = precision or _bundle_precision(bundle_dir) or build["precision"]
    require_precision(target, precision)
    builder = {"strongly_typed": True, "precision": precision, "workspace_mib": build["workspace_mib"],
               "builder_optimization_level": build["builder_optimization_level"],
               "hardware_compatibility": build["hardware_compatibility"],
               "version_compatible": build["version_compatible"], "timing_cache": TIMING_CACHE}
    plan, files, notes, models = {}, {}, [], {}
    for name, spec in pieces.items():
        model = models[name] = onnx.load(str(bundle_dir / spec.file), load_external_data=False)
        kv_mode = kv_binding(name, model, spec, context)
        if kv_mode == "swap" and spec.kv.count and build["kv_update"] == "inplace":
            notes.append(f"piece {name!r} writes its caches out of place (two-buffer swap); export it for this"
                         f" target (`specexport build --backend tensorrt --target {target['name']}`) to have"
                         " TensorRT update them in place")
        piece = {"onnx": spec.file, "engine": f"{TRT_DIR}/{name}.engine",
                 "script": f"{TRT_DIR}/build_{name}.sh",
                 "shape_tensors": shape_tensor_inputs(model),
                 "kv": {"mode": kv_mode, "count": spec.kv.count, "cache_len": context}}
        piece["profiles"] = piece_profiles(name, spec, piece["shape_tensors"], build, context,
                                           bucketed=kv_mode == "swap")
        piece["trtexec"] = shlex.join(["trtexec", *trtexec_args(piece, builder)])
        plan[name] = piece
    memory = plan_memory(models, pieces, plan, target, context)  # refuses before a script is written
    for name, piece in plan.items():
        files[piece["script"]] = _write(bundle_dir / piece["script"], script_text(name, piece, builder, target),
                                        executable=True)
    build_all = ["#!/bin/sh", "# Build every piece's engine with trtexec; the pieces share one timing cache.",
                 "set -eu", 'cd "$(dirname "$0")"'] + [f"sh ./{Path(p['script']).name}" for p in plan.values()]
    files[f"{TRT_DIR}/build_all.sh"] = _write(bundle_dir / TRT_DIR / "build_all.sh", "\n".join(build_all) + "\n",
                                              executable=True)
    t = target["tensorrt"]
    return {
        "target": {"name": target["name"], "description": target["description"], "device": target["device"],
                   "tensorrt_version": t["version"], "compute_capability": t["compute_capability"], "sm": t["sm"],
                   "max_context": build["max_context"], "max_batch": build["max_batch"],
                   "software": target["software"], "memory_budget": target["memory"].get("budget", "")},
        "builder": builder,
        "context": context,
        "opcheck": report.summary(),
        "notes": notes,
        "memory": memory,
        "plan": plan,
        "files": files,
        "engines": [],
    }
