"""Token trees in one call: every node's logits equal the chain of its own branch, in both graph flavours,
and the rows of a tree's leading chain of slots are computed bit for bit as one-token AR calls compute
them, whatever the tree after them (what `tree.settle` relies on to stay lossless at every precision)."""

from __future__ import annotations

import numpy as np
import pytest
from specexport.runtime import load
from specexport.runtime.backends.common import TreeMask
from specexport.runtime.decode import ids_array

# root 0; children 1, 2; 3 under 1; 4 under 2; 5 under 3; 6 under 1 (a branch interleaved with another)
PARENTS = [-1, 0, 0, 1, 2, 3, 1]
TOKENS = [11, 25, 37, 41, 53, 67, 79]


def branch(i: int) -> list[int]:
    path = []
    while i >= 0:
        path.append(i)
        i = PARENTS[i]
    return path[::-1]


def chain_logits(pieces, prompt: list[int], tokens: list[int]) -> np.ndarray:
    pieces.deep.run(pieces.shallow.run(ids_array(prompt), 0)["hidden"], 0)
    hidden = pieces.shallow.run(ids_array(tokens), len(prompt))["hidden"]
    return pieces.deep.run(hidden, len(prompt), keep=len(tokens))["logits"][0]


def test_tree_layout_depths_and_ancestors():
    tree = TreeMask.from_parents(PARENTS, 10)
    depth, visible = tree.depth, tree.visible
    assert depth.tolist() == [0, 1, 1, 2, 2, 3, 2]
    assert visible[5].nonzero()[0].tolist() == [0, 1, 3, 5]
    assert visible[6].nonzero()[0].tolist() == [0, 1, 6]
    with pytest.raises(ValueError, match="parents must come first"):
        TreeMask.from_parents([-1, 2, 0], 0)


@pytest.mark.parametrize("flavour", ["ort", "standard"])
def test_tree_call_equals_each_branch_as_a_chain(tiny_bundles, flavour):
    pieces = load(tiny_bundles(flavour)).pieces
    prompt = [1, 5, 9, 14, 3, 8]
    pieces.deep.run(pieces.shallow.run(ids_array(prompt), 0)["hidden"], 0)
    pos = len(prompt)
    hidden = pieces.shallow.run(ids_array(TOKENS), pos, tree=TreeMask.from_parents(PARENTS, pos))["hidden"]
    tree = pieces.deep.run(hidden, pos, keep=len(TOKENS), tree=TreeMask.from_parents(PARENTS, pos))["logits"][0]
    for i in range(len(TOKENS)):
        path = branch(i)
        chain = chain_logits(pieces, prompt, [TOKENS[j] for j in path])
        np.testing.assert_allclose(tree[i], chain[-1], rtol=1e-4, atol=1e-4, err_msg=f"node {i}")


# a leading chain of four slots (0-1-2-3), then branches hanging off it, 24 rows in all
CHAIN = 4
WIDE = [-1, 0, 1, 2, 2, 1, 0, 4, 5, 6, 3, 3, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]


def leading_rows_are_ar_bit_for_bit(pieces, hidden_size: int, dtype=np.float32) -> None:
    """Asserts that a tree call's leading chain rows equal one-token calls bit for bit (the other rows against
    their branches as chains: test_tree_call_equals_each_branch_as_a_chain)."""
    rng = np.random.default_rng(7)
    prefix = rng.standard_normal((1, 20, hidden_size)).astype(dtype)
    h = rng.standard_normal((1, len(WIDE), hidden_size)).astype(dtype)
    deep, pos = pieces.deep, prefix.shape[1]
    deep.run(prefix, 0)
    tree = deep.run(h, pos, keep=len(WIDE), tree=TreeMask.from_parents(WIDE, pos))["logits"][0]
    for i in range(CHAIN):  # AR: one call per token, in sequence
        ar = deep.run(h[:, i:i + 1], pos + i)["logits"][0, -1]
        np.testing.assert_array_equal(tree[i], ar, err_msg=f"leading chain row {i}")


@pytest.mark.parametrize("flavour", ["ort", "standard"])
def test_a_tree_calls_leading_chain_rows_are_ar_bit_for_bit(tiny_bundles, flavour):
    session = load(tiny_bundles(flavour))
    leading_rows_are_ar_bit_for_bit(session.pieces, session.bundle.manifest.model.dims.hidden)
