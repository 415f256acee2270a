"""GroupQueryAttention at head size 256 rounds a row by its call's total length (runtime/attention_rounding.py):
the session keeps every row on its AR call's side of the boundary, so speculative output stays AR's."""

from __future__ import annotations

import numpy as np
import pytest
from specexport.exporter.build import build_bundle
from specexport.runtime import load
from specexport.runtime.attention_rounding import BOUNDARY, SplitAtBoundary, split_point, tree_end

from .conftest import make_arch_checkpoint, make_noisy_drafter

SYSTEMS = [{"mode": "lookup"}, {"mode": "model"}, {"mode": "model", "tree": "4:3:2:0"}, {"mode": "auto"},
           {"mode": "self"}, {"mode": "model", "schedule": "pearl"}]


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    """A tiny Gemma 3 whose heads are 256 wide, as Gemma 3 270M's, with a drafter of its own."""
    root = tmp_path_factory.mktemp("gemma-256")
    checkpoint = make_arch_checkpoint(root / "model", "gemma3_text", head_dim=256, sliding_window=512)
    drafter = make_noisy_drafter(checkpoint, root / "drafter")
    build_bundle(root / "b", model=str(checkpoint), drafter=str(drafter), adapter="untrained", exit_layer=2,
                 context=256)
    return root / "b"


def _rows(deep, chunks: list[int], start: int, hidden: int) -> np.ndarray:
    deep.run(np.random.default_rng(2).standard_normal((1, start, hidden)).astype(np.float32), 0)
    h = np.random.default_rng(1).standard_normal((1, sum(chunks), hidden)).astype(np.float32)
    outs, done = [], 0
    for n in chunks:
        outs.append(deep.run(h[:, done:done + n], start + done, keep=n)["logits"].copy())
        done += n
    return np.concatenate(outs, axis=1)


def test_rows_of_a_call_across_the_boundary_equal_one_token_calls(wide_heads):
    session = load(wide_heads)
    deep, hidden = session.pieces.deep, session.bundle.manifest.model.dims.hidden
    assert isinstance(deep, SplitAtBoundary)
    for start in (40, 58, 62, 63, 64, 180):
        np.testing.assert_array_equal(_rows(deep, [12], start, hidden), _rows(deep, [1] * 12, start, hidden),
                                      err_msg=f"a 12-row call at {start}")
    # without the split, a call whose rows' AR calls lie on both sides of the boundary rounds otherwise
    assert not np.array_equal(_rows(deep.piece, [12], 58, hidden), _rows(deep.piece, [1] * 12, 58, hidden))


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_speculative_output_across_the_boundary_is_ar(wide_heads, system):
    session = load(wide_heads)
    drafted = 0
    for prompt in ("the sea", "a b c d e f g", "Explain how a hash table works."):
        ids = session.prompt_ids(prompt, session.options())
        assert len(ids) < BOUNDARY - 8  # generation crosses the boundary
        ar = session.generate_ids(ids, max_new_tokens=96, mode="ar").tokens
        out = session.generate_ids(ids, max_new_tokens=96, **system)
        assert out.tokens == ar, prompt
        drafted += out.stats.drafted
    assert drafted > 0


@pytest.mark.parametrize(("start", "n", "copy", "cut"), [
    (10, 8, True, None),      # every row and the call below the boundary
    (60, 8, True, 3),         # rows 60..62 have AR totals up to 64 (a one-row call and its copy), 63 beyond
    (60, 8, False, 4),        # without the copy, row 63's AR call totals 64
    (60, 3, True, None),      # rows 60..62 only: the call totals 63
    (60, 4, True, 3),         # row 63 alone beyond: the call would total 64, its AR call 65
    (63, 5, True, None),      # all beyond
    (100, 9, True, None),
])
def test_split_point(start, n, copy, cut):
    assert split_point(start, n, copy) == cut


def test_tree_end():
    assert tree_end(10, 256, True) == BOUNDARY - 1 and tree_end(10, 256, False) == BOUNDARY
    assert tree_end(62, 256, True) == BOUNDARY - 1  # the root alone: a one-token step
    assert tree_end(63, 256, True) == 256 and tree_end(10, 40, True) == 40


class RecordingPiece:
    """A test double for a backend piece: records calls; each row's outputs hold its position."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    def run(self, x, start, keep=1, tree=None):
        n = x.shape[1]
        self.calls.append((start, n, keep))
        kept = n if keep <= 0 else min(keep, n)
        rows = np.arange(start, start + n, dtype=np.float32)[None, :, None]
        return {"hidden": rows.copy(), "logits": rows[:, n - kept:].copy()}


@pytest.mark.parametrize("keep", [1, 3, 6, 8, 0])
def test_split_calls_join_their_results_as_one_call(keep):
    piece = RecordingPiece()
    out = SplitAtBoundary(piece, copy=True).run(np.zeros((1, 8), np.int64), 60, keep)
    assert [(s, n) for s, n, _ in piece.calls] == [(60, 3), (63, 5)]
    assert out["hidden"][0, :, 0].tolist() == list(range(60, 68))
    kept = 8 if keep <= 0 else keep
    assert out["logits"][0, :, 0].tolist() == list(range(68 - kept, 68))


def test_calls_that_need_no_split_and_trees_pass_through():
    piece = RecordingPiece()
    wrapped = SplitAtBoundary(piece, copy=True)
    wrapped.run(np.zeros((1, 8), np.int64), 10, 8)
    wrapped.run(np.zeros((1, 8), np.int64), 60, 8, tree=object())
    assert piece.calls == [(10, 8, 8), (60, 8, 8)]
    assert wrapped.tree_end(10, 256) == BOUNDARY - 1


def test_only_wide_heads_on_the_cpu_are_guarded(tiny_bundles):
    assert not isinstance(load(tiny_bundles("ort")).pieces.deep, SplitAtBoundary)  # head size 16
