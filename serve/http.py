"""HTTP plumbing the endpoints share: a size-capped JSON body, a watch on the client's connection, and the
server-sent-events response that streams a run's chunks."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from .errors import APIError, error_body
from .worker import Run


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON; 413 past `limit` bytes (by its Content-Length when it has one, before reading it)."""
    length = request.headers.get("content-length", "")
    too_large = APIError(413, f"the request body is larger than this server's limit of {limit} bytes", None,
                         "request_too_large")
    if length.isdigit() and int(length) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc})", None, "invalid_json") from None


class DisconnectWatch:
    """Cancels the run as soon as the client goes away, whether it is waiting for a whole response or reading
    a stream (uvicorn drops what is sent to a closed connection silently, so only `receive` tells)."""

    def __init__(self, request: Request, run: Run) -> None:
        self._task = asyncio.create_task(self._watch(request.receive, run))

    @staticmethod
    async def _watch(receive: Receive, run: Run) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        run.cancel()

    def stop(self) -> None:
        self._task.cancel()


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


DONE = b"data: [DONE]\n\n"


class EventStream:
    """A text/event-stream response: each chunk as `data: {...}`, then `data: [DONE]`. However it ends (done,
    the client gone, the server's shutdown cancelling it) its run is cancelled and the watch stopped."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[dict], run: Run, watch: DisconnectWatch) -> None:
        self._chunks = chunks
        self._run = run
        self._watch = watch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]})  # no proxy may hold the chunks back
            async for chunk in self._chunks:
                await send({"type": "http.response.body", "body": sse(chunk), "more_body": True})
            await send({"type": "http.response.body", "body": DONE, "more_body": False})
        except asyncio.CancelledError:
            # the server's shutdown timeout ran out: say so, so the client knows the text is cut short
            with contextlib.suppress(Exception):
                message = "the server shut down before this response was finished; send the request again"
                await send({"type": "http.response.body", "more_body": True,
                            "body": sse(error_body(503, message, None, "shutting_down"))})
                await send({"type": "http.response.body", "body": DONE, "more_body": False})
            raise
        finally:
            self._run.cancel()
            self._watch.stop()
