"""The target as distillation uses it on the CPU: greedy answers and sampled requests through BatchedDecoder.

One decoder is made per call, its cache sized for that call's longest prompt and answer, so a call of short
Magpie requests does not hold a cache sized for the longest shipped prompt. Calls can be cut short: `stop()`
is asked after every decode step, and an answer is handed to `on_done` the moment it ends, so a caller
that keeps them loses only the answers still being written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...hf_weights import extract
from .decoder import BatchedDecoder, Job

CACHE_BYTES = 3 << 30  # the key/value cache of one decoder; the 23 GB CI machine has room for it and the model


class Stopped(Exception):
    """stop() said so: the call ended early, every answer finished before it already handed over."""


class BatchedTarget:
    def __init__(self, model: Any, eos: set[int], slots: int) -> None:
        positions = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        self.weights = extract(model, max(positions, 4096))
        self.eos = frozenset(eos)
        self.slots = slots

    def _batches(self, jobs: list[Job]) -> list[tuple[int, int, list[Job]]]:
        """(slots, context, jobs) of each decoder: the jobs shortest prompt first, as many slots as the cache
        budget allows at the longest context each decoder needs, so a few long prompts get a decoder of
        fewer slots instead of a cache of every slot at their length."""
        d = self.weights.dims
        per_position = 2 * len(self.weights.layers) * d.kv_heads * d.head_dim * 4
        order = sorted(jobs, key=lambda j: (len(j.prompt) + j.max_new, j.key))
        limit = self.weights.rope.cos.shape[0]
        need = [len(j.prompt) + j.max_new + 1 for j in order]
        out: list[tuple[int, int, list[Job]]] = []
        start = 0
        while start < len(order):
            end = start
            while end < len(order) and self.slots * per_position * need[end] <= CACHE_BYTES:
                end += 1
            if end > start:
                slots = self.slots
            else:  # the rest are long: together, in as many slots as the longest leaves room for
                end, slots = len(order), max(1, CACHE_BYTES // (per_position * need[-1]))
            if need[end - 1] > limit:
                raise ValueError(f"a prompt of {need[end - 1] - order[end - 1].max_new - 1} tokens and"
                                 f" {order[end - 1].max_new} new ones pass the {limit} positions distillation decodes")
            out.append((min(slots, end - start), need[end - 1], order[start:end]))
            start = end
        return out

    def run(self, jobs: list[Job], on_done: Callable[[int, list[int]], None],
            stop: Callable[[], bool] = lambda: False, progress: Callable[[int], None] | None = None) -> None:
        """Decode jobs (admitted shortest prompt first); on_done(key, tokens) as each ends, its stop token
        kept. Raises Stopped once stop() is true."""
        def step(made: int) -> None:
            if progress is not None:
                progress(made)
            if stop():
                raise Stopped

        for slots, context, group in self._batches(jobs):
            decoder = BatchedDecoder(self.weights, slots=slots, context=context)
            for done in decoder.run(group, progress=step):
                on_done(done.key, done.response)
            del decoder

    def answer(self, prompts: dict[int, list[int]], max_new: int, on_done: Callable[[int, list[int]], None],
               stop: Callable[[], bool] = lambda: False, progress: Callable[[int], None] | None = None) -> None:
        """The greedy answer to every prompt (keyed as given), up to max_new tokens or an EOS."""
        self.run([Job(k, p, max_new, stop=self.eos) for k, p in prompts.items()], on_done, stop, progress)

    def sample(self, prompt: list[int], keys: range, max_new: int, temperature: float, top_p: float, seed: int,
               stop: Callable[[], bool] = lambda: False) -> dict[int, list[int]]:
        """One continuation of `prompt` per key, each drawn from its own generator seeded (seed, key), so the
        same keys give the same draws in any batch."""
        out: dict[int, list[int]] = {}
        jobs = [Job(k, prompt, max_new, temperature=temperature, top_p=top_p, seed=seed, stop=self.eos) for k in keys]
        self.run(jobs, out.__setitem__, stop)
        return out
