"""Whose fault a failed request is, over real HTTP, for both workers: a request the bundle cannot run is the
client's (400, `invalid_request_error`); a piece that fails mid-generation is the server's (500, `server_error`),
even though the runtime reports it as one sentence like a bad option. The failure is injected where ONNX
Runtime would raise it, under the runtime's own piece wrapper."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette", reason="the serve extra installs starlette and uvicorn")
pytest.importorskip("uvicorn", reason="the serve extra installs starlette and uvicorn")
httpx = pytest.importorskip("httpx", reason="the dev extra installs httpx")


from .test_serve import PROMPT, ThreadServer, _post, assert_error  # noqa: E402


class FailingOrt:
    """Makes an ONNX Runtime session's `run_with_iobinding` raise on its `fail_at`-th call from now, once, as
    ONNX Runtime does when a device or a kernel fails."""

    def __init__(self, ort_session, fail_at: int) -> None:
        self.calls = 0
        run = ort_session.run_with_iobinding

        def failing_run(*args, **kwargs):
            self.calls += 1
            if self.calls == fail_at:
                raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : the device went away")
            return run(*args, **kwargs)

        ort_session.run_with_iobinding = failing_run


def stream_events(server: ThreadServer, body: dict) -> tuple[int, list[str]]:
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60, json={**body, "stream": True}) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        return response.status_code, events


def assert_fails_mid_generation(server: ThreadServer, deep_session) -> None:
    body = {"prompt": PROMPT, "max_tokens": 20, "specexport": {"mode": "ar"}}
    FailingOrt(deep_session, fail_at=3)  # past the prefill and a step: the generation is under way
    error = assert_error(_post(server, "/v1/completions", body), 500, None, "generation_failed", "the device went away")
    assert "'deep'" in error["message"]  # the runtime's sentence, naming the piece
    FailingOrt(deep_session, fail_at=3)
    status, events = stream_events(server, body)
    assert status == 200 and events[-1] == "[DONE]"
    assert any(json.loads(e)["choices"][0]["text"] for e in events[:-2]), "no text came before the failure"
    error = json.loads(events[-2])["error"]
    assert (error["type"], error["code"]) == ("server_error", "generation_failed"), error
    # the server goes on: the next request is whole
    reply = _post(server, "/v1/completions", body)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 20


def test_one_at_a_time_a_bad_request_is_400_and_a_failing_piece_500(one_at_a_time):
    server = one_at_a_time
    # the tiny bundle has no drafter: the runtime's plan refuses the mode when the request is read, before the
    # worker takes it
    assert_error(_post(server, "/v1/completions", {"prompt": PROMPT, "specexport": {"mode": "model"}}), 400,
                 "specexport.mode", "invalid_value", "no drafter")
    assert_fails_mid_generation(server, server.app.state.worker.session.pieces.deep.session)
    health = server.health()
    assert (health["failed"], health["completed"], health["running"]) == (2, 1, 0), health


def test_batching_a_bad_request_is_400_and_a_failing_piece_500(batching):
    server = batching
    # the batched scheduler does not run PEARL's schedule: refused when the request is submitted to it
    assert_error(_post(server, "/v1/completions", {"prompt": PROMPT, "specexport": {"mode": "model",
                                                                                     "schedule": "pearl"}}),
                 400, None, "unsupported_value", "does not run batched")
    assert_fails_mid_generation(server, server.app.state.worker.scheduler.pieces.deep.session)
    health = server.health()
    assert (health["failed"], health["completed"], health["running"]) == (3, 1, 0), health
