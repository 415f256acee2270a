"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status that fits."""

from __future__ import annotations

from typing import Any

# OpenAI's error types by status; clients (the openai package among them) pick their exception by status
_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
          413: "invalid_request_error", 503: "server_error"}


class APIError(Exception):
    """A request the server refuses or could not serve, phrased as one sentence for the client."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param, code)
