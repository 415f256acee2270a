"""A bundle on disk: its directory, its checked manifest, its digest, and the files the manifest pins."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import SpecExportError
from .manifest import MANIFEST, Manifest, ManifestError, Piece, check_relative, manifest_digest, sha256_file

__all__ = ["Bundle", "bundle_file", "load_bundle", "manifest_digest", "parse_manifest", "read_manifest",
           "read_manifest_text", "sha256_file", "verify_files"]


@dataclass(frozen=True)
class Bundle:
    root: Path
    manifest: Manifest
    digest: str  # SHA-256 of manifest.json: pins the manifest and, through its checksums, every file

    @property
    def pieces(self) -> dict[str, Piece]:
        return self.manifest.pieces

    def piece_path(self, name: str) -> Path:
        return self.root / self.pieces[name].file

    @property
    def max_context(self) -> int:
        return self.manifest.max_context

    def draft_vocab(self, name: str) -> np.ndarray | None:
        """The token ids a drafting piece's pruned head covers (FR-Spec), in its logits' order; None when the
        piece is absent or its head keeps the whole vocabulary."""
        spec = self.pieces.get(name)
        vocab = spec.draft_vocab if spec is not None else None
        return np.load(self.root / vocab.file, allow_pickle=False) if vocab else None


def read_manifest_text(root: Path) -> bytes:
    root = Path(root)
    if not root.exists():
        raise SpecExportError(f"bundle {root} does not exist; build one with `specexport build --out {root}`")
    path = root / MANIFEST
    if not path.is_file():
        raise SpecExportError(f"{root} is not a specexport bundle (no {MANIFEST}); build one with"
                              " `specexport build`")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SpecExportError(f"cannot read {path}: {exc.strerror or exc}") from None


def parse_manifest(root: Path, text: bytes) -> Manifest:
    """The manifest checked field by field, and every path it names checked to stay inside ``root`` on disk."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecExportError(f"{Path(root) / MANIFEST} is not valid JSON ({exc}); rebuild the bundle") from None
    try:
        manifest = Manifest.from_dict(data)
        for where, rel in manifest.paths():
            bundle_file(root, rel, where)
    except ManifestError as exc:
        raise ManifestError(f"bundle {root}: {exc}") from None
    return manifest


def bundle_file(root: Path, rel: str, where: str) -> Path:
    """``root / rel``, refused when the manifest field ``where`` names a path that leaves the bundle: absolute,
    through ``..``, or through a symbolic link that points out of it (the manifest's own check sees only the
    text; this one sees the disk)."""
    check_relative(rel, where)
    path = Path(root) / rel
    if not path.resolve().is_relative_to(Path(root).resolve()):
        raise ManifestError(f"manifest field {where} is {rel!r}, which a symbolic link takes out of the bundle"
                            f" directory to {path.resolve()}; a bundle keeps its files inside itself")
    return path


def read_manifest(root: Path) -> Manifest:
    """The bundle's manifest, checked (no file checksums: `load_bundle` does those)."""
    return parse_manifest(root, read_manifest_text(root))


def verify_files(root: Path, manifest: Manifest) -> list[str]:
    """Names of files whose SHA-256 differs from the manifest's (or that are missing)."""
    bad = []
    for name, digest in manifest.files.items():
        path = Path(root) / name
        if not path.is_file() or sha256_file(path) != digest:
            bad.append(name)
    return bad


def normalise_digest(expect: str) -> str:
    """A digest as `specexport inspect` prints it (64 hex digits, optionally after "sha256:"), lower-case."""
    text = expect.strip().lower().removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise SpecExportError(f"expected digest {expect!r} is not a SHA-256 (64 hex digits, as `specexport inspect`"
                              " prints it)")
    return text


def load_bundle(root: str | Path, verify: bool = True, expect_digest: str | None = None) -> Bundle:
    """The bundle at ``root``, its manifest checked; with ``verify``, every file's checksum; with
    ``expect_digest``, refused unless its manifest's SHA-256 is that one (pin the bundle a deployment tested)."""
    root = Path(root)
    text = read_manifest_text(root)
    digest = manifest_digest(text)
    if expect_digest is not None and digest != normalise_digest(expect_digest):
        raise SpecExportError(f"bundle {root} has digest {digest}, not the expected {normalise_digest(expect_digest)};"
                              " it is another build than the one pinned (see `specexport inspect`)")
    manifest = parse_manifest(root, text)
    if verify:
        bad = verify_files(root, manifest)
        if bad:
            raise SpecExportError(f"bundle {root} is corrupt: checksum mismatch for {', '.join(bad)};"
                                  " rebuild it with `specexport build`")
    return Bundle(root, manifest, digest)
