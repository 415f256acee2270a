"""Target-model steps and autoregressive decoding, as plain functions over the pieces.

`Pieces` is runtime/backends/common.py's, the one shape of a set of pieces. Every loop here is a generator
that yields lists of newly final tokens and computes the next step only when asked, so the caller stops it
(EOS, stop string, max tokens) without wasted work.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from .backends.common import Pieces
from .sampling import SamplingParams, pick
from .stats import Stats


def emitted(tokens: list[int], room: int, eos_ids, ignore_eos: bool = False) -> tuple[list[int], bool]:
    """A step's final tokens as a request emits them: at most `room`, cut before an end-of-sequence token
    unless `ignore_eos`; and whether one ended the request."""
    tokens = tokens[:room]
    if not ignore_eos:
        for i, token in enumerate(tokens):
            if token in eos_ids:
                return tokens[:i], True
    return tokens, False


def ids_array(tokens: list[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)[None, :]


def target_step(pieces: Pieces, tokens: list[int], pos: int, keep: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Run shallow then deep on `tokens` at `pos`; returns (h_l [1, n, H], logits [1, keep, V])."""
    hidden = pieces.shallow.run(ids_array(tokens), pos)["hidden"]
    return hidden, pieces.deep.run(hidden, pos, keep=keep)["logits"]


def prefill(pieces: Pieces, prompt: list[int], stats: Stats) -> tuple[np.ndarray, np.ndarray]:
    t0 = time.perf_counter()
    hidden, logits = target_step(pieces, prompt, 0)
    stats.prompt_tokens = len(prompt)
    stats.steps += 1  # the prefill's target call yields the first token
    stats.prefill_s += time.perf_counter() - t0
    return hidden, logits


def autoregressive(pieces: Pieces, prompt: list[int], params: SamplingParams, rng: np.random.Generator,
                   stats: Stats) -> Iterator[list[int]]:
    stats.mode = "ar"
    _, logits = prefill(pieces, prompt, stats)
    pos = len(prompt)
    while True:
        token = pick(logits[0, -1], params, rng)
        yield [token]
        t0 = time.perf_counter()
        _, logits = target_step(pieces, [token], pos)
        pos += 1
        stats.record_step(0, 0, 0.0, time.perf_counter() - t0)
