"""/metrics, scraped from a real server after real requests, for both workers: every counter moved by what the
responses reported (tokens, steps, drafts, acceptance, by mode and by draft position), requests by outcome,
and the step histograms by the steps the generations (or the batched scheduler) took."""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("starlette", reason="the serve extra installs starlette and uvicorn")
pytest.importorskip("uvicorn", reason="the serve extra installs starlette and uvicorn")
pytest.importorskip("prometheus_client", reason="the serve extra installs prometheus-client")
httpx = pytest.importorskip("httpx", reason="the dev extra installs httpx")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from specexport.runtime import load  # noqa: E402
from specexport.serve import create_app  # noqa: E402

from .test_serve import PROMPT, ThreadServer, _post, _wait_idle, slow_down  # noqa: E402
from .test_serve_errors import FailingOrt  # noqa: E402

REPEATS = "the quick brown fox jumps over the lazy dog; " * 3  # prompt lookup finds drafts in it


class Scrape:
    """One GET /metrics, parsed by prometheus_client's own parser."""

    def __init__(self, server: ThreadServer) -> None:
        response = httpx.get(f"{server.url}/metrics", timeout=10)
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        self.samples = [s for family in text_string_to_metric_families(response.text) for s in family.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels` (0 where there are none yet)."""
        return sum(s.value for s in self.samples if s.name == name and labels.items() <= s.labels.items())

    def by_position(self, name: str, mode: str) -> list[float]:
        found = {int(s.labels["position"]): s.value for s in self.samples
                 if s.name == name and s.labels.get("mode") == mode}
        assert sorted(found) == list(range(1, len(found) + 1)), found
        return [found[p] for p in sorted(found)]


def ask(server: ThreadServer, prompt: str, mode: str, max_tokens: int, stream: bool = False) -> dict:
    """A completion's usage and specexport extension (a stream's from its last chunks)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "specexport": {"mode": mode}}
    if not stream:
        reply = _post(server, "/v1/completions", body)
        assert reply.status_code == 200, reply.text
        return {"usage": reply.json()["usage"], **reply.json()["specexport"]}
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    return {"usage": chunks[-1]["usage"], **chunks[-2]["specexport"]}


def assert_speculation_counted(after: Scrape, before: Scrape, replies: list[dict]) -> None:
    """Per mode, the counters moved by the sums of what the responses reported."""
    def moved(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert moved("specexport_prompt_tokens_total") == sum(r["usage"]["prompt_tokens"] for r in replies)
    for mode in {r["mode"] for r in replies}:
        mine = [r for r in replies if r["mode"] == mode]
        tokens = sum(r["usage"]["completion_tokens"] for r in mine)
        steps = sum(r["steps"] for r in mine)
        drafted, accepted = sum(r["drafted"] for r in mine), sum(r["accepted"] for r in mine)
        assert moved("specexport_generation_tokens_total", mode=mode) == tokens, mode
        assert moved("specexport_decode_steps_total", mode=mode) == steps, mode
        assert moved("specexport_draft_tokens_total", mode=mode) == drafted, mode
        assert moved("specexport_accepted_tokens_total", mode=mode) == accepted, mode
        assert moved("specexport_request_tokens_per_step_count", mode=mode) == len(mine)
        assert moved("specexport_request_tokens_per_step_sum", mode=mode) == pytest.approx(
            sum(r["usage"]["completion_tokens"] / r["steps"] for r in mine))
        # each drafted (accepted) token sits at one position; a step that drafted (kept) position p did p - 1
        drafted_at = after.by_position("specexport_draft_tokens_by_position_total", mode)
        accepted_at = after.by_position("specexport_accepted_tokens_by_position_total", mode)
        assert sum(drafted_at) == after.value("specexport_draft_tokens_total", mode=mode)
        assert sum(accepted_at) == after.value("specexport_accepted_tokens_total", mode=mode)
        assert all(a <= d for a, d in zip(accepted_at, drafted_at, strict=True))
        assert drafted_at == sorted(drafted_at, reverse=True) and accepted_at == sorted(accepted_at, reverse=True)
        if drafted:
            assert drafted_at[0] <= steps  # at most one first draft token a step


def test_metrics_of_one_request_at_a_time(one_at_a_time):
    server = one_at_a_time
    before = Scrape(server)
    replies = [ask(server, PROMPT, "ar", 12), ask(server, REPEATS, "lookup", 24),
               ask(server, REPEATS, "lookup", 20, stream=True), ask(server, PROMPT, "auto", 16)]
    assert sum(r["drafted"] for r in replies) > 0 and sum(r["accepted"] for r in replies) > 0  # lookup drafted
    assert _post(server, "/v1/completions", {"prompt": PROMPT, "specexport": {"mode": "fast"}}).status_code == 400
    assert _post(server, "/v1/completions", {"prompt": PROMPT, "specexport": {"mode": "model"}}).status_code == 400
    FailingOrt(server.app.state.worker.session.pieces.deep.session, fail_at=3)
    failing = {"prompt": PROMPT, "max_tokens": 12, "specexport": {"mode": "ar"}}  # ar: three deep calls in
    assert _post(server, "/v1/completions", failing).status_code == 500
    after = Scrape(server)

    outcomes = {o: after.value("specexport_requests_total", outcome=o) for o in
                ("completed", "cancelled", "rejected", "failed")}
    assert outcomes == {"completed": 4, "cancelled": 0, "rejected": 2, "failed": 1}
    assert_speculation_counted(after, before, replies)
    # one request at a time: a step is one request's, and each step after the prefill is timed
    decode_steps = sum(r["steps"] - 1 for r in replies)
    assert after.value("specexport_step_seconds_count") == decode_steps
    assert after.value("specexport_step_rows_count") == after.value("specexport_step_rows_sum") == decode_steps
    assert after.value("specexport_step_seconds_sum") > 0
    assert after.value("specexport_queue_depth") == 0 and after.value("specexport_requests_running") == 0

    # a client that gives up: its generation is cancelled, and the tokens it made still count
    slow_down(server.app.state.worker.session, 0.02)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", timeout=0.5,
                   json={"prompt": PROMPT, "max_tokens": 200, "specexport": {"mode": "ar"}})
    made = _wait_idle(server)["last_cancelled_tokens"]
    last = Scrape(server)
    assert last.value("specexport_requests_total", outcome="cancelled") == 1
    assert last.value("specexport_generation_tokens_total", mode="ar") - after.value(
        "specexport_generation_tokens_total", mode="ar") == made > 0


def test_metrics_of_a_batching_server(batching):
    server = batching
    before = Scrape(server)
    jobs = [(PROMPT, "ar", 12), (REPEATS, "lookup", 24), (REPEATS, "model", 20), (PROMPT, "auto", 16),
            (PROMPT, "lookup", 10), (REPEATS, "ar", 14)]
    replies: list[dict] = [{}] * len(jobs)

    def run(i: int) -> None:
        replies[i] = ask(server, *jobs[i], stream=i % 2 == 1)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(replies)
    pearl = {"prompt": PROMPT, "specexport": {"mode": "model", "schedule": "pearl"}}
    assert _post(server, "/v1/completions", pearl).status_code == 400
    after = Scrape(server)

    assert after.value("specexport_requests_total", outcome="completed") == len(jobs)
    assert after.value("specexport_requests_total", outcome="rejected") == 1
    assert_speculation_counted(after, before, replies)
    # a batched deep call is observed once, with its rows: the rows add up to the requests' steps, prefills included
    counts = server.app.state.worker.scheduler.counts
    assert after.value("specexport_step_seconds_count") == after.value("specexport_step_rows_count") == counts.steps
    assert after.value("specexport_step_rows_sum") == counts.row_steps == sum(r["steps"] for r in replies)
    assert after.value("specexport_step_rows_bucket", le="1.0") < counts.steps  # some steps verified two rows
    assert after.value("specexport_queue_depth") == 0 and after.value("specexport_requests_running") == 0


def test_two_apps_in_one_process_keep_their_own_metrics(one_at_a_time, tiny_bundles):
    other = create_app(load(tiny_bundles()))
    ask(one_at_a_time, PROMPT, "ar", 4)
    assert Scrape(one_at_a_time).value("specexport_requests_total", outcome="completed") == 1
    assert "specexport_requests_total{outcome=\"completed\"} 0.0" in other.state.metrics.render().decode()
    other.state.worker.close(5)
