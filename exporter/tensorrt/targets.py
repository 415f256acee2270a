"""TensorRT targets: one TOML file per device (recipes/targets/), picked by name, alias or path.

A target says which TensorRT the device runs (so which operator matrix applies), its compute capability
(engines are not portable across either), and the build settings that fit its memory.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10: JetPack 6's system Python
    import tomli as tomllib

from ...runtime.errors import SpecExportError

OPS_FILE = "trt_ops.json"
# what the TensorRT export writes: fp16 pieces, and ModelOpt's INT8 (weights and activations) and INT4 (weight-only)
# Q/DQ graphs of them; strongly typed builds take the precision from the ONNX file
PRECISIONS = ("fp16", "int8", "int4")
INT4_QDQ_OPSET = 21  # the first opset whose DequantizeLinear takes blocks (INT4 needs per-block scales)
HARDWARE_COMPAT = ("none", "ampere+")
# how the engines write their KV caches: "inplace" (TensorScatter, which TensorRT turns into an in-place
# KV-cache update) where the target's TensorRT parses it, else "swap" (two buffers: TensorRT computes one buffer
# bound as both input and output wrong)
KV_UPDATES = ("auto", "inplace", "swap")
EXPORT_OPSET = {"swap": 17, "inplace": 24}  # the graph builder's opset; TensorScatter needs opset 24
BUILD_DEFAULTS = {"precision": "fp16", "max_batch": 1, "builder_optimization_level": 3,
                  "hardware_compatibility": "none", "version_compatible": False, "verify_opt": 7,
                  "verify_max": 16, "kv_update": "auto"}


def recipes_dir() -> Path:
    """The recipes package's folder (as exporter.recipe finds it; not imported from there so that this
    module, needed by `specexport check` on the device, imports on Python 3.10 with tomli)."""
    try:
        from importlib.resources import files

        return Path(str(files("specexport.recipes")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "recipes"


def targets_dir() -> Path:
    return recipes_dir() / "targets"


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SpecExportError(f"target file {path} is not valid TOML ({exc})") from None


def _index() -> dict[str, Path]:
    """Every name and alias -> its file."""
    index: dict[str, Path] = {}
    for path in sorted(targets_dir().glob("*.toml")):
        data = _read(path)
        for key in [data.get("name", path.stem), *data.get("aliases", [])]:
            index.setdefault(key, path)
    return index


def available_targets() -> list[str]:
    """Target names (aliases left out)."""
    return sorted(p.stem for p in targets_dir().glob("*.toml"))


@lru_cache(maxsize=1)
def ops_matrix() -> dict:
    path = recipes_dir() / "data" / OPS_FILE
    return json.loads(path.read_text())


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in str(version).split(".") if p.isdigit())


def matrix_version(trt_version: str) -> str:
    """The operator-matrix entry for a TensorRT version: '10.3.0.30' -> '10.3'."""
    versions = ops_matrix()["versions"]
    key = _version_key(trt_version)
    for known in versions:
        if _version_key(known) == key[: len(_version_key(known))]:
            return known
    raise SpecExportError(f"TensorRT {trt_version} has no operator matrix in recipes/data/{OPS_FILE}"
                          f" (it records {', '.join(versions)}); add one from onnx-tensorrt's docs/operators.md")


def inplace_kv_since() -> str:
    """The first TensorRT whose ONNX parser takes TensorScatter (recorded in the operator matrix)."""
    return ops_matrix()["operators"]["TensorScatter"]["since"]


def _kv_update(requested: str, matrix: str, where: str) -> str:
    if requested not in KV_UPDATES:
        raise SpecExportError(f"{where} has kv_update {requested!r}; use one of {', '.join(KV_UPDATES)}")
    allowed = _version_key(matrix) >= _version_key(inplace_kv_since())
    if requested == "inplace" and not allowed:
        raise SpecExportError(f"{where} asks for in-place KV updates, which need TensorScatter (TensorRT"
                              f" {inplace_kv_since()} and later) but the target runs TensorRT {matrix}; use"
                              ' kv_update = "swap"')
    if requested == "auto":
        return "inplace" if allowed else "swap"
    return requested


def _validate(data: dict, path: Path) -> dict:
    where = f"target file {path}"
    trt = data.get("tensorrt", {})
    build = {**BUILD_DEFAULTS, **data.get("build", {})}
    for section, key in (("tensorrt", "version"), ("tensorrt", "compute_capability"), ("build", "max_context"),
                         ("build", "workspace_mib")):
        if key not in data.get(section, {}):
            raise SpecExportError(f"{where} has no [{section}] {key}; every target needs one")
    precisions = trt.get("precisions", ["fp16"])
    if not isinstance(precisions, list) or not precisions or any(p not in PRECISIONS for p in precisions):
        raise SpecExportError(f"{where} has [tensorrt] precisions = {precisions!r}; list some of"
                              f" {', '.join(PRECISIONS)}")
    if build["precision"] not in precisions:
        raise SpecExportError(f"{where} builds precision {build['precision']!r} by default, which its [tensorrt]"
                              f" precisions ({', '.join(precisions)}) leave out; pick one of those")
    if build["hardware_compatibility"] not in HARDWARE_COMPAT:
        raise SpecExportError(f"{where} has hardware_compatibility {build['hardware_compatibility']!r};"
                              f" use one of {', '.join(HARDWARE_COMPAT)}")
    for key in ("max_context", "max_batch", "workspace_mib", "verify_opt", "verify_max"):
        if not isinstance(build[key], int) or build[key] < 1:
            raise SpecExportError(f"{where}: [build] {key} must be a positive integer, not {build[key]!r}")
    if not 0 <= int(build["builder_optimization_level"]) <= 5:
        raise SpecExportError(f"{where}: builder_optimization_level must be 0..5")
    memory = data.get("memory", {})
    for key in ("total_gib", "system_gib"):
        value = memory.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise SpecExportError(f"{where}: [memory] {key} must be a number of GiB, 0 or more, not {value!r}")
    if memory.get("total_gib") and memory.get("system_gib", 0) >= memory["total_gib"]:
        raise SpecExportError(f"{where}: [memory] system_gib ({memory['system_gib']}) leaves nothing of total_gib"
                              f" ({memory['total_gib']}) for the engines")
    build["verify_max"] = min(build["verify_max"], build["max_context"])
    build.setdefault("prefill_opt", min(256, build["max_context"]))
    build["prefill_opt"] = min(int(build["prefill_opt"]), build["max_context"])
    build["verify_opt"] = min(build["verify_opt"], build["verify_max"])
    cc = str(trt["compute_capability"])
    major, _, minor = cc.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise SpecExportError(f"{where}: compute_capability must look like '8.7', not {cc!r}")
    version = str(trt["version"])
    matrix = matrix_version(version)
    build["kv_update"] = _kv_update(build["kv_update"], matrix, where)
    opset = EXPORT_OPSET[build["kv_update"]]
    if int(trt.get("opset", opset)) != opset:
        raise SpecExportError(f"{where}: [tensorrt] opset is {trt['opset']}, but {build['kv_update']} KV updates"
                              f" are exported at opset {opset}; set opset = {opset} or leave it out")
    parses = ops_matrix()["versions"][matrix]
    if not parses["opset_min"] <= opset <= parses["opset_max"]:
        raise SpecExportError(f"{where}: TensorRT {matrix} parses opsets {parses['opset_min']}-{parses['opset_max']},"
                              f" not the opset {opset} this target exports; fix the target's kv_update or version")
    if "int4" in precisions and parses["opset_max"] < INT4_QDQ_OPSET:
        raise SpecExportError(f"{where} lists int4, but TensorRT {matrix} parses opsets up to {parses['opset_max']}"
                              f" and INT4 weight-only graphs need {INT4_QDQ_OPSET}; drop int4 from its precisions")
    return {
        "name": data.get("name", path.stem), "description": data.get("description", ""),
        "aliases": list(data.get("aliases", [])), "device": data.get("device", "dgpu"),
        "path": str(path), "software": dict(data.get("software", {})),
        "tensorrt": {"version": version, "matrix": matrix, "compute_capability": cc,
                     "sm": f"sm_{major}{minor}", "opset": opset,
                     "parses_opsets": [parses["opset_min"], parses["opset_max"]], "precisions": list(precisions)},
        "build": build, "memory": dict(data.get("memory", {})),
    }


def load_target(name_or_path: str | dict) -> dict:
    """A target by name, alias or .toml path, validated; a dict that is already a target passes through."""
    if isinstance(name_or_path, dict):
        return name_or_path
    ref = str(name_or_path)
    path = Path(ref)
    if not (path.suffix == ".toml" and path.is_file()):
        index = _index()
        if ref not in index:
            aliases = sorted(set(index) - set(available_targets()))
            raise SpecExportError(f"unknown TensorRT target {ref!r}; use one of {', '.join(available_targets())}"
                                  f" (aliases: {', '.join(aliases)}) or pass a target .toml file")
        path = index[ref]
    return _validate(_read(path), path)


def describe(target: dict) -> str:
    t, b = target["tensorrt"], target["build"]
    return (f"{target['name']}: TensorRT {t['version']}, compute capability {t['compute_capability']}"
            f" ({t['sm']}), {b['precision']}, context {b['max_context']}, batch {b['max_batch']},"
            f" workspace {b['workspace_mib']} MiB, opset {t['opset']} (parses {t['parses_opsets'][0]}-"
            f"{t['parses_opsets'][1]}), {b['kv_update']} KV updates")


def require_precision(target: dict, precision: str) -> None:
    """Refuses, in one sentence, a precision the target's TensorRT does not build (before anything is written)."""
    allowed = target["tensorrt"]["precisions"]
    if precision in allowed:
        return
    version, most = target["tensorrt"]["version"], target["tensorrt"]["parses_opsets"][1]
    why = (f" (INT4 weight-only graphs need opset {INT4_QDQ_OPSET}, blocked DequantizeLinear, and it parses up to"
           f" {most})" if precision == "int4" and most < INT4_QDQ_OPSET else "")
    listed = " and ".join([", ".join(allowed[:-1]), allowed[-1]] if len(allowed) > 1 else allowed)
    raise SpecExportError(f"target {target['name']}'s TensorRT {version} builds {listed} pieces, not {precision}{why};"
                          f" use --precision {' or '.join(allowed)}")
