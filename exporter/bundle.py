"""Write a bundle: pieces, tokenizer and manifest in a temporary directory, renamed into place."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import onnx
from onnx import helper

from ..runtime.errors import SpecExportError
from ..runtime.manifest import MANIFEST, SCHEMA_VERSION, sha256_file
from .onnx_builder import save_model

KV_LAYOUT = "[batch, kv_heads, cache_len, head_dim]"
KV_MODES = {
    # how the runtime must bind each cache; see the docstring of llama_graph
    "ort": ("shared", "one buffer bound as past_* and present_*; GroupQueryAttention writes the new"
                      " entries in place at total_sequence_length - seq"),
    "standard": ("swap", "past_* in, whole updated buffer out as present_* (new entries scattered at"
                         " position_ids); bind two buffers and swap them after each call"),
}


def io_spec(values) -> list[dict]:
    return [{"name": v.name,
             "dtype": helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
             "shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]}
            for v in values]


class BundleWriter:
    """Use as a context manager: on any exception the partial directory is removed."""

    def __init__(self, out: Path, force: bool = False) -> None:
        self.out = Path(out)
        if self.out.exists() and not force:
            raise SpecExportError(f"{self.out} already exists; pass --force to replace it or choose another --out")
        if self.out.exists() and not (self.out / MANIFEST).is_file():
            raise SpecExportError(f"{self.out} exists and is not a bundle; refusing to replace it")
        self.pieces: dict[str, dict] = {}
        self.tmp: Path | None = None

    def __enter__(self) -> BundleWriter:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.partial-", dir=self.out.parent))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.tmp is not None and self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)

    def add_piece(self, name: str, model: onnx.ModelProto, flavour: str, **extra) -> dict:
        files = save_model(model, self.tmp / f"{name}.onnx")
        mode, how = KV_MODES[flavour]
        inputs = io_spec(model.graph.input)
        kv_count = sum(1 for t in inputs if t["name"].startswith("past_key."))
        spec = {"file": files[0].name, "data": files[1].name if len(files) > 1 else None,
                "inputs": inputs, "outputs": io_spec(model.graph.output),
                "kv": {"mode": mode, "layout": KV_LAYOUT, "count": kv_count, "binding": how},
                **extra}
        self.pieces[name] = spec
        return spec

    def add_file(self, src: Path, name: str | None = None) -> str:
        name = name or Path(src).name
        shutil.copyfile(src, self.tmp / name)
        return name

    def commit(self, manifest: dict) -> dict:
        """Checksums every file, writes the manifest, and renames the directory into place."""
        manifest = {"schema_version": SCHEMA_VERSION, **manifest, "pieces": self.pieces}
        manifest["files"] = {p.name: sha256_file(p) for p in sorted(self.tmp.iterdir()) if p.is_file()}
        (self.tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if self.out.exists():
            trash = self.out.with_name(f".{self.out.name}.old")
            shutil.rmtree(trash, ignore_errors=True)
            self.out.rename(trash)
            self.tmp.rename(self.out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            self.tmp.rename(self.out)
        self.tmp = None
        return manifest
