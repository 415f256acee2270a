"""Check each exported piece against the PyTorch model before a bundle is accepted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runtime.errors import SpecExportError
from ..runtime.ort_backend import OrtPiece

# max |onnx - torch| / max |torch|, per output; fp16 graphs are compared against the fp32 model
TOLERANCE = {"fp32": 1e-3, "fp16": 3e-2}

PARITY_PROMPTS = [
    "Explain how a hash table works.",
    "Write a haiku about the sea.",
    "What is 17 times 23? Show your steps.",
]


@dataclass
class PieceCheck:
    """How to feed one piece and what PyTorch says it must return for a token sequence."""

    name: str
    feed: Callable[[dict], np.ndarray]  # reference tensors -> the piece's primary input
    expect: dict[str, str]  # piece output -> reference tensor name
    keep_all: bool = False  # pass logits_to_keep = chunk length


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-6))


def run_checks(root: Path, manifest_pieces: dict, checks: list[PieceCheck], sequences: list[list[int]],
               reference: Callable[[list[int]], dict], precision: str, max_context: int) -> dict:
    """Runs every piece on every sequence in two chunks (prefill, then continuation against the cache)
    and raises naming the piece when an output is off by more than the tolerance."""
    tol = TOLERANCE[precision]
    report: dict[str, dict] = {}
    for check in checks:
        spec = manifest_pieces[check.name]
        piece = OrtPiece(check.name, root / spec["file"], spec, max_context, ["CPUExecutionProvider"], None)
        worst: dict[str, float] = {}
        for seq in sequences:
            ref = reference(seq)
            x = check.feed(ref)
            cut = max(1, len(seq) // 2)
            for lo, hi in ((0, cut), (cut, len(seq))):
                out = piece.run(x[:, lo:hi], lo, keep=hi - lo)
                for name, ref_name in check.expect.items():
                    err = relative_error(out[name], ref[ref_name][:, lo:hi])
                    worst[name] = max(worst.get(name, 0.0), err)
        for name, err in worst.items():
            if not err <= tol:
                raise SpecExportError(f"piece {check.name!r} output {name!r} differs from PyTorch by {err:.2e}"
                                      f" (relative), above the {precision} tolerance {tol:.0e}; the export is"
                                      " wrong for this model, please report it")
        report[check.name] = {"max_relative_error": worst, "tolerance": tol, "sequences": len(sequences)}
    return report
