"""Pre-render the model's Jinja chat template into plain strings the runtime can concatenate."""

from __future__ import annotations

from ..runtime.errors import SpecExportError
from ..runtime.manifest import ChatFormat

_USER = "\x00SPECEXPORT_USER\x00"
_SYSTEM = "\x00SPECEXPORT_SYSTEM\x00"


def _plain(tokenizer) -> ChatFormat | None:
    """A base model without a template (Gemma 3 270M's GGUF) still wants the BOS its tokenizer adds to every
    text, and the runtime encodes without special tokens, so the BOS becomes the prompt's prefix. A system
    prompt, having no role to go in, goes before the prompt, a blank line between them."""
    bos = tokenizer.bos_token
    if not bos or tokenizer("x")["input_ids"][:1] != [tokenizer.bos_token_id]:
        return None
    return ChatFormat(bos, "", (bos, "\n\n", ""))


def chat_format(tokenizer) -> ChatFormat | None:
    """Single-turn prompt format with and without a system message, or None without a template.

    The runtime must not need Jinja; rendering with sentinel contents and splitting on them keeps
    exactly what the template adds (default system prompt, role tags, generation prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        return _plain(tokenizer)

    def render(messages: list[dict]) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    plain = render([{"role": "user", "content": _USER}])
    if plain.count(_USER) != 1:
        raise SpecExportError("the model's chat template does not place the user message exactly once;"
                              " build with --no-chat-template")
    prefix, suffix = plain.split(_USER)
    try:
        with_system = render([{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}])
        before, rest = with_system.split(_SYSTEM)
        between, after = rest.split(_USER)
        system = (before, between, after)
    except Exception:  # templates that reject system messages
        system = None
    return ChatFormat(prefix, suffix, system)
