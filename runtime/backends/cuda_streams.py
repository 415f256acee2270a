"""PEARL on TensorRT: the drafter pieces on one CUDA stream, `deep` on another (runtime/pearl.py runs the
two on two Python threads, as on the CPU).

NOT RUN: written against TensorRT 10's Python API and cuda-python's runtime bindings, but this repository's
machines have no GPU, so neither the overlap nor the code has been checked on a device. What it assumes:
cuda-python releases the GIL in cudaStreamSynchronize (every call, from 12.9.1 and 13.0.0) and fills its
symbol table thread-safely (12.9.2, 13.0.1), which the `tensorrt` and `jetson-*` extras pin, so one thread
waits for its stream while the other enqueues work; TensorRT's `execute_async_v3` only enqueues.

The handoff of the self-draft's shallow states stays on the device:

- the shallow piece writes each position's state into a slot of a ring buffer (`RING` slots, one
  position each, 256 bytes apart or more, since each slot is bound as a TensorRT output) and an event
  `written[slot]` is recorded on the draft stream right after;
- before `deep` runs, the verify stream waits on `written[slot]` of every position it verifies, copies
  the slots into deep's input buffer (device to device) and records `consumed[slot]`;
- before shallow writes a slot again (RING positions later), the draft stream waits on `consumed[slot]`,
  so a state is never overwritten before deep has copied it. The drafter runs at most PEARL's window
  ahead of the last verification (a few positions), far fewer than RING.

Each TrtPiece still synchronizes its own stream at the end of `run` and copies its small outputs to the
host (the drafter needs the draft token to go on, the verifier the logits), so the events order the
device work of the two streams while each thread waits only for its own. With an independent drafter
(the `drafter` piece) no state crosses the streams: the verifier runs shallow and deep on its stream.
"""

from __future__ import annotations

import numpy as np

from .common import Pieces
from .tensorrt import DeviceBuffer, aligned, cuda_check


def _ids(tokens: list[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)[None, :]


RING = 64
DRAFT_STREAM_PIECES = ("adapter", "drafter", "head")  # plus shallow for the self-draft


class StreamHandoff:
    """Two CUDA streams and the device-side handoff of shallow states between them (see the module)."""

    def __init__(self, pieces: Pieces, self_draft: bool = True) -> None:
        self.pieces = pieces
        self.self_draft = self_draft  # shallow drafts (draft stream) or verifies (verify stream)
        cudart = self.cudart = pieces.deep.cudart
        flags = cudart.cudaStreamNonBlocking
        self.draft_stream = cuda_check(cudart.cudaStreamCreateWithFlags(flags), "cudaStreamCreateWithFlags")
        self.verify_stream = cuda_check(cudart.cudaStreamCreateWithFlags(flags), "cudaStreamCreateWithFlags")
        drafting = [*DRAFT_STREAM_PIECES, *(["shallow"] if self.self_draft else [])]
        self.saved = {}
        for name in ("shallow", "deep", *DRAFT_STREAM_PIECES):
            piece = getattr(pieces, name, None)
            if piece is not None:
                self.saved[name] = piece.stream
                piece.use_stream(self.draft_stream if name in drafting else self.verify_stream)
        spec = next(t for t in pieces.shallow.result_specs if t.name == "hidden")
        self.row = int(spec.shape[-1]) * np.dtype(spec.dtype).itemsize  # one position's state, in bytes
        # each slot is bound as shallow's output, and TensorRT takes only 256-byte aligned addresses
        self.stride = aligned(self.row)
        self.ring = DeviceBuffer(cudart, RING * self.stride)
        event = cudart.cudaEventDisableTiming
        self.written = [cuda_check(cudart.cudaEventCreateWithFlags(event), "cudaEventCreateWithFlags")
                        for _ in range(RING)]
        self.consumed = [cuda_check(cudart.cudaEventCreateWithFlags(event), "cudaEventCreateWithFlags")
                         for _ in range(RING)]

    def _slot(self, pos: int) -> tuple[int, int]:
        slot = pos % RING
        return slot, self.ring.ptr + slot * self.stride

    # -- drafter thread ------------------------------------------------------------------------------

    def shallow(self, token: int, pos: int) -> np.ndarray:
        """Shallow on one token, its state left in the ring for deep (and returned for the adapter)."""
        c = self.cudart
        slot, ptr = self._slot(pos)
        cuda_check(c.cudaStreamWaitEvent(self.draft_stream, self.consumed[slot], 0), "cudaStreamWaitEvent")
        out = self.pieces.shallow.run(_ids([token]), pos, device_out={"hidden": ptr})
        cuda_check(c.cudaEventRecord(self.written[slot], self.draft_stream), "cudaEventRecord")
        return out["hidden"]

    # -- verifier thread -----------------------------------------------------------------------------

    def deep(self, items, tokens: list[int], pos: int) -> np.ndarray:
        """Logits [n, V] of positions pos..pos+n-1 (as pearl.HostHandoff.deep)."""
        p, c, n = self.pieces, self.cudart, len(items)
        if items[0].hidden is None:  # an independent drafter: shallow runs here, on the verify stream
            hidden = p.shallow.run(_ids(tokens), pos)["hidden"]
            return p.deep.run(hidden, pos, keep=n)["logits"][0]
        dst = p.deep.input_ptr(p.deep.primary.name)
        d2d = c.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        for i in range(n):
            slot, src = self._slot(pos + i)
            cuda_check(c.cudaStreamWaitEvent(self.verify_stream, self.written[slot], 0), "cudaStreamWaitEvent")
            cuda_check(c.cudaMemcpyAsync(dst + i * self.row, src, self.row, d2d, self.verify_stream),
                       "cudaMemcpyAsync")
            cuda_check(c.cudaEventRecord(self.consumed[slot], self.verify_stream), "cudaEventRecord")
        shape_only = np.concatenate([it.hidden for it in items], axis=1)  # deep reads the device copy
        return p.deep.run(shape_only, pos, keep=n, device_in=dst)["logits"][0]

    def close(self) -> None:
        """Both streams drained, the pieces back on the shared stream, events and ring freed."""
        c = self.cudart
        for stream in (self.draft_stream, self.verify_stream):
            cuda_check(c.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        for name, stream in self.saved.items():
            getattr(self.pieces, name).use_stream(stream)
        for event in (*self.written, *self.consumed):
            c.cudaEventDestroy(event)
        for stream in (self.draft_stream, self.verify_stream):
            c.cudaStreamDestroy(stream)
        self.ring.free()
        self.written, self.consumed, self.saved = [], [], {}
