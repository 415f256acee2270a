"""Build the TensorRT engines a bundle's plan lists, on the device, through TensorRT's Python API.

Per piece: a strongly typed network (the precision is the ONNX file's: TensorRT 11 has no precision
flags), `OnnxParser.parse_from_file` (the external weights sit next to the .onnx), a builder config with
the plan's workspace cap, builder optimization level, hardware/version compatibility and one
optimization profile per call regime, then `build_serialized_network`. One timing cache is shared by
all pieces and saved in the bundle, so later builds on the same device reuse the measured tactics.
Each engine's TensorRT version, compute capability and SHA-256 go into the manifest, which is rewritten
atomically together with its checksums.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from ...runtime.backends.tensorrt import (
    check_engine_io,
    cuda_runtime,
    device_info,
    engine_io,
    import_tensorrt,
    require_tensorrt_version,
)
from ...runtime.bundle import bundle_file, read_manifest
from ...runtime.errors import SpecExportError
from ...runtime.manifest import Manifest, Piece, TensorRTSection, read_record, sha256_file
from ...runtime.paths import cache_dir
from ..bundle import write_manifest


def _vkey(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in str(text).split(".")[:2] if p.isdigit())


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def tensorrt_blocker() -> str | None:
    """Why TensorRT engines cannot be built on this machine (a short clause), or None when they can."""
    try:
        import_tensorrt()
        device_info(cuda_runtime())
    except SpecExportError as exc:
        return str(exc).split(";")[0]
    return None


def require_tensorrt(trt=None, cudart=None, hint: str = "") -> tuple:
    """(tensorrt module, cuda runtime module, device info), or one sentence saying what is missing."""
    trt = require_tensorrt_version(trt, hint) if trt is not None else import_tensorrt(hint)
    cudart = cudart or cuda_runtime()
    return trt, cudart, device_info(cudart)


def device_timing_cache(trt_version: str, device: dict) -> Path:
    """This device's timing cache outside any bundle, so a new bundle's build reuses earlier measurements
    (a timing cache is only valid for one TensorRT version on one GPU model)."""
    cc = device["compute_capability"].replace(".", "")
    return cache_dir("tensorrt") / f"timing-trt{trt_version}-sm{cc}.cache"


def _plan_section(section: dict, root: Path) -> dict:
    if not section.get("plan"):
        raise SpecExportError(f"bundle {root} has no TensorRT plan; make one with `specexport build --backend"
                              f" tensorrt --target NAME --plan-only` or `specexport engines plan {root} --target NAME`")
    return section


def _section_paths(root: Path, section: dict) -> dict[str, Path]:
    """Every path the section names, by field, checked as the manifest's reader checks them (typed, inside
    the bundle, symbolic links included) before anything is read or written: the section may come from a
    manifest on disk rather than from the planner."""
    typed = read_record(TensorRTSection, section, "tensorrt")
    return {where: bundle_file(root, rel, where) for where, rel in typed.paths("tensorrt")}


def _check_device(section: dict, device: dict, trt_version: str, any_device: bool, log: Callable) -> None:
    target = section["target"]
    if device["compute_capability"] != target["compute_capability"] and not any_device:
        raise SpecExportError(f"this GPU ({device['name']}) has compute capability {device['compute_capability']}"
                              f" but the plan is for target {target['name']} ({target['compute_capability']});"
                              " re-plan with `specexport engines plan BUNDLE --target NAME` for this device, or"
                              " pass --any-device")
    if _vkey(trt_version) != _vkey(target["tensorrt_version"]):
        log(f"note: the plan's operator check was for TensorRT {target['tensorrt_version']}, this device runs"
            f" {trt_version}")


def _profiles(trt, builder, network, config, plan: dict, piece: str) -> None:
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    for index, prof in enumerate(plan["profiles"]):
        profile = builder.create_optimization_profile()
        for tensor in inputs:
            name = tensor.name
            if tensor.is_shape_tensor:
                values = prof["values"].get(name)
                if values is None:
                    raise SpecExportError(f"piece {piece!r}: TensorRT treats input {name!r} as a shape tensor but the"
                                          " plan gives it no values; re-plan the bundle")
                profile.set_shape_input(name, values["min"], values["opt"], values["max"])
            else:
                shapes = prof["shapes"].get(name)
                if shapes is None:
                    raise SpecExportError(f"piece {piece!r}: the plan has no shapes for input {name!r}; re-plan")
                profile.set_shape(name, shapes["min"], shapes["opt"], shapes["max"])
        if config.add_optimization_profile(profile) != index:
            raise SpecExportError(f"piece {piece!r}: TensorRT rejected optimization profile {prof['name']!r}")


def _configure(trt, builder, builder_settings: dict, cache):
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(builder_settings["workspace_mib"]) << 20)
    config.builder_optimization_level = int(builder_settings["builder_optimization_level"])
    if builder_settings["hardware_compatibility"] == "ampere+":
        config.hardware_compatibility_level = trt.HardwareCompatibilityLevel.AMPERE_PLUS
    if builder_settings["version_compatible"]:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    if cache is not None and not config.set_timing_cache(cache, False):
        cache = None  # recorded on another device or TensorRT: start a new one
    if cache is None:
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)
    return config, cache


def build_piece(trt, builder, logger, onnx_path: Path, name: str, plan: dict, builder_settings: dict, cache):
    """One engine through the Python API from the piece's ONNX file; returns (serialized engine bytes,
    timing cache)."""
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise SpecExportError(f"TensorRT's ONNX parser rejected piece {name!r}: {errors}")
    config, cache = _configure(trt, builder, builder_settings, cache)
    _profiles(trt, builder, network, config, plan, name)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise SpecExportError(f"TensorRT could not build the engine of piece {name!r} (see its log above); on"
                              " an 8 GB Jetson close other programs or lower workspace_mib in the target")
    return bytes(serialized), cache


def _engine_meta(name: str, plan: dict, data_sha: str, size: int, trt_version: str, device: dict, section: dict,
                 built_with: str) -> dict:
    b = section["builder"]
    return {"piece": name, "file": plan["engine"], "sha256": data_sha, "size_bytes": size,
            "tensorrt_version": trt_version, "compute_capability": device["compute_capability"],
            "device": device["name"], "target": section["target"]["name"],
            "profiles": [p["name"] for p in plan["profiles"]], "precision": b["precision"],
            "hardware_compatibility": b["hardware_compatibility"], "version_compatible": b["version_compatible"],
            "built_with": built_with,
            "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def build_engines(bundle_dir: Path, *, pieces: list[str] | None = None, timing_cache: Path | None = None,
                  adopt: bool = False, any_device: bool = False, log: Callable[[str], None] = print, trt=None,
                  cudart=None) -> Manifest:
    """Build (or, with ``adopt``, record engines trtexec already built from the plan's scripts) the engines
    of a committed bundle's plan; rewrites its manifest with them and their checksums and returns it.
    ``trt``/``cudart`` default to the real modules."""
    root = Path(bundle_dir)
    manifest = read_manifest(root)
    section = build_section(root, plain_section(manifest), manifest.pieces, pieces=pieces, timing_cache=timing_cache,
                            adopt=adopt, any_device=any_device, log=log, trt=trt, cudart=cudart)
    return record_section(root, manifest, section)


def plan_bundle(bundle_dir: Path, target: str | dict) -> Manifest:
    """(Re)plan a committed bundle's engines for ``target`` (scripts under tensorrt/, the manifest's section);
    engines built for an earlier plan leave the manifest."""
    from .plan import plan_tensorrt

    manifest = read_manifest(Path(bundle_dir))
    section = plan_tensorrt(bundle_dir, manifest.pieces, target, context=manifest.max_context)
    return record_section(bundle_dir, manifest, section, drop_engines=True)


def plain_section(manifest: Manifest) -> dict:
    return manifest.to_dict()["tensorrt"]


def record_section(root: Path, manifest: Manifest, section: dict, drop_engines: bool = False) -> Manifest:
    """``manifest`` with the TensorRT ``section`` and the checksums of what it names (the plan's scripts,
    the engines), written atomically; ``drop_engines``: files of earlier engines leave the table."""
    root = Path(root)
    files = dict(manifest.files)
    if drop_engines:
        files = {k: v for k, v in files.items() if not k.endswith(".engine")}
    files.update({e["file"]: e["sha256"] for e in section.get("engines", [])})
    for rel in section.get("files", {}):
        path = bundle_file(root, rel, f"tensorrt.files.{rel}")
        if path.is_file():
            files[rel] = sha256_file(path)
    section = {**section, "files": {rel: files[rel] for rel in section.get("files", {}) if rel in files}}
    updated = dataclasses.replace(manifest, tensorrt=read_record(TensorRTSection, section, "tensorrt"), files=files)
    return write_manifest(root, updated)


def build_section(root: Path, section: dict, specs: dict[str, Piece], *, pieces: list[str] | None = None,
                  timing_cache: Path | None = None, adopt: bool = False, any_device: bool = False,
                  log: Callable[[str], None] = print, trt=None, cudart=None) -> dict:
    """The TensorRT ``section`` (plain, as the manifest stores it) with the engines of its plan built in
    ``root``, for the pieces ``specs``; what `build_engines` and `specexport build` share."""
    section = _plan_section(section, root)
    paths = _section_paths(root, section)
    trt, cudart, device = require_tensorrt(trt, cudart)
    trt_version = trt.__version__
    _check_device(section, device, trt_version, any_device, log)
    names = pieces or list(section["plan"])
    unknown = [n for n in names if n not in section["plan"]]
    if unknown:
        raise SpecExportError(f"the plan has no piece {', '.join(map(repr, unknown))}; it lists"
                              f" {', '.join(section['plan'])}")
    logger = trt.Logger(trt.Logger.WARNING)
    cache_path = Path(timing_cache) if timing_cache else paths["tensorrt.builder.timing_cache"]
    shared_cache = None if timing_cache else device_timing_cache(trt_version, device)
    load_from = next((p for p in (cache_path, shared_cache) if p is not None and p.is_file()), None)
    entries = {e["piece"]: e for e in section.get("engines", [])}
    builder, cache = None, None
    for name in names:
        plan = section["plan"][name]
        engine_path = paths[f"tensorrt.plan.{name}.engine"]
        engine_path.parent.mkdir(parents=True, exist_ok=True)
        if adopt:
            if not engine_path.is_file():
                raise SpecExportError(f"{engine_path} does not exist; run {plan['script']} first or build without"
                                      " --adopt")
            data = engine_path.read_bytes()
            runtime = trt.Runtime(logger)
            if section["builder"]["version_compatible"]:  # its embedded lean runtime must be allowed to run
                runtime.engine_host_code_allowed = True
            engine = runtime.deserialize_cuda_engine(data)
            if engine is None:
                raise SpecExportError(f"{engine_path} does not load in TensorRT {trt_version} on this GPU; rebuild it")
            if engine.num_optimization_profiles != len(plan["profiles"]):
                raise SpecExportError(f"{engine_path} has {engine.num_optimization_profiles} profiles, the plan"
                                      f" {len(plan['profiles'])}; rebuild it with {plan['script']}")
            check_engine_io(engine_io(engine), list(specs[name].inputs), list(specs[name].outputs), name, root)
            built_with = "trtexec"
        else:
            if builder is None:
                builder = trt.Builder(logger)
                if load_from is not None:
                    config = builder.create_builder_config()
                    cache = config.create_timing_cache(load_from.read_bytes())
            log(f"building the TensorRT engine of {name} ({len(plan['profiles'])} profiles)")
            data, cache = build_piece(trt, builder, logger, paths[f"tensorrt.plan.{name}.onnx"], name, plan,
                                      section["builder"], cache)
            write_atomic(engine_path, data)
            built_with = "python-api"
        entries[name] = _engine_meta(name, plan, hashlib.sha256(data).hexdigest(), len(data), trt_version, device,
                                     section, built_with)
    if cache is not None:
        data = bytes(cache.serialize())
        for path in (cache_path, shared_cache):
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, data)
    return {**section, "engines": [entries[n] for n in section["plan"] if n in entries]}
