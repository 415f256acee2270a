"""`EarlyExit` (runtime/early_exit.py): shallow beside `full` keeps a log of the token in each cache slot and
catches its cache up to the text before a drafter reads it. A test double stands in for the piece."""

from __future__ import annotations

import numpy as np
from specexport.runtime.backends.common import TreeMask
from specexport.runtime.decode import Pieces
from specexport.runtime.early_exit import EarlyExit, catch_up


class RecordingPiece:
    """A test double for a backend piece: records each call's tokens and start."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], int]] = []

    def run(self, x, start, keep=1, tree=None):
        self.calls.append((x[0].tolist(), start))
        return {"hidden": np.zeros((1, x.shape[1], 4), dtype=np.float32)}


def test_catch_up_runs_the_text_from_the_first_slot_the_cache_does_not_hold():
    piece = RecordingPiece()
    shallow = EarlyExit(piece, max_context=32)
    history = [5, 6, 7, 8, 9, 10]
    shallow.catch_up(history, 5)
    assert piece.calls == [([5, 6, 7, 8, 9], 0)]
    shallow.catch_up(history, 5)  # held now: nothing runs
    assert len(piece.calls) == 1
    shallow.run(np.array([[10, 11]]), 5)  # a draft's own calls are logged too
    shallow.catch_up([5, 6, 7, 8, 9, 10, 11, 12], 7)
    assert len(piece.calls) == 2
    # another text from slot 3 on (a new request that shares a prefix, or other tokens verified there)
    shallow.catch_up([5, 6, 7, 1, 2, 3, 4], 6)
    assert piece.calls[-1] == ([1, 2, 3], 3)


def test_a_call_leaves_every_slot_after_its_rows_unknown():
    # a slot's keys and values hold for the prefix before it: rewriting slot 2 makes 3 and later stale, and
    # a one-row call's copy (next slot) is not a token of the text
    piece = RecordingPiece()
    shallow = EarlyExit(piece, max_context=16)
    shallow.catch_up(list(range(20, 30)), 8)
    shallow.run(np.array([[22]]), 2)
    shallow.catch_up(list(range(20, 30)), 8)
    assert piece.calls[-1] == ([23, 24, 25, 26, 27], 3)


def test_a_tree_calls_rows_are_never_taken_for_text():
    piece = RecordingPiece()
    shallow = EarlyExit(piece, max_context=16)
    shallow.catch_up([1, 2, 3], 3)
    shallow.run(np.array([[4, 5, 6]]), 3, tree=TreeMask.from_parents([-1, 0, 0], 3))
    shallow.catch_up([1, 2, 3, 4, 5], 5)
    assert piece.calls[-1] == ([4, 5], 3)


def test_catch_up_leaves_a_plain_shallow_alone():
    # shallow and deep as the target: every target call ran shallow, and its cache is the target's
    piece = RecordingPiece()
    catch_up(Pieces(piece, piece), [1, 2, 3], 3)
    assert piece.calls == []
