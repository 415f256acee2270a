"""The one place a request's decoder is assembled: its plan (runtime/plan.py, the options resolved and checked
against the bundle) and the session's pieces become a drafter, a draft-length policy, a verification rule and
a schedule, and `decoder` returns the loop that runs them.

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
    AutoDrafter,
    AutoMemory,
    Drafter,
    HierDrafter,
    LookupDrafter,
    ModelDrafter,
    SelfDrafter,
)
from .head import HeadDrafter, HeadTreeDrafter
from .pearl import pearl
from .plan import Plan
from .policies import DraftPolicy, policy_of
from .sampling import SamplingParams
from .speculative import speculative
from .stats import Stats
from .tree import TreeDrafter, trees_supported
from .verification import make_verify


def decoder(ctx: DecodeContext, plan: Plan, ids: list[int], params: SamplingParams, rng: np.random.Generator,
            stats: Stats) -> Iterator[list[int]]:
    """The tokens of one request, a list per step, from the loop its plan asks for (runtime/plan.py has
    checked it against the bundle: nothing here refuses)."""
    pieces, context = ctx.pieces, ctx.max_context
    stats.mode, stats.lossy = plan.label, plan.lossy
    if plan.mode == "ar":
        return autoregressive(pieces, ids, params, rng, stats)
    # built before the first token: the goodput policy times the pieces (once per session) before the prefill
    drafter, policy = make_drafter(ctx, plan, stats), draft_policy(ctx, plan)
    if plan.schedule == "pearl":  # the drafter on a thread of its own beside the target (pearl.py)
        return pearl(pieces, drafter, policy, ids, params, rng, stats, context)
    wrap = ctx.drafts or (lambda drafter: drafter)
    return speculative(pieces, wrap(drafter), policy, ids, params, rng, stats, context,
                       accept=make_verify(plan.verify, plan.beta, plan.tau), full_trees=ctx.trees_in_full)


def make_drafter(ctx: DecodeContext, plan: Plan, stats: Stats) -> Drafter:
    """The plan's drafter: a token tree's grower, or the mode's (DRAFTERS)."""
    if plan.tree is not None:
        return (HeadTreeDrafter if plan.mode == "head" else TreeDrafter)(ctx.pieces, plan.tree, ctx.max_context)
    return DRAFTERS[plan.mode](ctx, plan, stats)


def draft_policy(ctx: DecodeContext, plan: Plan) -> DraftPolicy:
    return policy_of(plan.policy, plan.policy_value, plan.gamma,
                     cost=lambda gamma_max: ctx.cost_model(plan.mode, gamma_max))


def _lookup(ctx: DecodeContext, most: int) -> LookupDrafter:
    return LookupDrafter(ctx.pieces.vocab_size, ctx.max_context, most)


def _auto(ctx: DecodeContext, plan: Plan, stats: Stats) -> AutoDrafter:
    p = ctx.pieces
    drafters: list[Drafter] = []
    lookup_most = plan.lookup_tokens
    if plan.greedy and plan.verify == "exact":  # trees beat chains side by side (BENCHMARKS.md): only trees then
        shape, context = ctx.auto_tree(), ctx.max_context
        drafters += [TreeDrafter(p, shape, context)] if trees_supported(p) else []
        drafters += [HeadTreeDrafter(p, shape, context)] if trees_supported(p, "head") else []
        if drafters and shape.lookup:  # the tree's cap on lookup's branch holds for lookup alone too: where a
            lookup_most = min(lookup_most, shape.lookup)  # verified row is dear, long copies cost more than they earn
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
    return AutoDrafter(drafters, _lookup(ctx, lookup_most), stats, memory=memory, clock=ctx.clock,
                       sharing=ctx.sharing)


# mode -> its drafter, made per request from (ctx, plan, stats); with "ar", the modes of runtime/choices.py
DRAFTERS: dict[str, Callable[[DecodeContext, Plan, Stats], Drafter]] = {
    "self": lambda ctx, plan, stats: SelfDrafter(ctx.pieces),
    "model": lambda ctx, plan, stats: ModelDrafter(ctx.pieces),
    "head": lambda ctx, plan, stats: HeadDrafter(ctx.pieces),
    "lookup": lambda ctx, plan, stats: _lookup(ctx, plan.lookup_tokens),
    "hier": lambda ctx, plan, stats: HierDrafter(ctx.pieces, stats),
    "auto": _auto,
}
