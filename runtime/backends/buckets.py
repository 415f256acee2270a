"""Cache lengths that follow the used length, for graphs that read and write their whole cache on every call.

The standard graphs in swap mode (TensorRT before 10.15, and ONNX Runtime running the same graphs) take the
cache as `past_*`, scatter the call's entries into a copy that comes out as `present_*`, and attend over every
slot of it: a call moves about three times the bound cache. Bound at the full context, that is the cost of
the last token from the first one on. So the cache is bound at a *bucket*: the smallest of BUCKET_MIN, twice
that, ... (capped at the context) that holds the call's last position. The graphs take any cache length
(`cache_len` is a dynamic axis; the engines' profiles admit BUCKET_MIN..context), and the slots past a
query's position are masked to the type's minimum, whose exp is exactly 0, so on ONNX Runtime's CPU kernels
every bucket gives the same logits bit for bit (tests/test_buckets.py).

In [batch, kv_heads, slots, head_dim] a bucket's cache is the first kv_heads x bucket x head_dim elements
of its buffer, each head's `bucket` slots after the previous head's. Crossing into a bigger bucket therefore
lays the cache out again, once, into the other of the two swap buffers: kv_heads rows of the old bucket's
slots, from a pitch of the old bucket to a pitch of the new one, never within one buffer. A new sequence
(position 0) starts again at the smallest bucket; a rollback keeps the bucket it has.

The `ort` graphs' GroupQueryAttention writes its one buffer in place (shared mode), but its CPU kernel's time
also grows with the bound length, not only the used one (docs/journal/2026-11-25.md), and its rows are
the same bit for bit at any length. So those caches follow buckets too, with one slot to spare for the copied
row of a one-token call (multirow.py), and a growth lays the one buffer out again in place
(`relayout_in_place`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BUCKET_MIN = 128


def dynamic_cache_len(inputs) -> bool:
    """Whether a piece's caches take any length (`cache_len` a named axis); the in-place (TensorScatter)
    graphs fix it at the context, and are always bound whole."""
    caches = [t for t in inputs if t.name.startswith("past_")]
    return bool(caches) and all(isinstance(t.shape[2], str) for t in caches)


def bucket(length: int, context: int) -> int:
    """The cache length bound for a call whose last position is `length - 1`."""
    size = BUCKET_MIN
    while size < length:
        size *= 2
    return min(size, context)


@dataclass(frozen=True)
class Relayout:
    """One 2-D copy that moves a [kv_heads, old, head_dim] cache into a [kv_heads, new, head_dim] one (bytes)."""

    width: int  # bytes per head: the old bucket's slots
    height: int  # heads
    src_pitch: int
    dst_pitch: int

    @classmethod
    def of(cls, kv_heads: int, head_dim: int, itemsize: int, old: int, new: int) -> Relayout:
        row = head_dim * itemsize
        return cls(old * row, kv_heads, old * row, new * row)


class CacheBuckets:
    """A piece's current bucket: which cache length its next call binds, and when the cache must grow."""

    def __init__(self, context: int) -> None:
        self.context = context
        self.size = min(BUCKET_MIN, context)

    def for_call(self, start: int, n: int) -> tuple[int, int | None]:
        """(bucket to bind, the bucket the cache is laid out in now if it must grow first, else None)."""
        want = bucket(start + n, self.context)
        if start == 0:  # a new sequence: nothing before it to keep
            self.size = want
            return want, None
        if want <= self.size:
            return self.size, None
        old, self.size = self.size, want
        return want, old


def view(flat: np.ndarray, shape: tuple[int, ...], size: int) -> np.ndarray:
    """The [batch, kv_heads, size, head_dim] cache at the front of a buffer allocated for the full context."""
    full = list(shape)
    full[2] = size
    return flat[: int(np.prod(full))].reshape(full)


def relayout_in_place(flat: np.ndarray, shape: tuple[int, ...], old: int, new: int) -> None:
    """The same move within one buffer (shared mode: one buffer is both past and present). Each head's
    slots move right, so the last head goes first and none is overwritten before it is read; numpy copies an
    overlapping range as if through a temporary."""
    row = shape[-1]
    for r in range(int(np.prod(shape[:2])) - 1, 0, -1):  # batch x kv_heads rows of slots; row 0 stays
        flat[r * new * row:(r * new + old) * row] = flat[r * old * row:(r + 1) * old * row]


def relayout_host(src: np.ndarray, dst: np.ndarray, shape: tuple[int, ...], old: int, new: int) -> None:
    """The host side of a bucket's growth: `src` (flat, laid out at `old`) into `dst` (flat, at `new`)."""
    view(dst, shape, new)[:, :, :old] = view(src, shape, old)
