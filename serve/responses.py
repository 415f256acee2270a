"""OpenAI response objects and stream chunks, with the usage and specexport's speculative statistics."""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..runtime.stats import Stats
from .worker import Outcome

# the runtime's reasons to OpenAI's: an end-of-sequence token and a stop string are both "stop"
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


class Reply:
    """The pieces every response and chunk of one request shares."""

    def __init__(self, kind: str, model: str, prompt_tokens: int, return_token_ids: bool) -> None:
        self.kind = kind
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.return_token_ids = return_token_ids
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens}

    def extension(self, outcome: Outcome) -> dict[str, Any]:
        ext = speculative_stats(outcome.stats)
        if self.return_token_ids:
            ext["token_ids"] = outcome.token_ids
        return ext

    def complete(self, outcome: Outcome) -> dict[str, Any]:
        """The whole response of a request that did not stream."""
        reason = FINISH[outcome.finish_reason]
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": outcome.text}, "logprobs": None,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": outcome.text, "logprobs": None, "finish_reason": reason}
        return {**self._head(False), "choices": [choice], "usage": self.usage(len(outcome.token_ids)),
                "specexport": self.extension(outcome)}

    def role_chunk(self) -> dict[str, Any]:
        """A chat stream's first chunk: the assistant's role, as OpenAI's streams open."""
        return {**self._head(True), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]}

    def text_chunk(self, text: str) -> dict[str, Any]:
        return {**self._head(True), "choices": [self._choice(text, None)]}

    def final_chunk(self, outcome: Outcome) -> dict[str, Any]:
        """The finish reason, and specexport's statistics (known only now)."""
        return {**self._head(True), "choices": [self._choice(None, FINISH[outcome.finish_reason])],
                "specexport": self.extension(outcome)}

    def usage_chunk(self, outcome: Outcome) -> dict[str, Any]:
        """stream_options.include_usage: one more chunk, with no choices, as OpenAI sends it."""
        return {**self._head(True), "choices": [], "usage": self.usage(len(outcome.token_ids))}

    def _choice(self, text: str | None, reason: str | None) -> dict[str, Any]:
        if self.kind == "chat":
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}


def speculative_stats(stats: Stats) -> dict[str, Any]:
    """tau (mean tokens per verification step, the target's own token included: 1.00 for AR), acceptance, speed."""
    return {"mode": stats.mode, "steps": stats.steps, "tau": round(stats.mean_accepted_tokens, 4),
            "drafted": stats.drafted, "accepted": stats.accepted,
            "acceptance_rate": round(stats.acceptance_rate, 4), "tokens_per_s": round(stats.tokens_per_s, 2),
            "decode_tokens_per_s": round(stats.decode_tokens_per_s, 2), "prefill_s": round(stats.prefill_s, 4),
            "decode_s": round(stats.decode_s, 4), "lossy": stats.lossy}
