"""`specexport serve` (issue 23): the real server on a tiny bundle, called with the real `openai` client and httpx.

Most tests share one server running in a thread of this process; the shutdown tests start it as a subprocess
and signal it. Where a test needs a generation that outlasts a client's reaction (a disconnect, a shutdown
mid-request), the tiny model is too fast: its `deep` piece is slowed by a sleep per call (`slow_down`), the
only stand-in here; everything else is the real runtime and server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the serve extra installs starlette and uvicorn")
pytest.importorskip("uvicorn", reason="the serve extra installs starlette and uvicorn")
openai = pytest.importorskip("openai", reason="the dev extra installs the openai client")
httpx = pytest.importorskip("httpx", reason="the dev extra installs httpx")

PROMPT = "explain how a hash table works"
MAX_TOKENS = 24


def slow_down(session, seconds: float) -> None:
    """Every `deep` call of `session` takes `seconds` longer: a model slow enough to interrupt."""
    deep = session.pieces.deep
    run = deep.run

    def slow_run(*args, **kwargs):
        time.sleep(seconds)
        return run(*args, **kwargs)

    deep.run = slow_run


class ThreadServer:
    """The app under uvicorn in a daemon thread, on a free port of 127.0.0.1."""

    def __init__(self, app) -> None:
        import uvicorn
        from specexport.serve.server import bind

        sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()


@pytest.fixture(scope="module")
def bundle(tiny_bundles) -> Path:
    return tiny_bundles()


@pytest.fixture(scope="module")
def session(bundle):
    from specexport.runtime import load

    return load(bundle)


@pytest.fixture(scope="module")
def server(bundle) -> Iterator[ThreadServer]:
    from specexport.runtime import load
    from specexport.serve import create_app

    srv = ThreadServer(create_app(load(bundle), max_body_bytes=64 << 10))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model_name(server) -> str:
    return server.app.state.model.name


def token_ids(extension) -> list[int]:
    return extension["token_ids"]


# -- the endpoints ---------------------------------------------------------------------------------------------

def test_models_and_health(client, server, model_name):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert client.models.retrieve(model_name).id == model_name
    health = server.health()
    assert health["status"] == "ok" and health["model"] == model_name and health["running"] in (0, 1)


def test_chat_greedy_is_the_runtime_output_and_ar(client, session, model_name):
    reply = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS,
        extra_body={"specexport": {"return_token_ids": True}})
    alone = session.generate(PROMPT, max_new_tokens=MAX_TOKENS)
    ar = session.generate(PROMPT, max_new_tokens=MAX_TOKENS, mode="ar")
    ext = reply.model_extra["specexport"]
    assert token_ids(ext) == alone.tokens == ar.tokens
    assert reply.choices[0].message.content == alone.text
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == {"eos": "stop", "stop": "stop", "length": "length"}[alone.finish_reason]
    prompt_tokens = len(session.prompt_ids(PROMPT, session.options()))
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt_tokens, len(alone.tokens))
    assert reply.usage.total_tokens == prompt_tokens + len(alone.tokens)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-") and reply.model == model_name
    assert ext["mode"] == "auto" and ext["steps"] >= 1 and ext["tokens_per_s"] > 0
    assert ext["tau"] == pytest.approx(len(alone.tokens) / ext["steps"], abs=1e-3)


def test_chat_with_a_system_message(client, session, model_name):
    reply = client.chat.completions.create(
        model=model_name, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}],
        max_completion_tokens=MAX_TOKENS, extra_body={"specexport": {"return_token_ids": True}})
    alone = session.generate(PROMPT, max_new_tokens=MAX_TOKENS, system="be brief")
    assert token_ids(reply.model_extra["specexport"]) == alone.tokens


def test_chat_stream_yields_the_same_text_chunk_by_chunk(client, session, model_name):
    chunks = list(client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS, stream=True,
        stream_options={"include_usage": True}, extra_body={"specexport": {"return_token_ids": True}}))
    alone = session.generate(PROMPT, max_new_tokens=MAX_TOKENS)
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == alone.text
    assert len(texts) > 1, "the text came in one piece, not as it was generated"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and token_ids(finish[0].model_extra["specexport"]) == alone.tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(alone.tokens)
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"


def test_raw_sse_format(server):
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={"prompt": PROMPT, "max_tokens": 4, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        body = response.read().decode()
    events = body.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events[:-1])
    assert [json.loads(e[6:])["object"] for e in events[:-2]] == ["text_completion"] * (len(events) - 2)


def test_completions_raw_prompt_text_and_token_ids(client, session, model_name):
    alone = session.generate(PROMPT, max_new_tokens=MAX_TOKENS, chat=False)
    by_text = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                        extra_body={"specexport": {"return_token_ids": True}})
    ids = session.codec.encode(PROMPT)
    by_ids = client.completions.create(model=model_name, prompt=ids, max_tokens=MAX_TOKENS,
                                       extra_body={"specexport": {"return_token_ids": True, "mode": "ar"}})
    assert by_text.choices[0].text == by_ids.choices[0].text == alone.text
    assert token_ids(by_text.model_extra["specexport"]) == token_ids(by_ids.model_extra["specexport"]) == alone.tokens
    assert by_text.usage.prompt_tokens == len(ids) and by_text.object == "text_completion"
    assert by_ids.model_extra["specexport"]["mode"] == "ar"
    streamed = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == alone.text


def test_sampling_fields_reach_the_runtime(client, session, model_name):
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.8, seed=7)
    first = client.completions.create(**kwargs).choices[0].text
    again = client.completions.create(**kwargs).choices[0].text
    alone = session.generate(PROMPT, max_new_tokens=MAX_TOKENS, chat=False, temperature=0.9, top_p=0.8, seed=7)
    assert first == again == alone.text
    other_seed = session.generate(PROMPT, max_new_tokens=MAX_TOKENS, chat=False, temperature=0.9, top_p=0.8,
                                  seed=8)
    assert client.completions.create(**{**kwargs, "seed": 8}).choices[0].text == other_seed.text


def test_stop_strings(client, session, model_name):
    full = session.generate(PROMPT, max_new_tokens=MAX_TOKENS, chat=False).text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop.strip(), full
    reply = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=MAX_TOKENS, stop=stop)
    assert reply.choices[0].text == full[:full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_a_conversation_renders_the_chat_template(client, model_name, tiny_checkpoint):
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "write a haiku"}, {"role": "assistant", "content": "the sea"},
                {"role": "user", "content": PROMPT}]
    text = AutoTokenizer.from_pretrained(tiny_checkpoint).apply_chat_template(messages, tokenize=False,
                                                                               add_generation_prompt=True)
    chat = client.chat.completions.create(model=model_name, messages=messages, max_tokens=MAX_TOKENS)
    raw = client.completions.create(model=model_name, prompt=text, max_tokens=MAX_TOKENS)
    assert chat.choices[0].message.content == raw.choices[0].text
    assert chat.usage.prompt_tokens == raw.usage.prompt_tokens


def test_speculative_options_go_in_the_extension(client, session, model_name):
    reply = client.completions.create(model=model_name, prompt="the quick brown fox " * 3, max_tokens=MAX_TOKENS,
                                      extra_body={"specexport": {"mode": "lookup", "return_token_ids": True}})
    ext = reply.model_extra["specexport"]
    assert ext["mode"] == "lookup"
    assert token_ids(ext) == session.generate("the quick brown fox " * 3, max_new_tokens=MAX_TOKENS, chat=False,
                                              mode="ar").tokens
    assert 0.0 <= ext["acceptance_rate"] <= 1.0 and ext["drafted"] >= ext["accepted"]


# -- errors: OpenAI's shape, the right status, and the server goes on -----------------------------------------

def _post(server, path: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{server.url}{path}", content=content, timeout=60,
                      headers={"content-type": "application/json"}, **kwargs)


def assert_error(response: httpx.Response, status: int, param=None, code=None, *fragments: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    assert error["param"] == param and error["code"] == code, error
    assert "Traceback" not in error["message"] and error["message"].count("\n") == 0
    for fragment in fragments:
        assert fragment in error["message"], error["message"]
    return error


CHAT = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}

BAD_REQUESTS = [
    # (path, body, status, param, code, words of the message)
    ("/v1/chat/completions", {**CHAT, "specexport": {"mode": "fast"}}, 400, "specexport.mode", "invalid_value",
     ["unknown mode 'fast'"]),
    ("/v1/chat/completions", {**CHAT, "specexport": {"tree": "x:y"}}, 400, "specexport.tree", "invalid_value", []),
    ("/v1/chat/completions", {**CHAT, "specexport": {"speed": 2}}, 400, "specexport.speed", "invalid_value",
     ["unknown option specexport.speed"]),
    ("/v1/chat/completions", {**CHAT, "specexport": "auto"}, 400, "specexport", "invalid_value", []),
    ("/v1/chat/completions", {**CHAT, "specexport": {"ignore_eos": "yes"}}, 400, "specexport.ignore_eos",
     "invalid_value", ["ignore_eos must be true or false"]),
    ("/v1/chat/completions", {**CHAT, "temperature": -1}, 400, "temperature", "invalid_value", ["temperature"]),
    ("/v1/chat/completions", {**CHAT, "top_p": 0}, 400, "top_p", "invalid_value", ["top_p"]),
    ("/v1/chat/completions", {**CHAT, "seed": "one"}, 400, "seed", "invalid_value", ["seed"]),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400, "max_tokens", "invalid_value", []),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 100000}, 400, "max_tokens", "context_length_exceeded",
     ["maximum context length is 256"]),
    ("/v1/chat/completions", {**CHAT, "stop": [""]}, 400, "stop", "invalid_value", []),
    ("/v1/chat/completions", {**CHAT, "n": 2}, 400, "n", "unsupported_value", ["one choice"]),
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, 400, "stream", "invalid_value", []),
    ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}, 400, "stream_options",
     "invalid_value", []),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400, "tools", "unsupported_parameter", []),
    ("/v1/chat/completions", {**CHAT, "logprobs": True}, 400, "logprobs", "unsupported_parameter", []),
    ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages", "missing_required", []),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", "invalid_value", []),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role",
     "invalid_value", []),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content", "invalid_value", []),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "fox " * 400}]}, 400, "messages",
     "context_length_exceeded", ["maximum context length is 256"]),
    ("/v1/completions", {"prompt": "fox " * 400}, 400, "prompt", "context_length_exceeded", []),
    ("/v1/completions", {"prompt": ""}, 400, "prompt", "invalid_value", ["empty"]),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt", "unsupported_value", ["one prompt"]),
    ("/v1/completions", {"prompt": [10 ** 9]}, 400, "prompt", "invalid_value", ["vocabulary"]),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt", "missing_required", []),
    ("/v1/completions", [1, 2], 400, None, "invalid_request", ["JSON object"]),
    # the runtime's plan refuses it when the request is read (the bundle has no drafter), naming the field
    ("/v1/completions", {"prompt": PROMPT, "specexport": {"mode": "model"}}, 400, "specexport.mode",
     "invalid_value", ["no drafter"]),
    ("/v1/completions", {"prompt": PROMPT, "stream": True, "specexport": {"mode": "model"}}, 400, "specexport.mode",
     "invalid_value", ["no drafter"]),
    ("/v1/completions", {"prompt": PROMPT, "model": "gpt-4"}, 404, "model", "model_not_found", ["gpt-4"]),
]


@pytest.mark.parametrize("path, body, status, param, code, words", BAD_REQUESTS,
                         ids=[f"{i}-{b}" for i, (_, b, *_) in enumerate(BAD_REQUESTS)])
def test_bad_requests_get_openai_errors(server, path, body, status, param, code, words):
    assert_error(_post(server, path, body), status, param, code, *words)


def test_malformed_json_and_oversized_bodies(server):
    assert_error(_post(server, "/v1/chat/completions", b'{"messages": [}'), 400, None, "invalid_json", "JSON")
    assert_error(_post(server, "/v1/completions", b"\xff\xfe"), 400, None, "invalid_json")
    big = json.dumps({"prompt": "x" * (70 << 10)}).encode()  # the test server's limit is 64 KiB
    assert_error(_post(server, "/v1/completions", big), 413, None, "request_too_large", "65536 bytes")

    def chunked():  # no Content-Length: the limit holds while the body is read
        for _ in range(70):
            yield b" " * 1024

    response = httpx.post(f"{server.url}/v1/completions", content=chunked(), timeout=60)
    assert_error(response, 413, None, "request_too_large")


def test_unknown_routes_and_methods(server):
    assert_error(httpx.get(f"{server.url}/v1/embeddings", timeout=10), 404, None, None, "/v1/embeddings")
    response = httpx.get(f"{server.url}/v1/chat/completions", timeout=10)
    assert_error(response, 405, None, None, "POST")
    assert "POST" in response.headers["allow"]
    assert_error(httpx.get(f"{server.url}/v1/models/gpt-4", timeout=10), 404, "model", "model_not_found")


def test_the_openai_client_raises_its_own_errors(client, model_name):
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"specexport": {"mode": "fast"}})
    assert bad.value.status_code == 400 and bad.value.body["param"] == "specexport.mode"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}], n=2)


def test_failures_leave_the_server_serving(client, server, session, model_name):
    before = server.health()
    for body in ({"prompt": PROMPT, "specexport": {"mode": "model"}}, {"prompt": "x", "temperature": "hot"}):
        assert _post(server, "/v1/completions", body).status_code == 400
    reply = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=MAX_TOKENS)
    assert reply.choices[0].text == session.generate(PROMPT, max_new_tokens=MAX_TOKENS, chat=False).text
    after = server.health()
    assert after["failed"] == before["failed"]  # both were refused when read: neither reached the worker
    assert after["completed"] == before["completed"] + 1 and after["running"] == 0 and after["queued"] == 0


# -- reliability: disconnects and shutdown -----------------------------------------------------------------------

@pytest.fixture()
def slow_server(bundle) -> Iterator[ThreadServer]:
    from specexport.runtime import load
    from specexport.serve import create_app

    session = load(bundle)
    slow_down(session, 0.02)  # a whole 200-token answer takes > 4 s
    srv = ThreadServer(create_app(session))
    yield srv
    srv.stop()


def _wait_idle(server: ThreadServer, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        health = server.health()
        if health["running"] == 0 and health["queued"] == 0:
            return health
        assert time.monotonic() < deadline, f"the server is still busy: {health}"
        time.sleep(0.05)


def test_a_client_leaving_mid_stream_stops_its_generation(slow_server):
    body = {"prompt": PROMPT, "max_tokens": 200, "stream": True}
    with httpx.stream("POST", f"{slow_server.url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
    left = time.monotonic()
    health = _wait_idle(slow_server)
    assert time.monotonic() - left < 2.0, "the generation went on after the client left"
    assert health["cancelled"] == 1 and 0 < health["last_cancelled_tokens"] < 100, health
    # the slot is free: the next request runs at once and completes
    reply = httpx.post(f"{slow_server.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 5}, timeout=30)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 5


def test_a_client_giving_up_on_a_whole_response_stops_its_generation(slow_server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{slow_server.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 200}, timeout=0.5)
    health = _wait_idle(slow_server)
    assert health["cancelled"] == 1 and health["last_cancelled_tokens"] < 100, health


def test_queued_requests_wait_their_turn_in_order(slow_server, session):
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        r = httpx.post(f"{slow_server.url}/v1/completions", timeout=60,
                       json={"prompt": f"{PROMPT} {i}", "max_tokens": 10, "specexport": {"mode": "ar"}})
        results[i] = r.json()["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(3):  # one at a time on one Session: each gets what it would get alone
        assert results[i] == session.generate(f"{PROMPT} {i}", max_new_tokens=10, chat=False).text


class Flaky:
    """Makes `deep` raise on its `fail_at`-th call from now (a device error, say), once."""

    def __init__(self, session, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at
        deep = session.pieces.deep
        run = deep.run

        def flaky_run(*args, **kwargs):
            self.calls += 1
            if self.calls == self.fail_at:
                raise RuntimeError("the device went away")
            return run(*args, **kwargs)

        deep.run = flaky_run


@pytest.fixture()
def flaky_server(bundle):
    from specexport.runtime import load
    from specexport.serve import create_app

    session = load(bundle)
    srv = ThreadServer(create_app(session))
    yield srv, session
    srv.stop()


def test_a_generation_that_breaks_is_a_500_and_the_next_one_runs(flaky_server):
    server, session = flaky_server
    Flaky(session, fail_at=5)  # past the prefill: the response has begun
    response = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 20})
    assert_error(response, 500, None, "generation_failed", "the device went away")
    Flaky(session, fail_at=5)
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={"prompt": PROMPT, "max_tokens": 20, "stream": True}) as streamed:
        assert streamed.status_code == 200  # sent with the first chunk, before the failure
        events = [line[6:] for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "the device went away" in json.loads(events[-2])["error"]["message"]
    assert len(events) > 2  # text came before the error
    # the Session was given back: the next request gets the full, right answer
    reply = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "specexport": {"mode": "ar"}})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 20
    health = server.health()
    assert (health["failed"], health["completed"], health["running"]) == (2, 1, 0)


SLOW_SERVER = """
import sys, time
from specexport.runtime import load
from specexport.serve.server import serve

session = load(sys.argv[1])
deep, run = session.pieces.deep, session.pieces.deep.run
deep.run = lambda *a, **k: (time.sleep(float(sys.argv[2])), run(*a, **k))[1]
serve(session, port=0, shutdown_timeout=float(sys.argv[3]), log_level="warning")
"""


def _start(args: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    for line in proc.stderr:
        if " on http://" in line:
            return proc, line.split(" on ")[1].split()[0].removesuffix("/v1")
        assert time.monotonic() < deadline
    proc.kill()
    raise AssertionError(f"the server did not start: {proc.stderr.read()}")


def _sigterm_mid_stream(proc: subprocess.Popen, url: str, max_tokens: int) -> tuple[list[str], float]:
    """Starts a stream, sends SIGTERM after its first chunk, reads what is left; returns the events and the
    seconds from the signal to the process's exit."""
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", timeout=60,
                      json={"prompt": PROMPT, "max_tokens": max_tokens, "stream": True}) as response:
        lines = response.iter_lines()
        events.append(next(line for line in lines if line.startswith("data: ")))
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            events += [line for line in lines if line.startswith("data: ")]
        except httpx.HTTPError:  # cut off by the shutdown
            pass
    proc.wait(60)
    return events, time.monotonic() - signalled


def test_sigterm_lets_the_request_in_flight_finish_then_exits_0(bundle):
    proc, url = _start([sys.executable, "-c", SLOW_SERVER, str(bundle), "0.01", "20"])
    try:
        events, took = _sigterm_mid_stream(proc, url, 60)
        assert events[-1] == "data: [DONE]"
        final = [json.loads(e[6:]) for e in events[:-1]][-1]
        assert final["choices"][0]["finish_reason"] == "length"
        assert proc.returncode == 0, proc.stderr.read()
        assert took < 20
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=5)
    finally:
        proc.kill()


def test_sigterm_cancels_what_outlasts_the_timeout_and_exits_0(bundle):
    proc, url = _start([sys.executable, "-c", SLOW_SERVER, str(bundle), "0.05", "1"])
    try:
        events, took = _sigterm_mid_stream(proc, url, 200)  # 200 tokens would take 10 s
        assert events[-1] == "data: [DONE]" and len(events) < 100
        error = json.loads(events[-2][6:])["error"]
        assert error["code"] == "shutting_down" and error["type"] == "server_error"
        assert proc.returncode == 0, proc.stderr.read()
        assert took < 6, f"{took:.1f} s from SIGTERM to exit with a 1 s shutdown timeout"
    finally:
        proc.kill()


# -- the command ---------------------------------------------------------------------------------------------

def test_cli_serve_answers_and_stops_cleanly(bundle, session):
    proc, url = _start([str(Path(sys.executable).with_name("specexport")), "serve", "--bundle", str(bundle),
                        "--port", "0", "--log-level", "warning"])
    try:
        assert url.startswith("http://127.0.0.1:")  # localhost unless told otherwise
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=MAX_TOKENS,
                                               messages=[{"role": "user", "content": PROMPT}])
        assert reply.choices[0].message.content == session.generate(PROMPT, max_new_tokens=MAX_TOKENS).text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()


def test_cli_serve_refuses_in_one_sentence(bundle, tmp_path):
    exe = str(Path(sys.executable).with_name("specexport"))
    missing = subprocess.run([exe, "serve", "--bundle", str(tmp_path / "nope")], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 1 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    from specexport.serve.server import bind

    taken = bind("127.0.0.1", 0)
    try:
        busy = subprocess.run([exe, "serve", "--bundle", str(bundle), "--port", str(taken.getsockname()[1])],
                              capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    assert busy.returncode == 1 and "is in use" in busy.stderr and "Traceback" not in busy.stderr
    assert busy.stderr.strip().count("\n") == 0, busy.stderr
