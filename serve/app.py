"""The Starlette app: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics (Prometheus),
OpenAI-shaped errors."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..runtime import Session
from .errors import APIError, error_body
from .http import DisconnectWatch, EventStream, read_json
from .metrics import Metrics
from .model import ModelInfo
from .protocol import GenerationRequest, parse
from .responses import Reply
from .worker import Failure, Outcome, Run, Worker

log = logging.getLogger("specexport.serve")

MAX_BODY_BYTES = 4 << 20  # a context's worth of text many times over; a body past it is refused with 413


def create_app(session: Session, model_name: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               shutdown_timeout: float = 30.0, batch: int | None = None) -> Starlette:
    """An app serving `session` one request at a time (the rest wait their turn, in order), or with `batch` up
    to that many at once through the runtime's batched scheduler (serve/batch_worker.py)."""
    model = ModelInfo.of(session, model_name)
    metrics = Metrics()
    if batch:
        from .batch_worker import BatchWorker

        worker: Worker | BatchWorker = BatchWorker(session, batch, metrics)
    else:
        worker = Worker(session, metrics)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model.name, **worker.counters.as_dict()})

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    def model_card() -> dict:
        return {"id": model.name, "object": "model", "created": model.created, "owned_by": "specexport",
                "max_model_len": model.max_context}

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def one_model(request: Request) -> Response:
        name = request.path_params["name"]
        if name != model.name:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{model.name}`", "model",
                           "model_not_found")
        return JSONResponse(model_card())

    async def generate(request: Request, kind: str) -> Response | EventStream:
        try:
            body = await read_json(request, max_body_bytes)
            # tokenizing a long prompt (or rendering a template) would stall every other connection on the loop
            req = await run_in_threadpool(parse, kind, body, session, model)
            run = worker.submit(req)
        except APIError as exc:  # refused before the worker took it (past that, the worker counts it)
            metrics.refused(exc.status < 500)
            raise
        watch = DisconnectWatch(request, run)
        reply = Reply(kind, model.name, len(req.prompt_ids), req.return_token_ids)
        try:
            # the first event decides the status: a request the bundle cannot run is still a 400, not a
            # stream that breaks off
            first = await run.events.get()
            if first[0] == "error":
                raise _failure(first[1])
            if req.stream:
                stream = EventStream(_chunks(run, first, reply, req), run, watch)
                watch = None  # the stream owns it now
                return stream
            event = first
            while event[0] == "text":  # the outcome holds the whole text
                event = await run.events.get()
            if event[0] == "error":
                raise _failure(event[1])
            return JSONResponse(reply.complete(event[1]))
        finally:
            if watch is not None:
                run.cancel()  # no-op once finished; ends it when this handler is cancelled or raised
                watch.stop()

    async def chat(request: Request) -> Response | EventStream:
        return await generate(request, "chat")

    async def completions(request: Request) -> Response | EventStream:
        return await generate(request, "completion")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        # uvicorn has let in-flight requests finish (or cancelled them at its graceful-shutdown timeout)
        worker.close(shutdown_timeout)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", one_model, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        APIError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    app.state.worker = worker
    app.state.model = model
    app.state.metrics = metrics
    return app


async def _chunks(run: Run, first: tuple[str, object], reply: Reply, req: GenerationRequest) -> AsyncIterator[dict]:
    if reply.kind == "chat":
        yield reply.role_chunk()
    event = first
    while event[0] == "text":
        yield reply.text_chunk(event[1])
        event = await run.events.get()
    if event[0] == "error":  # past the first token the status is sent: the error goes in the stream, as vLLM does
        failure: Failure = event[1]
        yield _failure(failure).body()
        return
    outcome: Outcome = event[1]
    yield reply.final_chunk(outcome)
    if req.include_usage:
        yield reply.usage_chunk(outcome)


def _failure(failure: Failure) -> APIError:
    return APIError(400 if failure.client else 500, failure.message, None,
                    "unsupported_value" if failure.client else "generation_failed")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"there is no {request.url.path} here; the endpoints are /v1/chat/completions, /v1/completions," \
                  " /v1/models, /health and /metrics"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}; use {exc.headers.get('Allow', '')}" \
            if exc.headers else f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s: %s: %s", request.url.path, type(exc).__name__, exc)
    return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}: {exc}", None, "internal_error"),
                        status_code=500)
