"""What a request's decoder needs from a loaded bundle, as one plain value: the pieces, the context length,
the recipe's speculative defaults, and what the session learns and measures across requests (auto's
estimates, the goodput policy's cost models). `assemble.decoder` reads this, never the Session, so the
loop's assembly sits below the session that drives it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .decode import Pieces
from .drafters import AutoMemory, Drafter
from .errors import SpecExportError
from .manifest import ManifestError, SpeculativeDefaults
from .policies import CostModel, measure_cost
from .tree import AUTO_TREE, TreeShape


@dataclass
class DecodeContext:
    pieces: Pieces
    root: Path  # the bundle's directory, for messages
    max_context: int
    precision: str
    speculative: SpeculativeDefaults
    auto_trees: dict[str, TreeShape]
    trees_in_full: bool = False  # a tree step keeps its whole accepted branch (tree.trees_in_full)
    costs: dict[tuple[str, int], CostModel] = field(default_factory=dict)  # measured when first asked for
    auto_memory: dict[tuple[str, ...], AutoMemory] = field(default_factory=dict)  # per set of auto's choices
    # the request's own seconds, which auto's estimates are measured in; where the pieces are shared with other
    # sequences (runtime/batching), its share of their calls, and `sharing` how many sequences share them now
    clock: Callable[[], float] = time.perf_counter
    sharing: Callable[[], int] | None = None
    drafts: Callable[[Drafter], Drafter] | None = None  # wraps the request's drafter (the engine's draft counts)

    @classmethod
    def of(cls, pieces: Pieces, root: Path, max_context: int, precision: str,
           speculative: SpeculativeDefaults, trees_in_full: bool = False) -> DecodeContext:
        return cls(pieces, root, max_context, precision, speculative, parse_auto_trees(speculative), trees_in_full)

    def cost_model(self, mode: str, gamma_max: int) -> CostModel:
        """The goodput policy's cost model for `mode`: the pieces timed once, on first use (a fraction of a
        second; loading never pays it)."""
        key = (mode, gamma_max)
        if key not in self.costs:
            self.costs[key] = measure_cost(self.pieces, mode, gamma_max, self.max_context, clock=self.clock)
        return self.costs[key]

    def auto_tree(self) -> TreeShape:
        """auto's tree for the bundle's precision: the recipe's [speculative.auto_tree], else AUTO_TREE."""
        return self.auto_trees.get(self.precision, AUTO_TREE)


def parse_auto_trees(speculative: SpeculativeDefaults) -> dict[str, TreeShape]:
    """The manifest's per-precision auto trees, each checked as a field."""
    shapes = {}
    for precision, spec in speculative.auto_tree.items():
        try:
            shapes[precision] = TreeShape.parse(spec)
        except SpecExportError as exc:
            raise ManifestError(f"manifest field speculative.auto_tree.{precision} is not a tree shape: {exc}"
                                ) from None
    return shapes
