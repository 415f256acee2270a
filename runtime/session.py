"""`load(bundle)` -> a Session that tokenizes, schedules the pieces and streams text."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .decode import Pieces, autoregressive
from .drafters import (
    LOOKUP_MAX_TOKENS,
    AutoDrafter,
    AutoMemory,
    Drafter,
    HierDrafter,
    LookupDrafter,
    ModelDrafter,
    SelfDrafter,
)
from .errors import SpecExportError
from .manifest import Bundle, load_bundle
from .pearl import pearl_loop
from .policies import CostModel, make_policy, measure_cost
from .sampling import SamplingParams
from .speculative import speculative
from .stats import Stats
from .text import Detokenizer, TextCodec, check_prompt_fits
from .tree import AUTO_TREE, TreeDrafter, TreeShape, trees_supported
from .verification import make_verify

BACKENDS = ("onnxruntime", "tensorrt")


@dataclass
class Generation:
    text: str
    tokens: list[int]
    stats: Stats
    finish_reason: str
    lossy: bool = False  # a relaxed verification rule ran: not necessarily the target's own output


@dataclass
class Options:
    max_new_tokens: int = 128
    mode: str = "auto"  # a LOOPS key: ar | self | model | lookup | hier | auto
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    chat: bool = True
    system: str | None = None
    gamma: int | None = None  # speculative settings; None = the bundle's defaults
    eta: float | None = None
    policy: str | None = None  # draft length: fixed | confidence | entropy | goodput (runtime/policies.py)
    schedule: str = "sequential"  # sequential | pearl: drafter and verifier side by side (runtime/pearl.py)
    verify: str = "exact"  # exact | specdec (relaxed, greedy only; runtime/verification.py)
    beta: int | None = None  # specdec: a draft must be in the target's top beta ...
    tau: float | None = None  # ... and within tau nats of the top token's log-probability
    tree: str | None = None  # token-tree speculation with the drafter: a TreeShape spec (runtime/tree.py)


def _open_pieces(bundle: Bundle, backend: str, providers: list[str] | None,
                 threads: int | dict[str, int] | None) -> Pieces:
    if backend == "onnxruntime":
        from .backends.ort import OrtPiece

        def open_piece(name: str) -> OrtPiece:
            # a dict gives each piece its own count (PEARL runs the drafter and `deep` side by side)
            n = threads.get(name) if isinstance(threads, dict) else threads
            return OrtPiece(name, bundle.piece_path(name), bundle.pieces[name], bundle.max_context,
                            providers or ["CPUExecutionProvider"], n)
    elif backend == "tensorrt":
        from .backends.tensorrt import open_trt_piece

        def open_piece(name: str):
            return open_trt_piece(bundle, name)
    else:
        raise SpecExportError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    opened = {name: open_piece(name) for name in bundle.pieces}

    def pruned_vocab(piece: str) -> np.ndarray | None:  # FR-Spec: the ids a pruned draft head covers
        vocab = bundle.pieces.get(piece, {}).get("draft_vocab")
        return np.load(bundle.root / vocab["file"], allow_pickle=False) if vocab else None

    return Pieces(**opened, draft_vocab=pruned_vocab("adapter"), drafter_vocab=pruned_vocab("drafter"),
                  vocab_size=int(bundle.manifest["model"]["dims"]["vocab"]))


class Session:
    def __init__(self, bundle: Bundle, pieces: Pieces) -> None:
        self.bundle = bundle
        self.pieces = pieces
        self.codec = TextCodec(bundle.root, bundle.manifest["tokenizer"])
        self.defaults = bundle.manifest.get("generation", {})
        self.speculative = bundle.manifest.get("speculative", {})
        self.last_stats: Stats | None = None
        self.costs: dict[tuple[str, int], CostModel] = {}  # the goodput policy's, measured when first asked for
        self.auto_memory: dict[tuple[str, ...], AutoMemory] = {}  # what auto learned, per set of its choices

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
        return Generation(detok.emitted, detok.ids, self.last_stats, reason, self.last_stats.lossy)

    # -- the loop driver -------------------------------------------------------------------------

    def cost_model(self, mode: str, gamma_max: int) -> CostModel:
        """The goodput policy's cost model for `mode`: the pieces timed once per session, on first use (a
        fraction of a second; `load` never pays it)."""
        key = (mode, gamma_max)
        if key not in self.costs:
            self.costs[key] = measure_cost(self.pieces, mode, gamma_max, self.bundle.max_context)
        return self.costs[key]

    def resolve_mode(self, mode: str) -> str:
        """`mode` when the bundle has the pieces it needs; otherwise one sentence on how to get them."""
        if mode not in LOOPS:
            raise SpecExportError(f"unknown mode {mode!r}; use one of {', '.join(LOOPS)}")
        missing = [p for p in MODE_PIECES.get(mode, ()) if getattr(self.pieces, p, None) is None]
        if missing:
            raise SpecExportError(f"bundle {self.bundle.root} has no {' or '.join(missing)} piece, so --mode {mode}"
                                  f" is not available; rebuild it with {' and '.join(PIECE_FIXES[p] for p in missing)},"
                                  " or use --mode auto (it uses what the bundle has)")
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
    if opts.verify != "exact":
        raise SpecExportError(f"--verify {opts.verify} judges drafts, and --mode ar drafts nothing; use a"
                              " speculative mode such as --mode auto")
    return autoregressive(session.pieces, ids, params, rng, stats)


def _policy(session: Session, opts: Options, mode: str = "self"):
    spec = session.speculative
    gamma = opts.gamma if opts.gamma is not None else int(spec.get("gamma", 6))
    eta = opts.eta if opts.eta is not None else float(spec.get("eta", 0.6))
    return make_policy(opts.policy, gamma, eta, cost=lambda gamma_max: session.cost_model(mode, gamma_max))


def _lookup(session: Session, opts: Options) -> LookupDrafter:
    # lookup drafts cost nothing, so it takes its own cap, not the bundle's gamma (an explicit --gamma wins)
    return LookupDrafter(session.pieces.vocab_size, session.bundle.max_context, opts.gamma or LOOKUP_MAX_TOKENS)


def auto_tree(session: Session) -> TreeShape:
    """auto's tree for the bundle's precision: the recipe's [speculative.auto_tree] (measured per precision,
    recipes/smollm2-135m.toml), else AUTO_TREE."""
    shapes = session.speculative.get("auto_tree", {})
    precision = session.bundle.manifest.get("graph", {}).get("precision", "fp32")
    if not isinstance(shapes, dict) or precision not in shapes:
        return AUTO_TREE
    try:
        return TreeShape.parse(shapes[precision])
    except SpecExportError:
        raise SpecExportError(f"bundle {session.bundle.root}: speculative.auto_tree.{precision} in its manifest,"
                              f" {shapes[precision]!r}, is not a tree shape (NODES[:DEPTH[:WIDTH[:LOOKUP[:KEEP"
                              "[:EXPAND]]]]]); rebuild the bundle or fix the recipe") from None


def _auto(session: Session, opts: Options, stats: Stats) -> AutoDrafter:
    p = session.pieces
    greedy = SamplingParams(opts.temperature, opts.top_k, opts.top_p).greedy
    if greedy and opts.verify == "exact" and trees_supported(p):
        # the floored tree against lookup alone: it beat every chain side by side in every run (README), and
        # chains close behind it only cost auto steps spent finding that out again (measured: 0.97x the tree)
        drafters: list[Drafter] = [TreeDrafter(p, auto_tree(session), session.bundle.max_context)]
    else:
        drafters = [SelfDrafter(p)] if p.adapter is not None else []
        drafters += [ModelDrafter(p)] if p.drafter is not None else []
    # the estimates carry over between requests of a session, but not between different sets of choices
    memory = session.auto_memory.setdefault(tuple(d.name for d in drafters), AutoMemory({}))
    return AutoDrafter(drafters, _lookup(session, opts), stats, memory=memory)


# mode -> its drafter, made per generation from (session, options, stats)
DRAFTERS: dict[str, Callable[[Session, Options, Stats], Drafter]] = {
    "self": lambda session, opts, stats: SelfDrafter(session.pieces),
    "model": lambda session, opts, stats: ModelDrafter(session.pieces),
    "lookup": lambda session, opts, stats: _lookup(session, opts),
    "hier": lambda session, opts, stats: HierDrafter(session.pieces, stats),
    "auto": _auto,
}
MODE_PIECES = {"self": ("adapter",), "model": ("drafter",), "hier": ("drafter", "adapter")}
PIECE_FIXES = {"adapter": "an adapter (`specexport build --adapter auto`)",
               "drafter": "a drafter (`specexport build --drafter DIR`, a same-tokenizer checkpoint)"}


def _speculative_loop(mode: str) -> Callable:
    """The LOOPS entry of a speculative mode: the one draft-then-verify loop with that mode's drafter."""

    def loop(session: Session, ids, params, rng, stats, opts):
        if opts.tree:
            return _tree_loop(session, mode, ids, params, rng, stats, opts)
        if opts.schedule != "sequential":  # runtime/pearl.py
            return pearl_loop(session.pieces, mode, opts, lambda m: _policy(session, opts, m), ids, params, rng,
                              stats, session.bundle.max_context)
        stats.mode = mode
        accept = make_verify(opts.verify, params, opts.beta, opts.tau)
        stats.lossy = opts.verify != "exact"
        return speculative(session.pieces, DRAFTERS[mode](session, opts, stats), _policy(session, opts, mode),
                           ids, params, rng, stats, session.bundle.max_context, accept=accept)

    return loop


def _tree_loop(session: Session, mode: str, ids, params, rng, stats, opts):
    if mode != "model":
        raise SpecExportError(f"--tree grows its trees with the bundle's drafter piece, so it needs --mode model"
                              f" (not {mode})")
    if opts.schedule != "sequential" or opts.verify != "exact" or opts.policy:
        raise SpecExportError("--tree sets its own draft shape and verifies exactly: drop --schedule, --verify and"
                              " --policy, or drop --tree")
    if not params.greedy:
        raise SpecExportError("--tree verifies greedy decoding only; drop --temperature (or set it to 0),"
                              " or drop --tree")
    if not trees_supported(session.pieces):
        raise SpecExportError(f"bundle {session.bundle.root} predates token trees (its pieces take no"
                              " attention_bias); rebuild it with `specexport build` to use --tree")
    stats.mode = f"model-tree{opts.tree}"
    drafter = TreeDrafter(session.pieces, TreeShape.parse(opts.tree), session.bundle.max_context)
    return speculative(session.pieces, drafter, _policy(session, opts, mode), ids, params, rng, stats,
                       session.bundle.max_context)


LOOPS: dict[str, Callable] = {"ar": _ar_loop, **{mode: _speculative_loop(mode) for mode in DRAFTERS}}


def load(bundle: str | Path, backend: str = "onnxruntime", providers: list[str] | None = None,
         threads: int | dict[str, int] | None = None, verify: bool = True) -> Session:
    """Open a bundle: checksums verified, one backend session per piece, caches preallocated."""
    b = load_bundle(bundle, verify=verify)
    return Session(b, _open_pieces(b, backend, providers, threads))
