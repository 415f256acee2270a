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

    def run(self, x: np.ndarray, start: int, keep: int = 1) -> dict[str, np.ndarray]:
        """Run on ``x`` ([1, n] token ids or [1, n, hidden] states) at positions [start, start+n);
        ``keep`` is how many trailing positions need logits. Returns the piece's non-cache outputs."""
        ...


def control_feeds(names: set[str], start: int, n: int, keep: int) -> dict[str, np.ndarray]:
    """The small per-call inputs every flavour takes; each piece declares which ones it reads."""
    feeds = {
        "position_ids": np.arange(start, start + n, dtype=np.int64)[None, :],
        "seqlens_k": np.array([start + n - 1], dtype=np.int32),
        "total_sequence_length": np.array(start + n, dtype=np.int32),
        "logits_to_keep": np.array([keep], dtype=np.int64),
    }
    return {k: v for k, v in feeds.items() if k in names}
