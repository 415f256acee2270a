"""Token trees in one call: every node's logits equal the chain of its own branch, in both graph flavours,
and `keep_slots` turns the accepted branch into the plain sequence later calls see."""

from __future__ import annotations

import numpy as np
import pytest
from specexport.runtime import load
from specexport.runtime.backend import TreeMask
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


@pytest.mark.parametrize("flavour", ["ort", "standard"])
def test_kept_branch_reads_as_the_sequence(tiny_bundles, flavour):
    pieces = load(tiny_bundles(flavour)).pieces
    prompt = [1, 5, 9, 14, 3, 8]
    pos = len(prompt)
    path = branch(5)  # slots 0, 1, 3, 5
    want = chain_logits(pieces, prompt, [*(TOKENS[j] for j in path), 99])[-1]
    pieces.deep.run(pieces.shallow.run(ids_array(prompt), 0)["hidden"], 0)
    hidden = pieces.shallow.run(ids_array(TOKENS), pos, tree=TreeMask.from_parents(PARENTS, pos))["hidden"]
    pieces.deep.run(hidden, pos, keep=1, tree=TreeMask.from_parents(PARENTS, pos))
    for piece in (pieces.shallow, pieces.deep):
        piece.keep_slots(pos, [pos + j for j in path])
    # the next call writes after the branch and must see exactly it
    got = pieces.deep.run(pieces.shallow.run(ids_array([99]), pos + len(path))["hidden"], pos + len(path))
    np.testing.assert_allclose(got["logits"][0, -1], want, rtol=1e-4, atol=1e-4)
