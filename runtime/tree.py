"""Token-tree speculation with the drafter piece (SpecInfer's tree verification, EAGLE-2's dynamic tree).

A chain drafts one guess per position, so one miss ends the step. A tree keeps the drafter's runners-up
too, and the target checks every branch in one call, so a step keeps the longest branch it agrees with.

A step grows the tree from history[-1] depth by depth: the `width` likeliest leaves (by the drafter's
probability of the whole branch) go through the drafter in one call with a tree mask, each adding its
`width` likeliest next tokens; after `depth` levels the `nodes` likeliest tokens form the tree (a child is
never likelier than its parent, so they hang together). Two floors on the drafter's probability of a
branch can shrink that: KEEP, below which a token is not verified, and EXPAND, below which a branch is
not extended; a step where nothing is likely enough is a plain one-token step. shallow and deep then
read the whole tree in one call each and the target's greedy token is followed down from the root.
With the rowwise attention operator every row is computed bit for bit as AR computes its branch laid out as
a chain, so the whole branch is final and its cache entries move to consecutive slots (`trees_in_full`).
With GroupQueryAttention only rows laid out as a sequence are, so the branch is final only that far; the
rest leads the next step's tree as a chain, its trunk, and is verified again there (`settle_branch`).
Prompt lookup's continuation joins the tree as one more branch when the text so far repeats.
Greedy only: the output is exactly the target's greedy output. On a GPU a verify call costs about the
same for 1 or 64 tokens; on a CPU it does not (BENCHMARKS.md), so the node budget matters there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .backends.common import TreeMask
from .decode import Pieces, ids_array
from .drafters import LOOKUP_MAX_TOKENS, Draft, LookupDrafter, ModelDrafter
from .errors import SpecExportError
from .policies import DraftPolicy
from .sampling import SamplingParams


@dataclass(frozen=True)
class TreeShape:
    nodes: int  # most drafter tokens per step (the root, history[-1], is not one)
    depth: int = 6  # drafter levels
    width: int = 4  # leaves expanded per level, and tokens added per expanded leaf
    lookup: int = LOOKUP_MAX_TOKENS  # most tokens of prompt lookup's branch (0: none)
    keep: float = 0.0  # least drafter probability of a branch for its last token to be verified
    expand: float = 0.0  # least drafter probability of a branch for a drafter call to extend it

    @classmethod
    def parse(cls, spec: str) -> TreeShape:
        """'NODES[:DEPTH[:WIDTH[:LOOKUP[:KEEP[:EXPAND]]]]]'."""
        shape = None
        try:
            parts = str(spec).split(":")
            counts, probs = [int(p) for p in parts[:4]], [float(p) for p in parts[4:]]
            if len(parts) <= 6 and min(counts[:3]) >= 1 and min(counts[3:], default=0) >= 0 and all(
                    0.0 <= p < 1.0 for p in probs):
                shape = cls(*counts, *probs)
        except ValueError:
            pass
        if shape is None:
            raise SpecExportError(f"--tree {spec!r} is not a tree shape; give NODES[:DEPTH[:WIDTH[:LOOKUP[:KEEP"
                                  "[:EXPAND]]]]]: positive integers (LOOKUP may be 0) and two probabilities in"
                                  " [0, 1), such as 32 or 4:2:2 or 32:6:4:0 or 4:3:2:10:0.08:0.3")
        return shape


def trees_supported(pieces: Pieces, mode: str = "model") -> bool:
    """Whether the bundle has the piece that grows `mode`'s trees (the drafter; the head for mode head) and
    every piece a tree step runs takes token trees (bundles built before `attention_bias` do not)."""
    grower = pieces.head if mode == "head" else pieces.drafter
    return grower is not None and all(TreeMask.supported(p) for p in (pieces.shallow, pieces.deep, grower))


# auto's tree: up to four drafter tokens three deep, but a token is verified only when the drafter gives its
# branch 8% or more, and a branch is extended only at 30% or more, plus lookup's branch. On a CPU each verified
# token adds to a step's cost, so most steps verify the one or two likely tokens and no more (BENCHMARKS.md,
# "Measurements behind constants in the code"). A GPU, whose verify cost is flat in the tree's size, would want more.
AUTO_TREE = TreeShape(4, 3, 2, keep=0.08, expand=0.3)


@dataclass
class Node:
    token: int
    parent: int  # index in the candidate list; -1: the root
    score: float  # the drafter's log-probability of the branch down to this token
    depth: int
    slot: int = -1  # drafter cache slot once expanded


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def children(logits: np.ndarray, parent: int, base: float, depth: int, width: int,
             vocab_map: np.ndarray | None) -> list[Node]:
    """The `width` likeliest next tokens under a drafting piece's `logits` (over `vocab_map`'s ids when its head
    is pruned) as candidate nodes of `parent`, whose branch score is `base`."""
    logp = log_softmax(logits)
    top = np.argpartition(-logp, min(width, len(logp) - 1))[:width]
    top = top[np.argsort(-logp[top], kind="stable")]
    ids = vocab_map[top] if vocab_map is not None else top
    return [Node(int(t), parent, base + float(logp[i]), depth) for t, i in zip(ids, top, strict=True)]


Expand = Callable[[list[Node], list[int], int, np.ndarray, int], np.ndarray]


class TreeGrower:
    """EAGLE-2's dynamic tree, for every piece that grows one (the drafter, runtime/head.py's head): from the
    root's distribution, level by level, the `width` likeliest leaves go through the piece in one call with a
    tree mask (`expand`, the piece's own), then the likeliest candidates form the tree and prompt lookup's
    continuation joins it as one more branch when the text so far repeats."""

    def __init__(self, shape: TreeShape, vocab_map: np.ndarray | None, vocab_size: int, max_context: int) -> None:
        self.shape, self.vocab_map = shape, vocab_map
        self.lookup = LookupDrafter(vocab_size, max_context, shape.lookup)
        # the floors as branch scores (log-probabilities); 0 means no floor. A leaf below either floor adds
        # nothing to the tree, so only leaves at or above both are extended.
        self.keep, expand = (np.log(p) if p > 0 else -np.inf for p in (shape.keep, shape.expand))
        self.extend_floor = max(self.keep, expand)

    def grow(self, history: list[int], logits: np.ndarray, expand: Expand, slot: int, cache_end: int, nodes: int,
             final: int | None = None) -> tuple[list[int], list[int]]:
        """(tokens, parents) of the step's tree in topological order; tokens[0] is history[-1]. `logits`: the
        piece's distribution of the token after history[-1]; `expand(cands, frontier, slot, visible, depth)`
        runs the piece on the frontier's tokens at cache slots slot.. (`visible`: each row's slots from
        len(history) - 1 on) and returns their logits rows; the piece's cache ends at `cache_end`. Only the
        first `final` tokens of `history` (all by default) enter lookup's index."""
        pos, width = len(history) - 1, self.shape.width
        if nodes == 0:
            return [history[-1]], [-1]
        cands = children(logits, -1, 0.0, 1, width, self.vocab_map)
        level = list(range(len(cands)))
        for depth in range(2, self.shape.depth + 1):
            if slot + width > cache_end:
                break
            frontier, visible = next_frontier(cands, level, width, nodes, self.extend_floor, slot, pos)
            if not frontier:
                break
            rows = expand(cands, frontier, slot, visible, depth)
            slot += len(frontier)
            level = []
            for row, i in enumerate(frontier):
                kids = children(rows[row], i, cands[i].score, depth, width, self.vocab_map)
                level.extend(range(len(cands), len(cands) + len(kids)))
                cands.extend(kids)
        # the likely enough candidates hang together too, children never being likelier than parents
        tokens, parents = select(cands, min(nodes, sum(c.score >= self.keep for c in cands)))
        tokens[0] = history[-1]
        n, end = self.lookup.match(history, final) if self.shape.lookup else (0, -1)
        if n:
            room = self.lookup.max_context - pos - len(tokens)  # every token needs a cache slot
            graft(tokens, parents, history[end + 1:end + 1 + min(self.lookup.max_tokens, room)])
        return tokens, parents


class TreeDrafter:
    """Grows a step's tree with the bundle's drafter piece (`TreeGrower`); prompt lookup's branch catches the
    copies of the prompt a small drafter misses, which lookup gets right at no cost but their verification.
    The drafter's cache holds the history through history[-1] (ModelDrafter's bookkeeping does the catching
    up) and, past it, the expanded tokens of the current tree, which the next step overwrites. A tree's size
    is its shape's, not the draft-length policy's: the policy only decides whether to draft at all. Greedy
    decoding only: the session refuses --tree otherwise, and auto offers a tree only then."""

    name = "tree"

    def __init__(self, pieces: Pieces, shape: TreeShape, max_context: int) -> None:
        self.chain = ModelDrafter(pieces)
        self.grower = TreeGrower(shape, pieces.drafter_vocab, pieces.vocab_size, max_context)
        self.piece, self.shape, self.max_context = pieces.drafter, shape, max_context

    def start(self, prompt: list[int], hidden: np.ndarray | None) -> None:
        self.drafting = self.drafted_last = False
        self.draft = Draft([])
        self.trunk_at = -1  # the position of the step the last draft's `ahead` is a trunk for
        self.chain.start(prompt, hidden)
        self.grower.lookup.start(prompt, hidden)

    def propose(self, history: list[int], budget: int, policy: DraftPolicy, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        # what the last tree's target rows chose beyond the final tokens (`settle_branch`): a chain ahead of the
        # new tree, verified again in rows computed as AR computes them; the call ends at the context's end
        limit = self.max_context
        trunk = self.draft.ahead[: max(0, limit - len(history))] if len(history) - 1 == self.trunk_at else []
        seq = [*history, *trunk]
        t0 = time.perf_counter()
        out = self.chain.catch_up(seq, final=len(history))
        # reading what other drafters' steps made (in auto) is not a tree step's cost; reading its own is
        catchup = 0.0 if self.drafted_last else time.perf_counter() - t0
        self.drafting = True
        tokens, parents = self.grow(seq, out, max(0, min(self.shape.nodes, limit - len(seq))), len(history))
        m = len(trunk)
        if len(tokens) == 1:  # nothing likely enough: the trunk alone, or a plain one-token step
            self.draft = Draft(trunk, catchup_s=catchup)
        else:  # the trunk as a chain from history[-1], the tree hanging from its end
            self.draft = Draft([*trunk, *tokens[1:]], parents=[-1, *range(m), *(p + m for p in parents[1:])],
                               catchup_s=catchup)
        return self.draft

    def advance(self, hidden: np.ndarray, pos: int, final: int) -> None:
        # the next grow compares the drafter's cache with the history
        self.trunk_at = pos + final if self.drafting else -1
        self.drafted_last, self.drafting = self.drafting, False

    def grow(self, history: list[int], out: dict[str, np.ndarray], nodes: int,
             final: int | None = None) -> tuple[list[int], list[int]]:
        """The tree from `out`, the drafter's output at history[-1], its cache holding the history through it:
        its slots past history[-1] take the expanded tokens."""
        pos = len(history) - 1

        def expand(cands: list[Node], frontier: list[int], slot: int, visible: np.ndarray, depth: int) -> np.ndarray:
            visible[:, 0] = True  # the root, in the drafter's cache at pos
            mask = TreeMask(pos, np.array([depth - 1] * len(frontier)), visible)
            ids = ids_array([cands[i].token for i in frontier])
            return self.piece.run(ids, slot, keep=len(frontier), tree=mask)["logits"][0]

        return self.grower.grow(history, out["logits"][0, -1], expand, pos + 1, self.max_context, nodes, final)


def next_frontier(cands: list[Node], level: list[int], width: int, nodes: int, extend_floor: float, slot: int,
                  base: int) -> tuple[list[int], np.ndarray]:
    """The leaves of `level` the next drafting call expands, given cache slots from `slot` on, and their rows of the
    call's tree mask from slot `base` (each sees its ancestors' slots and its own). A child is never likelier than
    its parent, so a leaf below the `nodes`-th likeliest score so far cannot lead into the tree: expanding it would
    be a wasted call; nor one below `extend_floor`. At most the `width` likeliest."""
    floor = sorted((c.score for c in cands), reverse=True)[nodes - 1] if len(cands) >= nodes else -np.inf
    bound = max(floor, extend_floor)
    frontier = [i for i in sorted(level, key=lambda i: -cands[i].score)[:width] if cands[i].score >= bound]
    visible = np.zeros((len(frontier), slot + len(frontier) - base), dtype=bool)
    for row, i in enumerate(frontier):
        cands[i].slot = slot + row
        a = i
        while a >= 0:
            visible[row, cands[a].slot - base] = True
            a = cands[a].parent
    return frontier, visible


def select(cands: list[Node], nodes: int) -> tuple[list[int], list[int]]:
    """The `nodes` likeliest candidates whose parents are kept too, root first, parents before children."""
    ranked = sorted(range(len(cands)), key=lambda i: (-cands[i].score, cands[i].depth, i))
    kept: set[int] = set()
    for i in ranked:
        if len(kept) == nodes:
            break
        if cands[i].parent < 0 or cands[i].parent in kept:
            kept.add(i)
    order = sorted(kept, key=lambda i: (cands[i].depth, i))
    index = {c: k + 1 for k, c in enumerate(order)}
    return ([-1, *(cands[i].token for i in order)],
            [-1, *(index.get(cands[i].parent, 0) for i in order)])


def graft(tokens: list[int], parents: list[int], branch: list[int]) -> None:
    """Add `branch`, a chain from the root, to the tree in place, sharing the nodes it already has; new
    nodes go last, so parents still come before their children."""
    node = 0
    for token in branch:
        child = next((i for i in range(1, len(tokens)) if parents[i] == node and tokens[i] == token), None)
        if child is None:
            tokens.append(token)
            parents.append(node)
            child = len(tokens) - 1
        node = child


def walk(tokens: list[int], parents: list[int], logits: np.ndarray) -> tuple[list[int], int]:
    """Follow the target's greedy token down from the root: (the branch's node indices, the target's token
    after its last node)."""
    children: dict[int, dict[int, int]] = {}
    for i in range(1, len(tokens)):
        children.setdefault(parents[i], {}).setdefault(tokens[i], i)
    path = [0]
    while True:
        target = int(np.argmax(logits[path[-1]]))
        nxt = children.get(path[-1], {}).get(target)
        if nxt is None:
            return path, target
        path.append(nxt)


def tree_depth(parents: list[int]) -> int:
    """How many draft positions a tree reaches: its longest branch below the root (`parents` as Draft's)."""
    depths = [0] * len(parents)
    for i in range(1, len(parents)):  # a parent comes before its children
        depths[i] = depths[parents[i]] + 1
    return max(depths)


def settle_branch(draft: Draft, logits: np.ndarray, full: bool = False) -> tuple[list[int], list[int]]:
    """After a tree's verify call: (the target's final tokens along its branch, the tree rows they follow). The
    rows are the branch's nodes from the root, one per final token; the tokens are those nodes' drafts after
    the root, then the token the last node's row chose. The rest of the branch, if any, goes in `draft.ahead`.

    `full` (`trees_in_full`): every row is computed as AR computes the same tokens laid out as a chain, so the
    whole branch is final; the caller then moves the rows' cache entries to consecutive slots.

    Otherwise only the tree's leading chain of slots (the trunk and the first child of its end) is computed as
    AR computes it. Any other row sums over masked slots, so its attention (GroupQueryAttention) adds the same
    terms in other places of the kernel's vector lanes; the last bits differ, and with int8 activations
    (MatMulNBits, accuracy level 4) such a bit can move an argmax after a few layers. Tokens those rows choose
    are therefore not final: the next tree verifies them again as its trunk, where the cache entries they
    write are AR's too. So no kept slot is ever moved (the rows returned are 0, 1, ...), and the output is
    AR's, bit for bit."""
    tokens = [-1, *draft.tokens]
    path, target = walk(tokens, draft.parents, logits)
    decided = [*(tokens[i] for i in path[1:]), target]  # decided[i]: the token row path[i] chose
    exact = len(path)
    if not full:
        chain = 1
        while chain < len(tokens) and draft.parents[chain] == chain - 1:
            chain += 1
        exact = 1  # rows path[:exact] sit in the leading chain
        while exact < len(path) and path[exact] < chain:
            exact += 1
    draft.ahead = decided[exact:]
    return decided[:exact], path[:exact]


def trees_in_full(attention: str, pieces: Pieces) -> bool:
    """Whether a tree step keeps its whole accepted branch: the bundle's attention computes each row alone, in
    slot order with masked slots skipped (`rowwise`), so a branch's rows are its chain's bit for bit, and the
    output path's pieces can move their cache slots to lay the branch out as that chain (host caches)."""
    return attention == "rowwise" and all(getattr(p, "moves_slots", False) for p in (pieces.shallow, pieces.deep))


def lay_out_branch(pieces: Pieces, pos: int, rows: list[int]) -> None:
    """The caches of the pieces a verify call ran (shallow, deep) hold the tree's rows at slots pos + row: the
    final ones move to pos, pos + 1, ..., where AR would have written them."""
    src = [pos + r for r in rows]
    dst = list(range(pos, pos + len(rows)))
    for piece in (pieces.shallow, pieces.deep):
        piece.move_slots(src, dst)
