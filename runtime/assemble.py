"""The one place a request's decoder is assembled: its options and the session's pieces become a drafter, a
draft-length policy, a verification rule and a schedule, and `decoder` returns the loop that runs them.

    mode      drafter (who proposes tokens)                     policy         verify        schedule
    ar        none: one target call per token (decode.py)       -              -             -
    self      shallow + adapter (Kangaroo)                      --policy       --verify      --schedule
    model     the drafter piece, or a token tree with --tree    --policy       exact / tree  sequential
    head      the draft head over the target's states (EAGLE-3)  --policy       --verify      sequential
    lookup    prompt lookup (copies earlier text)               its own cap    --verify      --schedule
    hier      the drafter, screened by the adapter              --policy       --verify      --schedule
    auto      per step, the drafter that promises most tokens/s --policy       --verify      --schedule

auto chooses between: greedy, exact verification, and a bundle whose pieces take token trees → the drafter's
tree (the recipe's shape for the bundle's precision) against prompt lookup alone. The tree beat every chain
side by side on Spec-Bench, and offering chains as well only cost steps spent re-learning that (BENCHMARKS.md).
Sampling, or a relaxed rule, or older pieces → the chains the bundle has (adapter, drafter) against lookup.
What auto learns carries over between the requests of a session, per set of choices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from .context import DecodeContext
from .decode import autoregressive
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
from .head import HeadDrafter, HeadTreeDrafter
from .options import Options
from .pearl import pearl_loop
from .policies import DraftPolicy, make_policy
from .sampling import SamplingParams
from .speculative import speculative
from .stats import Stats
from .tree import TreeDrafter, TreeShape, trees_supported
from .verification import make_verify

MODE_PIECES = {"self": ("adapter",), "model": ("drafter",), "head": ("head",), "hier": ("drafter", "adapter")}
PIECE_FIXES = {"adapter": "an adapter (`specexport build --adapter auto`)",
               "drafter": "a drafter (`specexport build --drafter DIR`, a same-tokenizer checkpoint)",
               "head": "a draft head (`specexport build --head DIR`, trained with `specexport train-head`)"}


def decoder(ctx: DecodeContext, opts: Options, ids: list[int], params: SamplingParams, rng: np.random.Generator,
            stats: Stats) -> Iterator[list[int]]:
    """The tokens of one request, a list per step, from the loop its options ask for."""
    mode = resolve_mode(ctx, opts.mode)
    pieces, context = ctx.pieces, ctx.max_context
    if mode == "ar":
        if opts.verify != "exact":
            raise SpecExportError(f"--verify {opts.verify} judges drafts, and --mode ar drafts nothing; use a"
                                  " speculative mode such as --mode auto")
        return autoregressive(pieces, ids, params, rng, stats)
    if opts.tree:
        drafter = tree_drafter(ctx, mode, opts, params)
        stats.mode = f"{mode}-tree{opts.tree}"
        return speculative(pieces, drafter, draft_policy(ctx, opts, mode), ids, params, rng, stats, context)
    if opts.schedule == "pearl":  # the drafter on a thread of its own beside the target (pearl.py)
        return pearl_loop(pieces, mode, opts, lambda m: draft_policy(ctx, opts, m), ids, params, rng, stats,
                          context)
    stats.mode = mode
    stats.lossy = opts.verify != "exact"
    return speculative(pieces, DRAFTERS[mode](ctx, opts, stats), draft_policy(ctx, opts, mode), ids,
                       params, rng, stats, context, accept=make_verify(opts.verify, params, opts.beta, opts.tau))


def resolve_mode(ctx: DecodeContext, mode: str) -> str:
    """`mode` when the bundle has the pieces it needs; otherwise one sentence on how to get them."""
    if mode != "ar" and mode not in DRAFTERS:
        raise SpecExportError(f"unknown mode {mode!r}; use one of ar, {', '.join(DRAFTERS)}")
    missing = [p for p in MODE_PIECES.get(mode, ()) if getattr(ctx.pieces, p, None) is None]
    if missing:
        raise SpecExportError(f"bundle {ctx.root} has no {' or '.join(missing)} piece, so --mode {mode}"
                              f" is not available; rebuild it with {' and '.join(PIECE_FIXES[p] for p in missing)},"
                              " or use --mode auto (it uses what the bundle has)")
    return mode


def draft_policy(ctx: DecodeContext, opts: Options, mode: str = "self") -> DraftPolicy:
    spec = ctx.speculative
    gamma = opts.gamma if opts.gamma is not None else spec.gamma
    eta = opts.eta if opts.eta is not None else spec.eta
    return make_policy(opts.policy, gamma, eta, cost=lambda gamma_max: ctx.cost_model(mode, gamma_max))


def tree_drafter(ctx: DecodeContext, mode: str, opts: Options, params: SamplingParams) -> Drafter:
    if mode not in ("model", "head"):
        raise SpecExportError(f"--tree grows its trees with the bundle's drafter piece or its draft head, so it"
                              f" needs --mode model or --mode head (not {mode})")
    if opts.schedule != "sequential" or opts.verify != "exact" or opts.policy:
        raise SpecExportError("--tree sets its own draft shape and verifies exactly: drop --schedule, --verify and"
                              " --policy, or drop --tree")
    if not params.greedy:
        raise SpecExportError("--tree verifies greedy decoding only; drop --temperature (or set it to 0),"
                              " or drop --tree")
    if not trees_supported(ctx.pieces, mode):
        raise SpecExportError(f"bundle {ctx.root} predates token trees (its pieces take no"
                              " attention_bias); rebuild it with `specexport build` to use --tree")
    shape = TreeShape.parse(opts.tree)
    if mode == "head":
        return HeadTreeDrafter(ctx.pieces, shape, ctx.max_context)
    return TreeDrafter(ctx.pieces, shape, ctx.max_context)


def _lookup(ctx: DecodeContext, opts: Options) -> LookupDrafter:
    # lookup drafts cost nothing, so it takes its own cap, not the bundle's gamma (an explicit --gamma wins)
    return LookupDrafter(ctx.pieces.vocab_size, ctx.max_context, opts.gamma or LOOKUP_MAX_TOKENS)


def _auto(ctx: DecodeContext, opts: Options, stats: Stats) -> AutoDrafter:
    p = ctx.pieces
    greedy = SamplingParams(opts.temperature, opts.top_k, opts.top_p).greedy
    drafters: list[Drafter] = []
    if greedy and opts.verify == "exact":  # trees beat chains side by side (BENCHMARKS.md): only trees then
        shape, context = ctx.auto_tree(), ctx.max_context
        drafters += [TreeDrafter(p, shape, context)] if trees_supported(p) else []
        drafters += [HeadTreeDrafter(p, shape, context)] if trees_supported(p, "head") else []
    if not drafters:
        drafters = [SelfDrafter(p)] if p.adapter is not None else []
        drafters += [ModelDrafter(p)] if p.drafter is not None else []
        drafters += [HeadDrafter(p)] if p.head is not None else []
    # the recipe may narrow auto's choices per precision, from side-by-side measurements of them
    offered = ctx.speculative.auto_drafters.get(ctx.precision)
    if offered:
        names = set(offered.split(","))
        drafters = [d for d in drafters if d.name in names] or drafters
    memory = ctx.auto_memory.setdefault(tuple(d.name for d in drafters), AutoMemory({}))
    return AutoDrafter(drafters, _lookup(ctx, opts), stats, memory=memory)


# mode -> its drafter, made per request from (ctx, options, stats)
DRAFTERS: dict[str, Callable[[DecodeContext, Options, Stats], Drafter]] = {
    "self": lambda ctx, opts, stats: SelfDrafter(ctx.pieces),
    "model": lambda ctx, opts, stats: ModelDrafter(ctx.pieces),
    "head": lambda ctx, opts, stats: HeadDrafter(ctx.pieces),
    "lookup": lambda ctx, opts, stats: _lookup(ctx, opts),
    "hier": lambda ctx, opts, stats: HierDrafter(ctx.pieces, stats),
    "auto": _auto,
}
MODES = ("ar", *DRAFTERS)
