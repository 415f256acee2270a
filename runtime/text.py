"""Tokenizer, chat formatting and incremental detokenisation (the `tokenizers` library only)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from .errors import SpecExportError
from .manifest import TokenizerInfo


class TextCodec:
    def __init__(self, root: Path, spec: TokenizerInfo) -> None:
        try:
            self.tokenizer = Tokenizer.from_file(str(Path(root) / spec.file))
        except Exception as exc:  # the tokenizers library raises its own types; the file is what is wrong
            raise SpecExportError(f"the bundle's tokenizer {spec.file} does not load ({exc}); rebuild the"
                                  " bundle") from None
        self.chat = spec.chat  # pre-rendered by the exporter: the runtime needs no Jinja
        self.eos_ids = set(spec.eos_token_ids)

    def format(self, prompt: str, system: str | None = None, chat: bool = True) -> str:
        if not chat or not self.chat:
            return prompt
        if system is None:
            return self.chat.user_prefix + prompt + self.chat.user_suffix
        if self.chat.with_system is None:
            raise SpecExportError("this bundle's chat template takes no system prompt; drop --system")
        before, between, after = self.chat.with_system
        return before + system + between + prompt + after

    def encode(self, text: str) -> list[int]:
        # the chat template already holds every special token the model expects
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class Detokenizer:
    """Turns a growing list of token ids into text deltas: never half a UTF-8 character, and never the start
    of a stop string before the next tokens show whether it is one. `emitted` is the request's text (cut
    before a stop string once one appears); the deltas add up to it."""

    def __init__(self, codec: TextCodec, stop: list[str] | tuple[str, ...] = (), streaming: bool = True) -> None:
        self.codec = codec
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.emitted = ""
        self.stopped = False
        self._shown = 0  # characters of `emitted` streamed so far
        # Decoding the whole text again at every step costs more the longer the answer; a request read only
        # at its end with no stop string to watch for decodes once, in flush
        self._deferred = not streaming and not self.stop
        self._decoded = 0  # how many ids `emitted` was decoded from (a request's end may flush twice)

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        if self._deferred:
            return ""
        text = self.codec.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character still arriving
            return ""
        self._decoded = len(self.ids)
        hits = [text.find(s) for s in self.stop if s in text]
        if hits:
            self.emitted, self.stopped = text[:min(hits)], True
            return self.flush()
        self.emitted = text
        safe = len(text) - _stop_prefix(text, self.stop)  # held back: what may be a stop string's start
        delta = text[self._shown:safe]
        self._shown = max(self._shown, safe)
        return delta

    def flush(self) -> str:
        """What is held back, once the request ends without the stop string completing."""
        # the longest run of ids ending on a whole character: a streamed request's last push may have ended
        # inside one, after tokens of whole ones that it then held back
        if not self.stopped and self._decoded != len(self.ids):
            end = self._decoded = len(self.ids)
            while end and (text := self.codec.decode(self.ids[:end])).endswith("\ufffd"):
                end -= 1
            self.emitted = text if end else ""
        delta = self.emitted[self._shown:]
        self._shown = len(self.emitted)
        return delta


def _stop_prefix(text: str, stops: list[str]) -> int:
    """The length of the longest end of `text` that begins one of `stops` (and is not all of it)."""
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])),
               default=0)


def check_prompt_fits(n_prompt: int, max_new_tokens: int, max_context: int) -> None:
    if n_prompt == 0:
        raise SpecExportError("the prompt is empty; pass some text to generate from")
    if n_prompt >= max_context:
        raise SpecExportError(f"the prompt is {n_prompt} tokens but the bundle's context is {max_context};"
                              " shorten the prompt or rebuild with a larger --context")
