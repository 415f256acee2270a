"""Tokenizer, chat formatting and incremental detokenisation (the `tokenizers` library only)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from .errors import SpecExportError


class TextCodec:
    def __init__(self, root: Path, spec: dict) -> None:
        self.tokenizer = Tokenizer.from_file(str(Path(root) / spec["file"]))
        self.chat = spec.get("chat")  # pre-rendered by the exporter: the runtime needs no Jinja
        self.eos_ids = set(spec["eos_token_ids"])

    def format(self, prompt: str, system: str | None = None, chat: bool = True) -> str:
        if not chat or not self.chat:
            return prompt
        if system is None:
            return self.chat["user_prefix"] + prompt + self.chat["user_suffix"]
        before, between, after = self.chat["with_system"]
        return before + system + between + prompt + after

    def encode(self, text: str) -> list[int]:
        # the chat template already holds every special token the model expects
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class Detokenizer:
    """Turns a growing list of token ids into text deltas without splitting a UTF-8 character."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.codec.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character still arriving
            return ""
        delta = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return delta


def check_prompt_fits(n_prompt: int, max_new_tokens: int, max_context: int) -> None:
    if n_prompt == 0:
        raise SpecExportError("the prompt is empty; pass some text to generate from")
    if n_prompt >= max_context:
        raise SpecExportError(f"the prompt is {n_prompt} tokens but the bundle's context is {max_context};"
                              " shorten the prompt or rebuild with a larger --context")
