"""Write a bundle: pieces, tokenizer and manifest in a temporary directory, renamed into place."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import onnx
from onnx import helper

from ..runtime.errors import SpecExportError
from ..runtime.manifest import (
    MANIFEST,
    SCHEMA_VERSION,
    DraftVocab,
    KVBinding,
    Manifest,
    Piece,
    TensorIO,
    absolute_paths,
    sha256_file,
)
from .onnx_builder import save_model
from .shared_weights import share_identical

KV_LAYOUT = "[batch, kv_heads, cache_len, head_dim]"
KV_MODES = {
    # how the runtime must bind each cache; see the docstring of llama_graph
    "ort": ("shared", "one buffer bound as past_* and present_*; GroupQueryAttention writes the new"
                      " entries in place at total_sequence_length - seq"),
    "standard": ("swap", "past_* in, whole updated buffer out as present_* (new entries scattered at"
                         " position_ids); bind two buffers and swap them after each call"),
}


def io_spec(values) -> tuple[TensorIO, ...]:
    return tuple(TensorIO(v.name, helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
                          tuple(d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim))
                 for v in values)


PARTIAL = ".{name}.partial-"  # + a random suffix: a build's work in progress, beside `--out`
OWNER = ".owner"  # in a partial directory: the pid of the build writing it


class BundleWriter:
    """Use as a context manager: on any exception the partial directory is removed; a failed write (a full
    disk) is one sentence. A build killed outright (SIGKILL, power) leaves its partial directory behind with
    its pid inside; the next build beside it removes every one whose build is gone."""

    def __init__(self, out: Path, force: bool = False) -> None:
        self.out = Path(out)
        if self.out.exists() and not force:
            raise SpecExportError(f"{self.out} already exists; pass --force to replace it or choose another --out")
        if self.out.exists() and not (self.out / MANIFEST).is_file():
            raise SpecExportError(f"{self.out} exists and is not a bundle; refusing to replace it")
        self.pieces: dict[str, Piece] = {}
        self.tmp: Path | None = None

    def __enter__(self) -> BundleWriter:
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            remove_leftovers(self.out)
            self.tmp = Path(tempfile.mkdtemp(prefix=PARTIAL.format(name=self.out.name), dir=self.out.parent))
            (self.tmp / OWNER).write_text(str(os.getpid()))
        except OSError as exc:
            raise SpecExportError(f"cannot write a bundle beside {self.out}: {exc.strerror or exc}; choose another"
                                  " --out") from None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.tmp is not None and self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)
        if exc_type is not None and issubclass(exc_type, OSError):
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
            raise SpecExportError(f"writing the bundle failed: {exc.strerror or exc}{where}; nothing was written"
                                  f" to {self.out}, free some space or choose another --out") from None

    def add_piece(self, name: str, model: onnx.ModelProto, flavour: str, **extra) -> Piece:
        """Saves the piece's graph; ``extra`` are `Piece` fields (draft_vocab may be given as a mapping)."""
        files = save_model(model, self.tmp / f"{name}.onnx")
        mode, how = KV_MODES[flavour]
        inputs = io_spec(model.graph.input)
        kv_count = sum(1 for t in inputs if t.name.startswith("past_key."))
        if isinstance(extra.get("draft_vocab"), dict):
            extra["draft_vocab"] = DraftVocab(**extra["draft_vocab"])
        if extra.get("layers") is not None:
            extra["layers"] = tuple(extra["layers"])
        spec = Piece(file=files[0].name, data=files[1].name if len(files) > 1 else None, inputs=inputs,
                     outputs=io_spec(model.graph.output), kv=KVBinding(mode, KV_LAYOUT, kv_count, how), **extra)
        self.pieces[name] = spec
        return spec

    def replace_graph(self, name: str, model: onnx.ModelProto, **changes) -> Piece:
        """Saves another graph for a piece already added (a quantized one), its inputs and outputs read again;
        ``changes``: further `Piece` fields. Before `commit` a piece's data file is its own."""
        old = self.pieces[name]
        for file in (old.file, old.data):
            if file:
                (self.tmp / file).unlink(missing_ok=True)  # ONNX appends external data to a file that exists
        files = save_model(model, self.tmp / f"{name}.onnx")
        self.pieces[name] = dataclasses.replace(old, file=files[0].name, data=files[1].name if len(files) > 1 else None,
                                                inputs=io_spec(model.graph.input), outputs=io_spec(model.graph.output),
                                                **changes)
        return self.pieces[name]

    def set_parity(self, name: str, result: dict) -> None:
        self.pieces[name] = dataclasses.replace(self.pieces[name], parity=result)

    def add_file(self, src: Path, name: str | None = None) -> str:
        name = name or Path(src).name
        shutil.copyfile(src, self.tmp / name)
        return name

    def _drop_owner(self) -> None:
        (self.tmp / OWNER).unlink(missing_ok=True)

    def commit(self, **sections) -> Manifest:
        """Checksums every file (the tensorrt/ folder's too), checks and writes the manifest through its
        types, and renames the directory into place. ``sections``: the `Manifest` fields but the pieces,
        the files and the schema version."""
        self._drop_owner()  # not a file of the bundle
        model = sections.get("model")
        vocab = model.dims.vocab if model is not None else None
        for name, (_, has_data) in share_identical(self.tmp, list(self.pieces), vocab).items():
            if not has_data:
                self.pieces[name] = dataclasses.replace(self.pieces[name], data=None)
        files = {p.relative_to(self.tmp).as_posix(): sha256_file(p)
                 for p in sorted(self.tmp.rglob("*")) if p.is_file() and p.name != MANIFEST}
        manifest = Manifest(schema_version=SCHEMA_VERSION, pieces=dict(self.pieces), files=files, **sections)
        write_manifest(self.tmp, manifest)
        if self.out.exists():
            trash = self.out.with_name(f".{self.out.name}.old")
            shutil.rmtree(trash, ignore_errors=True)
            self.out.rename(trash)
            self.tmp.rename(self.out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            self.tmp.rename(self.out)
            # a replacing build killed between its two renames set the previous bundle aside: gone now
            shutil.rmtree(self.out.with_name(f".{self.out.name}.old"), ignore_errors=True)
        self.tmp = None
        return manifest


def write_manifest(root: Path, manifest: Manifest) -> Manifest:
    """Checks ``manifest`` as the runtime will read it (and that it names no path of this machine), then
    writes it in one rename."""
    plain = manifest.to_dict()
    local = absolute_paths({k: plain[k] for k in ("provenance", "pieces", "tensorrt")})
    if local:
        raise SpecExportError(f"the manifest would record an absolute path of this machine in {local[0]}; a bundle"
                              " names files by name and SHA-256 (please report this)")
    checked = Manifest.from_dict(json.loads(json.dumps(plain)))
    path = Path(root) / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.tmp")
    tmp.write_text(checked.to_json())
    os.replace(tmp, path)
    return checked


def remove_leftovers(out: Path) -> list[Path]:
    """Removes what killed builds of `out` left beside it: partial directories whose build is gone, and the
    previous bundle a replacing build had set aside (`.NAME.old`) when `out` itself is there again."""
    removed = []
    for partial in out.parent.glob(PARTIAL.format(name=out.name) + "*"):
        owner = partial / OWNER
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            pid = None
        if pid is None and time.time() - partial.stat().st_mtime < 60:
            continue  # a build that has just begun and not yet signed its directory
        if pid is None or not _alive(pid):
            shutil.rmtree(partial, ignore_errors=True)
            removed.append(partial)
    trash = out.with_name(f".{out.name}.old")
    if trash.exists() and out.exists():
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(trash)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
