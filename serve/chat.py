"""A chat request's messages as the prompt text the model was trained on.

A system message (optional) and one user message use the runtime's own pre-rendered format, so the server's
prompt is exactly `Session.generate`'s. Longer conversations render the model's Jinja chat template (kept in
the bundle's manifest) in a sandbox, as Hugging Face's `apply_chat_template` does."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .errors import bad_request
from .model import ModelInfo

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def render(messages: Any, model: ModelInfo) -> str:
    turns = [_turn(m, i) for i, m in enumerate(_message_list(messages))]
    roles = [role for role, _ in turns]
    if roles in (["user"], ["system", "user"]):
        return _single_turn(turns[-1][1], turns[0][1] if len(turns) == 2 else None, model)
    if model.chat_template is None:
        raise bad_request("this bundle's model has no chat template, so a conversation must be one user message"
                          " (or use /v1/completions with the raw prompt)", "messages")
    if roles[-1] == "assistant":
        raise bad_request("the last message is the assistant's; end the conversation with a user message",
                          "messages")
    from jinja2 import TemplateError

    try:
        return _template(model.chat_template).render(
            messages=[{"role": r, "content": c} for r, c in turns], add_generation_prompt=True,
            bos_token=model.bos_token, eos_token=model.eos_token)
    except TemplateError as exc:
        raise bad_request(f"the model's chat template fails on these messages ({exc})", "messages") from None


def _single_turn(user: str, system: str | None, model: ModelInfo) -> str:
    chat = model.chat
    if chat is None:
        if system is not None:
            raise bad_request("this bundle's model has no chat template, so it takes no system message", "messages")
        return user
    if system is None:
        return chat.user_prefix + user + chat.user_suffix
    if not chat.with_system:
        raise bad_request("this model's chat template takes no system message; leave it out", "messages")
    before, between, after = chat.with_system
    return before + system + between + user + after


def _message_list(messages: Any) -> list:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {role, content} objects", "messages")
    return messages


def _turn(message: Any, i: int) -> tuple[str, str]:
    param = f"messages[{i}]"
    if not isinstance(message, dict):
        raise bad_request(f"{param} must be an object with a role and a content", param)
    role = message.get("role")
    if role not in ROLES:
        raise bad_request(f"{param}.role {role!r} is not supported; use system, developer, user or assistant"
                          " (this server has no tools)", f"{param}.role")
    return ROLES[role], _content(message.get("content"), f"{param}.content")


def _content(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts can go to a text model
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad_request(f"{param} holds a part that is not text; this model reads text only", param)
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"{param} must be a string or a list of text parts", param)


@lru_cache(maxsize=4)
def _template(source: str):
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:  # templates call it to refuse a conversation
        raise bad_request(f"the model's chat template refuses these messages: {message}", "messages")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise bad_request(f"the bundle's chat template does not parse ({exc})", "messages") from None
