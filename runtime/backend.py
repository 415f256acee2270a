"""The backend interface: one `Piece` per graph, each owning its KV cache.

A piece is called with the new tokens (ids or hidden states) and the position of the first one.
It writes their keys/values at exactly those positions and attends to everything before them, so
the caller rolls back a rejected draft by simply calling again from an earlier position: nothing is
copied or cleared (attention never looks past the query's own position).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .errors import SpecExportError


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: list  # ints and named dynamic axes

    @classmethod
    def from_json(cls, d: dict) -> TensorSpec:
        return cls(d["name"], d["dtype"], list(d["shape"]))


class Piece(Protocol):
    name: str

    def run(self, x: np.ndarray, start: int, keep: int = 1, parents: list[int] | None = None) -> dict[str, np.ndarray]:
        """Run on ``x`` ([1, n] token ids or [1, n, hidden] states) at positions [start, start+n);
        ``keep`` is how many trailing positions need logits. Returns the piece's non-cache outputs.
        With ``parents`` the n tokens are a tree (``parents[i] < i``, -1 for the root, which must come
        first): they take cache slots [start, start+n), positions start + depth, and each attends only
        to the slots before `start` and to its own ancestors."""
        ...

    def keep_slots(self, start: int, slots: list[int]) -> None:
        """Move the cache entries at `slots` (ascending, each >= start) to start, start+1, ...: after a
        tree call, the accepted branch becomes the plain sequence later calls attend to."""
        ...


def tree_layout(parents: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(depth [n], visible [n, n]) of a token tree in topological order: visible[i, j] when j is i or
    one of its ancestors."""
    n = len(parents)
    depth = np.zeros(n, dtype=np.int64)
    visible = np.eye(n, dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            if p >= i:
                raise ValueError(f"tree token {i} has parent {p}: parents must come first")
            depth[i] = depth[p] + 1
            visible[i] |= visible[p]
        elif i:
            raise ValueError(f"tree token {i} has no parent: only the first token is the root")
    return depth, visible


def attention_bias(start: int, n: int, width: int, dtype: str, parents: list[int] | None) -> np.ndarray:
    """The `attention_bias` input: zeros, except -max between a tree's branches. Causality is the
    graph's own (slot j <= slot i), so a chain needs no mask here."""
    bias = np.zeros((1, 1, n, width), dtype=dtype)
    if parents is not None:
        _, visible = tree_layout(parents)
        bias[0, 0, :, start:start + n][~visible] = np.finfo(dtype).min
    return bias


def control_feeds(names: set[str], start: int, n: int, keep: int, parents: list[int] | None = None,
                  bias: tuple[int, str] | None = None) -> dict[str, np.ndarray]:
    """The small per-call inputs every flavour takes; each piece declares which ones it reads. `bias` is
    the width and dtype of the piece's `attention_bias` (its last axis: start + n in ONNX Runtime's
    GroupQueryAttention, the whole cache in the standard graphs)."""
    if parents is not None and "attention_bias" not in names:
        raise SpecExportError("this bundle's pieces predate token trees (no attention_bias input); rebuild"
                              " it with `specexport build` to use --tree")
    positions = np.arange(start, start + n, dtype=np.int64)
    if parents is not None:
        positions = start + tree_layout(parents)[0]
    feeds = {
        "position_ids": positions[None, :],
        "seqlens_k": np.array([start + n - 1], dtype=np.int32),
        "total_sequence_length": np.array(start + n, dtype=np.int32),
        "logits_to_keep": np.array([keep], dtype=np.int64),
    }
    if bias is not None and "attention_bias" in names:
        feeds["attention_bias"] = attention_bias(start, n, bias[0], bias[1], parents)
    return {k: v for k, v in feeds.items() if k in names}


def bias_spec(inputs: list[TensorSpec], start: int, n: int, max_context: int) -> tuple[int, str] | None:
    """Width and dtype of a piece's `attention_bias` for a call of n tokens at `start`, if it has one."""
    spec = next((t for t in inputs if t.name == "attention_bias"), None)
    if spec is None:
        return None
    return (max_context if spec.shape[-1] == "cache_len" else start + n), spec.dtype
