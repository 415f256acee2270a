"""One copy of a weight per bundle: a tensor two pieces hold bit for bit (a tied table read as shallow's rows and
deep's LM head, the draft head's embedding rows beside shallow's) is stored in the first piece's data file, and
the later pieces' graphs point at it there (ONNX external data names a file, an offset and a length, so a graph
may read a tensor from a file beside it that another graph writes). Nothing about the computation changes: the
bytes are the ones each piece would have stored.

`read_rows_from_lm_head` lays a float piece's embedding table out as the LM head stores it ([hidden, vocab], the
MatMul's weight), gathering along the vocabulary axis, so that a tied model's table is one tensor in both.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
from onnx.external_data_helper import ExternalDataInfo

ALIGN = 64  # where each kept tensor starts in a rewritten data file


def _point(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Where an external tensor's bytes are (onnx's own setter wants the bytes in hand, which are not)."""
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL


def _tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            for sub in [attr.g, *attr.graphs] if attr.type in (onnx.AttributeProto.GRAPH,
                                                                 onnx.AttributeProto.GRAPHS) else []:
                yield from _tensors(sub)


def share_identical(root: Path, pieces: list[str], vocab: int | None = None) -> dict[str, tuple[int, bool]]:
    """Stores each table of the pieces' graphs in `root` (name.onnx with name.onnx.data, in `pieces`' order)
    once: a later piece's copy of a table already stored points at the first. A table is a tensor of rank 2 or
    more with an axis of `vocab` rows (the embedding, the LM head, their quantized rows and scales), or a flat
    one at least `vocab` long (an LM head's codes, scales and zero points in the row-invariant matmul's tiles);
    every tensor when `vocab` is None: the tables are what counts, and a piece that shares nothing else stays a
    file a tool can take alone (a quantizer; a trtexec on another machine needs the files it names). Returns,
    per piece, the bytes its own data file lost and whether it still has one (none when every tensor is shared)."""
    stored: dict[tuple, tuple[str, int, int]] = {}  # (dtype, dims, sha256) -> (file, offset, length)
    report: dict[str, tuple[int, bool]] = {}
    for name in pieces:
        path, own = root / f"{name}.onnx", root / f"{name}.onnx.data"
        if not own.exists():
            continue
        model = onnx.load(str(path), load_external_data=False)
        blob = own.read_bytes()
        kept: list[tuple[onnx.TensorProto, bytes, tuple]] = []
        shared = 0
        for tensor in _tensors(model.graph):
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = ExternalDataInfo(tensor)
            if info.location != own.name:  # already another file's
                continue
            data = blob[info.offset:info.offset + info.length]
            key = (tensor.data_type, tuple(tensor.dims), hashlib.sha256(data).digest())
            table = vocab is None or (len(tensor.dims) >= 2 and vocab in tensor.dims) or (
                len(tensor.dims) == 1 and tensor.dims[0] >= vocab)  # the row-invariant matmul's flat tiles
            if key in stored and table:
                _point(tensor, *stored[key])
                shared += len(data)
            else:
                kept.append((tensor, data, key))
        out = bytearray()
        for tensor, data, key in kept:
            out += b"\0" * (-len(out) % ALIGN)
            _point(tensor, own.name, len(out), len(data))
            stored[key] = (own.name, len(out), len(data))
            out += data
        if shared:
            if out:
                own.write_bytes(bytes(out))
            else:
                own.unlink()
            onnx.save_model(model, str(path))
        report[name] = (shared, own.exists())
    return report

