"""Which attention operator the `ort` pieces run: ONNX Runtime's GroupQueryAttention (`gqa`) or specexport's
row-invariant operator (`rowwise`, native/row_attention.cc).

The rowwise operator takes GroupQueryAttention's inputs in GroupQueryAttention's order (packed or separate
q/k/v, the in-place cache, seqlens_k, the rotary tables, position_ids, the attention bias) and computes each
output row alone, so a one-row call needs no copied row (exporter/multirow.py) and a head size over 128 rounds
a row alike at any call length. The pieces are built as for `gqa` and each
GroupQueryAttention node is then renamed into the operator; nothing else of the graph changes.

It is the `ort` flavour's default wherever the package was installed with it (`choose`): rows computed alone
keep every row of a token tree exact and let int8/int4 bundles batch, and a whole decode measured faster with it
than with GroupQueryAttention at fp32 and int4 (BENCHMARKS.md, "AR and `auto` beside ONNX Runtime GenAI").
Where the library is missing the build falls back to `gqa` and says so. It is a CPU kernel: a bundle meant for a
GPU provider is built with `--attention gqa`, and the `standard` flavour has no GroupQueryAttention to replace.
GroupQueryAttention is refused for heads wider than 128 (Gemma 3's 256): its CPU kernel rounds such rows by the
call's total length, which no lossless schedule can follow.
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


def choose(asked: str | None, flavour: str, precision: str, kv_cache: str) -> tuple[str, str | None]:
    """The build's attention: `asked` (checked), else `rowwise` for the `ort` flavour's float caches where the
    operator loads, else `gqa`; and, where the default fell back for want of the library, one sentence why."""
    if asked is not None:
        check_choice(asked, flavour, precision, kv_cache)
        return asked, None
    if flavour != "ort" or precision == "fp16" or kv_cache != "float":
        return "gqa", None
    error = attention_op.load_error()
    if error is None:
        return "rowwise", None
    return "gqa", f"building with ONNX Runtime's GroupQueryAttention (--attention gqa): {error}"


def check_head_size(attention: str, flavour: str, head_dim: int) -> None:
    """Refuses GroupQueryAttention where its CPU rows would round by the call's length (heads over 128 wide)."""
    if flavour == "ort" and attention == "gqa" and head_dim > attention_op.WIDEST_GQA_HEAD:
        raise SpecExportError(f"this model's attention heads are {head_dim} wide, where ONNX Runtime's"
                              " GroupQueryAttention rounds a row by its call's length and speculation would leave"
                              " AR's output; build with --attention rowwise (the operator is built by `make setup`)")


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
