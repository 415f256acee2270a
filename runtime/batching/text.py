"""Text out of a batched request, as Session.stream gives it: deltas that never split a character or show
the start of a stop string early; a stop string ends the request and frees its cache row."""

from __future__ import annotations

from collections.abc import Iterator

from ..text import Detokenizer, TextCodec
from .request import BatchRequest


class BatchTextStream:
    """Iterate for text deltas; `finish_reason` ("length", "eos", "stop", "cancelled", "error") and `text` are
    final once the iteration ends. `close()` (or leaving the iteration early) cancels the request."""

    def __init__(self, request: BatchRequest, codec: TextCodec) -> None:
        self.request = request
        self.finish_reason: str | None = None
        self._detok = Detokenizer(codec, request.opts.stop)

    @property
    def text(self) -> str:
        return self._detok.emitted

    @property
    def stats(self):
        return self.request.stats

    def __iter__(self) -> Iterator[str]:
        try:
            for tokens in self.request:
                delta = self._detok.push(tokens)
                if self._detok.stopped:
                    self.finish_reason = "stop"
                    self.request.cancel()
                if delta:
                    yield delta
                if self.finish_reason:
                    return
            rest = self._detok.flush()
            if rest:
                yield rest
            self.finish_reason = self.request.finish_reason
        finally:
            if self.finish_reason is None:  # the caller stopped reading: nobody wants the rest
                self.request.cancel()
                self.finish_reason = "cancelled"

    def close(self) -> None:
        self.request.cancel()
