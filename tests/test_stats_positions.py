"""Stats by draft position: what /metrics reports as acceptance per position (a token tree counts by depth)."""

from __future__ import annotations

import pytest
from specexport.runtime.stats import Stats
from specexport.runtime.tree import tree_depth


def test_a_chain_counts_each_position_it_drafted_and_kept():
    stats = Stats()
    stats.record_step(3, 1, 0.01, 0.02)  # drafted positions 1-3, kept 1
    stats.record_step(0, 0, 0.0, 0.02)  # drafted nothing
    stats.record_step(4, 4, 0.01, 0.02)
    assert stats.drafted_at == [2, 2, 2, 1] and stats.accepted_at == [2, 1, 1, 1]
    assert (stats.drafted, stats.accepted, stats.steps) == (7, 5, 3)
    assert stats.step_s == pytest.approx([0.03, 0.02, 0.03]) and "step_s" not in stats.as_dict()


def test_a_tree_counts_by_its_depth_not_its_nodes():
    # root 0; 1 and 2 its children; 3 under 1; 4 under 3: five nodes, four drafts, three levels deep
    parents = [-1, 0, 0, 1, 3]
    assert tree_depth(parents) == 3 and tree_depth([-1]) == 0
    stats = Stats()
    stats.record_step(4, 2, 0.01, 0.02, depth=tree_depth(parents))
    assert stats.drafted_at == [1, 1, 1] and stats.accepted_at == [1, 1, 0]
