"""`load(bundle)` -> a Session that tokenizes, schedules the pieces and streams text."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .decode import Pieces, autoregressive
from .drafters import SelfDrafter
from .errors import SpecExportError
from .manifest import Bundle, load_bundle
from .policies import make_policy
from .sampling import SamplingParams
from .speculative import speculative
from .stats import Stats
from .text import Detokenizer, TextCodec, check_prompt_fits

BACKENDS = ("onnxruntime", "tensorrt")


@dataclass
class Generation:
    text: str
    tokens: list[int]
    stats: Stats
    finish_reason: str


@dataclass
class Options:
    max_new_tokens: int = 128
    mode: str = "auto"  # auto | ar | self
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    chat: bool = True
    system: str | None = None
    gamma: int | None = None  # speculative settings; None = the bundle's defaults
    eta: float | None = None
    policy: str | None = None  # draft length: fixed[:gamma] | confidence[:eta] (runtime/policies.py)


def _open_pieces(bundle: Bundle, backend: str, providers: list[str] | None, threads: int | None) -> Pieces:
    if backend == "onnxruntime":
        from .ort_backend import OrtPiece

        def open_piece(name: str) -> OrtPiece:
            return OrtPiece(name, bundle.piece_path(name), bundle.pieces[name], bundle.max_context,
                            providers or ["CPUExecutionProvider"], threads)
    elif backend == "tensorrt":
        from .trt_backend import open_trt_piece

        def open_piece(name: str):
            return open_trt_piece(bundle, name)
    else:
        raise SpecExportError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    opened = {name: open_piece(name) for name in bundle.pieces}
    vocab = bundle.pieces.get("adapter", {}).get("draft_vocab")
    draft_vocab = np.load(bundle.root / vocab["file"], allow_pickle=False) if vocab else None
    return Pieces(**opened, draft_vocab=draft_vocab, vocab_size=int(bundle.manifest["model"]["dims"]["vocab"]))


class Session:
    def __init__(self, bundle: Bundle, pieces: Pieces) -> None:
        self.bundle = bundle
        self.pieces = pieces
        self.codec = TextCodec(bundle.root, bundle.manifest["tokenizer"])
        self.defaults = bundle.manifest.get("generation", {})
        self.speculative = bundle.manifest.get("speculative", {})
        self.last_stats: Stats | None = None

    # -- public API -------------------------------------------------------------------------------

    def options(self, **overrides) -> Options:
        base = {k: v for k, v in self.defaults.items() if k in Options.__dataclass_fields__}
        base.update({k: v for k, v in overrides.items() if v is not None})
        return Options(**base)

    def prompt_ids(self, prompt: str, opts: Options) -> list[int]:
        return self.codec.encode(self.codec.format(prompt, opts.system, opts.chat))

    def stream(self, prompt: str, **overrides) -> Iterator[str]:
        """Yields text as it is generated; the final `Stats` are in `self.last_stats`."""
        opts = self.options(**overrides)
        ids = self.prompt_ids(prompt, opts)
        detok = Detokenizer(self.codec)
        for chunk, _ in self._tokens(ids, opts, detok):
            if chunk:
                yield chunk

    def generate(self, prompt: str, **overrides) -> Generation:
        opts = self.options(**overrides)
        return self.generate_ids(self.prompt_ids(prompt, opts), **overrides)

    def generate_ids(self, prompt_ids: list[int], **overrides) -> Generation:
        opts = self.options(**overrides)
        detok = Detokenizer(self.codec)
        reason = "length"
        for _, reason in self._tokens(list(prompt_ids), opts, detok):  # noqa: B007 - the last one counts
            pass
        return Generation(detok.emitted, detok.ids, self.last_stats, reason)

    # -- the loop driver -------------------------------------------------------------------------

    def resolve_mode(self, mode: str) -> str:
        if mode == "auto":
            return "self" if self.pieces.adapter is not None else "ar"
        if mode == "self" and self.pieces.adapter is None:
            raise SpecExportError(f"bundle {self.bundle.root} has no adapter piece, so --mode self is not"
                                  " available; rebuild with an adapter or use --mode ar")
        if mode not in LOOPS:
            raise SpecExportError(f"unknown mode {mode!r}; use one of auto, {', '.join(LOOPS)}")
        return mode

    def _loop(self, mode: str, ids: list[int], params: SamplingParams, opts: Options, stats: Stats):
        rng = np.random.default_rng(opts.seed)
        return LOOPS[mode](self, ids, params, rng, stats, opts)

    def _tokens(self, ids: list[int], opts: Options, detok: Detokenizer) -> Iterator[tuple[str, str]]:
        """Drives a decoding loop; yields (text delta, finish reason so far)."""
        max_context = self.bundle.max_context
        check_prompt_fits(len(ids), opts.max_new_tokens, max_context)
        budget = min(opts.max_new_tokens, max_context - len(ids))
        params = SamplingParams(opts.temperature, opts.top_k, opts.top_p)
        stats = Stats()
        self.last_stats = stats
        mode = self.resolve_mode(opts.mode)
        t0 = time.perf_counter()
        loop = self._loop(mode, ids, params, opts, stats)
        reason = "length"
        try:
            for tokens in loop:
                tokens = tokens[: budget - stats.new_tokens]
                for i, token in enumerate(tokens):
                    if token in self.codec.eos_ids:
                        tokens, reason = tokens[:i], "eos"
                        break
                stats.new_tokens += len(tokens)
                delta = detok.push(tokens)
                if opts.stop and any(s in detok.emitted for s in opts.stop):
                    cut = min(detok.emitted.index(s) for s in opts.stop if s in detok.emitted)
                    delta = delta[: max(0, len(delta) - (len(detok.emitted) - cut))]
                    detok.emitted = detok.emitted[:cut]
                    reason = "stop"
                yield delta, reason
                if reason != "length" or stats.new_tokens >= budget:
                    break
        finally:
            loop.close()
            stats.decode_s = time.perf_counter() - t0 - stats.prefill_s


def _ar_loop(session: Session, ids, params, rng, stats, opts):
    return autoregressive(session.pieces, ids, params, rng, stats)


def _policy(session: Session, opts: Options):
    spec = session.speculative
    gamma = opts.gamma if opts.gamma is not None else int(spec.get("gamma", 6))
    eta = opts.eta if opts.eta is not None else float(spec.get("eta", 0.6))
    return make_policy(opts.policy, gamma, eta)


def _self_loop(session: Session, ids, params, rng, stats, opts):
    stats.mode = "self"
    return speculative(session.pieces, SelfDrafter(session.pieces), _policy(session, opts), ids, params, rng,
                       stats, session.bundle.max_context)


LOOPS: dict[str, Callable] = {"ar": _ar_loop, "self": _self_loop}


def load(bundle: str | Path, backend: str = "onnxruntime", providers: list[str] | None = None,
         threads: int | None = None, verify: bool = True) -> Session:
    """Open a bundle: checksums verified, one backend session per piece, caches preallocated."""
    b = load_bundle(bundle, verify=verify)
    return Session(b, _open_pieces(b, backend, providers, threads))
