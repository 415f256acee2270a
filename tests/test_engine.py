"""The engine's parts that are not the loop: how calls are grouped (cost.py), how a batched call's time is
charged to its sequences (calls.py), and auto's plain step while sequences share the engine."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from specexport.runtime.backends.common import Pieces
from specexport.runtime.drafters import PLAIN, AutoDrafter, Draft, LookupDrafter
from specexport.runtime.engine.calls import Engine, SequenceClock, SequencePiece
from specexport.runtime.engine.cost import CallCost, partition
from specexport.runtime.stats import Stats


def _groupings(items: list[int]):
    """Every way to split `items` into non-empty groups."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for grouping in _groupings(rest):
        yield [[first], *grouping]
        for i in range(len(grouping)):
            yield [*grouping[:i], [first, *grouping[i]], *grouping[i + 1:]]


def _seconds(groups: list[list[int]], lengths: list[int], cost: CallCost) -> float:
    return sum(cost.call_s(len(g), max(lengths[i] for i in g)) for g in groups)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 16), min_size=1, max_size=6), st.floats(0.0, 5.0), st.floats(0.0, 1.0),
       st.floats(0.0, 1.0))
def test_partition_is_the_cheapest_grouping(lengths, fixed, per_row, per_token):
    """Against every grouping of up to six calls: each call in exactly one group, and no grouping predicted
    cheaper."""
    cost = CallCost(fixed, per_row, per_token)
    groups = partition(lengths, cost)
    assert sorted(itertools.chain(*groups)) == list(range(len(lengths)))
    best = min(_seconds(g, lengths, cost) for g in _groupings(list(range(len(lengths)))))
    assert _seconds(groups, lengths, cost) <= best + 1e-9


def test_partition_follows_what_padding_costs():
    lengths = [1, 1, 1, 11]
    # compute-bound rows (int4 on a small CPU): the long draft is verified alone
    assert sorted(map(sorted, partition(lengths, CallCost(3e-3, 4e-4, 1.6e-3)))) == [[0, 1, 2], [3]]
    # memory-bound calls (fp32): one call, padded
    assert partition(lengths, CallCost(20e-3, 1e-4, 1e-4)) == [[0, 1, 2, 3]]
    assert partition(lengths, None) == [[0, 1, 2, 3]]  # no cost model: one call


class RecordingPiece:
    """A test double for a pooled piece: records each batched call's rows and lengths, sleeps `seconds` per
    call, and answers each row's tokens back as its `hidden` (so a row's results can be checked as its own)."""

    input_names = frozenset({"input_ids"})
    moves_slots = True
    backend, shared_pool, handoff = "test-double", False, "host"

    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls, self.max_context = seconds, [], 1000
        self.results = [("hidden", np.dtype(np.int64), ["batch", "seq"])]

    def run_rows(self, x, rows, starts, keep=1, trees=None, extra=None):
        self.calls.append((list(rows), x.shape[1]))
        time.sleep(self.seconds)
        return {"hidden": x.copy()}


def test_a_batched_call_is_charged_by_tokens_and_waits_are_not():
    """Two sequences' calls meet in one batched call: each gets back its own rows, and each sequence's clock
    advances by its share of the call (by tokens), not by the wall time both waited."""
    piece = RecordingPiece(0.2)
    engine = Engine(Pieces(shallow=piece), rows=4)
    clocks = [SequenceClock(), SequenceClock()]
    views = [SequencePiece(engine, "shallow", row, clock) for row, clock in enumerate(clocks)]
    engine.join()
    engine.join()
    got, spent = [None, None], [0.0, 0.0]

    def run(i: int, tokens: list[int]) -> None:
        t0 = clocks[i]()
        got[i] = views[i].run(np.array([tokens]), 5)["hidden"]
        spent[i] = clocks[i]() - t0
        engine.leave()

    threads = [threading.Thread(target=run, args=(0, [7])), threading.Thread(target=run, args=(1, [8, 9, 10]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert piece.calls == [([0, 1], 3)]  # one call, the short row padded
    assert got[0].tolist() == [[7]] and got[1].tolist() == [[8, 9, 10]]
    assert spent[0] == pytest.approx(0.05, abs=0.03) and spent[1] == pytest.approx(0.15, abs=0.03)


def test_a_verification_call_is_charged_by_what_its_rows_cost():
    """Where the weights' traffic dominates (fp32), rows of a verification call pay alike whatever their drafts;
    where each token is dear (int4 here), a long draft pays for the padding it causes (each padded position
    split among the rows that reach it)."""
    from specexport.runtime.engine.calls import Call

    def shares(cost: CallCost) -> list[float]:
        engine = Engine(Pieces(deep=RecordingPiece(0.0)), 3, cost)
        return engine._shares([Call("deep", i, np.zeros((1, n)), 0, 1, None, None) for i, n in enumerate((1, 1, 6))])

    flat = shares(CallCost(20e-3, 1e-4, 1e-5))
    assert max(flat) - min(flat) < 0.05 and sum(flat) == pytest.approx(1.0)
    steep = shares(CallCost(1e-3, 0.0, 1e-3))
    assert steep[2] > 0.7 and steep[0] == pytest.approx(steep[1]) and sum(steep) == pytest.approx(1.0)
    # the one-token rows pay for one position each, not for the padding the six-token draft causes: of the call's
    # 1 + 3 * 6 ms, each pays a third of the fixed ms and its one token
    assert steep[0] == pytest.approx((1 / 3 + 1) / 19)


def test_a_lone_sequence_runs_its_calls_at_once():
    piece = RecordingPiece(0.0)
    engine = Engine(Pieces(shallow=piece), rows=4)
    view = SequencePiece(engine, "shallow", 2, SequenceClock())
    engine.join()
    assert view.run(np.array([[4, 5]]), 0)["hidden"].tolist() == [[4, 5]]
    assert piece.calls == [([2], 2)]


def test_an_engine_of_one_row_hands_its_sequence_the_pieces_themselves():
    """A Session's engine has nothing to merge: its sequence calls the pieces directly (so PEARL's drafter may run
    beside the target); an engine of several rows hands each sequence views that meet in the rendezvous."""
    pieces = Pieces(shallow=RecordingPiece(0.0), deep=RecordingPiece(0.0))
    one = Engine(pieces).views(0)
    assert set(one.named()) == {"shallow", "deep"} and all(one[name] is pieces[name] for name in pieces.named())
    many = Engine(pieces, rows=2).views(1).named()
    assert set(many) == {"shallow", "deep"}
    assert all(isinstance(v, SequencePiece) and v.row == 1 and v.pooled is pieces[n] for n, v in many.items())


class TreeLike:
    name = "tree"

    def start(self, prompt, hidden) -> None:
        pass

    def propose(self, history, budget, policy, params, rng) -> Draft:
        return Draft([1])

    def advance(self, hidden, pos, final) -> None:
        pass


def test_auto_offers_a_plain_step_beside_a_tree_while_the_engine_is_shared():
    sharing = [1]
    auto = AutoDrafter([TreeLike()], LookupDrafter(100, 256), Stats(), sharing=lambda: sharing[0])
    history = list(range(10))
    picks = set()
    for _ in range(40):  # every choice is tried while it is new
        picks.add(auto.pick(history)[0])
        auto.record(auto.pick(history), 1, 0.01)
        auto.step += 1
    assert PLAIN not in picks  # alone, the tree decides plain steps itself
    alone = auto.pick(history)[1]
    sharing[0] = 4
    shared = set()
    for _ in range(3):
        choice = auto.pick(history)
        assert choice[1] != alone  # estimates are kept per load: what led alone is measured again under it
        shared.add(choice[0])
        auto.record(choice, 1, 0.01)
    assert PLAIN in shared
    before = auto.step
    auto.advance(None, 0, 1)
    assert auto.step - before == pytest.approx(0.25)  # four sequences share the memory: a round is one step


class Copier:
    """A drafter that, as prompt lookup, offers ten tokens whatever the budget."""

    name = "copy"

    def start(self, prompt, hidden) -> None:
        pass

    def propose(self, history, budget, policy, params, rng) -> Draft:
        return Draft(list(range(10))) if budget else Draft([])

    def advance(self, hidden, pos, final) -> None:
        pass


class Grower:
    """A drafter that, as a token tree's, offers a tree of five tokens whatever the budget."""

    name = "tree"
    parents = (-1, 0, 1, 0, 3, 1)  # of [history[-1], *tokens]: two branches from the root

    def start(self, prompt, hidden) -> None:
        pass

    def propose(self, history, budget, policy, params, rng) -> Draft:
        return Draft([7, 8, 9, 10, 11], parents=list(self.parents))

    def advance(self, hidden, pos, final) -> None:
        pass


def test_a_probe_of_a_tree_is_one_token_and_a_tree_that_pays_is_whole():
    """Sharing, a tree's probe verifies one token (its first branch's first), not the whole tree that pads every
    sharer's call; a tree that pays for its rows is verified whole; alone, the tree is the drafter's."""
    from specexport.runtime.batching.drafts import SharedDrafts
    from specexport.runtime.sampling import SamplingParams

    rows = [4]
    drafts = SharedDrafts(Grower(), CallCost(20e-3, 0.0, 5e-4), lambda: rows[0], lambda: 0.0, prior=0.3)
    greedy = SamplingParams()
    steps = [drafts.propose([1, 2], 3, None, greedy, None) for _ in range(33)]
    assert [d.tokens for d in steps[:32]] == [[]] * 32  # plain steps while drafts do not pay
    assert steps[32].tokens == [7] and steps[32].parents is None and drafts.drafted == 1  # the probe
    drafts.alpha = 0.999
    whole = drafts.propose([1, 2], 3, None, greedy, None)
    assert whole.tokens == [7, 8, 9, 10, 11] and whole.parents == list(Grower.parents)
    rows[0] = 1
    assert drafts.propose([1, 2], 3, None, greedy, None).parents == list(Grower.parents)


def test_shared_draft_counts_follow_the_load_and_the_acceptance():
    """Alone, a request drafts as its drafter says; sharing calls where a padded position costs four tokens, it
    drafts nothing while its drafts are seldom accepted (probing one now and then), and more as they are
    accepted; where each verified token is as dear as at int4 on a small CPU, not even then."""
    from specexport.runtime.batching.drafts import SharedDrafts
    from specexport.runtime.sampling import SamplingParams

    rows = [1]
    drafts = SharedDrafts(Copier(), CallCost(20e-3, 0.0, 5e-4), lambda: rows[0], lambda: 0.0, prior=0.3)
    greedy = SamplingParams()
    assert len(drafts.propose([1, 2], 3, None, greedy, None).tokens) == 10  # alone: untouched
    rows[0] = 4
    counts = []
    for _ in range(1000):  # every probe rejected
        counts.append(len(drafts.propose([1, 2], 3, None, greedy, None).tokens))
        drafts.advance(None, 0, 1)
    probes = [i for i, n in enumerate(counts) if n]
    assert set(counts) == {0, 1} and probes[0] == 32  # plain steps, then a probe of one token: after 8 x 4 sharing
    # each probe doubles the wait before the next, up to 64 x 4, where a probe every step would cost the sharers
    assert np.diff(probes).tolist() == [65, 129, 257, 257, 257]
    counts = []
    for _ in range(2000):  # every probe accepted: alpha climbs, and so does the count
        counts.append(len(drafts.propose([1, 2], 3, None, greedy, None).tokens))
        drafts.advance(None, 0, drafts.drafted + 1)
    assert counts[-1] == 3 and max(counts) == 3  # up to the budget, cut from ten
    assert drafts.probe_every == 8  # drafts that pay reset the interval
    drafts.cost = CallCost(3e-3, 4e-4, 1.6e-3)  # int4's: padding three rows for a draft costs more than it earns,
    drafts.alpha = 0.6  # and so does a call of its own, unless nearly every draft is accepted
    assert drafts.best(3, 4) == 0
    drafts.alpha = 0.999
    assert drafts.best(3, 4) == 3
    drafts.cost = CallCost(3e-3, 1e-4, 1.14e-3)  # measured at int4 on the 2-core CPU: at four rows drafts pay only
    drafts.alpha, drafts.idle = 0.5, 0  # above 90% acceptance,
    assert drafts.best(3, 4, 0.9) == 0 and drafts.best(3, 4, 0.999) == 3
    assert not any(drafts.propose([1, 2], 3, None, greedy, None).tokens for _ in range(1000))  # so none is probed
    rows[0] = 2  # at two rows drafts accepted nine times in ten would pay: probed again at once
    assert drafts.best(3, 2, 0.9) > 0 and len(drafts.propose([1, 2], 3, None, greedy, None).tokens) == 1
