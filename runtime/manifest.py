"""The bundle manifest: the one contract between the exporter and the runtime.

The exporter writes it (``specexport.exporter.bundle``); everything the runtime needs is read from
here and nothing is guessed. ``SCHEMA_VERSION`` changes whenever a field changes meaning.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import SpecExportError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
PIECE_NAMES = ("shallow", "adapter", "deep", "drafter")


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Bundle:
    root: Path
    manifest: dict

    @property
    def pieces(self) -> dict[str, dict]:
        return self.manifest["pieces"]

    def piece_path(self, name: str) -> Path:
        return self.root / self.pieces[name]["file"]

    @property
    def max_context(self) -> int:
        return int(self.manifest["model"]["dims"]["max_context"])


def read_manifest(root: Path) -> dict:
    root = Path(root)
    if not root.exists():
        raise SpecExportError(f"bundle {root} does not exist; build one with `specexport build --out {root}`")
    path = root / MANIFEST
    if not path.is_file():
        raise SpecExportError(f"{root} is not a specexport bundle (no {MANIFEST}); build one with"
                              " `specexport build`")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SpecExportError(f"{path} is not valid JSON ({exc}); rebuild the bundle") from None
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SpecExportError(f"{root} has manifest schema {version}, this specexport reads schema"
                              f" {SCHEMA_VERSION}; rebuild the bundle with this version")
    return manifest


def verify_files(root: Path, manifest: dict) -> list[str]:
    """Names of files whose SHA-256 differs from the manifest's (or that are missing)."""
    bad = []
    for name, digest in manifest["files"].items():
        path = Path(root) / name
        if not path.is_file() or sha256_file(path) != digest:
            bad.append(name)
    return bad


def load_bundle(root: str | Path, verify: bool = True) -> Bundle:
    root = Path(root)
    manifest = read_manifest(root)
    if verify:
        bad = verify_files(root, manifest)
        if bad:
            raise SpecExportError(f"bundle {root} is corrupt: checksum mismatch for {', '.join(bad)};"
                                  " rebuild it with `specexport build`")
    return Bundle(root, manifest)
