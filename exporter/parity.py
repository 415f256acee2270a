"""Check each exported piece against the PyTorch model before a bundle is accepted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runtime.backends.ort import OrtPiece
from ..runtime.errors import SpecExportError
from ..runtime.manifest import Piece

# max |onnx - torch| / max |torch|, per output; fp16 graphs are compared against the fp32 model
TOLERANCE = {"fp32": 1e-3, "fp16": 3e-2, "int8": 0.2, "int4": 1.0}
# Quantized pieces are checked twice. Against the fp32 model the rounding itself is the error: the bound
# above only catches a wholesale broken piece, so logits must also keep the fp32 top-1 token at a share of
# positions (MIN_TOP1, below what SmolLM2-135M and the tiny test model keep). Against PyTorch running the
# same rounded weights only ONNX Runtime's int8 activations (accuracy_level 4) differ, so DEQUANT_TOLERANCE
# sits a few times above their error and far below a wrongly packed or misplaced weight's (> 1).
MIN_TOP1 = {"int8": 0.85, "int4": 0.35}
DEQUANT_TOLERANCE = {"int8": 0.25, "int4": 0.25}

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
    precision: str | None = None  # the piece's own, where it is not the bundle's (drafting pieces)
    extra: Callable[[dict], dict[str, np.ndarray]] | None = None  # more inputs, as [1, seq, ...] arrays


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-6))


def _fail(piece: str, output: str, what: str, precision: str) -> None:
    raise SpecExportError(f"piece {piece!r} output {output!r} {what} for {precision}; the export is wrong for"
                          " this model, please report it")


def _compare(piece: OrtPiece, check: PieceCheck, ref: dict, seq: list[int], worst: dict[str, float],
             top1: dict[str, list[int]] | None) -> None:
    """Runs `piece` on `seq` in two chunks and folds the errors into `worst` (and top-1 counts into `top1`)."""
    x = check.feed(ref)
    extra = check.extra(ref) if check.extra is not None else {}
    cut = max(1, len(seq) // 2)
    for lo, hi in ((0, cut), (cut, len(seq))):
        out = piece.run(x[:, lo:hi], lo, keep=hi - lo, extra={k: v[:, lo:hi] for k, v in extra.items()})
        for name, ref_name in check.expect.items():
            want = ref[ref_name][:, lo:hi]
            worst[name] = max(worst.get(name, 0.0), relative_error(out[name], want))
            if top1 is not None and name == "logits":
                agree = top1.setdefault(name, [0, 0])
                agree[0] += int((out[name].argmax(-1) == want.argmax(-1)).sum())
                agree[1] += want.shape[0] * want.shape[1]


def run_checks(root: Path, manifest_pieces: dict[str, Piece], checks: list[PieceCheck], sequences: list[list[int]],
               reference: Callable[[list[int]], dict], precision: str, max_context: int,
               dequantized: Callable[[list[int]], dict] | None = None, attention: str = "gqa",
               matmul: str = "mlas") -> dict:
    """Runs every piece on every sequence in two chunks (prefill, then continuation against the cache)
    and raises naming the piece when an output is off by more than the tolerance. `dequantized`: for
    int8/int4 pieces, the reference of PyTorch running the same rounded weights (see DEQUANT_TOLERANCE). A check
    with a precision of its own is held to that precision's tolerances."""
    report: dict[str, dict] = {}
    for check in checks:
        piece_precision = check.precision or precision
        tol = TOLERANCE[piece_precision]
        rounded = dequantized if piece_precision in DEQUANT_TOLERANCE else None
        spec = manifest_pieces[check.name]
        piece = OrtPiece(check.name, root / spec.file, spec, max_context, ["CPUExecutionProvider"], None,
                         attention=attention, matmul=matmul)
        worst: dict[str, float] = {}
        worst_dq: dict[str, float] = {}
        top1: dict[str, list[int]] = {}  # output -> [agreeing positions, positions]
        for seq in sequences:
            _compare(piece, check, reference(seq), seq, worst, top1 if rounded is not None else None)
            if rounded is not None:  # each piece fed its own input from the rounded model
                _compare(piece, check, rounded(seq), seq, worst_dq, None)
        result = {"max_relative_error": worst, "tolerance": tol, "sequences": len(sequences)}
        if rounded is not None:  # first: the sharpest check names a packing error as such
            for name, err in worst_dq.items():
                if not err <= DEQUANT_TOLERANCE[piece_precision]:
                    _fail(check.name, name, f"differs by {err:.2e} (relative) from PyTorch running the same"
                          f" rounded weights, above {DEQUANT_TOLERANCE[piece_precision]:.2g}", piece_precision)
            agreement = {name: a / max(n, 1) for name, (a, n) in top1.items()}
            for name, share in agreement.items():
                if not share >= MIN_TOP1[piece_precision]:
                    _fail(check.name, name, f"agrees with the fp32 model's top-1 token at only {share:.0%} of"
                          f" positions, below {MIN_TOP1[piece_precision]:.0%}", piece_precision)
            result.update(dequantized_max_relative_error=worst_dq,
                          dequantized_tolerance=DEQUANT_TOLERANCE[piece_precision], top1_agreement=agreement,
                          min_top1_agreement=MIN_TOP1[piece_precision])
        for name, err in worst.items():
            if not err <= tol:
                _fail(check.name, name, f"differs from PyTorch by {err:.2e} (relative), above the tolerance"
                      f" {tol:.2g}", piece_precision)
        report[check.name] = result
    return report
