"""`specexport distill` and corpus_sequences on the tiny random Llama: the goal is reached with self-written
(Magpie) requests once the prompts run out, generation is batched, the cache is reused and resumed, and bad
arguments get one sentence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from specexport.exporter.model_source import resolve
from specexport.exporter.training.corpus import CorpusSettings, build_corpus, corpus_dirs, corpus_sequences
from specexport.exporter.training.distill_data import load_prompt_ids
from specexport.runtime.options import OptionError

from .test_cli import assert_one_sentence_error

PROMPTS = ["hash table", "the quick brown fox", "write a haiku", "explain speculative decoding"]
GOAL = 200  # four prompts' 8-token responses are 32 tokens at most: the rest must come from Magpie


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The module's cache, so the tests below share one corpus; restored afterwards."""
    root = tmp_path_factory.mktemp("corpus-cache")
    old = os.environ.get("SPECEXPORT_CACHE")
    os.environ["SPECEXPORT_CACHE"] = str(root)
    yield root
    if old is None:
        os.environ.pop("SPECEXPORT_CACHE")
    else:
        os.environ["SPECEXPORT_CACHE"] = old


@pytest.fixture(scope="module")
def setup(cache, tiny_checkpoint, tmp_path_factory):
    prompts = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    settings = CorpusSettings(max_new_tokens=8, prompts=str(prompts), round_size=16, max_query_tokens=24, seed=3)
    sha = resolve(tiny_checkpoint).origin_sha256
    first = build_corpus(tiny_checkpoint, sha, GOAL, settings, batch_size=16, threads=1, progress=False)
    return tiny_checkpoint, sha, settings, first


def run(setup, goal=GOAL, **kw):
    checkpoint, sha, settings, _ = setup
    return build_corpus(checkpoint, sha, goal, settings, batch_size=16, threads=1, progress=False, **kw)


def test_goal_reached_with_self_written_requests_in_batches(setup):
    checkpoint, sha, settings, first = setup
    assert first.response_tokens >= GOAL and first.new_tokens == first.response_tokens
    shipped, magpie = corpus_dirs(sha, settings)
    assert (first.shipped_dir, first.magpie_dir) == (shipped, magpie)
    assert load_prompt_ids(shipped) == [f"p{i}" for i in range(len(PROMPTS))]
    assert len(list(magpie.glob("shard_*.npz"))) >= 2 and first.shards[0].parent == shipped
    # batched: calls of up to 16 rows, the responses to a round's 16 requests in one call
    assert first.max_rows == 16
    seqs = corpus_sequences(checkpoint, sha, GOAL, settings, batch_size=16, threads=1, progress=False)
    assert len(seqs) == first.sequences and all(s.dtype == np.int64 for s, _ in seqs)
    assert sum(len(s) - p for s, p in seqs) == first.response_tokens
    # the shipped prompts' responses first, in prompt order; then requests the target wrote, each once
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    texts = [tok.decode(s[:p]) for s, p in seqs]
    for prompt, text in zip(PROMPTS, texts, strict=False):
        assert f"user\n{prompt}<|im_end|>" in text
    requests = [t.split("<|im_start|>user\n", 1)[1] for t in texts[len(PROMPTS):]]
    assert len(set(requests)) == len(requests) and not set(requests) & set(PROMPTS)
    for path in magpie.glob("requests_*.npz"):  # none empty or too short
        assert np.diff(np.load(path)["offsets"]).min() >= settings.min_query_tokens


def test_a_second_call_generates_nothing(setup):
    *_, first = setup
    stamps = {p: p.stat().st_mtime_ns for p in first.magpie_dir.iterdir()}
    again = run(setup)
    assert again.generate_calls == 0 and again.new_tokens == 0
    assert (again.sequences, again.response_tokens, again.shards) == (first.sequences, first.response_tokens,
                                                                      first.shards)
    assert {p: p.stat().st_mtime_ns for p in first.magpie_dir.iterdir()} == stamps


def test_resumes_and_extends_identically(setup):
    *_, first = setup
    last = first.shards[-1]
    requests = last.with_name(last.name.replace("shard_", "requests_"))
    before = {p.name: p.read_bytes() for p in (last, requests)}
    data = lambda p: {k: v for k, v in np.load(p).items()}  # noqa: E731
    old_shard = data(last)
    # interrupted after the round's requests were written: only the responses are made again
    last.unlink()
    resumed = run(setup)
    assert resumed.shards == first.shards and 0 < resumed.generate_calls <= 1
    assert all(np.array_equal(v, data(last)[k]) for k, v in old_shard.items())
    # interrupted before: the same requests are sampled again from the seed
    last.unlink()
    requests.unlink()
    resumed = run(setup)
    assert resumed.generate_calls > 1 and requests.read_bytes() == before[requests.name]
    assert all(np.array_equal(v, data(last)[k]) for k, v in old_shard.items())
    # a larger goal goes on from there and keeps what was made
    more = run(setup, goal=GOAL * 2)
    assert more.response_tokens >= GOAL * 2 and more.shards[:len(first.shards)] == first.shards


def test_bad_arguments_are_refused(setup):
    with pytest.raises(OptionError, match="token goal must be a positive"):
        run(setup, goal=0)
    with pytest.raises(OptionError, match="batch size must be positive"):
        build_corpus(setup[0], setup[1], 10, setup[2], batch_size=0)


def distill(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "SPECEXPORT_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "specexport.cli.main", "distill", *args], capture_output=True,
                          text=True, env=env, timeout=600)


def distill_here(*args: str, cache: Path) -> subprocess.CompletedProcess:
    """`distill` through the command's own error handling in this process: each process of its own spends
    seconds importing PyTorch before it reads its arguments, and what these calls check is the answer."""
    from click.testing import CliRunner
    from specexport.cli.main import main

    result = CliRunner().invoke(main, ["distill", *args], env={"SPECEXPORT_CACHE": str(cache)})
    return subprocess.CompletedProcess(["distill", *args], result.exit_code, result.stdout, result.stderr)


def test_the_command(tiny_checkpoint, tmp_path):
    model = ("--model", str(tiny_checkpoint))
    # the shipped prompts' first shard (256 prompts) holds more than 40 response tokens: no Magpie round
    out = distill(*model, "--tokens", "40", "--max-new-tokens", "4", "--batch-size", "64", "--threads", "1",
                  cache=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "256 sequences" in out.stdout and "tok/s, up to 64 sequences at once" in out.stdout, out.stdout
    assert "response tokens" in out.stderr  # the progress bar
    # the process's contract (exit code, progress bar on stderr) is checked above; the rest in this process
    again = distill_here(*model, "--tokens", "40", "--max-new-tokens", "4", "--batch-size", "64", cache=tmp_path)
    assert again.returncode == 0 and "nothing new generated" in again.stdout, again.stdout
    for args, code, fragment in ((("--tokens", "0"), 2, "--tokens must be a positive"),
                                 (("--tokens", "10", "--batch-size", "0"), 2, "--batch-size must be positive"),
                                 (("--tokens", "10", "--threads", "-1"), 2, "--threads must be 0")):
        assert_one_sentence_error(distill_here(*model, *args, cache=tmp_path), fragment, code=code)
    bad_device = distill_here(*model, "--tokens", "10", "--device", "tpu", cache=tmp_path)
    assert bad_device.returncode == 2 and "Traceback" not in bad_device.stderr
    if not torch.cuda.is_available():
        assert_one_sentence_error(distill_here(*model, "--tokens", "10", "--device", "cuda", cache=tmp_path),
                                  "--device cuda asked for a GPU")


def test_a_stopped_run_keeps_its_finished_responses(setup, tmp_path, monkeypatch):
    """Stopped mid-call (the time budget; Ctrl-C takes the same path), a run leaves the responses it finished
    in the shard's partial file, and the next run answers only the rest."""
    from specexport.exporter.training import corpus

    checkpoint, sha, shared, _ = setup
    settings = CorpusSettings(**{**shared.__dict__, "round_size": 32})  # two batches of 16 a round
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path))
    steps = {"n": 0}
    real_count = corpus._Generator._count

    def count(self, made, bar):  # called once a decode step
        real_count(self, made, bar)
        steps["n"] += 1

    monkeypatch.setattr(corpus._Generator, "_count", count)
    # the shipped prompts take a step and 7 more; the round's first 16 answers 8 more; then the budget ends
    monkeypatch.setattr(corpus._Generator, "out_of_time", lambda self: steps["n"] >= 20)
    stopped = build_corpus(checkpoint, sha, GOAL, settings, batch_size=16, threads=1, progress=False, minutes=5)
    _, magpie = corpus_dirs(sha, settings)
    shard = magpie / "shard_00000.npz"
    assert stopped.stopped and not shard.exists()
    partial = corpus._read_partial(shard)
    assert 0 < len(partial) < settings.round_size
    monkeypatch.setattr(corpus._Generator, "out_of_time", lambda self: False)
    resumed = build_corpus(checkpoint, sha, GOAL, settings, batch_size=16, threads=1, progress=False)
    assert resumed.response_tokens >= GOAL and not corpus._partial_path(shard).exists()
    with np.load(shard) as data:
        tokens, offsets, plens = data["tokens"], data["offsets"], data["prompt_lens"]
    for row, resp in partial.items():  # the kept answers are in the shard as they were
        assert resp == tokens[offsets[row] + plens[row]:offsets[row + 1]].tolist()
    # and were not made again: this run made the Magpie shards' tokens less the kept ones
    made = sum(corpus._response_tokens(p) for p in magpie.glob("shard_*.npz"))
    assert resumed.new_tokens == made - sum(map(len, partial.values()))


def test_the_corpus_packs_and_unpacks_into_an_empty_cache(setup, tmp_path, monkeypatch):
    from specexport.exporter.training.corpus import pack_corpus, read_shards, unpack_corpus
    from specexport.runtime.errors import SpecExportError

    checkpoint, sha, settings, first = setup
    summary = pack_corpus(tmp_path / "corpus.npz", sha, settings)
    assert summary["response_tokens"] >= first.response_tokens and len(summary["sha256"]) == 64
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "empty-cache"))
    restored = build_corpus(checkpoint, sha, GOAL, settings, batch_size=16, threads=1, progress=False,
                            packed=(tmp_path / "corpus.npz", summary["sha256"]))
    assert restored.new_tokens == 0 and restored.generate_calls == 0  # nothing generated again
    assert [(s.tolist(), p) for s, p in read_shards(restored.shards)] == \
        [(s.tolist(), p) for s, p in read_shards(first.shards)]
    with pytest.raises(SpecExportError, match="does not match the sha256"):
        unpack_corpus(tmp_path / "corpus.npz", sha, settings, "0" * 64)
    with pytest.raises(SpecExportError, match="made for another target"):
        unpack_corpus(tmp_path / "corpus.npz", "f" * 64, settings)
