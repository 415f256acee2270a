"""Token trees final in full: on bundles built with --attention rowwise every row of a tree's verify call is its
branch laid out as a chain, bit for bit, so a tree step keeps its whole accepted branch and moves its cache
entries to consecutive slots (runtime/tree.py, `trees_in_full`); GroupQueryAttention bundles keep only the
tree's leading chain. Either way the output is AR's, token for token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from specexport.exporter.build import build_bundle
from specexport.runtime import attention_op, load, speculative
from specexport.runtime.backends.common import TreeMask
from specexport.runtime.decode import ids_array
from specexport.runtime.drafters import Draft
from specexport.runtime.head import FeatureTap
from specexport.runtime.tree import settle_branch

from .conftest import make_noisy_drafter

pytestmark = pytest.mark.skipif(not attention_op.available(), reason="the attention operator is not built")

PROMPTS = ["hash table", "the quick brown fox", "write a haiku about the sea"]
SHAPES = ["4:2:2", "8:3:3", "32:6:4:0"]
NEW_TOKENS = 40
# root 0; children 1, 2; 3 under 2; 4 under 1; 5 under 3: the branch 0-2-3-5 leaves the leading chain at once
PARENTS = [-1, 0, 0, 2, 1, 3]
TOKENS = [11, 25, 37, 41, 53, 67]
BRANCH = [0, 2, 3, 5]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_checkpoint):
    """(attention, precision) -> a tiny ort bundle with a noisy drafter piece, built once."""
    root = tmp_path_factory.mktemp("tree-full")
    drafter = make_noisy_drafter(tiny_checkpoint, root / "drafter")
    built: dict[tuple[str, str], Path] = {}

    def build(attention: str, precision: str = "fp32") -> Path:
        key = (attention, precision)
        if key not in built:
            out = root / f"{attention}-{precision}"
            build_bundle(out, model=str(tiny_checkpoint), drafter=str(drafter), adapter="none", exit_layer=2,
                         context=256, flavour="ort", precision=precision, attention=attention,
                         # the tiny drafter's int4 logits are off PyTorch's by more than int4's parity allows
                         drafting_precision="int8" if precision == "int4" else None)
            built[key] = out
        return built[key]

    return build


@pytest.fixture()
def steps(monkeypatch):
    """Every tree step's (kept rows, leading-chain length of its tree, tokens left ahead), from the loop's
    settle."""
    seen: list[tuple[list[int], int, int]] = []

    def recording(draft, logits, full=False):
        new, rows = settle_branch(draft, logits, full)
        chain = 1
        while chain <= len(draft.tokens) and draft.parents[chain] == chain - 1:
            chain += 1
        seen.append((rows, chain, len(draft.ahead)))
        return new, rows

    monkeypatch.setattr(speculative, "settle_branch", recording)
    return seen


def off_chain(steps) -> int:
    """How many steps kept a row outside their tree's leading chain."""
    return sum(rows[-1] >= chain for rows, chain, _ in steps)


def test_settle_branch_in_full_keeps_the_whole_branch():
    # 0 -> 1 -> 3 is the target's branch, and row 3 chooses 30; node 3 is off the leading chain (0-1-2)
    draft = Draft([10, 11, 12, 13], parents=[-1, 0, 1, 1, 3])
    logits = np.zeros((5, 32), dtype=np.float32)
    for row, token in ((0, 10), (1, 12), (2, 31), (3, 30), (4, 7)):
        logits[row, token] = 1.0
    assert settle_branch(draft, logits, full=True) == ([10, 12, 30], [0, 1, 3]) and draft.ahead == []
    assert settle_branch(draft, logits) == ([10, 12], [0, 1]) and draft.ahead == [30]


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_moved_branch_is_its_chain_bit_for_bit(bundle, precision):
    """After a tree call, the branch's entries moved to consecutive slots make the next token's logits AR's
    bit for bit; left where the tree put them, they do not."""
    pieces = load(bundle("rowwise", precision)).pieces
    prompt = [1, 5, 9, 14, 3, 8, 21, 30]
    pos, branch = len(prompt), [TOKENS[i] for i in BRANCH]
    nxt = ids_array([17])

    def prefill() -> None:
        pieces.deep.run(pieces.shallow.run(ids_array(prompt), 0)["hidden"], 0)

    def next_logits() -> np.ndarray:
        at = pos + len(branch)
        return pieces.deep.run(pieces.shallow.run(nxt, at)["hidden"], at)["logits"].copy()

    prefill()
    chain_rows = pieces.deep.run(pieces.shallow.run(ids_array(branch), pos)["hidden"], pos,
                                 keep=len(branch))["logits"][0].copy()
    want = next_logits()
    results = {}
    for move in (True, False):
        prefill()
        tree = TreeMask.from_parents(PARENTS, pos)
        hidden = pieces.shallow.run(ids_array(TOKENS), pos, tree=tree)["hidden"]
        rows = pieces.deep.run(hidden, pos, keep=len(TOKENS), tree=tree)["logits"][0][BRANCH]
        np.testing.assert_array_equal(rows, chain_rows)  # the branch's rows are its chain's already
        if move:
            src = [pos + i for i in BRANCH]
            for piece in (pieces.shallow, pieces.deep):
                piece.move_slots(src, list(range(pos, pos + len(BRANCH))))
        results[move] = next_logits()
    np.testing.assert_array_equal(results[True], want)
    assert not np.array_equal(results[False], want)


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_rowwise_trees_keep_whole_branches_and_give_ar_tokens(bundle, precision, steps):
    session = load(bundle("rowwise", precision))
    assert session.context.trees_in_full
    for prompt in PROMPTS:
        ar = session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="ar").tokens
        assert len(ar) > 10
        for shape in SHAPES:
            out = session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="model", tree=shape)
            assert out.tokens == ar, (precision, shape, prompt)
        assert session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="auto").tokens == ar, (precision, prompt)
    assert steps and all(ahead == 0 for _, _, ahead in steps)  # nothing is left to verify again
    assert off_chain(steps) > 0, "no step kept a branch beyond its tree's leading chain"


def test_gqa_trees_keep_the_leading_chain_only(bundle, steps):
    session = load(bundle("gqa"))
    assert not session.context.trees_in_full
    for prompt in PROMPTS:
        ar = session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="ar").tokens
        for shape in SHAPES:
            assert session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="model", tree=shape).tokens == ar
    assert steps and off_chain(steps) == 0
    assert any(ahead for _, _, ahead in steps)  # branches beyond the chain were left to the next step


class Recorder:
    """A piece stub that records slot moves."""

    def __init__(self) -> None:
        self.moves: list[tuple[list[int], list[int]]] = []

    def run(self, x, start, keep=1, tree=None, **kw):
        return {"features": np.arange(x.shape[1], dtype=np.float32)[None, :, None] * np.ones((1, 1, 3))}

    def move_slots(self, src, dst):
        self.moves.append((src, dst))


def test_feature_tap_moves_its_rows_with_the_slots():
    inner = Recorder()
    tap = FeatureTap(inner)
    tap.run(np.zeros((1, 6, 4)), 20, keep=6)
    tap.move_slots([20, 22, 23, 25], [20, 21, 22, 23])
    assert inner.moves == [([20, 22, 23, 25], [20, 21, 22, 23])]
    assert tap.features[0, :4, 0].tolist() == [0.0, 2.0, 3.0, 5.0]
