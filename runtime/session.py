"""`load(bundle)` -> a Session that tokenizes, schedules the pieces and streams text."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .assemble import decoder
from .bundle import Bundle, load_bundle
from .context import DecodeContext
from .decode import emitted
from .engine import Engine, open_pieces, sequence_pieces
from .errors import SpecExportError
from .options import Limits, Options, make_options
from .plan import Capabilities, Plan, make_plan
from .row_padding import ONE_ROW_CALLS, one_row_calls
from .sampling import SamplingParams
from .stats import Stats
from .text import Detokenizer, TextCodec, check_prompt_fits
from .tree import trees_in_full


@dataclass
class Generation:
    text: str
    tokens: list[int]
    stats: Stats
    finish_reason: str
    lossy: bool = False  # a relaxed verification rule ran: not necessarily the target's own output


class Session:
    """A loaded bundle: the decode engine with one sequence (runtime/engine). Threads may share one: its pieces
    hold one cache row, so requests take turns, each holding the session from its first token to its last (a
    stream that is abandoned half-read gives the session back when it is closed or collected). The weights and
    ONNX Runtime's thread pools are the session's; a request's options, statistics and text are its own
    (TextStream). For requests that should run side by side, serve them from a BatchScheduler on this session
    (runtime/batching: the same engine with a row per request), or open one Session per thread."""

    def __init__(self, bundle: Bundle, engine: Engine) -> None:
        self.bundle = bundle
        self.engine = engine
        self.pieces = pieces = sequence_pieces(engine.views(0), bundle)
        self.codec = TextCodec(bundle.root, bundle.manifest.tokenizer)
        self.defaults = dataclasses.asdict(bundle.manifest.generation)
        self.speculative = bundle.manifest.speculative
        # what the decoder reads: the pieces and what the session learns across requests (context.py)
        self.context = DecodeContext.of(pieces, bundle.root, bundle.max_context, bundle.manifest.precision,
                                        self.speculative, trees_in_full(bundle.manifest.graph.attention, pieces))
        # a verification call's most tokens: a TensorRT engine's widest profile; ONNX Runtime, the context
        self.limits = Limits(bundle.max_context, getattr(pieces.deep, "keep_max", None) or bundle.max_context - 1)
        self._turn = threading.Lock()  # one request at a time on the pieces' caches
        self._holder: int | None = None  # the thread whose request has the turn

    # -- public API -------------------------------------------------------------------------------

    @property
    def one_row_calls(self) -> str:
        """How a one-token call of shallow and deep keeps verification's arithmetic, in a word
        (row_padding.one_row_calls): `graph`, `attention`, `session` or `none`."""
        spec = self.bundle.pieces["deep"]
        return one_row_calls(self.engine.pieces, spec.min_rows, spec.one_row_padding)

    @property
    def one_row_calls_note(self) -> str:
        """`one_row_calls` in plain words, for reports: 'one-token calls are ...'."""
        return ONE_ROW_CALLS[self.one_row_calls]

    def options(self, **overrides) -> Options:
        """The bundle's generation defaults with `overrides` (None: keep the default), checked alone, together
        and against the bundle (`plan`): a bad value or one the bundle cannot run raises OptionError, one
        sentence."""
        opts = make_options(self.defaults, overrides, self.limits)
        self.plan(opts)
        return opts

    def plan(self, opts: Options) -> Plan:
        """How `opts` decode on this bundle (runtime/plan.py), or OptionError, one sentence."""
        return make_plan(opts, Capabilities.of(self.context))

    def prompt_ids(self, prompt: str, opts: Options) -> list[int]:
        return self.codec.encode(self.codec.format(prompt, opts.system, opts.chat))

    def stream(self, prompt: str, **overrides) -> TextStream:
        """Text as it is generated: iterate the returned TextStream; its `stats` and `finish_reason` are the
        request's own, final once the iteration ends."""
        return self._request(prompt, overrides, streaming=True)

    def generate(self, prompt: str, **overrides) -> Generation:
        return self._request(prompt, overrides, streaming=False).generation()

    def _request(self, prompt: str, overrides: dict, streaming: bool) -> TextStream:
        opts = make_options(self.defaults, overrides, self.limits)  # planned once, by the TextStream
        return TextStream(self, self.prompt_ids(prompt, opts), opts, streaming)

    def generate_ids(self, prompt_ids: list[int], **overrides) -> Generation:
        opts = make_options(self.defaults, overrides, self.limits)
        return TextStream(self, list(prompt_ids), opts, streaming=False).generation()

    # -- the loop driver -------------------------------------------------------------------------

    def _tokens(self, ids: list[int], opts: Options, plan: Plan, detok: Detokenizer,
                stats: Stats) -> Iterator[tuple[str, str]]:
        """Drives a request's decoding loop; yields (text delta, finish reason so far)."""
        if self._holder == threading.get_ident():
            raise SpecExportError("this thread is already running a request on this Session (a stream not yet"
                                  " read to its end); finish or close it first, or open another Session")
        with self._turn:
            self._holder = threading.get_ident()
            try:
                yield from self._run(ids, opts, plan, detok, stats)
            finally:
                self._holder = None

    def _run(self, ids: list[int], opts: Options, plan: Plan, detok: Detokenizer,
             stats: Stats) -> Iterator[tuple[str, str]]:
        max_context = self.bundle.max_context
        check_prompt_fits(len(ids), opts.max_new_tokens, max_context)
        budget = min(opts.max_new_tokens, max_context - len(ids))
        params = SamplingParams(opts.temperature, opts.top_k, opts.top_p)
        t0 = time.perf_counter()
        loop = decoder(self.context, plan, ids, params, np.random.default_rng(opts.seed), stats)
        reason = "length"
        try:
            for tokens in loop:
                tokens, ended = emitted(tokens, budget - stats.new_tokens, self.codec.eos_ids, opts.ignore_eos)
                if ended:
                    reason = "eos"
                    stats.eos_tokens = 1
                stats.new_tokens += len(tokens)
                delta = detok.push(tokens)
                if detok.stopped:
                    reason = "stop"
                elif reason != "length" or stats.new_tokens >= budget:
                    delta += detok.flush()  # the end: nothing more can complete a stop string
                yield delta, reason
                if reason != "length" or stats.new_tokens >= budget:
                    break
            rest = detok.flush()  # the loop ran out (the context is full): what was held back
            if rest:
                yield rest, reason
        finally:
            loop.close()
            stats.decode_s = time.perf_counter() - t0 - stats.prefill_s


class TextStream:
    """One request: iterate it for text as it is generated. Its state (options, stats, the text so far) is its
    own, never the Session's."""

    def __init__(self, session: Session, prompt_ids: list[int], opts: Options, streaming: bool = True) -> None:
        self.opts = opts
        self.plan = session.plan(opts)  # refused here, not at the first token
        self.stats = Stats()
        self.finish_reason = "length"
        self._detok = Detokenizer(session.codec, opts.stop, streaming)
        self._chunks = session._tokens(prompt_ids, opts, self.plan, self._detok, self.stats)

    def __iter__(self) -> Iterator[str]:
        for chunk, reason in self._chunks:
            self.finish_reason = reason
            if chunk:
                yield chunk

    def close(self) -> None:
        """Ends the request where it stands and gives the Session back to other requests."""
        self._chunks.close()

    def generation(self) -> Generation:
        """Runs the request to its end (if it has not run yet) and returns all of it."""
        for _ in self:
            pass
        return Generation(self._detok.emitted, self._detok.ids, self.stats, self.finish_reason, self.stats.lossy)


def load(bundle: str | Path, backend: str = "onnxruntime", providers: list[str] | None = None,
         threads: int | dict[str, int] | None = None, verify: bool = True,
         expect_digest: str | None = None) -> Session:
    """Open a bundle: checksums verified, one backend session per piece, caches preallocated. With
    ``expect_digest`` (the SHA-256 `specexport inspect` prints) any other bundle is refused."""
    b = load_bundle(bundle, verify=verify, expect_digest=expect_digest)
    check_cache_fits(b)
    return Session(b, Engine(open_pieces(b, backend, providers, threads)))


def cache_bytes(bundle: Bundle) -> int:
    """What the pieces' KV caches take at the bundle's context (ONNX Runtime binds one buffer per cache)."""
    total = 0
    for spec in bundle.pieces.values():
        past = next((t for t in spec.inputs if t.name.startswith("past_key.")), None)
        if past is None:
            continue
        dims = spec.dims or bundle.manifest.model.dims
        per_layer = 2 * dims.kv_heads * dims.head_dim * bundle.max_context * np.dtype(past.dtype).itemsize
        total += spec.kv.count * per_layer
    return total


def check_cache_fits(bundle: Bundle) -> None:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not on this platform: nothing to compare with
        return
    need = cache_bytes(bundle)
    if need > memory:
        raise SpecExportError(f"bundle {bundle.root}'s KV caches take {need / 2**30:.1f} GiB at its context of"
                              f" {bundle.max_context} tokens, more than this machine's {memory / 2**30:.1f} GiB;"
                              " rebuild it with a smaller --context")
