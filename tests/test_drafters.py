"""The other drafters on tiny random bundles: an independent drafter piece (model), prompt lookup, the
drafter + self-draft hierarchy and the automatic choice are lossless (greedy: token-identical to AR;
sampling: the same distribution), SpecDec's relaxed rule is lossy only when asked, and the CLI refuses
what a bundle cannot do in one sentence."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats as sps
from specexport.cli.main import main
from specexport.runtime import load
from specexport.runtime.backends.common import TreeMask
from specexport.runtime.drafters import PLAIN, LookupDrafter
from specexport.runtime.policies import FixedPolicy
from specexport.runtime.sampling import SamplingParams
from specexport.runtime.tree import TreeShape
from specexport.runtime.verification import rank, specdec_verify

from .conftest import make_noisy_drafter
from .test_speculative_sampling import ALPHA

# the tiny model's greedy text falls into runs of one token after some of these, so lookup has matches
PROMPTS = ["hash table", "write a haiku about the sea", "the quick brown fox", "explain how",
           "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. the quick"]
SETTINGS = [(3, 0.0), (6, 0.6)]  # (gamma, eta)
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def drafter_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    return make_noisy_drafter(tiny_checkpoint, tmp_path_factory.mktemp("noisy-drafter"))


@pytest.fixture(scope="module")
def drafter_bundle(drafting_bundles):
    """build(flavour) -> a bundle with an (untrained) adapter and the drafter piece (conftest's, built once for
    the session)."""
    return drafting_bundles


@pytest.fixture(scope="module")
def session(drafter_bundle):
    return load(drafter_bundle("ort"), threads=1)


def ar_tokens(session, prompts=PROMPTS) -> dict[str, list[int]]:
    return {p: session.generate(p, max_new_tokens=NEW_TOKENS, mode="ar").tokens for p in prompts}


# -- greedy: token-identical to AR -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["model", "lookup", "hier", "auto"])
def test_greedy_equals_ar(session, mode):
    ar = ar_tokens(session)
    total = Counter()
    for prompt in PROMPTS:
        for gamma, eta in SETTINGS:
            out = session.generate(prompt, max_new_tokens=NEW_TOKENS, mode=mode, gamma=gamma, eta=eta)
            assert out.tokens == ar[prompt], (mode, prompt, gamma, eta)
            s = out.stats
            assert s.mode == mode and not s.lossy and not out.lossy
            total.update(drafted=s.drafted, accepted=s.accepted, **s.extra.get("auto_steps", {}),
                         cut=s.extra.get("screen_cut", 0))
    # each path was really exercised: drafts accepted and rejected
    assert 0 < total["accepted"] < total["drafted"], total
    if mode == "hier":
        assert total["cut"] > 0  # the untrained adapter disputes drafts, so the screen cut some
    if mode == "auto":  # greedy on a bundle whose pieces take trees: auto weighs the tree against lookup alone
        assert total["lookup"] > 0 and total["tree"] > 0 and total["self"] + total["model"] + total["ar"] == 0, total


@pytest.mark.parametrize("tree", ["1", "4:2:2", "8", "24:6:4:0", "4:3:2:10:0.08:0.3"])
def test_tree_greedy_equals_ar(session, tree):
    ar = ar_tokens(session)
    total = Counter()
    for prompt in PROMPTS:
        out = session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="model", tree=tree)
        assert out.tokens == ar[prompt], (tree, prompt)
        assert out.stats.mode == f"model-tree{tree}" and not out.lossy
        total.update(steps=out.stats.steps, drafted=out.stats.drafted, accepted=out.stats.accepted)
    assert 0 < total["accepted"] < total["drafted"], total
    # the prefill drafts nothing; a step drafts the shape's nodes and at most a lookup branch besides, after
    # a trunk of what the last tree's inexact rows chose: at most its deepest branch and the target's token
    shape = TreeShape.parse(tree)
    trunk = max(shape.depth, shape.lookup) + 1
    assert total["drafted"] <= (total["steps"] - len(PROMPTS)) * (shape.nodes + shape.lookup + trunk)


def test_tree_keeps_more_than_a_chain_of_the_same_drafter(session):
    """The runners-up are what a tree adds: with the same drafter it accepts more per step than the chain."""
    def tau(**how) -> float:
        return sum(session.generate(p, max_new_tokens=NEW_TOKENS, mode="model", **how).stats.mean_accepted_tokens
                   for p in PROMPTS)

    chain, tree = tau(gamma=6, eta=0.0), tau(tree="24:6:4:0")
    assert tree > chain, (tree, chain)


def test_tree_on_the_standard_flavour_and_at_the_context_end(drafter_bundle, tiny_checkpoint, drafter_checkpoint,
                                                             tmp_path):
    from specexport.exporter.build import build_bundle

    std = load(drafter_bundle("standard"), threads=1)
    for prompt in PROMPTS[:2]:
        ar = std.generate(prompt, max_new_tokens=NEW_TOKENS, mode="ar").tokens
        assert std.generate(prompt, max_new_tokens=NEW_TOKENS, mode="model", tree="12").tokens == ar
    build_bundle(tmp_path / "b", model=str(tiny_checkpoint), drafter=str(drafter_checkpoint), adapter="none",
                 exit_layer=2, context=48)
    s = load(tmp_path / "b", threads=1)
    ids = s.prompt_ids(PROMPTS[0], s.options())
    ar = s.generate_ids(ids, max_new_tokens=500, mode="ar").tokens
    assert s.generate_ids(ids, max_new_tokens=500, mode="model", tree="16:6:4").tokens == ar


def test_tree_floors_verify_and_extend_only_likely_branches(session):
    """KEEP leaves out the drafter tokens whose branch is unlikely (a step with none left is a plain step) and
    EXPAND the drafter calls that would extend unlikely branches; the output stays the target's own."""
    ar = ar_tokens(session)
    drafter = session.pieces.drafter
    real_run = drafter.run
    calls = Counter()

    def counting_run(x, start, keep=1, tree=None):
        calls["extend" if tree is not None else "catch_up"] += 1
        return real_run(x, start, keep, tree)

    def run(tree: str) -> Counter:
        calls.clear()
        total = Counter()
        for prompt in PROMPTS:
            out = session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="model", tree=tree)
            assert out.tokens == ar[prompt], (tree, prompt)
            total.update(steps=out.stats.steps, drafted=out.stats.drafted)
        return total + calls

    drafter.run = counting_run
    try:  # the tiny random drafter is unsure: a tenth of its candidates reach 1%, a hundredth 10%
        free, kept, gated = run("6:3:2:0"), run("6:3:2:0:0.01"), run("6:3:2:0:0:0.02")
    finally:
        drafter.run = real_run
    assert 0 < kept["drafted"] < free["drafted"] / 2, (kept, free)
    assert kept["steps"] > free["steps"]  # fewer tokens verified, fewer accepted per step
    assert 0 < gated["extend"] < free["extend"], (gated, free)  # the third level is never reached here


def test_tree_shapes_parse():
    assert TreeShape.parse("4:3:2:10:0.08:0.3") == TreeShape(4, 3, 2, 10, keep=0.08, expand=0.3)
    assert TreeShape.parse("8:2:2:0:0.1") == TreeShape(8, 2, 2, 0, keep=0.1)
    assert TreeShape.parse("32") == TreeShape(32)


def test_tree_selection_keeps_branches_whole():
    from specexport.runtime.tree import Node, select, walk

    # root children a (-0.1), b (-0.5); a's child c (-0.3 total), b's child d (-0.6); e under an unkept c would
    # be likelier than d, but only whole branches are kept
    cands = [Node(10, -1, -0.1, 1), Node(11, -1, -0.5, 1), Node(12, 0, -0.3, 2), Node(13, 1, -0.6, 2),
             Node(14, 2, -0.35, 3)]
    tokens, parents = select(cands, 3)
    assert tokens[1:] == [10, 12, 14] and parents == [-1, 0, 1, 2]
    tokens, parents = select(cands, 5)
    assert tokens[1:] == [10, 11, 12, 13, 14] and parents == [-1, 0, 0, 1, 2, 3]
    logits = np.zeros((6, 20))
    logits[0, 10] = logits[1, 12] = logits[3, 19] = 1.0  # root -> a -> c, then the target wants 19
    assert walk(tokens, parents, logits) == ([0, 1, 3], 19)


def test_settle_makes_final_only_what_rows_laid_out_as_a_sequence_decide():
    from specexport.runtime.drafters import Draft
    from specexport.runtime.tree import settle_branch

    # slots: root 0, a 1 (child of root), b 2 (root), c 3 (under b), d 4 (under c); the leading chain of
    # slots is 0-1, so rows 0 and 1 are AR's arithmetic and rows 2-4 are not
    draft = Draft([10, 11, 12, 13], parents=[-1, 0, 0, 2, 3])
    logits = np.zeros((5, 20))
    logits[0, 11] = logits[2, 12] = logits[3, 13] = logits[4, 19] = 1.0  # root -> b -> c -> d, then 19
    assert settle_branch(draft, logits)[0] == [11] and draft.ahead == [12, 13, 19]
    # along the leading chain everything it decides is final, the token after it included
    draft = Draft([10, 11, 12, 13], parents=[-1, 0, 1, 2, 0])  # chain 0-1-2-3, then a sibling of 1
    logits = np.zeros((5, 20))
    logits[0, 10] = logits[1, 11] = logits[2, 12] = logits[3, 7] = 1.0
    assert settle_branch(draft, logits)[0] == [10, 11, 12, 7] and draft.ahead == []
    # the sibling's row decides nothing final beyond its own token
    logits = np.zeros((5, 20))
    logits[0, 13] = logits[4, 5] = 1.0
    assert settle_branch(draft, logits)[0] == [13] and draft.ahead == [5]


def test_lookup_branch_is_grafted_sharing_what_the_tree_has():
    from specexport.runtime.tree import graft

    tokens, parents = [7, 10, 11, 12], [-1, 0, 0, 1]
    graft(tokens, parents, [10, 12, 5, 6])  # follows 10 -> 12, then adds 5 under 12 and 6 under 5
    assert tokens == [7, 10, 11, 12, 5, 6] and parents == [-1, 0, 0, 1, 3, 4]
    graft(tokens, parents, [11, 9])
    assert tokens[-1] == 9 and parents[-1] == 2


def test_auto_offers_a_tree_only_where_it_verifies(session):
    """Sampling and the relaxed rule keep auto to chains; greedy with exact verification adds the tree."""
    def offered(**how) -> set[str]:  # auto counts steps for every choice it has, taken or not
        return set(session.generate("hash table", max_new_tokens=24, mode="auto", **how).stats.extra["auto_steps"])

    assert offered() == {"tree", "lookup"}  # the floored tree makes its own plain steps
    assert offered(temperature=0.8) == {"self", "model", "lookup", "ar"}
    assert offered(verify="specdec") == {"self", "model", "lookup", "ar"}


def test_tree_refusals(session, tiny_bundles):
    from specexport.runtime.errors import SpecExportError

    with pytest.raises(SpecExportError, match="greedy decoding only"):
        session.generate("hash table", max_new_tokens=4, mode="model", tree="8", temperature=0.7)
    with pytest.raises(SpecExportError, match="needs mode model"):
        session.generate("hash table", max_new_tokens=4, mode="self", tree="8")
    deep = session.pieces.deep
    names = deep.input_names
    deep.input_names = names - {"attention_bias"}  # as a bundle built before token trees
    try:
        with pytest.raises(SpecExportError, match="predates token trees"):
            session.generate("hash table", max_new_tokens=4, mode="model", tree="8")
        assert not TreeMask.supported(deep)  # which is also what keeps auto to chains on such a bundle
    finally:
        deep.input_names = names
    for bad in ("0", "8:x", "8:2:2:2:2", "-3", "8:2:0", "8:2:2:-1", "8:2:2:2:0.1:1.0", "8:2:2:2:-0.1",
                "8:2:2:2:0.1:0.2:0.3", "8:2:2.5"):
        with pytest.raises(SpecExportError, match="is not a tree shape"):
            session.generate("hash table", max_new_tokens=4, mode="model", tree=bad)


class PrunedHead:
    """Stand-in for a drafter piece with a vocabulary-pruned head (FR-Spec; `specexport train-drafter
    --draft-vocab`): the real piece's outputs restricted to the ascending ids `vocab`."""

    def __init__(self, piece, vocab: np.ndarray) -> None:
        self.piece, self.vocab, self.name = piece, vocab, "drafter"

    def run(self, x, start, keep=1):
        logits = self.piece.run(x, start, keep)["logits"][..., self.vocab]
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return {"logits": logits, "top_token": self.vocab[logits.argmax(-1)], "top_prob": p.max(-1)}


def test_model_drafter_with_a_pruned_head(drafter_bundle):
    s = load(drafter_bundle("ort"), threads=1)
    ar = ar_tokens(s, PROMPTS[:3])
    vocab = np.unique(np.concatenate([np.arange(0, 300, 3), *map(np.asarray, ar.values())]))
    s.pieces.drafter, s.pieces.drafter_vocab = PrunedHead(s.pieces.drafter, vocab), vocab
    accepted = 0
    for prompt in PROMPTS[:3]:
        out = s.generate(prompt, max_new_tokens=NEW_TOKENS, mode="model", gamma=3, eta=0.0)
        assert out.tokens == ar[prompt]
        accepted += out.stats.accepted
        sampled = s.generate(prompt, max_new_tokens=NEW_TOKENS, mode="model", gamma=3, temperature=0.7, seed=1)
        assert sampled.tokens == s.generate(prompt, max_new_tokens=NEW_TOKENS, mode="model", gamma=3,
                                            temperature=0.7, seed=1).tokens
    assert accepted > 0


def test_lookup_drafts_what_followed_the_latest_match():
    lookup = LookupDrafter(vocab_size=20, max_context=100, max_tokens=3)
    greedy, policy, rng = SamplingParams(), FixedPolicy(1), np.random.default_rng(0)
    history = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 8, 2, 3]
    assert lookup.match(history) == (2, 6)  # "2 3" last ended at index 6 (then 5 6 7), not at index 2
    assert lookup.propose(history, 1, policy, greedy, rng).tokens == [5, 6, 7]  # its own cap, not the budget
    assert lookup.propose([*history, 11], 1, policy, greedy, rng).tokens == []  # no match: no draft
    draft = lookup.propose(history, 1, policy, SamplingParams(temperature=1.0), rng)
    assert [int(np.argmax(q)) for q in draft.qs] == draft.tokens and all(q.sum() == 1 for q in draft.qs)


def test_auto_keys_its_estimates_by_the_copy_in_progress():
    """No match, a 2- or 3-token match and a long copy are separate contexts, and choices are compared within
    the step's context: auto learns that spurious short matches lose without souring on a summary that is
    quoting its source, and a long copy's lookup steps are weighed against the tree's steps in copies, not
    against its average over all text (which any copying step would beat)."""
    from specexport.runtime.drafters import COPY_RUN, NO_MATCH, AutoDrafter
    from specexport.runtime.stats import Stats

    lookup = LookupDrafter(vocab_size=100, max_context=1000)
    source = list(range(10, 30))  # the prompt's passage
    quoting = [*source, 99, *source[:COPY_RUN + 2]]  # the answer has copied COPY_RUN + 2 of it so far
    n, end = lookup.match(quoting)
    assert (n, end) == (3, COPY_RUN + 1) and lookup.agreement(quoting, end, 50) == COPY_RUN + 2
    assert lookup.agreement(quoting, end, 4) == 4  # capped
    short = [*source, 99, source[0], source[1], 98, source[0], source[1]]  # a 2-token match, no copy
    fresh = [1, 2, 3, 4]
    auto = AutoDrafter([], lookup, Stats(mode="auto"))
    assert [auto.context(h) for h in (fresh, short, quoting)] == [NO_MATCH, 2, COPY_RUN]
    for choice, seconds in (((PLAIN, 2), 0.01), (("lookup", 2), 0.015), ((PLAIN, COPY_RUN), 0.01)):
        auto.record(choice, 1, seconds)  # a token per step each, the lookups slower for verifying their drafts
    assert auto.pick(quoting) == ("lookup", COPY_RUN)  # untried in this context: tried first
    auto.record(("lookup", COPY_RUN), 11, 0.015)
    auto.step += 1
    assert auto.pick([*quoting, source[COPY_RUN + 2]]) == ("lookup", COPY_RUN)  # the copy goes on: it leads
    assert auto.pick(short) == (PLAIN, 2)  # lookup lost to a plain step here; the long copy's lead is not its own

    class Named:  # the choice only reads a drafter's name
        name = "tree"

    auto = AutoDrafter([Named()], lookup, Stats(mode="auto"))
    assert PLAIN not in auto.steps  # the tree makes its own plain steps
    auto.record(("tree", NO_MATCH), 2, 0.020)  # 100 tokens/s over ordinary text
    auto.record(("tree", COPY_RUN), 12, 0.020)  # 600 while copying ...
    auto.record(("lookup", COPY_RUN), 10, 0.018)  # ... where lookup alone makes 556: the tree keeps the copy
    assert auto.pick(quoting) == ("tree", COPY_RUN) and auto.pick(fresh) == ("tree", NO_MATCH)


def test_auto_memory_carries_between_generations():
    """A session's next request starts from what auto learned in the last one instead of trying every choice
    again: with the shared memory the first pick is the leader, with a new one it is an untried choice."""
    from specexport.runtime.drafters import AutoDrafter, AutoMemory
    from specexport.runtime.stats import Stats

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

    def drafter(memory):
        return AutoDrafter([Named("self"), Named("model")], LookupDrafter(vocab_size=100, max_context=100),
                           Stats(mode="auto"), memory=memory)

    memory = AutoMemory({})
    first = drafter(memory)
    for step, (choice, tokens) in enumerate([("self", 2), ("model", 4), (PLAIN, 1)]):
        assert first.pick([1, 2, 3])[0] == choice  # untried: each in turn
        first.record((choice, 0), tokens, 0.01)
        first.step = step + 1
    assert drafter(memory).pick([1, 2, 3]) == ("model", 0)
    assert drafter(AutoMemory({})).pick([1, 2, 3]) == ("self", 0)
    assert memory.step == 3  # revisit intervals run on across generations


def test_model_and_hier_on_the_standard_flavour(drafter_bundle):
    """The standard flavour swaps cache buffers instead of writing in place: rollback must still hold."""
    s = load(drafter_bundle("standard"), threads=1)
    ar = ar_tokens(s, PROMPTS[:2])
    for mode in ("model", "hier", "auto"):
        for prompt in PROMPTS[:2]:
            assert s.generate(prompt, max_new_tokens=NEW_TOKENS, mode=mode, gamma=4, eta=0.0).tokens == ar[prompt]


def test_auto_without_adapter_or_drafter_is_lookup_and_plain_steps(tiny_bundles):
    s = load(tiny_bundles("ort", 2, adapter="none"), threads=1)
    ar = ar_tokens(s)
    steps = Counter()
    for prompt in PROMPTS:
        out = s.generate(prompt, max_new_tokens=NEW_TOKENS, mode="auto")
        assert out.tokens == ar[prompt]
        assert set(out.stats.extra["auto_steps"]) == {"lookup", "ar"}
        steps.update(out.stats.extra["auto_steps"])
    assert steps["lookup"] > 0 and steps["ar"] > 0


def test_context_end_is_respected(tiny_checkpoint, drafter_checkpoint, tmp_path):
    from specexport.exporter.build import build_bundle

    build_bundle(tmp_path / "b", model=str(tiny_checkpoint), drafter=str(drafter_checkpoint), adapter="untrained",
                 exit_layer=2, context=48)
    s = load(tmp_path / "b", threads=1)
    ids = s.prompt_ids(PROMPTS[0], s.options())
    ar = s.generate_ids(ids, max_new_tokens=500, mode="ar").tokens
    for mode in ("model", "lookup", "hier", "auto"):
        assert s.generate_ids(ids, max_new_tokens=500, mode=mode, gamma=8, eta=0.0).tokens == ar, mode


# -- sampling: the target's distribution -------------------------------------------------------------
#
# Stated test: chi-square test of homogeneity between the (2nd, 3rd) generated tokens under AR sampling
# and under speculative sampling with each drafter (1,500 fixed-seed draws each), rejecting at
# alpha = 0.001 (tests/test_speculative_sampling.py). The prompt ends in the target's own greedy text,
# which runs into repeats of one token, so lookup has a match (and gets drafts both accepted and
# rejected) at the first speculative step; the noisy-copy drafter is accepted about half the time.

DRAWS = 1500
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def sampling_prompt(session) -> list[int]:
    ids = session.prompt_ids("hash table", session.options())
    return ids + session.generate_ids(ids, max_new_tokens=5, mode="ar").tokens


def pair_counts(session, ids, mode: str, seed0: int, stats: Counter) -> Counter:
    pairs = Counter()
    for seed in range(seed0, seed0 + DRAWS):
        out = session.generate_ids(ids, max_new_tokens=3, mode=mode, temperature=TEMPERATURE, seed=seed, gamma=3,
                                   eta=0.0)
        pairs[tuple(out.tokens[1:3])] += 1  # tokens 2-3 come from speculative steps
        stats.update(drafted=out.stats.drafted, accepted=out.stats.accepted)
    return pairs


@pytest.fixture(scope="module")
def ar_pairs(session, sampling_prompt) -> Counter:
    return pair_counts(session, sampling_prompt, "ar", 0, Counter())


def homogeneity_pvalue(a: Counter, b: Counter) -> float:
    common = [k for k in set(a) | set(b) if a[k] + b[k] >= 20]  # rare pairs pooled into one cell
    table = np.array([[a[k] for k in common] + [DRAWS - sum(a[k] for k in common)],
                      [b[k] for k in common] + [DRAWS - sum(b[k] for k in common)]])
    table = table[:, table.sum(0) > 0]
    assert table.shape[1] >= 5, "the test needs a spread-out distribution"
    return sps.chi2_contingency(table).pvalue


@pytest.mark.parametrize("mode", ["lookup", "model", "hier"])
def test_sampling_matches_ar_in_distribution(session, sampling_prompt, ar_pairs, mode):
    counts = Counter()
    spec = pair_counts(session, sampling_prompt, mode, 100_000, counts)
    assert 0 < counts["accepted"] < counts["drafted"], counts  # both verification branches ran
    assert homogeneity_pvalue(ar_pairs, spec) > ALPHA


# -- SpecDec's relaxed verification ------------------------------------------------------------------


def test_specdec_rule_on_toy_logits():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.4, 0.1], [0.1, 0.1, 0.1, 0.7]]))
    assert rank(logits[1], 0) == 1 and rank(logits[1], 1) == 2  # ties ordered by id, as argmax
    greedy, rng = SamplingParams(), np.random.default_rng(0)
    strict = specdec_verify(1, 100.0)
    assert strict([1], None, logits, greedy, rng) == [0]  # beta 1: only the argmax passes
    assert specdec_verify(2, 1.0)([1, 0], None, logits, greedy, rng) == [1, 0, 3]  # all pass, then the bonus
    assert specdec_verify(2, 0.4)([1], None, logits, greedy, rng) == [0]  # in the top 2 but log(.5/.3) > 0.4
    assert specdec_verify(2, 5.0)([1, 1], None, logits, greedy, rng) == [1, 2]  # 2nd draft ranks 3rd: argmax
    assert specdec_verify(3, 5.0)([1, 1], None, logits, greedy, rng) == [1, 1, 3]


def test_specdec_beta_one_is_greedy_and_a_loose_rule_is_lossy(session):
    ar = ar_tokens(session)
    exact = {p: session.generate(p, max_new_tokens=NEW_TOKENS, mode="model", gamma=4, eta=0.0) for p in PROMPTS}
    differs, more = False, 0
    for prompt in PROMPTS:
        strict = session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="model", gamma=4, eta=0.0,
                                  verify="specdec", beta=1, tau=100.0)
        assert strict.tokens == ar[prompt]  # beta 1 accepts exactly what greedy verification does
        assert strict.stats.accepted == exact[prompt].stats.accepted
        assert strict.lossy and strict.stats.lossy and "LOSSY" in strict.stats.summary()
        loose = session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="model", gamma=4, eta=0.0,
                                 verify="specdec", beta=20, tau=20.0)
        assert loose.lossy and loose.stats.lossy
        more += loose.stats.acceptance_rate > exact[prompt].stats.acceptance_rate
        differs |= loose.tokens != ar[prompt]
    # documented divergence: the relaxed rule keeps drafts the target would not have chosen
    assert differs and more >= len(PROMPTS) - 1


# -- refusals, in one sentence -----------------------------------------------------------------------


def run_cli(*args: str):
    return CliRunner().invoke(main, ["generate", *args, "--max-new-tokens", "4"])


def assert_one_error(result, *fragments: str, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_cli_refusals(tiny_bundles, drafter_bundle):
    # bad options, alone or together, are usage errors: exit 2 and one sentence (runtime/plan.py)
    plain = str(tiny_bundles("ort", 2, adapter="none"))
    assert_one_error(run_cli("--bundle", plain, "--mode", "model", "hi"), "no drafter piece", "--drafter DIR")
    assert_one_error(run_cli("--bundle", plain, "--hierarchy", "drafter,self", "hi"), "no drafter or adapter")
    assert_one_error(run_cli("--bundle", plain, "--verify", "specdec", "--temperature", "0.8", "hi"),
                     "greedy decoding only")
    assert_one_error(run_cli("--bundle", plain, "--verify", "specdec", "--mode", "ar", "hi"), "mode ar")
    assert_one_error(run_cli("--bundle", plain, "--hierarchy", "drafter,self", "--mode", "self", "hi"),
                     "different modes")
    assert_one_error(run_cli("--bundle", plain, "--hierarchy", "self,drafter", "hi"), "drafter,self")
    assert_one_error(run_cli("--bundle", plain, "--tree", "8", "hi"), "no drafter piece")
    assert_one_error(run_cli("--bundle", str(drafter_bundle("ort")), "--tree", "8", "--schedule", "pearl", "hi"),
                     "drop schedule")


def test_cli_modes_and_lossy_json(drafter_bundle):
    import json

    bundle = str(drafter_bundle("ort"))
    ar = json.loads(run_cli("--bundle", bundle, "--mode", "ar", "--json", "hash table").stdout)
    for args in (["--mode", "model"], ["--mode", "lookup"], ["--hierarchy", "drafter,self"], ["--tree", "12"]):
        result = run_cli("--bundle", bundle, *args, "--json", "hash table")
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert out["tokens"] == ar["tokens"] and out["lossy"] is False
    relaxed = json.loads(run_cli("--bundle", bundle, "--mode", "model", "--verify", "specdec", "--json",
                                 "hash table").stdout)
    assert relaxed["lossy"] is True and relaxed["stats"]["lossy"] is True


def _simulate_auto(costs_at, steps: int, max_revisit: int = 128) -> list[str]:
    """Drive AutoDrafter's choice alone: `costs_at(step)` maps each choice to (tokens, seconds) per step."""
    from specexport.runtime.drafters import AutoDrafter
    from specexport.runtime.stats import Stats

    class Named:  # the choice only reads a drafter's name
        def __init__(self, name: str) -> None:
            self.name = name

    auto = AutoDrafter([Named("self"), Named("model")], LookupDrafter(vocab_size=10_000, max_context=10_000),
                       Stats(mode="auto"), max_revisit=max_revisit)
    history, picks = [0, 1], []
    for step in range(steps):
        choice, context = auto.pick(history)  # the history never repeats: lookup is never a candidate
        tokens, seconds = costs_at(step)[choice]
        auto.record((choice, context), tokens, seconds, auto.retry)
        auto.step += 1
        history.append(len(history))
        picks.append(choice)
    return picks


def test_auto_backs_off_from_a_clear_loser():
    """A choice that loses every retry is retried ever less often (its interval doubles up to 128 steps),
    never dropped; with the interval fixed at 16 steps it would be retried every 17."""
    costs = {"model": (3, 0.010), "self": (2, 0.012), "ar": (1, 0.008)}
    backoff = Counter(_simulate_auto(lambda step: costs, 300))
    fixed = Counter(_simulate_auto(lambda step: costs, 300, max_revisit=16))
    assert 3 <= backoff["self"] <= 5 and 3 <= backoff["ar"] <= 5, backoff
    assert fixed["self"] >= 15 and fixed["ar"] >= 15, fixed
    assert backoff["model"] >= 290


def test_auto_follows_a_new_winner_within_the_longest_interval():
    """When the loser becomes the winner, the next retry finds it (at most 128 + 1 steps later), and it
    keeps the lead from then on."""
    before = {"model": (3, 0.010), "self": (2, 0.012), "ar": (1, 0.008)}
    after = {"model": (1, 0.010), "self": (4, 0.012), "ar": (1, 0.008)}
    picks = _simulate_auto(lambda step: before if step < 100 else after, 400)
    switched = next(i for i in range(100, 400) if picks[i] == "self")
    assert switched <= 100 + 129
    assert Counter(picks[switched + 20:])["self"] >= 0.9 * len(picks[switched + 20:])


def test_autos_lookup_alone_takes_the_trees_cap_on_lookups_branch(session):
    from dataclasses import replace

    from specexport.runtime import assemble
    from specexport.runtime.context import parse_auto_trees
    from specexport.runtime.stats import Stats

    ctx = session.context
    plan = session.plan(session.options(mode="auto"))
    saved = ctx.auto_trees
    try:
        for spec, most in [("2:1:2:4", 4), ("2:1:2:0", plan.lookup_tokens), ("2:1:2:99", plan.lookup_tokens)]:
            ctx.auto_trees = parse_auto_trees(replace(session.speculative, auto_tree={"fp32": spec}))
            auto = assemble._auto(ctx, plan, Stats())
            assert "tree" in auto.drafters and auto.lookup.max_tokens == most, spec
        sampled = session.plan(session.options(mode="auto", temperature=0.8))  # chains, no tree: lookup's own cap
        assert assemble._auto(ctx, sampled, Stats()).lookup.max_tokens == sampled.lookup_tokens
    finally:
        ctx.auto_trees = saved


def test_auto_takes_its_tree_from_the_recipe_for_the_bundles_precision(session):
    from dataclasses import replace

    from specexport.runtime.context import parse_auto_trees
    from specexport.runtime.errors import SpecExportError
    from specexport.runtime.tree import AUTO_TREE

    ctx = session.context
    saved = ctx.auto_trees
    try:
        ctx.auto_trees = parse_auto_trees(replace(session.speculative, auto_tree={"int4": "8:4:2"}))
        assert ctx.auto_tree() == AUTO_TREE  # this bundle is fp32: the recipe names no tree for it
        ctx.auto_trees = parse_auto_trees(replace(session.speculative, auto_tree={"fp32": "2:1:2:0"}))
        assert ctx.auto_tree() == TreeShape(2, 1, 2, 0)
        out = session.generate("hash table", max_new_tokens=12, mode="auto")
        assert out.tokens == session.generate("hash table", max_new_tokens=12, mode="ar").tokens
        # a shape that is not one is refused when the bundle loads, naming the field
        with pytest.raises(SpecExportError, match=r"speculative\.auto_tree\.fp32 is not a tree shape"):
            parse_auto_trees(replace(session.speculative, auto_tree={"fp32": "lots"}))
    finally:
        ctx.auto_trees = saved
