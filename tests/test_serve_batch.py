"""`specexport serve --batch N` (issue 23, point 2 under point 1's server): concurrent chat requests through the
real server and the real `openai` client, decoded together by the batched scheduler in every mode it runs
(ar, lookup, and the drafting pieces' model and self, and auto), each AR's tokens."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("starlette", reason="the serve extra installs starlette and uvicorn")
pytest.importorskip("uvicorn", reason="the serve extra installs starlette and uvicorn")
openai = pytest.importorskip("openai", reason="the dev extra installs the openai client")

from specexport.runtime import SpecExportError, load  # noqa: E402
from specexport.serve import create_app  # noqa: E402

from .test_serve import ThreadServer  # noqa: E402

PROMPTS = ["explain how a hash table works", "write a haiku about the sea", "a hash table maps keys to values"]


def chat_concurrently(client, name: str, jobs: list[tuple[str, str, int]]) -> list:
    """Each (prompt, mode, max_tokens) job as a chat request from a thread of its own, all at once; the replies
    in the jobs' order, each with the token ids it generated."""
    replies = [None] * len(jobs)

    def ask(j: int) -> None:
        prompt, mode, n = jobs[j]
        replies[j] = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": prompt}], max_tokens=n,
            extra_body={"specexport": {"mode": mode, "return_token_ids": True}})

    threads = [threading.Thread(target=ask, args=(j,)) for j in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return replies


@pytest.fixture(scope="module")
def session(drafting_bundle):
    return load(drafting_bundle)


def test_concurrent_requests_are_batched_and_each_is_ar(session):
    server = ThreadServer(create_app(session, batch=2))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        jobs = [(p, mode, n) for p, n in zip(PROMPTS, (24, 17, 30), strict=True)
                for mode in ("ar", "lookup", "model", "self", "auto")]
        name = server.app.state.model.name
        replies = chat_concurrently(client, name, jobs)
        for (prompt, mode, n), reply in zip(jobs, replies, strict=True):
            ar = session.generate(prompt, mode="ar", max_new_tokens=n)
            assert reply.model_extra["specexport"]["token_ids"] == ar.tokens, (prompt, mode)
            assert reply.choices[0].message.content == ar.text
        # they were decoded together: deep ran as many rows as the requests took steps (each reply's steps count
        # its prefill's call too), in fewer calls than that, up to two rows a call
        counts = server.app.state.worker.scheduler.counts
        assert counts.row_steps == sum(r.model_extra["specexport"]["steps"] for r in replies)
        assert counts.max_rows == 2 and counts.steps < counts.row_steps, counts
        with pytest.raises(openai.BadRequestError, match="does not run batched"):
            client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           extra_body={"specexport": {"mode": "self", "schedule": "pearl"}})
        assert server.health()["completed"] == len(jobs)
    finally:
        server.stop()


def test_a_bundle_that_cannot_batch_is_refused_in_one_sentence(tiny_bundles):
    with pytest.raises(SpecExportError, match="--flavour standard"):
        create_app(load(tiny_bundles("ort", attention="gqa")), batch=2)
