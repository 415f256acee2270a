"""The server on Ray Serve (issue 23, point 4): `specexport serve --ray` starts a local Ray instance (autoscaling
between one and two replicas), requests go through Ray's HTTP proxy and get the runtime's own tokens, as from the
plain server; SIGTERM takes it all down with exit 0. Needs `pip install '.[ray]'`; skipped without it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the serve extra installs starlette and uvicorn")
ray = pytest.importorskip("ray", reason="Ray Serve is optional: pip install 'specexport[ray]'")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is optional: pip install 'specexport[ray]'")
openai = pytest.importorskip("openai", reason="the dev extra installs the openai client")

PROMPT = "explain how a hash table works"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_proxy(tiny_bundles):
    import httpx

    port = free_port()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("specexport")), "serve", "--ray", "--bundle",
                             str(tiny_bundles()), "--port", str(port), "--autoscale", "1:2", "--replica-cpus", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for line in proc.stderr:  # printed once the application is up
            if "on Ray Serve at" in line:
                break
        else:
            raise AssertionError(f"Ray Serve did not start (exit {proc.wait()})")
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # Ray's logs must not fill the pipe
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "the replicas did not become ready"
            time.sleep(0.5)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_ray_serve_gives_the_runtimes_tokens(ray_proxy, tiny_bundles):
    from specexport.runtime import load

    url, _ = ray_proxy
    session = load(tiny_bundles())
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    alone = session.generate(PROMPT, max_new_tokens=24)
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=24, extra_body={"specexport": {"return_token_ids": True}})
    assert reply.model_extra["specexport"]["token_ids"] == alone.tokens
    assert reply.choices[0].message.content == alone.text
    streamed = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=24, stream=True)
    texts = [c.choices[0].delta.content for c in streamed if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == alone.text and len(texts) > 1
    # errors keep their status and shape through Ray's proxy
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                       extra_body={"specexport": {"mode": "fast"}})
    assert bad.value.body["param"] == "specexport.mode"


def test_ray_serve_stops_on_sigterm_with_exit_0(ray_proxy):
    import httpx

    url, proc = ray_proxy
    assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
