"""The bundle manifest: the one contract between the exporter and the runtime, as typed records.

The exporter builds a `Manifest` and writes `Manifest.to_json()`; the runtime reads one with
`Manifest.from_dict`, which checks every field's type and range and every path, and says what is wrong
in one sentence naming the field. `SCHEMA_VERSION` changes whenever the layout changes; a bundle of
another schema is refused with the command that rebuilds it. docs/bundle-format.md describes each field.

Sections whose content only informs (parity figures, training records, the TensorRT plan's profiles,
a piece's attention layout, which the graph itself carries out) are typed as plain mappings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Union

from .errors import SpecExportError

SCHEMA_VERSION = 3  # 3: the draft head piece, and deep's features output for it
MANIFEST = "manifest.json"
PIECE_NAMES = ("shallow", "adapter", "deep", "drafter", "head")
# the longest context of any supported family's config (Llama 3.x, Qwen3: 128k) with room to spare; a
# larger one is a typo, and would only fail later allocating its caches
MAX_CONTEXT = 1 << 18
MAX_GAMMA = 64


class ManifestError(SpecExportError):
    """The manifest breaks the contract: one sentence naming the field."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# -- the records ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Dims:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_eps: float
    max_context: int

    def check(self, where: str) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            _at_least(getattr(self, name), 1, f"{where}.{name}")
        if self.heads % self.kv_heads:
            raise ManifestError(f"manifest field {where}.heads ({self.heads}) is not a multiple of kv_heads"
                                f" ({self.kv_heads})")
        if not 0.0 < self.rms_eps < 1.0:
            raise ManifestError(f"manifest field {where}.rms_eps is {self.rms_eps}, outside (0, 1)")
        if not 1 <= self.max_context <= MAX_CONTEXT:
            raise ManifestError(f"manifest field {where}.max_context is {self.max_context}, outside 1..{MAX_CONTEXT};"
                                " rebuild the bundle with a --context in that range")


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    dims: Dims
    exit_layer: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def check(self, where: str) -> None:
        if not 1 <= self.exit_layer <= self.dims.layers - 1:
            raise ManifestError(f"manifest field {where}.exit_layer is {self.exit_layer}, outside"
                                f" 1..{self.dims.layers - 1} for a {self.dims.layers}-layer model")
        for name, ids in (("bos_token_id", [self.bos_token_id] if self.bos_token_id is not None else []),
                          ("eos_token_ids", self.eos_token_ids)):
            for t in ids:
                if not 0 <= t < self.dims.vocab:
                    raise ManifestError(f"manifest field {where}.{name} holds {t}, outside the vocabulary"
                                        f" 0..{self.dims.vocab - 1}")


@dataclass(frozen=True)
class GraphInfo:
    flavour: Literal["ort", "standard"]
    opset: int
    precision: Literal["fp32", "fp16", "int8", "int4"]
    opset_note: str = ""
    quantization: dict[str, Any] | None = None
    # the `ort` pieces' attention: ONNX Runtime's GroupQueryAttention, or specexport's row-invariant operator
    # (runtime/attention_op.py), which the runtime must be able to load; manifests without it are `gqa`
    attention: Literal["gqa", "rowwise"] = "gqa"
    # the int4/int8 `ort` pieces' weight matmuls: ONNX Runtime's MatMulNBits, or specexport's row-invariant
    # operator in the same library; manifests without it are `mlas`
    matmul: Literal["mlas", "rowwise"] = "mlas"

    def check(self, where: str) -> None:
        _at_least(self.opset, 1, f"{where}.opset")
        if self.matmul == "rowwise" and (self.flavour != "ort" or self.precision not in ("int4", "int8")):
            raise ManifestError(f"manifest field {where}.matmul is 'rowwise' in a {self.precision} {self.flavour!r}"
                                " bundle; only int4 and int8 'ort' pieces have the operator")
        if self.attention == "rowwise" and self.flavour != "ort":
            raise ManifestError(f"manifest field {where}.attention is 'rowwise' in a {self.flavour!r}-flavour bundle;"
                                " only 'ort' pieces have the operator")


@dataclass(frozen=True)
class ChatFormat:
    """The chat template rendered around a placeholder: what goes before and after one user turn."""

    user_prefix: str
    user_suffix: str
    with_system: tuple[str, ...] | None = None  # (before the system text, between it and the user's, after)

    def check(self, where: str) -> None:
        if self.with_system is not None and len(self.with_system) != 3:
            raise ManifestError(f"manifest field {where}.with_system has {len(self.with_system)} parts, not 3")


@dataclass(frozen=True)
class TokenizerInfo:
    file: str
    eos_token_ids: tuple[int, ...]
    chat: ChatFormat | None = None
    chat_template: str | None = None


@dataclass(frozen=True)
class GenerationDefaults:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def check(self, where: str) -> None:
        _at_least(self.max_new_tokens, 0, f"{where}.max_new_tokens")
        _at_least(self.temperature, 0.0, f"{where}.temperature")
        _at_least(self.top_k, 0, f"{where}.top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise ManifestError(f"manifest field {where}.top_p is {self.top_p}, outside (0, 1]")


@dataclass(frozen=True)
class SpeculativeDefaults:
    gamma: int = 3  # most draft tokens per step
    eta: float = 0.6  # stop drafting below this draft-token probability
    auto_tree: dict[str, str] = field(default_factory=dict)  # precision -> TreeShape spec for mode auto
    auto_drafters: dict[str, str] = field(default_factory=dict)  # precision -> auto's drafters ("tree,head")

    def check(self, where: str) -> None:
        if not 1 <= self.gamma <= MAX_GAMMA:
            raise ManifestError(f"manifest field {where}.gamma is {self.gamma}, outside 1..{MAX_GAMMA}")
        if not 0.0 <= self.eta <= 1.0:
            raise ManifestError(f"manifest field {where}.eta is {self.eta}, outside [0, 1]")
        # the auto_tree shapes are parsed where trees are known: runtime/context.py parse_auto_trees
        for precision, names in self.auto_drafters.items():
            unknown = set(str(names).split(",")) - {"tree", "head-tree", "self", "model", "head"}
            if unknown:
                raise ManifestError(f"manifest field {where}.auto_drafters.{precision} names {sorted(unknown)[0]!r},"
                                    " not one of tree, head-tree, self, model, head")


DTYPES = ("float32", "float16", "int64", "int32", "int8", "uint8", "bool")  # what the pieces' graphs take and give


@dataclass(frozen=True)
class TensorIO:
    name: str
    dtype: str  # a numpy dtype name
    shape: tuple[int | str, ...]  # sizes and named dynamic axes

    def check(self, where: str) -> None:
        if not self.name:
            raise ManifestError(f"manifest field {where}.name is empty")
        if self.dtype not in DTYPES:
            raise ManifestError(f"manifest field {where}.dtype is {self.dtype!r}, not one of {', '.join(DTYPES)}")
        for i, d in enumerate(self.shape):
            if (isinstance(d, int) and d < 0) or (isinstance(d, str) and not d):
                raise ManifestError(f"manifest field {where}.shape[{i}] is {d!r}, not a size or an axis name")


@dataclass(frozen=True)
class KVBinding:
    mode: Literal["shared", "swap"]  # one buffer in place, or two swapped after each call
    layout: str
    count: int  # cached layers
    binding: str = ""  # in words, for a reader of the manifest

    def check(self, where: str) -> None:
        _at_least(self.count, 0, f"{where}.count")


@dataclass(frozen=True)
class DraftVocab:
    """FR-Spec: the pruned head keeps these token ids (ascending, in a .npy file)."""

    file: str
    size: int
    note: str = ""

    def check(self, where: str) -> None:
        _at_least(self.size, 1, f"{where}.size")


@dataclass(frozen=True)
class Piece:
    file: str
    inputs: tuple[TensorIO, ...]
    outputs: tuple[TensorIO, ...]
    kv: KVBinding
    data: str | None = None  # external weights beside the graph
    layers: tuple[int, ...] | None = None  # [first, end) of the target's layers
    min_rows: int = 1  # every call runs on at least this many rows (exporter/multirow.py)
    one_row_padding: str | None = None  # piece, attention or none (exporter/multirow.py); None: before the field
    exit_layer: int | None = None  # the adapter's
    features: tuple[int, ...] | None = None  # the head's: the target layers it drafts from (hidden_states indices)
    dims: Dims | None = None  # the drafter's own
    architecture: str | None = None  # the drafter's model_type
    attention: dict[str, Any] | None = None  # windows and RoPE tables per layer (docs/bundle-format.md)
    draft_vocab: DraftVocab | None = None
    quantization: dict[str, Any] | None = None
    source: dict[str, Any] | None = None  # where a drafter came from (names and hashes, no paths)
    training: dict[str, Any] | None = None
    parity: dict[str, Any] | None = None

    def check(self, where: str) -> None:
        _at_least(self.min_rows, 1, f"{where}.min_rows")
        if self.one_row_padding not in (None, "piece", "attention", "none"):
            raise ManifestError(f"manifest field {where}.one_row_padding is {self.one_row_padding!r}, not one of"
                                " piece, attention, none; rebuild the bundle")
        if self.layers is not None and (len(self.layers) != 2 or not 0 <= self.layers[0] < self.layers[1]):
            raise ManifestError(f"manifest field {where}.layers is {list(self.layers)}, not [first, end) with"
                                " 0 <= first < end")
        names = [t.name for t in self.inputs]
        if len(set(names)) != len(names):
            raise ManifestError(f"manifest field {where}.inputs names a tensor twice")
        if not {"input_ids", "hidden_in"} & set(names):
            raise ManifestError(f"manifest field {where}.inputs has neither input_ids nor hidden_in, so nothing"
                                " feeds the piece")
        if self.features is not None and (len(self.features) != 3 or not 0 < self.features[0] < self.features[1]
                                          < self.features[2]):
            raise ManifestError(f"manifest field {where}.features is {list(self.features)}, not three ascending layer"
                                " indices (low, middle, high); rebuild the bundle")
        caches = sum(1 for n in names if n.startswith("past_key."))
        if caches != self.kv.count:
            raise ManifestError(f"manifest field {where}.kv.count is {self.kv.count} but the piece takes {caches}"
                                " past_key inputs")

    def files(self) -> dict[str, str | None]:
        """The bundle files this piece reads, by the field that names them."""
        return {"file": self.file, "data": self.data,
                "draft_vocab.file": self.draft_vocab.file if self.draft_vocab else None}


@dataclass(frozen=True)
class EngineRecord:
    """One TensorRT engine built on a device: what it is for and what it was built with."""

    piece: str
    file: str
    sha256: str
    size_bytes: int
    tensorrt_version: str
    compute_capability: str
    device: str
    target: str
    profiles: tuple[str, ...]
    precision: str
    hardware_compatibility: str
    version_compatible: bool
    built_with: str
    built_at: str


@dataclass(frozen=True)
class EnginePlan:
    """How to build one piece's engine: its ONNX file, engine path, script and optimization profiles."""

    onnx: str
    engine: str
    script: str
    shape_tensors: tuple[str, ...]
    kv: dict[str, Any]
    profiles: tuple[dict[str, Any], ...]
    trtexec: str = ""

    def check(self, where: str) -> None:
        # `engines build` reads the first and writes the other two, each joined to the bundle's root
        for name in ("onnx", "engine", "script"):
            check_relative(getattr(self, name), f"{where}.{name}")
        if not self.profiles:
            raise ManifestError(f"manifest field {where}.profiles is empty; re-plan the bundle with"
                                " `specexport engines plan BUNDLE --target NAME`")


@dataclass(frozen=True)
class BuilderSettings:
    """The TensorRT builder's settings the plan was made with (the target's [build] table)."""

    strongly_typed: bool
    precision: str
    workspace_mib: int
    builder_optimization_level: int
    hardware_compatibility: Literal["none", "ampere+"]
    version_compatible: bool
    timing_cache: str  # in the bundle, shared by its pieces' builds

    def check(self, where: str) -> None:
        _at_least(self.workspace_mib, 1, f"{where}.workspace_mib")
        check_relative(self.timing_cache, f"{where}.timing_cache")


@dataclass(frozen=True)
class TensorRTSection:
    engines: tuple[EngineRecord, ...] = ()
    plan: dict[str, EnginePlan] = field(default_factory=dict)
    target: dict[str, Any] | None = None
    builder: BuilderSettings | None = None
    context: int | None = None
    opcheck: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # scripts of the plan -> SHA-256
    memory: dict[str, Any] | None = None  # bytes per piece (weights, KV caches, logits) and against the device

    def check(self, where: str) -> None:
        for rel in self.files:
            check_relative(rel, f"{where}.files.{rel}")
        if not self.plan:
            return
        if self.builder is None:
            raise ManifestError(f"manifest field {where}.builder is missing, which a plan is built with; re-plan the"
                                " bundle with `specexport engines plan BUNDLE --target NAME`")
        # the device check of `engines build` reads these three
        for key in ("name", "compute_capability", "tensorrt_version"):
            if not isinstance((self.target or {}).get(key), str):
                raise ManifestError(f"manifest field {where}.target.{key} should be a string, which a plan is built"
                                    " for; re-plan the bundle with `specexport engines plan BUNDLE --target NAME`")

    def engine(self, piece: str) -> EngineRecord | None:
        return next((e for e in self.engines if e.piece == piece), None)

    def paths(self, where: str) -> list[tuple[str, str]]:
        """(field, path) of every file of the bundle this section names."""
        named = [(f"{where}.engines.{e.piece}.file", e.file) for e in self.engines]
        for name, plan in self.plan.items():
            named += [(f"{where}.plan.{name}.{f}", getattr(plan, f)) for f in ("onnx", "engine", "script")]
        if self.builder is not None:
            named.append((f"{where}.builder.timing_cache", self.builder.timing_cache))
        return named + [(f"{where}.files.{rel}", rel) for rel in self.files]


@dataclass(frozen=True)
class Provenance:
    """What the bundle was built from, by what: identified by name and hash, never by a build machine's path."""

    source_name: str  # the GGUF file's or checkpoint directory's name
    source_sha256: str  # of the GGUF file, or of the checkpoint's weight files
    source_description: str
    recipe_name: str | None
    recipe_sha256: str | None
    versions: dict[str, str]
    command: str
    built_at: str


@dataclass(frozen=True)
class Manifest:
    schema_version: int
    name: str
    model: ModelInfo
    graph: GraphInfo
    tokenizer: TokenizerInfo
    generation: GenerationDefaults
    speculative: SpeculativeDefaults
    tensorrt: TensorRTSection
    provenance: Provenance
    pieces: dict[str, Piece]
    files: dict[str, str]  # every file of the bundle (relative path) -> SHA-256

    # -- reading --------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: object) -> Manifest:
        """The manifest, checked: raises `ManifestError` naming the first field that breaks the contract."""
        if not isinstance(data, dict):
            raise ManifestError("the manifest is not a JSON object; rebuild the bundle with `specexport build`")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            command = data.get("provenance", {}).get("command") if isinstance(data.get("provenance"), dict) else None
            how = command if isinstance(command, str) and command.startswith("specexport ") else "specexport build"
            found = "has no schema_version" if version is None else f"has schema_version {json.dumps(version)}"
            raise ManifestError(f"its manifest {found} but this specexport reads schema {SCHEMA_VERSION}; rebuild it"
                                f" with `{how}`")
        manifest = _parse(cls, data, "")
        manifest.check()
        return manifest

    def check(self) -> None:
        """The checks that span fields: required pieces, and every path inside the bundle and in `files`."""
        for name in ("shallow", "deep"):
            if name not in self.pieces:
                raise ManifestError(f"manifest field pieces has no {name!r} piece; every bundle has shallow and deep")
        for name in self.pieces:
            if name not in PIECE_NAMES:
                raise ManifestError(f"manifest field pieces.{name} is not a piece this runtime knows"
                                    f" ({', '.join(PIECE_NAMES)})")
        for rel, digest in self.files.items():
            check_relative(rel, f"files.{rel}")
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ManifestError(f"manifest field files.{rel} is not a SHA-256 (64 hex digits)")
        named = [("tokenizer.file", self.tokenizer.file)]
        for name, piece in self.pieces.items():
            named += [(f"pieces.{name}.{f}", rel) for f, rel in piece.files().items() if rel is not None]
        named += [(f"tensorrt.engines.{e.piece}.file", e.file) for e in self.tensorrt.engines]
        for where, rel in named:
            check_relative(rel, where)
            if rel not in self.files:
                raise ManifestError(f"manifest field {where} names {rel!r}, which the manifest's files table does"
                                    " not list, so its checksum cannot be verified; rebuild the bundle")
        head = self.pieces.get("head")
        if head is not None:
            if head.features is None:
                raise ManifestError("manifest field pieces.head.features is missing: a draft head names the layers it"
                                    " drafts from; rebuild the bundle")
            if head.features[0] != self.model.exit_layer:
                raise ManifestError(f"manifest field pieces.head.features starts at layer {head.features[0]}, not the"
                                    f" exit layer {self.model.exit_layer}; rebuild the bundle")
            if not any(t.name == "features" for t in self.pieces["deep"].outputs):
                raise ManifestError("manifest field pieces.deep.outputs has no 'features', which the head drafts"
                                    " from; rebuild the bundle")
        unknown = [e.piece for e in self.tensorrt.engines if e.piece not in self.pieces]
        if unknown:
            raise ManifestError(f"manifest field tensorrt.engines has an engine for {unknown[0]!r}, which is not a"
                                " piece of this bundle")
        for name, plan in self.tensorrt.plan.items():
            if name not in self.pieces:
                raise ManifestError(f"manifest field tensorrt.plan.{name} plans an engine for a piece this bundle does"
                                    " not have; re-plan it with `specexport engines plan BUNDLE --target NAME`")
            if plan.onnx != self.pieces[name].file:
                raise ManifestError(f"manifest field tensorrt.plan.{name}.onnx is {plan.onnx!r}, not the piece's file"
                                    f" {self.pieces[name].file!r}; re-plan the bundle with `specexport engines plan"
                                    " BUNDLE --target NAME`")

    def paths(self) -> list[tuple[str, str]]:
        """(field, path relative to the bundle) of every file the manifest names, its TensorRT section's
        included: what a reader joins to the bundle's directory."""
        named = [("tokenizer.file", self.tokenizer.file)]
        for name, piece in self.pieces.items():
            named += [(f"pieces.{name}.{f}", rel) for f, rel in piece.files().items() if rel is not None]
        return named + self.tensorrt.paths("tensorrt") + [(f"files.{rel}", rel) for rel in self.files]

    # -- writing --------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return _plain(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    # -- what readers ask -----------------------------------------------------------------------------
    @property
    def max_context(self) -> int:
        return self.model.dims.max_context

    @property
    def precision(self) -> str:
        return self.graph.precision


def manifest_digest(text: bytes | str) -> str:
    """The bundle's digest: SHA-256 of its manifest file's bytes (the manifest holds every file's checksum,
    so this one hash pins all of them)."""
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def check_relative(rel: object, where: str) -> None:
    """A path that stays inside the bundle directory: relative, with no `..` and no drive."""
    if not isinstance(rel, str) or not rel:
        raise ManifestError(f"manifest field {where} is not a file name")
    path = PurePosixPath(rel.replace("\\", "/"))
    if path.is_absolute() or re.match(r"^[A-Za-z]:", rel) or ".." in path.parts:
        raise ManifestError(f"manifest field {where} is {rel!r}, a path that leaves the bundle directory; a"
                            " bundle names its files relative to itself")


def absolute_paths(value: object, where: str = "") -> list[str]:
    """Fields whose string value is an absolute path (the exporter refuses to write them)."""
    if isinstance(value, dict):
        return [w for k, v in value.items() for w in absolute_paths(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, (list, tuple)):
        return [w for i, v in enumerate(value) for w in absolute_paths(v, f"{where}[{i}]")]
    if isinstance(value, str) and (re.match(r"^(/|~/|[A-Za-z]:[\\/])[^\s]*$", value)):
        return [where]
    return []


# -- checking and converting ---------------------------------------------------------------------------

def _at_least(value: float, low: float, where: str) -> None:
    if value < low:
        raise ManifestError(f"manifest field {where} is {value}, below {low}")


def _kind(tp: object) -> str:
    """How a type reads in a sentence."""
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if tp in names:
        return names[tp]
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "an object"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_kind(a) if a is not type(None) else "null" for a in typing.get_args(tp))
    return str(tp)


def _fail(where: str, tp: object, value: object) -> ManifestError:
    shown = json.dumps(value)[:60] if not isinstance(value, (dict, list)) else type(value).__name__
    return ManifestError(f"manifest field {where or '(top level)'} should be {_kind(tp)}, not {shown}")


def read_record(tp: Any, value: Any, where: str) -> Any:
    """``value`` (plain JSON) read as type ``tp`` and checked, as `Manifest.from_dict` reads its fields."""
    return _parse(tp, value, where)


def _parse(tp: Any, value: Any, where: str) -> Any:
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _parse_record(tp, value, where)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        if len(others) == 1:  # an optional field: what is wrong inside it is named, not just "should be"
            return _parse(others[0], value, where)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _parse(arg, value, where)
            except ManifestError:
                continue
        raise _fail(where, tp, value)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise _fail(where, tp, value)
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise _fail(where, tp, value)
        item = typing.get_args(tp)[0]
        return tuple(_parse(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise _fail(where, tp, value)
        item = typing.get_args(tp)[1]
        return {k: _parse(item, v, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise _fail(where, tp, value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(where, tp, value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _fail(where, tp, value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _fail(where, tp, value)
        return value
    raise TypeError(f"manifest type {tp!r} has no reader")  # a record above uses a type this file cannot read


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _parse_record(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise _fail(where, cls, value)
    hints = _hints(cls)
    unknown = sorted(set(value) - set(hints))
    if unknown:
        raise ManifestError(f"manifest field {_join(where, unknown[0])} is not part of schema {SCHEMA_VERSION};"
                            " rebuild the bundle with this specexport")
    kwargs = {}
    for f in dataclasses.fields(cls):
        at = _join(where, f.name)
        if f.name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ManifestError(f"manifest field {at} is missing; rebuild the bundle with `specexport build`")
            continue
        kwargs[f.name] = _parse(hints[f.name], value[f.name], at)
    record = cls(**kwargs)
    check = getattr(record, "check", None)
    if check is not None and cls is not Manifest:  # the manifest's own check runs once all is read
        check(where)
    return record


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
