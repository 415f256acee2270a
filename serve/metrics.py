"""/metrics: the server's Prometheus metrics, in a registry of the app's own (several apps in one process, tests
among them, would otherwise collide in prometheus_client's global one). docs/serving.md lists them.

Requests count by outcome; a generation that ends (run to its end or cancelled) adds its tokens and its
speculative figures under the mode its response reports: τ is generation tokens over decode steps, acceptance
accepted over drafted tokens, overall and by draft position."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..runtime.stats import Stats

OUTCOMES = ("completed", "cancelled", "rejected", "failed")
STEP_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
STEP_ROWS = (1, 2, 4, 8, 16, 32, 64)
TAU = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("specexport_requests", "Generation requests by outcome: completed, cancelled (the"
                                " client left or the server stopped), rejected (4xx: the request's fault), failed"
                                " (5xx: the server's)", ["outcome"], registry=r)
        for outcome in OUTCOMES:  # every outcome is a series from the start, so rate() sees its first one
            self.requests.labels(outcome)
        self.prompt_tokens = Counter("specexport_prompt_tokens", "Prompt tokens read by generations that ended",
                                     registry=r)
        self.generation_tokens = Counter("specexport_generation_tokens", "Tokens generated, by mode", ["mode"],
                                         registry=r)
        self.steps = Counter("specexport_decode_steps", "Target calls that made tokens (the prefill's and one per"
                             " verification step), by mode; tau = generation tokens / decode steps", ["mode"],
                             registry=r)
        self.drafted = Counter("specexport_draft_tokens", "Draft tokens verified, by mode", ["mode"], registry=r)
        self.accepted = Counter("specexport_accepted_tokens", "Draft tokens the target accepted, by mode", ["mode"],
                                registry=r)
        self.drafted_at = Counter("specexport_draft_tokens_by_position", "Steps that drafted a token at draft"
                                  " position `position` (1: a step's first draft token), by mode",
                                  ["mode", "position"], registry=r)
        self.accepted_at = Counter("specexport_accepted_tokens_by_position", "Steps whose draft token at position"
                                   " `position` the target accepted, by mode", ["mode", "position"], registry=r)
        self.tau = Histogram("specexport_request_tokens_per_step", "Each generation's tau: its tokens per decode"
                             " step, by mode", ["mode"], buckets=TAU, registry=r)
        self.step_seconds = Histogram("specexport_step_seconds", "Seconds per decoding step, drafting and"
                                      " verification (a batched step once, however many rows)", buckets=STEP_SECONDS,
                                      registry=r)
        self.step_rows = Histogram("specexport_step_rows", "Requests verified together per decoding step",
                                   buckets=STEP_ROWS, registry=r)
        self.queue_depth = Gauge("specexport_queue_depth", "Requests waiting for their turn (for the Session, or"
                                 " for a cache row under --batch)", registry=r)
        self.running = Gauge("specexport_requests_running", "Requests being decoded", registry=r)

    def watch(self, queue_depth: Callable[[], float], running: Callable[[], float]) -> None:
        """The gauges read these at each scrape, from the worker that knows them."""
        self.queue_depth.set_function(queue_depth)
        self.running.set_function(running)

    def refused(self, client: bool) -> None:
        """A request that ended in an error response: the request's fault (4xx) or the server's (5xx)."""
        self.requests.labels("rejected" if client else "failed").inc()

    def ended(self, stats: Stats, tokens: int, cancelled: bool, steps_timed: bool) -> None:
        """A generation that ran to its end or was cancelled. `steps_timed`: its steps' seconds are the
        request's own (one at a time), so they go in the step histograms here; a batched step is observed
        once, by `step`."""
        self.requests.labels("cancelled" if cancelled else "completed").inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        mode = stats.mode
        self.generation_tokens.labels(mode).inc(tokens)
        self.steps.labels(mode).inc(stats.steps)
        self.drafted.labels(mode).inc(stats.drafted)
        self.accepted.labels(mode).inc(stats.accepted)
        for i, (drafted, accepted) in enumerate(zip(stats.drafted_at, stats.accepted_at, strict=True)):
            self.drafted_at.labels(mode, str(i + 1)).inc(drafted)
            self.accepted_at.labels(mode, str(i + 1)).inc(accepted)
        if stats.steps:
            self.tau.labels(mode).observe(tokens / stats.steps)
        if steps_timed:
            for seconds in stats.step_s:
                self.step(1, seconds)

    def step(self, rows: int, seconds: float) -> None:
        self.step_seconds.observe(seconds)
        self.step_rows.observe(rows)

    def render(self) -> bytes:
        return generate_latest(self.registry)
