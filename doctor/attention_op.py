"""The doctor's probe of specexport's row-invariant operators' library (runtime/attention_op.py: the attention and
the int4/int8 matmul): built with the package or not, whether ONNX Runtime registers it here, and the vector
paths its operators take on this CPU."""

from __future__ import annotations

import onnxruntime as ort

from ..runtime import attention_op
from .probes import OK, WARNING, Probe


def probe_attention_op() -> Probe:
    """A missing operator is a warning, not a failure: bundles built with --attention gqa do not need it."""
    error = attention_op.load_error()
    path = attention_op.library_path()
    details = {"library": str(path) if path else None}
    if error is None:
        try:
            attention_op.register(ort.SessionOptions())
        except Exception as exc:  # ONNX Runtime's own refusal, whatever its type
            error = f"ONNX Runtime {ort.__version__} does not register {path} ({exc})"
    if error is not None:
        return Probe("attention operator", None, WARNING, f"{error}; bundles built with --attention rowwise will"
                     " not load", details)
    isa, matmul_isa = attention_op.isa(), attention_op.matmul_isa()
    details["isa"], details["matmul_isa"] = isa, matmul_isa
    return Probe("attention operator", isa, OK, f"specexport.{attention_op.OP_TYPE} registers with ONNX Runtime"
                 f" {ort.__version__} and runs its {isa} path here, specexport.{attention_op.MATMUL_OP_TYPE} its"
                 f" {matmul_isa} path (every path gives the same bits)", details)
