"""OpenAI request bodies (chat and completions) checked and turned into a runtime request.

Fields follow OpenAI's; specexport's own options travel in the `specexport` extension object (the openai
client sends it with `extra_body`). Every check raises an APIError naming the offending field, before
anything runs. Fields this server does not know are ignored (as vLLM and llama.cpp do); fields it knows but
cannot honour (tools, logprobs, penalties, ...) are refused when set, rather than silently dropped."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..runtime import OptionError, Options, Session
from . import chat
from .errors import APIError, bad_request
from .model import ModelInfo

log = logging.getLogger("specexport.serve")

# specexport's options a client may set in the extension object (the rest map from OpenAI's fields)
EXTENSION_OPTIONS = ("mode", "tree", "policy", "schedule", "verify", "gamma", "eta", "beta", "tau", "top_k",
                     "ignore_eos")
EXTENSION_FLAGS = ("return_token_ids",)  # the server's own: also return the generated token ids

# OpenAI fields with no effect here at their "off" values; any other value is refused (None is always off)
_UNSUPPORTED = {
    "logprobs": (False, 0), "top_logprobs": (0,), "tools": ([],), "tool_choice": ("none", "auto"),
    "functions": ([],), "function_call": ("none", "auto"), "response_format": ({"type": "text"},),
    "presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},), "echo": (False,),
    "best_of": (1,), "suffix": ("",), "modalities": (["text"],), "audio": (), "prediction": (),
}
_KNOWN = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n",
          "specexport", "user", "metadata", "store", "service_tier", "parallel_tool_calls"}
_CHAT = {"messages", "max_completion_tokens"}
_COMPLETION = {"prompt"}


@dataclass
class GenerationRequest:
    kind: str  # "chat" or "completion"
    prompt_ids: list[int]
    options: Options
    stream: bool
    include_usage: bool
    return_token_ids: bool


def parse(kind: str, body: Any, session: Session, model: ModelInfo) -> GenerationRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", None, "invalid_request")
    _check_model(body.get("model"), model)
    own = _CHAT if kind == "chat" else _COMPLETION
    _check_fields(body, own)
    ids = _chat_ids(body, session, model) if kind == "chat" else _completion_ids(body, session, model)
    stream = _flag(body, "stream")
    include_usage = _stream_options(body, stream)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n != 1):
        raise bad_request(f"n {n!r} is not supported: this server returns one choice per request; send n requests"
                          " (with different seeds to sample different ones)", "n", "unsupported_value")
    overrides, params = _options(body, kind)
    extension, flags = _extension(body.get("specexport"))
    overrides.update(extension)
    params.update({k: f"specexport.{k}" for k in extension})
    if extension.get("tree") is not None and extension.get("mode") is None:
        overrides["mode"] = "model"  # token trees grow from the drafter piece (as `specexport generate --tree`)
    options = _checked(session, overrides, params)
    prompt_param = "messages" if kind == "chat" else "prompt"
    options.max_new_tokens = _budget(len(ids), overrides.get("max_new_tokens"), params.get("max_new_tokens"),
                                     prompt_param, model)
    return GenerationRequest(kind, ids, options, stream, include_usage, flags.get("return_token_ids", False))


def _check_model(name: Any, model: ModelInfo) -> None:
    # optional, as in vLLM and llama.cpp: one server serves one model
    if name is not None and name != model.name:
        raise APIError(404, f"The model `{name}` does not exist; this server serves `{model.name}`", "model",
                       "model_not_found")


def _check_fields(body: dict, own: set[str]) -> None:
    for name, value in body.items():
        if name in _UNSUPPORTED:
            if value is not None and value not in _UNSUPPORTED[name]:
                raise bad_request(f"{name} is not supported by this server; leave it out", name,
                                  "unsupported_parameter")
        elif name not in _KNOWN and name not in own:
            log.warning("ignoring the unknown request field %r", name)


def _chat_ids(body: dict, session: Session, model: ModelInfo) -> list[int]:
    if "messages" not in body:
        raise bad_request("messages is required: a list of {role, content} objects", "messages", "missing_required")
    return session.codec.encode(chat.render(body["messages"], model))


def _completion_ids(body: dict, session: Session, model: ModelInfo) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return session.codec.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t < model.vocab_size for t in prompt):
            raise bad_request(f"prompt holds a token id outside this model's vocabulary [0, {model.vocab_size})",
                              "prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request("this server takes one prompt per request; send one request per prompt", "prompt",
                          "unsupported_value")
    raise bad_request("prompt is required: a string or a list of token ids", "prompt",
                      "missing_required" if prompt is None else "invalid_value")


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false, not {value!r}", name)
    return value


def _stream_options(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise bad_request("stream_options can only be given with stream: true", "stream_options")
    if not isinstance(options, dict):
        raise bad_request("stream_options must be an object such as {\"include_usage\": true}", "stream_options")
    return _flag(options, "include_usage") if "include_usage" in options else False


def _options(body: dict, kind: str) -> tuple[dict, dict]:
    """The runtime options the OpenAI fields set, and the field each came from (for error messages)."""
    overrides: dict[str, Any] = {}
    params: dict[str, str] = {}
    length = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    for option, field in (("max_new_tokens", length), ("temperature", "temperature"), ("top_p", "top_p"),
                          ("seed", "seed"), ("stop", "stop")):
        value = body.get(field)
        if value is None:
            continue
        if option == "stop" and isinstance(value, str):
            value = [value]
        if option == "max_new_tokens" and not isinstance(value, bool) and isinstance(value, int) and value < 1:
            raise bad_request(f"{field} {value} is below its least value, 1", field)
        overrides[option] = value
        params[option] = field
    return overrides, params


def _extension(ext: Any) -> tuple[dict, dict]:
    if ext is None:
        return {}, {}
    if not isinstance(ext, dict):
        raise bad_request("specexport must be an object of specexport options, such as {\"mode\": \"auto\"}",
                          "specexport")
    options, flags = {}, {}
    for key, value in ext.items():
        if key in EXTENSION_FLAGS:
            if not isinstance(value, bool):
                raise bad_request(f"specexport.{key} must be true or false, not {value!r}", f"specexport.{key}")
            flags[key] = value
        elif key in EXTENSION_OPTIONS:
            options[key] = value
        else:
            raise bad_request(f"unknown option specexport.{key}; the options are"
                              f" {', '.join(EXTENSION_OPTIONS + EXTENSION_FLAGS)}", f"specexport.{key}")
    return options, flags


def _checked(session: Session, overrides: dict, params: dict) -> Options:
    """The runtime's own option check (runtime/options.py), its sentence passed on with the field it names."""
    try:
        return session.options(**overrides)
    except OptionError as exc:
        raise bad_request(str(exc), _culprit(session, overrides, params)) from None


def _culprit(session: Session, overrides: dict, params: dict) -> str | None:
    # the runtime's sentence names its option, not the client's field: the first override refused on its
    # own is the one to point at (a combination refused only together names none)
    for option, value in overrides.items():
        try:
            session.options(**{option: value})
        except OptionError:
            return params.get(option, option)
    return None


def _budget(n_prompt: int, asked: int | None, field: str | None, prompt_param: str, model: ModelInfo) -> int:
    """The most new tokens: as asked, else the bundle's default, within the context (as vLLM counts it)."""
    if n_prompt == 0:
        raise bad_request("the prompt is empty; send some text to generate from", prompt_param)
    room = model.max_context - n_prompt
    if room <= 0:
        raise bad_request(f"This model's maximum context length is {model.max_context} tokens, and the prompt is"
                          f" {n_prompt} tokens; shorten the prompt", prompt_param,
                          "context_length_exceeded")
    if asked is None:
        return min(model.default_max_tokens, room)
    if asked > room:
        raise bad_request(f"This model's maximum context length is {model.max_context} tokens. However, you"
                          f" requested {n_prompt + asked} tokens ({n_prompt} in the prompt, {asked} in the"
                          f" completion); reduce the prompt or {field}", field, "context_length_exceeded")
    return asked
