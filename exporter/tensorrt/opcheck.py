"""Will TensorRT X parse this ONNX file? Every node against onnx-tensorrt's operator matrix, no TensorRT needed.

The matrix (recipes/data/trt_ops.json) records, per operator, the supported types, the TensorRT version
that added it and its restrictions as data; this module evaluates them node by node: domain, operator,
version, input type, constant-input requirements (an initializer, or a value that folds to a constant),
value limits (TopK's K < 3840), attributes, ranks and unsupported optional inputs/outputs. An operator
the file does not record is reported as unknown rather than guessed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ...runtime.errors import SpecExportError
from ...runtime.manifest import Piece
from .qdq import QDQ_OPS, qdq_failures
from .targets import load_target, matrix_version, ops_matrix

DEFAULT_DOMAINS = ("", "ai.onnx")
MAX_LISTED = 6  # nodes named per failing operator in the error sentence
# ONNX Runtime contrib ops it registers in the default domain: they look standard but are not
ORT_ONLY = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")


@dataclass
class Finding:
    piece: str
    node: str
    op_type: str
    domain: str
    reason: str

    def where(self) -> str:
        op = f"{self.domain}:{self.op_type}" if self.domain not in DEFAULT_DOMAINS else self.op_type
        return f"{self.piece}/{self.node} ({op})"


@dataclass
class OpCheckReport:
    target: str
    tensorrt: str  # the matrix version checked against
    pieces: dict[str, dict] = field(default_factory=dict)  # piece -> {"nodes": n, "ops": {op: count}}
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict:
        return {"target": self.target, "tensorrt": self.tensorrt, "ok": self.ok, "pieces": self.pieces,
                "errors": [asdict(f) for f in self.errors], "warnings": [asdict(f) for f in self.warnings]}

    def summary(self) -> dict:
        """What the manifest records: the verdict and counts, not every node."""
        return {"target": self.target, "tensorrt": self.tensorrt, "ok": self.ok,
                "nodes": {p: info["nodes"] for p, info in self.pieces.items()},
                "warnings": [f"{f.where()}: {f.reason}" for f in self.warnings]}

    def render(self) -> str:
        lines = [f"TensorRT {self.tensorrt} operator check for target {self.target}:"]
        for piece, info in self.pieces.items():
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(info["ops"].items()))
            lines.append(f"  {piece}: {info['nodes']} nodes ({ops})")
        lines += [f"  error: {f.where()}: {f.reason}" for f in self.errors]
        lines += [f"  warning: {f.where()}: {f.reason}" for f in self.warnings]
        lines.append("  result: " + ("all nodes supported" if self.ok else f"{len(self.errors)} unsupported node(s)"))
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        """One sentence naming every failing node, grouped by operator and reason."""
        if self.ok:
            return
        groups: dict[tuple[str, str, str], list[Finding]] = {}
        for f in self.errors:
            groups.setdefault((f.domain, f.op_type, f.reason), []).append(f)
        parts = []
        for (domain, op_type, reason), found in groups.items():
            op = f"{domain}:{op_type}" if domain not in DEFAULT_DOMAINS else op_type
            names = [f"{f.piece}/{f.node}" for f in found]
            listed = ", ".join(names[:MAX_LISTED]) + (f" and {len(names) - MAX_LISTED} more"
                                                       if len(names) > MAX_LISTED else "")
            parts.append(f"{op} at {listed} ({reason})")
        hint = (" (export with --flavour standard for TensorRT)"
                if any(f.domain not in DEFAULT_DOMAINS or f.op_type in ORT_ONLY for f in self.errors) else "")
        raise SpecExportError(f"TensorRT {self.tensorrt} (target {self.target}) cannot parse {len(self.errors)}"
                              f" node(s): {'; '.join(parts)}{hint}")


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in str(version).split("."))


def _applies(rule: dict, version: str) -> bool:
    v = _vkey(version)
    if "since" in rule and v < _vkey(rule["since"]):
        return False
    return not ("until" in rule and v >= _vkey(rule["until"]))


class _Graph:
    """What the checks need to know about one graph: value types and ranks, which values are constants."""

    def __init__(self, graph: onnx.GraphProto, base_dir: Path | None, outer: _Graph | None = None) -> None:
        self.base_dir = base_dir
        self.initializers = {t.name: t for t in graph.initializer}
        if outer is not None:  # subgraphs see the outer scope's constants
            self.initializers = {**outer.initializers, **self.initializers}
        self.constant_nodes = {n.output[0]: n for n in graph.node if n.op_type == "Constant" and n.output}
        self.types: dict[str, int] = dict(outer.types) if outer else {}
        self.ranks: dict[str, int | None] = dict(outer.ranks) if outer else {}
        self.shapes: dict[str, list | None] = dict(outer.shapes) if outer else {}  # dims, None where symbolic
        for v in [*graph.input, *graph.output, *graph.value_info]:
            tt = v.type.tensor_type
            if tt.elem_type:
                self.types[v.name] = tt.elem_type
            self.ranks[v.name] = len(tt.shape.dim) if tt.HasField("shape") else None
            self.shapes[v.name] = ([d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
                                   if tt.HasField("shape") else None)
        for t in graph.initializer:
            self.types[t.name] = t.data_type
            self.ranks[t.name] = len(t.dims)
        self.consumed = {i for n in graph.node for i in n.input if i}
        self.graph_outputs = {o.name for o in graph.output}
        # constant folding reach: a value is foldable when every input of its producer is
        self.foldable = set(self.initializers) | set(self.constant_nodes) | (outer.foldable if outer else set())
        for node in graph.node:
            if node.op_type not in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                                    "Multinomial", "Bernoulli") and all(i in self.foldable for i in node.input if i):
                self.foldable.update(node.output)

    def is_initializer(self, name: str) -> bool:
        return name in self.initializers or name in self.constant_nodes

    def value(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name], base_dir=str(self.base_dir or ""))
        if name in self.constant_nodes:
            for attr in self.constant_nodes[name].attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
                if attr.name in ("value_int", "value_ints"):
                    return np.asarray(onnx.helper.get_attribute_value(attr))
        return None


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _input(node: onnx.NodeProto, i: int) -> str:
    return node.input[i] if i < len(node.input) else ""


def _rule_failure(rule: dict, node: onnx.NodeProto, g: _Graph, type_names: dict) -> tuple[str, str] | None:
    """(severity, reason) when the node breaks the rule, else None."""
    kind, text = rule["check"], rule["text"]
    if kind == "note":
        return None
    if kind == "initializer_input":
        name = _input(node, rule["input"])
        return ("error", text) if name and not g.is_initializer(name) else None
    if kind == "constant_input":
        name = _input(node, rule["input"])
        return ("error", text) if name and name not in g.foldable else None
    if kind == "input_below":
        name = _input(node, rule["input"])
        if not name:
            return None
        value = g.value(name)
        if value is None:
            return ("warning", f"{text}; its value is computed at run time, so it is not checked here")
        if np.any(np.asarray(value) >= rule["limit"]):
            return "error", f"{text} (it is {np.asarray(value).ravel().tolist()})"
        return None
    if kind == "attr_equals":
        value = _attr(node, rule["attr"], rule.get("default"))
        return ("error", f"{text} (it is {value})") if value != rule["value"] else None
    if kind == "attr_in":
        value = _attr(node, rule["attr"], rule.get("default"))
        return ("error", f"{text} (it is {value!r})") if value not in rule["values"] else None
    if kind == "attr_absent":
        present = [a for a in rule["attrs"] if _attr(node, a) is not None]
        return ("error", f"{text} (set: {', '.join(present)})") if present else None
    if kind == "attr_not_contains":
        value = _attr(node, rule["attr"], "") or ""
        return ("error", text) if rule["substring"] in value else None
    if kind == "absent_inputs":
        present = [i for i in rule["inputs"] if _input(node, i)]
        return ("error", text) if present else None
    if kind == "absent_outputs":
        used = [i for i in rule["outputs"] if i < len(node.output) and node.output[i]]
        return ("error", text) if used else None
    if kind == "unused_outputs":
        extra = [o for o in node.output[rule["from"]:] if o and (o in g.consumed or o in g.graph_outputs)]
        return ("error", text) if extra else None
    if kind == "input_rank":
        for i in rule["inputs"]:
            name = _input(node, i)
            if not name:
                continue
            rank = g.ranks.get(name)
            if rank is None:
                return "warning", f"{text}; the rank of {name!r} is unknown here"
            if rank != rule["rank"]:
                return "error", f"{text} ({name!r} has rank {rank})"
        return None
    if kind == "input_type":
        name = _input(node, rule["input"])
        got = type_names.get(str(g.types.get(name, 0)))
        return ("error", f"{text} (it is {got})") if name and got and got not in rule["types"] else None
    raise ValueError(f"unknown restriction kind {kind!r} in the operator matrix")


def check_graph(graph: onnx.GraphProto, version: str, piece: str = "model", base_dir: Path | None = None,
                _outer: _Graph | None = None) -> tuple[list[Finding], list[Finding], dict[str, int]]:
    """(errors, warnings, op counts) for every node of ``graph`` (and its subgraphs) under TensorRT ``version``
    (a version key of the matrix, e.g. '10.3'); the graph should carry inferred value_info."""
    matrix = ops_matrix()
    ops, unsupported, domains = matrix["operators"], matrix["unsupported"], matrix["domains"]
    type_names, limited = matrix["type_names"], matrix["limited_types"]
    g = _Graph(graph, base_dir, _outer)
    errors: list[Finding] = []
    warnings: list[Finding] = []
    counts: dict[str, int] = {}

    for node in graph.node:
        name = node.name or (node.output[0] if node.output else "?")
        domain = node.domain or ""
        counts[node.op_type] = counts.get(node.op_type, 0) + 1

        def fail(reason: str, severity: str = "error", node=node, name=name, domain=domain,
                 sink=(errors, warnings)) -> None:
            sink[0 if severity == "error" else 1].append(Finding(piece, name, node.op_type, domain, reason))

        if domain not in DEFAULT_DOMAINS:
            note = domains.get(domain, "a custom domain TensorRT's parser does not know (it would need a plugin"
                                       " named after the op)")
            fail(f"domain {domain!r} is {note}")
            continue
        if node.op_type in ORT_ONLY:
            fail(f"{node.op_type} is an ONNX Runtime contrib op registered in the default domain, not an ONNX"
                 " standard op; TensorRT's parser has no importer for it")
            continue
        if node.op_type in unsupported:
            fail(f"not supported by TensorRT's ONNX parser ({unsupported[node.op_type]})")
            continue
        spec = ops.get(node.op_type)
        if spec is None:
            fail(f"{node.op_type} is not in the operator matrix recorded in recipes/data/trt_ops.json; check"
                 " onnx-tensorrt's docs/operators.md and record it")
            continue
        if "since" in spec and _vkey(version) < _vkey(spec["since"]):
            fail(f"{node.op_type} is parsed from TensorRT {spec['since']} on; this target has {version}")
            continue
        type_input = spec.get("type_input", 0)
        if spec.get("types") and type_input is not None:
            checked = [_input(node, type_input)]
            if spec.get("check_output_type"):
                checked.append(node.output[0])
            for value in checked:
                got = type_names.get(str(g.types.get(value, 0)))
                if got is None or got in spec["types"]:
                    continue
                if got in limited and "FP32" in spec["types"]:
                    fail(f"{value!r} is {got}: {limited[got]}", "warning")
                else:
                    fail(f"{value!r} is {got}; TensorRT {node.op_type} takes {', '.join(spec['types'])}")
        for rule in spec.get("restrictions", []):
            if not _applies(rule, version):
                continue
            failure = _rule_failure(rule, node, g, type_names)
            if failure:
                fail(failure[1], failure[0])
        if node.op_type in QDQ_OPS:  # a quantized graph's scales, zero points, blocks and packing
            for severity, reason in qdq_failures(node, g, matrix["quantization"], type_names):
                fail(reason, severity)
        for attr in node.attribute:  # If / Loop / Scan bodies
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                e, w, c = check_graph(sub, version, f"{piece}/{name}", base_dir, g)
                errors += e
                warnings += w
                for op, n in c.items():
                    counts[op] = counts.get(op, 0) + n
    return errors, warnings, counts


def check_model(model: onnx.ModelProto, version: str, piece: str = "model", base_dir: Path | None = None
                ) -> tuple[list[Finding], list[Finding], dict[str, int]]:
    """Opset range, then every node. ``model`` may be loaded without its external weights."""
    info = ops_matrix()["versions"][version]
    errors: list[Finding] = []
    for opset in model.opset_import:
        if opset.domain in DEFAULT_DOMAINS and not info["opset_min"] <= opset.version <= info["opset_max"]:
            errors.append(Finding(piece, "(model)", "opset_import", "", f"opset {opset.version} is outside the"
                                  f" {info['opset_min']}-{info['opset_max']} range TensorRT {version} parses"))
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True)
    except Exception as exc:  # a graph ONNX itself rejects cannot be parsed by TensorRT either
        errors.append(Finding(piece, "(model)", "type_inference", "", f"ONNX type inference fails: {exc}"))
        inferred = model
    e, w, counts = check_graph(inferred.graph, version, piece, base_dir)
    return errors + e, w, counts


def check_pieces(bundle_dir: Path, pieces: dict[str, Piece], target: str | dict) -> OpCheckReport:
    """Every piece of a bundle against the target's TensorRT."""
    target = load_target(target)
    version = matrix_version(target["tensorrt"]["version"])
    report = OpCheckReport(target["name"], version)
    for name, spec in pieces.items():
        path = Path(bundle_dir) / spec.file
        if not path.is_file():
            raise SpecExportError(f"piece {name!r} names {path}, which does not exist; rebuild the bundle")
        model = onnx.load(str(path), load_external_data=False)
        errors, warnings, counts = check_model(model, version, name, path.parent)
        report.errors += errors
        report.warnings += warnings
        report.pieces[name] = {"file": spec.file, "nodes": sum(counts.values()), "ops": counts}
    return report


def require_supported(bundle_dir: Path, pieces: dict[str, Piece], target: str | dict) -> OpCheckReport:
    """check_pieces, raising one SpecExportError that names the failing nodes."""
    report = check_pieces(bundle_dir, pieces, target)
    report.raise_if_failed()
    return report
