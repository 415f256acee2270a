"""A bundle's pieces opened for an engine (a cache row per sequence), and one sequence's `Pieces` from them."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .. import attention_op
from ..backends.common import Pieces
from ..bundle import Bundle
from ..errors import SpecExportError
from ..head import FeatureTap
from ..row_padding import pad_if_needed

if TYPE_CHECKING:  # ONNX Runtime loads with the first piece opened on it, not with the runtime
    import onnxruntime as ort

BACKENDS = ("onnxruntime", "tensorrt")


def open_pieces(bundle: Bundle, backend: str = "onnxruntime", providers: list[str] | None = None,
                threads: int | dict[str, int] | None = None, rows: int = 1,
                sessions: dict[str, ort.InferenceSession] | None = None, pad: bool | None = None) -> Pieces:
    """The bundle's pieces, with `rows` cache rows, shallow and deep wrapped to run one-row calls as two
    rows where this machine needs it (row_padding.py: probed here, unless `pad` says, as another engine on the
    same weights found). `threads`: a dict gives each piece its own count (PEARL runs the drafter and `deep`
    side by side); `sessions`: ONNX Runtime sessions another engine opened on the CPU, whose weights are not
    loaded again."""
    attention, matmul = bundle.manifest.graph.attention, bundle.manifest.graph.matmul
    if backend == "onnxruntime":
        from ..backends.ort import OrtPiece

        for op, choice in (("attention", attention), ("matmul", matmul)):
            if choice == "rowwise" and attention_op.load_error() is not None:
                raise SpecExportError(f"bundle {bundle.root}'s pieces use specexport's row-invariant {op} operator,"
                                      f" but {attention_op.load_error()}")
        gpu = [p for p in providers or [] if p != "CPUExecutionProvider"]
        if attention == "rowwise" and gpu:
            raise SpecExportError(f"bundle {bundle.root}'s attention is specexport's CPU operator, which {gpu[0]}"
                                  " would run on the host with the caches copied on every call; rebuild the bundle"
                                  " with --attention gqa for a GPU provider")

        def open_piece(name: str) -> OrtPiece:
            n = threads.get(name) if isinstance(threads, dict) else threads
            return OrtPiece(name, bundle.piece_path(name), bundle.pieces[name], bundle.max_context,
                            providers or ["CPUExecutionProvider"], n, attention, matmul, rows,
                            (sessions or {}).get(name))
    elif backend == "tensorrt":
        from ..backends.tensorrt import open_trt_piece

        if rows > 1:
            raise SpecExportError("the TensorRT backend's engines hold one sequence each; serve several requests"
                                  " at once on --backend onnxruntime")

        def open_piece(name: str):
            return open_trt_piece(bundle, name)
    else:
        raise SpecExportError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    dims = bundle.manifest.model.dims
    on_cpu = not any(p != "CPUExecutionProvider" for p in providers or [])
    if backend == "onnxruntime" and attention == "gqa" and bundle.manifest.graph.flavour == "ort" \
            and dims.head_dim > attention_op.WIDEST_GQA_HEAD and on_cpu:
        raise SpecExportError(f"bundle {bundle.root}'s GroupQueryAttention has {dims.head_dim}-wide heads, whose rows"
                              " ONNX Runtime's CPU kernel rounds by the call's length, so speculation would leave AR's"
                              " output; rebuild the bundle with --attention rowwise")
    pieces = Pieces(**{name: open_piece(name) for name in bundle.pieces}, vocab_size=dims.vocab)
    min_rows = min(bundle.pieces["shallow"].min_rows, bundle.pieces["deep"].min_rows)
    pad_if_needed(pieces, dims.vocab, min_rows, bundle.max_context, pad)
    return pieces


def cpu_sessions(pieces: Pieces) -> dict[str, ort.InferenceSession]:
    """The ONNX Runtime sessions of `pieces` that run on the CPU, by piece name, for another engine to share."""
    # a wrapper (the one-row padding around shallow and deep) answers for the piece it holds
    return {name: piece.session for name, piece in pieces.named().items()
            if piece.backend == "onnxruntime" and piece.device is None}


def sequence_pieces(views: Pieces, bundle: Bundle) -> Pieces:
    """One sequence's `Pieces` from its views of an engine's pieces (Engine.views), with the draft vocabularies;
    with a draft head, `deep` keeps its last call's features for it (runtime/head.py)."""
    return replace(views, deep=FeatureTap(views.deep) if views.head is not None else views.deep,
                   draft_vocab=bundle.draft_vocab("adapter"), drafter_vocab=bundle.draft_vocab("drafter"),
                   head_vocab=bundle.draft_vocab("head"), vocab_size=bundle.manifest.model.dims.vocab)
