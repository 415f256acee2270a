"""The feature-level draft head: training-time test trains what the runtime runs, the piece passes parity and
drafts losslessly at every precision (greedy token for token, sampling by the PIT test), and a bundle
without a head, or one of the older schema, is refused in one sentence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from specexport.doctor.tiny import make_noisy_drafter
from specexport.exporter.build import build_bundle
from specexport.exporter.hf_weights import embedding
from specexport.exporter.model_source import resolve
from specexport.exporter.training.adapter_source import distilled_sequences
from specexport.exporter.training.fit_head import HeadTrainConfig, load_head, train_head, unrolled_states
from specexport.runtime import load
from specexport.runtime.decode import ids_array
from specexport.runtime.errors import SpecExportError
from specexport.runtime.sampling import SamplingParams
from transformers import AutoModelForCausalLM

from .batch_calls import PINNED_COST
from .test_sampling_lossless import assert_lossless, sample_runs

EXIT = 1  # the tiny model has 4 layers: the head reads layers 1, 2 and 3
DATA = {"prompt_limit": 48, "max_new_tokens": 48, "batch_size": 16, "device": "cpu"}
TRAIN = HeadTrainConfig(exit_layer=EXIT, steps=40, tokens_per_batch=1024, lr=3e-3, warmup=5, eval_every=20,
                        holdout=0.15, draft_vocab=64)


@pytest.fixture(scope="module")
def trained(tiny_checkpoint, tmp_path_factory):
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
    sha = resolve(tiny_checkpoint).origin_sha256
    sequences = distilled_sequences(tiny_checkpoint, sha, DATA)
    out = tmp_path_factory.mktemp("head")
    meta = train_head(model, sequences, TRAIN, out, sha, device="cpu")
    return model, sequences, out, meta


@pytest.fixture(scope="module")
def bundles(trained, tiny_checkpoint, tmp_path_factory):
    """precision -> a tiny bundle with the trained head (fp32: drafting at fp32 too, and a noisy drafter)."""
    root = tmp_path_factory.mktemp("head-bundles")
    make_noisy_drafter(tiny_checkpoint, root / "drafter")
    built = {}
    for precision in ("fp32", "int8", "int4"):
        # the drafter only orders tokens for the PIT test's second statistic, at fp32
        build_bundle(root / precision, model=str(tiny_checkpoint), exit_layer=EXIT, context=256, adapter="untrained",
                     drafter=str(root / "drafter") if precision == "fp32" else "none", head=str(trained[2]),
                     precision=precision, drafting_precision="bundle" if precision == "fp32" else None)
        built[precision] = root / precision
    return built


def test_training_reports_agreement_per_draft_position(trained):
    _, _, _, meta = trained
    held, before = meta["heldout"], meta["heldout_before"]
    assert len(held["agreement_by_position"]) == TRAIN.unroll == len(held["chain_by_position"])
    assert held["loss"] < before["loss"]
    # a chain's position k + 1 needs positions 1 .. k right: it can only lose agreement down the chain
    assert all(a >= b for a, b in zip(held["chain_by_position"], held["chain_by_position"][1:], strict=False))
    assert held["chain_tokens_per_step"] == pytest.approx(1 + sum(held["chain_by_position"]))
    assert [h["step"] for h in meta["history"]] == [0, 20, 40]
    assert meta["tokens_seen"] > 0 and meta["history"][-1]["train_tokens"] == meta["tokens_seen"]


def test_training_time_test_trains_what_the_runtime_runs(trained, bundles):
    """Pass k of the unrolled training forward at slot t equals the bundle's head run as the runtime runs it:
    slots 0 .. t - k from the target's states, then k draft steps on its own states."""
    model, sequences, out, _ = trained
    head, _ = load_head(out, model)
    session = load(bundles["fp32"], threads=1)
    seq = [int(t) for t in sequences[0][0][:24]]
    with torch.no_grad():
        states = model(torch.tensor([seq]), output_hidden_states=True).hidden_states
        feats = torch.cat([states[i] for i in head.cfg.features], -1)
        embeds = torch.from_numpy(embedding(model))[torch.tensor([seq[1:]])]
        passes = unrolled_states(head, feats[:, :-1], embeds, TRAIN.unroll)
    vocab = session.pieces.head_vocab
    lm = model.lm_head.weight[torch.from_numpy(vocab)]
    piece = session.pieces.head
    for k in range(1, TRAIN.unroll):
        t = len(seq) - 3
        want = (head.output_norm(passes[k][0, t]) @ lm.T).detach().numpy()
        got = piece.run(ids_array(seq[1:t - k + 2]), 0, extra={"features": feats[:, :t - k + 1].numpy()})
        for j in range(1, k + 1):
            own = np.concatenate([np.zeros((1, 1, 2 * feats.shape[-1] // 3), np.float32), got["state"][:, -1:]], -1)
            got = piece.run(ids_array([seq[t - k + j + 1]]), t - k + j, extra={"features": own})
        np.testing.assert_allclose(got["logits"][0, -1], want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_head_and_auto_are_ar_token_for_token(bundles, precision):
    session = load(bundles[precision], threads=1)
    manifest = json.loads((bundles[precision] / "manifest.json").read_text())
    assert manifest["pieces"]["head"]["features"] == [1, 2, 3]
    assert any(o["name"] == "features" for o in manifest["pieces"]["deep"]["outputs"])
    drafted = 0
    for prompt in ("hash table", "the quick brown fox", "bread keeps fresh"):
        ar = session.generate(prompt, max_new_tokens=48, mode="ar").tokens
        for mode in ("head", "auto"):
            out = session.generate(prompt, max_new_tokens=48, mode=mode)
            assert out.tokens == ar, (precision, mode, prompt)
            drafted += out.stats.drafted
        policy = session.generate(prompt, max_new_tokens=48, mode="head", policy="fixed", gamma=4)
        assert policy.tokens == ar
        for tree in ("8:4:3:0", "4:3:2:10:0.05:0.2"):  # EAGLE-2's dynamic tree from the head, with lookup's branch
            out = session.generate(prompt, max_new_tokens=48, mode="head", tree=tree)
            assert out.tokens == ar, (precision, tree, prompt)
            assert out.stats.mode == f"head-tree{tree}"
            drafted += out.stats.drafted
    assert drafted > 0
    auto = session.generate("hash table", max_new_tokens=48, mode="auto").stats.extra["auto_steps"]
    if precision == "fp32":  # the recipe's [speculative.auto_drafters] narrows auto to the drafter's tree there
        assert manifest["speculative"]["auto_drafters"]["fp32"] == "tree" and set(auto) == {"tree", "lookup"}
    else:  # no drafter piece in these bundles: greedy auto grows the head's tree
        assert "head-tree" in auto


def test_head_runs_batched_as_alone(bundles):
    """The draft head's chains and trees in the batched engine, three requests side by side: its features ride
    in each row's calls, and every request is AR's."""
    from specexport.runtime.batching import BatchScheduler

    session = load(bundles["int8"], threads=1)
    prompts = ("hash table", "the quick brown fox", "bread keeps fresh")
    ids = [session.prompt_ids(p, session.options()) for p in prompts]
    ar = [session.generate_ids(i, max_new_tokens=40, mode="ar").tokens for i in ids]
    with BatchScheduler(session, max_batch=3, cost=PINNED_COST) as scheduler:
        for overrides in ({"mode": "head"}, {"mode": "head", "tree": "4:3:2:10:0.05:0.2"}):
            with scheduler._wake:  # admitted together, so that their calls meet
                requests = [scheduler.submit(i, max_new_tokens=40, **overrides) for i in ids]
            assert [r.result() for r in requests] == ar, overrides
            assert sum(r.stats.drafted for r in requests) > 0
        assert scheduler.counts.max_rows == 3


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_head_drafts_for_pearl_as_ar(bundles, precision):
    """PEARL's drafter thread runs the head through the drafters' one-token protocol: greedy output is AR's, and
    the head's drafts, from the target's states where the verifier has handed them over and from its own past
    them, are accepted as well as rejected."""
    session = load(bundles[precision], threads=1)
    drafted = accepted = 0
    for prompt in ("hash table", "the quick brown fox", "bread keeps fresh"):
        ar = session.generate(prompt, max_new_tokens=48, mode="ar").tokens
        for policy in ("fixed:3", "confidence:0.3"):
            out = session.generate(prompt, max_new_tokens=48, mode="head", schedule="pearl", policy=policy)
            assert out.tokens == ar, (precision, policy, prompt)
            assert out.stats.mode == "head, pearl" and out.stats.extra["schedule"] == "pearl"
            drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert 0 < accepted < drafted


def test_head_under_pearl_is_race_free(bundles):
    """Random delays in `deep` and the head shift when the verifier hands the target's states over and when a
    rollback lands mid-step: 12 runs, every one AR's tokens."""
    import random
    from dataclasses import replace

    from specexport.runtime.head import HeadDrafter
    from specexport.runtime.policies import make_policy

    from .test_schedules import DelayingPiece, pearl_tokens

    session = load(bundles["fp32"], threads=1)
    ids = session.prompt_ids("the quick brown fox", session.options())
    ar = session.generate_ids(ids, max_new_tokens=32, mode="ar").tokens
    for run in range(12):
        delays = random.Random(run)
        pieces = session.pieces
        # the delays wrap the head tap, whose features the wrapper answers for
        pieces = replace(pieces, head=DelayingPiece(pieces.head, delays), deep=DelayingPiece(pieces.deep, delays))
        out = pearl_tokens(pieces, ids, make_policy(f"fixed:{1 + run % 4}", 4, 0.5), SamplingParams(), run, 32,
                           HeadDrafter(pieces))
        assert out == ar[:32], run


def test_head_reads_again_the_slot_a_rollback_overtook(bundles):
    """The one race PEARL leaves the head: between the verifier's handing over the states of positions it
    verified and its rollback, the drafter may step from the rejected draft with the target's states. Played
    out in order here: after the rollback the head's draft is the one a head that never saw the rejected
    draft makes."""
    from specexport.runtime.decode import prefill
    from specexport.runtime.head import HeadDrafter
    from specexport.runtime.stats import Stats

    session = load(bundles["fp32"], threads=1)
    pieces = session.pieces
    prompt = session.prompt_ids("the quick brown fox", session.options())
    greedy = SamplingParams()

    def verify(tokens: list[int], pos: int) -> np.ndarray:
        hidden = pieces.shallow.run(ids_array(tokens), pos)["hidden"]
        return pieces.deep.run(hidden, pos, keep=len(tokens))["logits"][0]

    hidden, logits = prefill(pieces, prompt, Stats())
    history = [*prompt, int(np.argmax(logits[0, -1]))]
    pos = len(history) - 1
    racing = HeadDrafter(pieces)
    racing.start(prompt, hidden)
    first = racing.step(history[-1], pos, greedy, None).token
    target = verify([history[-1], first], pos)  # the target's tokens after history[-1] and after `first`
    instead = int(np.argmax(target[0]))
    rejected = first if first != instead else (instead + 1) % session.pieces.vocab_size
    racing.verified(pos, 1)  # position pos is final: its state is handed over
    racing.step(rejected, pos + 1, greedy, None)  # the step the rollback overtakes: it read slot pos with `rejected`
    racing.rollback([*history, instead])
    after = racing.step(instead, pos + 1, greedy, None)

    fresh = HeadDrafter(pieces)  # the same steps where the verifier's verdict came first
    hidden, _ = prefill(pieces, prompt, Stats())
    fresh.start(prompt, hidden)
    fresh.step(history[-1], pos, greedy, None)
    verify([history[-1], instead], pos)  # row pos is the same: it does not see the token after it
    fresh.verified(pos, 1)
    alone = fresh.step(instead, pos + 1, greedy, None)
    assert after.token == alone.token and np.array_equal(after.signal.logits, alone.signal.logits)


def test_head_sampling_under_pearl_follows_the_target(bundles):
    """PIT over 300 fixed-seed generations of the head on PEARL's drafter thread (draws keyed by position)."""
    session = load(bundles["fp32"], threads=1)
    pvalues, total, _ = sample_runs(session, SamplingParams(0.8), ("model",), mode="head", schedule="pearl",
                                    policy="fixed:3")
    assert_lossless(pvalues, total)


# ONNX Runtime's shared pool is the process's for good, so the refusal is shown in a process of its own
SHARED_POOL_PEARL = """
import sys
from specexport.runtime import load
from specexport.runtime.backends.ort import use_shared_thread_pool
from specexport.runtime.errors import SpecExportError
from specexport.runtime.head import FeatureTap
use_shared_thread_pool(1)
session = load(sys.argv[1], threads=1)
assert isinstance(session.context.pieces.deep, FeatureTap), type(session.context.pieces.deep)
try:
    session.generate("hash table", max_new_tokens=8, mode="self", schedule="pearl")
except SpecExportError as exc:
    print(exc)
"""


def test_pearl_refuses_the_shared_pool_through_the_head_tap(bundles):
    """With a head `deep` is wrapped to keep its features; the wrapper answers for the ONNX Runtime piece it
    holds, so PEARL still refuses to run its two threads on the one shared pool."""
    run = subprocess.run([sys.executable, "-c", SHARED_POOL_PEARL, str(bundles["fp32"])], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "one shared thread pool" in run.stdout, run.stdout


def test_head_sampling_follows_the_target(bundles):
    """PIT over 300 fixed-seed generations: the head's drafts, accepted and rejected, leave the target's
    distribution (the drafter's distribution only orders tokens for the second statistic)."""
    session = load(bundles["fp32"], threads=1)
    pvalues, total, _ = sample_runs(session, SamplingParams(0.8), ("model",), mode="head")
    assert_lossless(pvalues, total)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_head_reads_shallow_s_table(bundles, precision):
    """The head's embedding rows are shallow's, bit for bit (the tied table as deep's LM head holds it: fp32 in its
    [hidden, vocab] layout, int8 in the row-invariant matmul's tiles), so the bundle stores them once, in
    shallow's data file."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo

    head = onnx.load(str(bundles[precision] / "head.onnx"), load_external_data=False)
    where = {t.name: ExternalDataInfo(t).location for t in head.graph.initializer
             if t.data_location == onnx.TensorProto.EXTERNAL}
    embedding = [n for n in where if n.startswith("tied_rows")]
    assert embedding and all(where[n] == "shallow.onnx.data" for n in embedding), where


def test_head_piece_passes_parity_at_its_precision(bundles):
    manifest = json.loads((bundles["int8"] / "manifest.json").read_text())
    head = manifest["pieces"]["head"]
    assert head["parity"]["top1_agreement"]["logits"] >= head["parity"]["min_top1_agreement"]
    assert head["draft_vocab"]["size"] == 64 and head["training"]["heldout"]["agreement_by_position"]


def test_a_bundle_without_a_head_refuses_mode_head(tiny_bundles):
    session = load(tiny_bundles(), threads=1)
    with pytest.raises(SpecExportError, match=r"has no head piece, so mode head is not available; rebuild"):
        session.generate("hash table", max_new_tokens=4, mode="head")


def test_manifest_refuses_a_head_that_does_not_fit(bundles, tmp_path):
    import shutil

    from specexport.runtime.manifest import Manifest, ManifestError

    data = json.loads((bundles["fp32"] / "manifest.json").read_text())
    wrong = json.loads(json.dumps(data))
    wrong["pieces"]["head"]["features"] = [2, 2, 3]
    with pytest.raises(ManifestError, match=r"pieces.head.features is \[2, 2, 3\], not three ascending"):
        Manifest.from_dict(wrong)
    wrong = json.loads(json.dumps(data))
    wrong["pieces"]["head"]["features"] = [0, 2, 3]
    with pytest.raises(ManifestError, match=r"pieces\.head\.features"):
        Manifest.from_dict(wrong)
    wrong = json.loads(json.dumps(data))
    wrong["pieces"]["deep"]["outputs"] = [o for o in wrong["pieces"]["deep"]["outputs"] if o["name"] != "features"]
    with pytest.raises(ManifestError, match=r"pieces\.deep\.outputs has no 'features'"):
        Manifest.from_dict(wrong)
    old = shutil.copytree(bundles["fp32"], tmp_path / "old")
    (old / "manifest.json").write_text(json.dumps({**data, "schema_version": 2}))
    with pytest.raises(SpecExportError, match="has schema_version 2 but this specexport reads schema 3; rebuild it"):
        load(old)


def test_build_refuses_a_head_for_another_target(trained, tmp_path):
    from specexport.doctor.tiny import make_tiny_checkpoint

    other = make_tiny_checkpoint(tmp_path / "other", seed=5)
    with pytest.raises(SpecExportError, match="trained for another target model"):
        build_bundle(tmp_path / "b", model=str(other), exit_layer=EXIT, context=64, adapter="none",
                     head=str(trained[2]))
    assert not (tmp_path / "b").exists()


def test_train_head_cli_refuses_bad_arguments(tmp_path):
    from click.testing import CliRunner
    from specexport.cli.main import main

    for args, said in ((["--tokens", "0"], "--tokens must be a positive number"),
                       (["--tokens", "100", "--unroll", "0"], "--unroll must be at least 1"),
                       (["--device", "tpu"], "Invalid value for '--device'")):
        result = CliRunner().invoke(main, ["train-head", "--out", str(tmp_path / "h"), *args])
        assert result.exit_code != 0 and said in result.output, result.output
        assert not (tmp_path / "h").exists()


def test_inspect_shows_the_head(bundles):
    from specexport.runtime.inspect_bundle import inspect_bundle

    report = inspect_bundle(Path(bundles["int8"]))
    assert "head" in report["pieces"]


def test_tensorrt_plan_checks_and_profiles_the_head(trained, tiny_checkpoint, tmp_path):
    """A TensorRT bundle (fp16 standard flavour, plan only) passes the operator check with its head, plans the
    head's engine with profiles for its features input, and drafts losslessly on ONNX Runtime's CPU."""
    manifest = build_bundle(tmp_path / "trt", model=str(tiny_checkpoint), exit_layer=EXIT, context=128,
                            adapter="none", head=str(trained[2]), backend="tensorrt", target="orin-nano",
                            plan_only=True).to_dict()
    trt = manifest["tensorrt"]
    assert trt["opcheck"]["ok"] and trt["opcheck"]["nodes"]["head"] > 0
    profiles = {p["name"]: p["shapes"]["features"] for p in trt["plan"]["head"]["profiles"]}
    assert profiles["decode"]["max"] == [1, 1, 3 * 64] and profiles["prefill"]["max"] == [1, 128, 3 * 64]
    assert (tmp_path / "trt" / trt["plan"]["head"]["script"]).is_file()
    session = load(tmp_path / "trt", threads=1)
    ar = session.generate("hash table", max_new_tokens=32, mode="ar").tokens
    assert session.generate("hash table", max_new_tokens=32, mode="head").tokens == ar
