"""The independent drafter piece: external same-tokenizer checkpoints and trained Spec-Drafters export,
match PyTorch across cache use and pass parity; anything unusable is refused before a bundle exists."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from specexport.cli.main import main
from specexport.exporter.build import build_bundle
from specexport.exporter.model_source import resolve
from specexport.exporter.tokenizer_match import load_tokenizer, tokenizer_difference
from specexport.exporter.training.fit_drafter import DrafterTrainConfig, train_drafter
from specexport.runtime.backends.ort import OrtPiece
from specexport.runtime.bundle import read_manifest
from specexport.runtime.errors import SpecExportError
from transformers import AutoModelForCausalLM

from .conftest import make_tiny_checkpoint

SMOKE = DrafterTrainConfig(layers=1, hidden=32, head_dim=16, steps=30, tokens_per_batch=1024, lr=3e-3, warmup=5,
                           eval_every=10, holdout=0.15, draft_vocab=64, threads=1)


@pytest.fixture(scope="module")
def drafter_checkpoint(tiny_checkpoint, tmp_path_factory):
    """A second tiny Llama: fewer layers, other weights, the target's tokenizer."""
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("drafter"), layers=2, seed=1)
    if (path / "tokenizer.json").read_bytes() != (tiny_checkpoint / "tokenizer.json").read_bytes():
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(tiny_checkpoint / name, path / name)
    return path


def _copy_with_tokenizer(src, dst, edit):
    """A copy of the drafter checkpoint whose tokenizer `edit` changed (edit(tokenizer) -> tokenizer)."""
    shutil.copytree(src, dst)
    for f in dst.glob("tokenizer*"):
        f.unlink()
    edit(load_tokenizer(src)).save_pretrained(dst)
    return dst


@pytest.mark.parametrize("flavour", ["ort", "standard"])
def test_external_drafter_exports_and_matches_torch_across_the_cache(tiny_checkpoint, drafter_checkpoint, tmp_path,
                                                                    flavour):
    out = tmp_path / "b"
    # the drafter's graph at fp32, held to fp32's tolerance (the default recipe would draft at int8)
    manifest = build_bundle(out, model=str(tiny_checkpoint), context=128, flavour=flavour, adapter="none",
                            drafter=str(drafter_checkpoint), drafting_precision="bundle").to_dict()
    spec = manifest["pieces"]["drafter"]
    assert set(manifest["pieces"]) == {"shallow", "deep", "drafter"}
    assert spec["parity"]["max_relative_error"]["logits"] <= spec["parity"]["tolerance"] == 1e-3
    assert spec["dims"]["layers"] == 2 and spec["kv"]["count"] == 2 and spec["draft_vocab"] is None
    assert spec["source"]["kind"] == "checkpoint"
    assert spec["source"]["sha256"] == resolve(drafter_checkpoint).origin_sha256
    assert {t["name"] for t in spec["outputs"]} >= {"logits", "top_token", "top_prob", "present_key.1"}
    assert "drafter.onnx" in manifest["files"]

    ids = np.random.default_rng(3).integers(0, 300, size=13)
    model = AutoModelForCausalLM.from_pretrained(drafter_checkpoint, dtype=torch.float32).eval()
    with torch.inference_mode():
        want = model(torch.from_numpy(ids)[None]).logits[0].numpy()
    manifest = read_manifest(out)  # the pieces' operators (the default build's row-invariant ones) come from it
    piece = OrtPiece("drafter", out / spec["file"], manifest.pieces["drafter"], 128, ["CPUExecutionProvider"], 1,
                     manifest.graph.attention, manifest.graph.matmul)
    first = piece.run(ids[None, :10], 0, keep=10)
    second = piece.run(ids[None, 10:], 10, keep=3)  # against the cache of the first call
    got = np.concatenate([first["logits"][0], second["logits"][0]])
    np.testing.assert_allclose(got, want, atol=1e-3 * np.abs(want).max())
    tops = np.concatenate([first["top_token"][0], second["top_token"][0]])
    assert np.array_equal(tops, want.argmax(-1))
    probs = np.exp(want - want.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.concatenate([first["top_prob"][0], second["top_prob"][0]]), probs.max(-1),
                               atol=1e-4)


def test_tokenizer_differences_are_named(tiny_checkpoint, drafter_checkpoint, tmp_path):
    target = load_tokenizer(tiny_checkpoint)
    assert tokenizer_difference(load_tokenizer(drafter_checkpoint), target) is None

    def extra_special(tok):
        tok.add_special_tokens({"additional_special_tokens": ["<tool>"]})
        return tok

    def other_eos(tok):
        tok.eos_token = "<|im_start|>"
        return tok

    bigger = _copy_with_tokenizer(drafter_checkpoint, tmp_path / "bigger", extra_special)
    assert tokenizer_difference(load_tokenizer(bigger), target) == \
        "the drafter's tokenizer has 301 tokens, the target's 300"
    eos = _copy_with_tokenizer(drafter_checkpoint, tmp_path / "eos", other_eos)
    assert tokenizer_difference(load_tokenizer(eos), target) == \
        "the drafter's eos token is '<|im_start|>', the target's '<|im_end|>'"

    merges = shutil.copytree(drafter_checkpoint, tmp_path / "merges")
    data = json.loads((merges / "tokenizer.json").read_text())
    m = data["model"]["merges"]
    m[0], m[1] = m[1], m[0]
    (merges / "tokenizer.json").write_text(json.dumps(data))
    assert "their BPE merges differ" in tokenizer_difference(load_tokenizer(merges), target)

    swapped = shutil.copytree(drafter_checkpoint, tmp_path / "swapped")
    data = json.loads((swapped / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(data))
    assert tokenizer_difference(load_tokenizer(swapped), target).startswith("2 token→id entries differ, e.g.")


def _cli_build(tiny_checkpoint, out, *extra):
    return CliRunner().invoke(main, ["build", "--model", str(tiny_checkpoint), "--out", str(out), "--context", "64",
                                     "--adapter", "none", *extra])


def _assert_refused(result, out, *fragments):
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and all(f in errors[0] for f in fragments), result.output
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.partial-*"))


def test_cli_refuses_unusable_drafters_before_writing(tiny_checkpoint, drafter_checkpoint, tmp_path):
    def smaller_vocab(tok):
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        from .conftest import CORPUS

        raw = Tokenizer(models.BPE(unk_token="<unk>"))
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=280, special_tokens=["<unk>"],
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")

    other = _copy_with_tokenizer(drafter_checkpoint, tmp_path / "other-tok", smaller_vocab)
    out = tmp_path / "out"
    _assert_refused(_cli_build(tiny_checkpoint, out, "--drafter", str(other)), out,
                    "does not use the target's tokenizer", "the drafter's tokenizer has 280 tokens, the target's 300")
    _assert_refused(_cli_build(tiny_checkpoint, out, "--drafter", str(tmp_path / "missing")), out,
                    "does not exist", "--drafter none")
    (tmp_path / "empty").mkdir()
    _assert_refused(_cli_build(tiny_checkpoint, out, "--drafter", str(tmp_path / "empty")), out,
                    "neither a directory written by `specexport train-drafter`")
    gpt2 = shutil.copytree(drafter_checkpoint, tmp_path / "gpt2")
    config = json.loads((gpt2 / "config.json").read_text())
    (gpt2 / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    _assert_refused(_cli_build(tiny_checkpoint, out, "--drafter", str(gpt2)), out, "'gpt2' model")


@pytest.fixture(scope="module")
def distilled_dir(tiny_checkpoint, tmp_path_factory):
    """The tiny target's own responses to 32 training prompts, as shards."""
    from specexport.exporter.recipe import recipes_dir
    from specexport.exporter.training.distill_data import generate_responses, read_prompts

    prompts = read_prompts(recipes_dir() / "data" / "train_prompts.jsonl")[:32]
    return generate_responses(tiny_checkpoint, prompts, tmp_path_factory.mktemp("distill"), max_new_tokens=32,
                              batch_size=16, threads=1)


@pytest.fixture(scope="module")
def distilled(distilled_dir):
    from specexport.exporter.training.distill_data import load_sequences

    return load_sequences(distilled_dir)


@pytest.fixture(scope="module")
def trained(tiny_checkpoint, distilled, tmp_path_factory):
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
    out = tmp_path_factory.mktemp("spec-drafter")
    meta = train_drafter(model, distilled, SMOKE, out, resolve(tiny_checkpoint).origin_sha256, command="test")
    return model, out, meta


def test_training_records_heldout_agreement_and_is_deterministic(trained, tiny_checkpoint, distilled, tmp_path):
    model, out, meta = trained
    assert meta["heldout"]["loss"] < meta["heldout_before"]["loss"]
    assert 0 <= meta["heldout"]["agreement"] <= 1 and meta["heldout"]["tokens"] > 0 and meta["train_tokens"] > 0
    assert meta["exit_free"] and meta["draft_vocab"]["size"] == 64 and meta["target_sha256"] == \
        resolve(tiny_checkpoint).origin_sha256
    assert (out / "drafter.safetensors").is_file() and (out / "drafter_vocab.npy").is_file()
    assert json.loads((out / "drafter.json").read_text())["heldout"] == meta["heldout"]
    again = train_drafter(model, distilled, SMOKE, tmp_path, resolve(tiny_checkpoint).origin_sha256)
    assert again["history"] == meta["history"]


def test_materialised_drafter_is_the_trained_one(trained):
    """Folding the projections into a plain Llama (what is exported) changes no logit."""
    from specexport.exporter.training.fit_drafter import load_drafter

    model, out, _ = trained
    drafter, vocab, _ = load_drafter(out, model)
    embed, head = model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach()
    ids = torch.tensor([[3, 141, 59, 26, 53, 58, 97, 93]])
    with torch.inference_mode():
        trained_logits = drafter.hidden(embed, ids) @ drafter.head(head[torch.from_numpy(vocab)]).T
        plain = drafter.to_llama(embed, head)(ids).logits[..., torch.from_numpy(vocab)]
    torch.testing.assert_close(plain, trained_logits, rtol=1e-4, atol=1e-4)


def test_trained_drafter_builds_with_parity_and_refuses_other_targets(trained, tiny_checkpoint, drafter_checkpoint,
                                                                      tmp_path):
    _, out, meta = trained
    manifest = build_bundle(tmp_path / "b", model=str(tiny_checkpoint), context=128, adapter="none",
                            drafter=str(out), drafting_precision="bundle").to_dict()
    spec = manifest["pieces"]["drafter"]
    assert spec["parity"]["max_relative_error"]["logits"] <= 1e-3
    assert spec["dims"]["hidden"] == 32 and spec["dims"]["layers"] == 1
    assert spec["draft_vocab"] == {**spec["draft_vocab"], "file": "drafter_vocab.npy", "size": 64}
    assert next(t for t in spec["outputs"] if t["name"] == "logits")["shape"][-1] == 64
    assert spec["training"]["heldout"] == meta["heldout"] and spec["source"]["kind"] == "spec-drafter"
    vocab = np.load(tmp_path / "b" / "drafter_vocab.npy")
    assert np.array_equal(vocab, np.load(out / "drafter_vocab.npy")) and np.all(np.diff(vocab) > 0)
    manifest = read_manifest(tmp_path / "b")
    piece = OrtPiece("drafter", tmp_path / "b" / spec["file"], manifest.pieces["drafter"], 128,
                     ["CPUExecutionProvider"], 1, manifest.graph.attention, manifest.graph.matmul)
    assert set(piece.run(np.array([[5, 17, 42]]), 0)["top_token"].ravel()) <= set(vocab.tolist())
    _reads_the_targets_rows(tmp_path / "b")

    with pytest.raises(SpecExportError, match="trained for another target model"):
        build_bundle(tmp_path / "c", model=str(drafter_checkpoint), context=64, adapter="none", drafter=str(out))
    assert not (tmp_path / "c").exists()


def _reads_the_targets_rows(bundle: Path) -> None:
    """The drafter projects the tied target's rows (P_in in the graph) from the file that stores them for all."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo

    graph = onnx.load(str(bundle / "drafter.onnx"), load_external_data=False).graph
    names = {t.name: ExternalDataInfo(t).location for t in graph.initializer}
    assert "embed_tokens" not in names
    # the rows (float) or their codes (quantized); small scales may be kept inline
    assert [names[n] for n in names if n in ("tied_rows", "tied_rows_q4", "tied_rows_q8")] == ["shallow.onnx.data"]


def test_a_trained_drafter_at_int4_reads_the_lm_head_rows_and_drafts_as_ar(trained, tiny_checkpoint, tmp_path):
    from specexport.runtime import load

    _, out, _ = trained
    manifest = build_bundle(tmp_path / "b", model=str(tiny_checkpoint), context=128, adapter="none",
                            drafter=str(out), precision="int4").to_dict()
    parity = manifest["pieces"]["drafter"]["parity"]
    assert parity["dequantized_max_relative_error"]["logits"] <= parity["dequantized_tolerance"]
    if manifest["graph"]["matmul"] == "rowwise":  # MatMulNBits' layout keeps a table of the drafter's own
        _reads_the_targets_rows(tmp_path / "b")
    session = load(tmp_path / "b", threads=1)
    ar = session.generate("hash table", max_new_tokens=24, mode="ar").tokens
    drafted = session.generate("hash table", max_new_tokens=24, mode="model")
    assert drafted.tokens == ar and drafted.stats.drafted > 0


def test_auto_takes_the_recipe_drafter_only_for_its_target(trained, tiny_checkpoint, drafter_checkpoint, tmp_path):
    _, out, _ = trained
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'name = "tiny"\n[drafter]\npath = "{out}"\n')
    mine = build_bundle(tmp_path / "a", recipe=str(recipe), model=str(tiny_checkpoint), context=64,
                        adapter="none").to_dict()
    assert "drafter" in mine["pieces"]
    other = build_bundle(tmp_path / "b", recipe=str(recipe), model=str(drafter_checkpoint), context=64,
                         adapter="none", exit_layer=1).to_dict()
    assert set(other["pieces"]) == {"shallow", "deep"}
    none = build_bundle(tmp_path / "c", recipe=str(recipe), model=str(tiny_checkpoint), context=64, adapter="none",
                        drafter="none").to_dict()
    assert "drafter" not in none["pieces"]


def test_train_drafter_cli(tiny_checkpoint, tmp_path):
    out = tmp_path / "d"
    result = CliRunner().invoke(main, ["train-drafter", "--model", str(tiny_checkpoint), "--out", str(out),
                                       "--layers", "1", "--hidden", "64", "--steps", "3", "--prompt-limit", "16",
                                       "--draft-vocab", "0", "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert "held-out top-1 agreement" in result.output
    meta = json.loads((out / "drafter.json").read_text())
    assert meta["config"]["steps"] == 3 and meta["draft_vocab"] is None and meta["command"].startswith("specexport")


TRAINERS = [("train-drafter", "drafter.json", ["--layers", "1", "--hidden", "64"]),
            ("train-adapter", "adapter.json", [])]


@pytest.mark.parametrize("command, meta_file, shape", TRAINERS)
def test_extra_data_trains_but_never_holds_out(tiny_checkpoint, distilled_dir, tmp_path, command, meta_file, shape):
    """--extra-data (drafter and adapter alike) adds training sequences; a response to a held-out prompt is
    left out of them, so the held-out set is the base data's and stays unseen."""
    args = [command, "--model", str(tiny_checkpoint), *shape, "--steps", "2", "--prompt-limit", "16",
            "--draft-vocab", "0"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "d"), "--extra-data", str(distilled_dir)])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "d" / meta_file).read_text())
    # 16 base prompts, 1 held out; the 32 extra responses repeat those 16 prompts, so exactly 1 is left out
    assert meta["heldout_sequences"] == 1 and meta["train_sequences"] == 15 + 31
    assert "plus 31 responses" in meta["data"] and "(1 to held-out prompts left out)" in meta["data"]

    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "e"), "--extra-data", str(tmp_path / "nope")])
    assert result.exit_code != 0 and "holds no distillation shards" in result.output
    assert not (tmp_path / "e" / meta_file).exists()
