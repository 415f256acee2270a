"""`specexport inspect`: what a bundle holds and whether its files are intact."""

from __future__ import annotations

from pathlib import Path

from . import attention_op
from .bundle import manifest_digest, parse_manifest, read_manifest_text, verify_files


def _size(root: Path, name: str | None) -> int:
    return (root / name).stat().st_size if name and (root / name).is_file() else 0


def inspect_bundle(root: Path) -> dict:
    root = Path(root)
    text = read_manifest_text(root)
    manifest = parse_manifest(root, text)
    bad = verify_files(root, manifest)
    plain = manifest.to_dict()
    pieces = {}
    for name, spec in manifest.pieces.items():
        p = plain["pieces"][name]
        pieces[name] = {
            "file": spec.file, "bytes": _size(root, spec.file) + _size(root, spec.data),
            "layers": p["layers"], "kv_mode": spec.kv.mode, "kv_count": spec.kv.count,
            "inputs": p["inputs"], "outputs": p["outputs"], "parity": spec.parity,
            # a drafting piece may be quantized in a float bundle (the recipe's [export.drafting_precision])
            "weights": f"int{spec.quantization['bits']}" if spec.quantization else plain["graph"]["precision"],
            "features": p.get("features"),  # the draft head's: the target layers it drafts from
            "heldout": (spec.training or {}).get("heldout"),  # a trained drafting piece's held-out agreement
        }
    return {
        "bundle": str(root), "name": manifest.name, "schema_version": manifest.schema_version,
        "digest": manifest_digest(text),
        "model": plain["model"], "graph": plain["graph"], "pieces": pieces,
        "tensorrt": plain["tensorrt"], "provenance": plain["provenance"],
        "total_bytes": sum(_size(root, f) for f in manifest.files),
        "checksums_ok": not bad, "bad_files": bad,
    }


def _attention(graph: dict) -> str:
    if graph.get("attention", "gqa") == "gqa":
        return "gqa (ONNX Runtime's GroupQueryAttention)" if graph["flavour"] == "ort" else "standard ops"
    state = "loads here" if attention_op.available() else f"cannot load here: {attention_op.load_error()}"
    return f"rowwise (specexport.{attention_op.OP_TYPE}; {state})"


def _matmul(graph: dict) -> str:
    if graph.get("matmul", "mlas") == "mlas":
        return ""
    state = "loads here" if attention_op.available() else f"cannot load here: {attention_op.load_error()}"
    return f", matmul rowwise (specexport.{attention_op.MATMUL_OP_TYPE}; {state})"


def _shape(t: dict) -> str:
    return f"{t['name']} {t['dtype']}[{', '.join(str(d) for d in t['shape'])}]"


def render(report: dict) -> str:
    m, g = report["model"], report["graph"]
    d = m["dims"]
    lines = [
        f"bundle   {report['bundle']} ({report['name']}, schema {report['schema_version']})",
        f"digest   sha256:{report['digest']}",
        f"model    {m['architecture']}: {d['layers']} layers, hidden {d['hidden']}, {d['heads']} heads /"
        f" {d['kv_heads']} KV heads, vocab {d['vocab']}, context {d['max_context']}, exit layer {m['exit_layer']}",
        f"graphs   flavour {g['flavour']}, opset {g['opset']}, {g['precision']}, attention {_attention(g)}{_matmul(g)}",
        "pieces",
    ]
    for name, p in report["pieces"].items():
        parity = ""
        if p["parity"]:
            errs = ", ".join(f"{k} {v:.1e}" for k, v in p["parity"]["max_relative_error"].items())
            parity = f"; parity {errs} (tol {p['parity']['tolerance']:.0e})"
        layers = f" layers [{p['layers'][0]}, {p['layers'][1]})" if p["layers"] else ""
        if p.get("features"):
            layers = f" reads layers {', '.join(map(str, p['features']))}"
        held = p.get("heldout") or {}
        if held.get("agreement_by_position"):  # the head's, per draft position
            parity += "; held-out agreement " + ", ".join(f"{a:.0%}" for a in held["agreement_by_position"])
        lines.append(f"  {name:<8} {p['file']}{layers}, {p['weights']} weights, {p['bytes'] / 1e6:.1f} MB,"
                     f" {p['kv_count']} KV caches ({p['kv_mode']}){parity}")
        inputs = [t for t in p["inputs"] if not t["name"].startswith("past_")]
        lines.append("           in:  " + "; ".join(_shape(t) for t in inputs))
        lines.append("           out: " + "; ".join(_shape(t) for t in p["outputs"]
                                                   if not t["name"].startswith("present_")))
    engines = report["tensorrt"].get("engines") or []
    lines.append(f"tensorrt {len(engines)} engine(s)" + "".join(
        f"\n  {e['piece']}: TensorRT {e['tensorrt_version']}, sm_{e['compute_capability']}" for e in engines))
    prov = report["provenance"]
    lines.append(f"source   {prov['source_description']} (sha256 {prov['source_sha256'][:16]}…)")
    if prov["recipe_name"]:
        lines.append(f"recipe   {prov['recipe_name']} (sha256 {(prov['recipe_sha256'] or '')[:16]}…)")
    lines.append("built    " + prov["built_at"] + " with " + ", ".join(f"{k} {v}" for k, v in prov["versions"].items()))
    lines.append(f"size     {report['total_bytes'] / 1e6:.1f} MB")
    lines.append("checksums OK" if report["checksums_ok"] else "checksums FAILED: " + ", ".join(report["bad_files"]))
    return "\n".join(lines)
