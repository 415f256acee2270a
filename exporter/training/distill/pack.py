"""The corpus as it is committed: every shard's token ids in one compressed file, so training elsewhere
reads the same corpus without generating it again.

A pack holds the shipped part's and the Magpie part's shards (and the Magpie requests and the answers of a
round a stopped run left unfinished, so a run that grows the corpus further goes on from where the packed one
stopped), token ids as uint16 where the vocabulary allows, deflated: about 3 MB a million response tokens.
`unpack` writes them back into the cache directories of the same target and settings, refusing a pack made
from another target or other settings with one sentence. Its sha256 is what the recipe records.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ....runtime.errors import SpecExportError

FORMAT = 1


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    # partial shards too: the answers a stopped run finished, which the next run (anywhere) takes up
    return sorted(directory.glob("*.npz"))


def pack(dirs: dict[str, Path], out: Path, meta: dict) -> dict:
    """Pack every finished shard and request file of `dirs` ({part: directory}) into `out`; returns the
    pack's summary (its sha256, sequences, response tokens)."""
    arrays: dict[str, np.ndarray] = {}
    sequences = response_tokens = 0
    for part, directory in dirs.items():
        for path in _files(directory):
            with np.load(path) as data:
                for key in data.files:
                    value = data[key]
                    if key == "tokens" and value.size and value.max() < 1 << 16 and value.min() >= 0:
                        value = value.astype(np.uint16)
                    arrays[f"{part}/{path.stem}/{key}"] = value
                if path.name.startswith("shard_"):
                    sequences += len(data["prompt_lens"])
                    response_tokens += int(data["offsets"][-1]) - int(data["prompt_lens"].sum())
    summary = {**meta, "format": FORMAT, "sequences": sequences, "response_tokens": response_tokens}
    arrays["meta"] = np.asarray(json.dumps(summary, sort_keys=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    os.replace(tmp, out)
    return {**summary, "sha256": sha256(out)}


def read_meta(path: Path) -> dict:
    with np.load(path) as data:
        return json.loads(str(data["meta"]))


def unpack(path: Path, dirs: dict[str, Path], expect: dict, digest: str | None = None) -> int:
    """Write the pack's files that `dirs` lack; returns how many. `expect`: the meta values it must match
    (target, settings); `digest`: its sha256 as the recipe records it."""
    if not path.exists():
        raise SpecExportError(f"the committed corpus {path} is missing; restore it from git or drop it from the"
                              " recipe's [corpus]")
    if digest is not None and sha256(path) != digest:
        raise SpecExportError(f"the committed corpus {path} does not match the sha256 the recipe records; restore"
                              " it from git, or pack it again and record the new digest")
    meta = read_meta(path)
    wrong = {k: (meta.get(k), v) for k, v in expect.items() if meta.get(k) != v}
    if wrong:
        raise SpecExportError(f"the corpus {path} was made for another target or with other settings {wrong};"
                              " distill one for this target instead")
    written = 0
    with np.load(path) as data:
        files: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        for key in data.files:
            if key == "meta":
                continue
            part, stem, name = key.split("/")
            files.setdefault((part, stem), {})[name] = data[key]
        for (part, stem), arrays in files.items():
            target = dirs[part] / f"{stem}.npz"
            if target.exists():
                continue
            if "tokens" in arrays:
                arrays["tokens"] = arrays["tokens"].astype(np.int32)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)
            os.replace(tmp, target)
            written += 1
    return written
