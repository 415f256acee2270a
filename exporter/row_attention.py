"""Which attention operator the `ort` pieces run: ONNX Runtime's GroupQueryAttention (`gqa`) or specexport's
row-invariant operator (`rowwise`, native/row_attention.cc).

The rowwise operator takes GroupQueryAttention's inputs in GroupQueryAttention's order (packed or separate
q/k/v, the in-place cache, seqlens_k, the rotary tables, position_ids, the attention bias) and computes each
output row alone, so a one-row call needs no copied row (exporter/multirow.py) and a head size over 128 no
split at a length boundary (runtime/attention_rounding.py). The pieces are built as for `gqa` and each
GroupQueryAttention node is then renamed into the operator; nothing else of the graph changes.

It is a CPU kernel: a bundle meant for a GPU provider keeps GroupQueryAttention (`gqa`), and the `standard`
flavour has no GroupQueryAttention to replace.
"""

from __future__ import annotations

import onnx
from onnx import helper

from ..runtime import attention_op
from ..runtime.errors import SpecExportError

ATTENTIONS = ("gqa", "rowwise")
_KEPT = ("num_heads", "kv_num_heads", "scale", "softcap", "do_rotary")


def check_choice(attention: str, flavour: str, precision: str, kv_cache: str) -> None:
    """Refuses, in one sentence, an attention the build cannot honour."""
    if attention not in ATTENTIONS:
        raise SpecExportError(f"unknown attention {attention!r}; use one of {', '.join(ATTENTIONS)}")
    if attention == "gqa":
        return
    if flavour != "ort":
        raise SpecExportError(f"--attention rowwise replaces the 'ort' flavour's GroupQueryAttention; the {flavour!r}"
                              " flavour has none: drop --attention or build with --flavour ort")
    if precision == "fp16":
        raise SpecExportError("--attention rowwise computes in fp32; build fp16 pieces with --attention gqa")
    if kv_cache != "float":
        raise SpecExportError(f"--attention rowwise keeps a float cache, and the recipe asks for kv_cache ="
                              f" {kv_cache!r}: drop one of them")
    error = attention_op.load_error()
    if error is not None:
        raise SpecExportError(f"--attention rowwise needs the operator to check the pieces, but {error}")


def use_rowwise(model: onnx.ModelProto) -> int:
    """Rewrites every GroupQueryAttention of `model` in place into the rowwise operator; returns how many."""
    count = 0
    for node in model.graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        unsupported = [a.name for a in node.attribute if a.name not in (*_KEPT, "rotary_interleaved")]
        interleaved = any(a.name == "rotary_interleaved" and a.i for a in node.attribute)
        if unsupported or interleaved or len(node.input) > 11:
            raise SpecExportError(f"GroupQueryAttention {node.name} uses {unsupported or 'more inputs'}, which the"
                                  " rowwise operator does not; build with --attention gqa")
        kept = [a for a in node.attribute if a.name in _KEPT]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.op_type, node.domain = attention_op.OP_TYPE, attention_op.DOMAIN
        count += 1
    if count and not any(o.domain == attention_op.DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(attention_op.DOMAIN, 1))
    return count
