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

from ..errors import SpecExportError
from ..manifest import TensorIO as TensorSpec


def check_io(piece: str, kind: str, declared: list[TensorSpec], actual: dict[str, tuple[str, tuple]]) -> None:
    """The graph's (or engine's) inputs or outputs, name -> (numpy dtype name, shape), are the manifest's: a
    bundle whose manifest says otherwise is refused naming the tensor, before any call could fail on it."""
    said = {t.name: (t.dtype, tuple(t.shape)) for t in declared}
    for name in sorted(set(said) | set(actual)):
        field = f"manifest field pieces.{piece}.{kind}s"
        if name not in actual:
            raise SpecExportError(f"{field} lists {name!r}, which the piece's graph does not have; rebuild the bundle")
        if name not in said:
            raise SpecExportError(f"{field} does not list {name!r}, which the piece's graph has; rebuild the bundle")
        if said[name] != actual[name]:
            (dtype, shape), (want, want_shape) = actual[name], said[name]
            raise SpecExportError(f"{field} gives {name!r} as {want}{list(want_shape)} but the piece's graph has"
                                  f" {dtype}{list(shape)}; rebuild the bundle")


class Piece(Protocol):
    """What the schedulers may ask a piece (wrappers and a sequence's view answer for the piece they hold):"""

    name: str
    backend: str  # "onnxruntime" | "tensorrt"
    shared_pool: bool  # runs on the process-wide thread pool, which every other piece's call takes turns on
    handoff: str  # how PEARL passes states between its two threads: "host" arrays or "cuda-stream" buffers

    def run(self, x: np.ndarray, start: int, keep: int = 1, tree: TreeMask | None = None) -> dict[str, np.ndarray]:
        """Run on ``x`` ([1, n] token ids or [1, n, hidden] states) at positions [start, start+n);
        ``keep`` is how many trailing positions need logits. Returns the piece's non-cache outputs.
        On a GPU provider the states a piece makes or reads may be `DeviceStates` instead of arrays.
        With ``tree`` the n tokens belong to a token tree: they still take cache slots [start, start+n),
        but their positions and what they attend to come from the tree."""
        ...


class WrappedPiece:
    """A piece that changes how some calls run (`run`) and is the wrapped piece in everything else."""

    def __init__(self, piece) -> None:
        self.piece = piece

    def __getattr__(self, name: str):
        return getattr(self.piece, name)


PIECE_NAMES = ("shallow", "deep", "adapter", "drafter", "head")


@dataclass
class Pieces:
    """A set of pieces, the one shape every layer passes them in: an engine's (a cache row per sequence, no
    vocabularies), a sequence's (runtime/engine/pieces.sequence_pieces: views of the engine's, `deep` keeping its
    features for a head, the draft vocabularies of pruned heads), the loops', the batch scheduler's, the one-row
    padding's probe and the CUDA streams'. A piece the bundle lacks is None; `named()` has the others."""

    shallow: Piece | None = None
    deep: Piece | None = None
    adapter: Piece | None = None
    drafter: Piece | None = None
    draft_vocab: np.ndarray | None = None  # token ids of a vocabulary-pruned adapter head (FR-Spec)
    drafter_vocab: np.ndarray | None = None  # the same for the drafter piece's head
    head: Piece | None = None  # the feature-level draft head (runtime/head.py)
    head_vocab: np.ndarray | None = None  # the same for the draft head's LM head
    vocab_size: int = 0

    def named(self) -> dict[str, Piece]:
        """The pieces there are, by name."""
        return {name: getattr(self, name) for name in PIECE_NAMES if getattr(self, name) is not None}

    def __getitem__(self, name: str) -> Piece:
        piece = getattr(self, name, None) if name in PIECE_NAMES else None
        if piece is None:
            raise KeyError(name)
        return piece


@dataclass(frozen=True)
class TreeMask:
    """A call's tokens as part of a token tree rooted at slot `base` (the root's position): token i sits
    at position base + depth[i] and attends to every slot before `base` and, of the slots from `base` to
    the call's end, to those `visible[i]` marks (its ancestors and itself)."""

    base: int
    depth: np.ndarray  # [n]
    visible: np.ndarray  # [n, start + n - base] bool

    @staticmethod
    def supported(piece) -> bool:
        """Whether a piece takes token trees (bundles built before `attention_bias` do not)."""
        return "attention_bias" in getattr(piece, "input_names", ())

    @classmethod
    def from_parents(cls, parents: list[int], base: int) -> TreeMask:
        """A whole tree in one call at `base`, in topological order: parents[i] < i, -1 for the root only."""
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
        return cls(base, depth, visible)


def attention_bias(start: int, n: int, width: int, dtype: str, tree: TreeMask | None) -> np.ndarray:
    """The `attention_bias` input: zeros, except -max between a tree's branches. Causality is the
    graph's own (slot j <= slot i), so a chain needs no mask here."""
    bias = np.zeros((1, 1, n, width), dtype=dtype)
    if tree is not None:
        bias[0, 0, :, tree.base:start + n][~tree.visible] = np.finfo(dtype).min
    return bias


def slot_moves(src: list[int], dst: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
    """The cache slots a branch's layout moves, as index arrays (source, destination), leaving out slots that
    are their own destination; None when nothing moves."""
    pairs = [(s, d) for s, d in zip(src, dst, strict=True) if s != d]
    if not pairs:
        return None
    src_idx, dst_idx = (np.array(p, dtype=np.int64) for p in zip(*pairs, strict=True))
    return src_idx, dst_idx


def control_feeds(names: set[str], start: int, n: int, keep: int, tree: TreeMask | None = None,
                  bias: tuple[int, str] | None = None) -> dict[str, np.ndarray]:
    """The small per-call inputs every flavour takes; each piece declares which ones it reads. `bias` is
    the width and dtype of the piece's `attention_bias` (its last axis: start + n in ONNX Runtime's
    GroupQueryAttention, the whole cache in the standard graphs)."""
    if tree is not None and "attention_bias" not in names:
        raise SpecExportError("this bundle's pieces predate token trees (they take no attention_bias); rebuild"
                              " it with `specexport build` to use --tree")
    positions = np.arange(start, start + n, dtype=np.int64) if tree is None else tree.base + tree.depth
    feeds = {
        "position_ids": positions[None, :],
        "seqlens_k": np.array([start + n - 1], dtype=np.int32),
        "total_sequence_length": np.array(start + n, dtype=np.int32),
        "logits_to_keep": np.array([keep], dtype=np.int64),
    }
    if bias is not None and "attention_bias" in names:
        feeds["attention_bias"] = attention_bias(start, n, bias[0], bias[1], tree)
    return {k: v for k, v in feeds.items() if k in names}


def bias_input(inputs: list[TensorSpec]) -> TensorSpec | None:
    """A piece's `attention_bias` input, if it has one (found once, when the piece opens)."""
    return next((t for t in inputs if t.name == "attention_bias"), None)


def bias_spec(spec: TensorSpec | None, start: int, n: int, max_context: int) -> tuple[int, str] | None:
    """Width and dtype of the `attention_bias` input `spec` for a call of n tokens at `start`."""
    if spec is None:
        return None
    return (max_context if spec.shape[-1] == "cache_len" else start + n), spec.dtype


class DeviceStates:
    """Shallow states left in device memory: rows [first, first + n) of a store with one row per cache slot,
    where a shallow call writes the state of slot p into row p. The drafters and the loop only slice these
    along the sequence axis and join neighbouring slices, so a slice stays a row range of the store and
    `deep` or the adapter binds it by address, without the states ever reaching the host.

    A row holds the state of the last token written at that slot; the loop reads a row only while it is
    the state it means (final positions are never written again, drafts are read before the next step)."""

    __slots__ = ("first", "n", "store")

    def __init__(self, store: StateStore, first: int, n: int) -> None:
        self.store, self.first, self.n = store, first, n

    @property
    def shape(self) -> tuple[int, int, int]:
        return 1, self.n, self.store.hidden

    @property
    def ptr(self) -> int:
        """The device address of the first row."""
        return self.store.ptr + self.first * self.store.row_bytes

    def __getitem__(self, key) -> DeviceStates:
        # the only indexing the loop does: [:, a:b] (a slice of positions)
        if (not isinstance(key, tuple) or len(key) != 2 or key[0] != slice(None) or not isinstance(key[1], slice)
                or key[1].step not in (None, 1)):
            raise TypeError(f"device states take only [:, a:b] slices, not {key!r}")
        a, b, _ = key[1].indices(self.n)
        return DeviceStates(self.store, self.first + a, max(0, b - a))

    def __array__(self, *args, **kwargs):
        # a host copy would be the very transfer this type exists to avoid: fail where it would happen
        raise TypeError("shallow states on the device are not copied to the host; pass them to a piece instead")

    def __repr__(self) -> str:
        return f"DeviceStates(rows {self.first}..{self.first + self.n - 1} on {self.store.device})"


class StateStore(Protocol):
    """Where a backend keeps shallow states on a device (see DeviceStates)."""

    device: str
    hidden: int  # elements per row
    row_bytes: int
    ptr: int  # device address of row 0


def join_states(parts: list):
    """Shallow states of consecutive positions as one [1, n, H] block: numpy arrays are concatenated (the
    CPU path, as before); device states must be neighbouring rows of one store, and become one range."""
    if not isinstance(parts[0], DeviceStates):
        return np.concatenate(parts, axis=1)
    parts = [p for p in parts if p.n] or parts[:1]
    first = parts[0]
    end = first.first + first.n
    for p in parts[1:]:
        if p.store is not first.store or p.first != end:
            raise RuntimeError(f"cannot join device states {first!r} .. {p!r}: they are not neighbouring rows")
        end += p.n
    return DeviceStates(first.store, first.first, end - first.first)
