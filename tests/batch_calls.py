"""What the batch scheduler's deep calls held, for tests that must show rows shared calls (tokens equal to AR
hold just as well when requests run one at a time), and a pinned cost model so that whether drafting pays does
not hang on the machine's load while the tests run."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from specexport.runtime.engine.cost import CallCost

# a verification row costs little beside the call's fixed cost: drafting pays, whatever the machine's load
PINNED_COST = CallCost(fixed_s=2e-3, per_row_s=2e-4, per_token_s=5e-5)


@dataclass(frozen=True)
class DeepCall:
    rows: int  # requests in the call
    tokens: int  # positions a row (a verification carries the last token and a draft: 2 or more)
    tree: bool  # some row verified a token tree


@contextmanager
def deep_calls(scheduler):
    """Records every deep call the scheduler makes while the block runs."""
    deep = scheduler.pieces.deep
    real, calls = deep.run_rows, []

    def recording(x, rows, starts, keep=1, trees=None, extra=None):
        calls.append(DeepCall(len(rows), int(x.shape[1]), any(t is not None for t in trees or [])))
        return real(x, rows, starts, keep, trees, extra)

    deep.run_rows = recording
    try:
        yield calls
    finally:
        deep.run_rows = real


def shared_drafts(calls: list[DeepCall], tree: bool = False) -> int:
    """Calls in which several requests ran and drafts (token trees, where `tree`) were verified."""
    return sum(1 for c in calls if c.rows > 1 and c.tokens > 1 and (c.tree or not tree))
