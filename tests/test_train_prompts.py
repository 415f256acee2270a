"""The shipped self-distillation prompts (recipes/data/train_prompts.jsonl, no model) and the response shards
(tiny random Llama)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from specexport.exporter.training import distill_data

REPO = Path(__file__).resolve().parents[1]
SPECBENCH = Path(__file__).resolve().parents[2] / "shared" / "specbench" / "question.jsonl"
SHIPPED = REPO / "recipes" / "data" / "train_prompts.jsonl"
CATEGORIES = {"writing", "roleplay", "reasoning", "math", "math_word", "coding", "extraction", "stem", "humanities",
              "translation", "summarization", "qa", "rag"}
WINDOW = 12


@pytest.fixture(scope="module")
def prompts() -> list[dict]:
    return distill_data.read_prompts(SHIPPED)


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _windows(text: str, n: int = WINDOW) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_size_ids_and_category_balance(prompts):
    assert len(prompts) >= 4000
    assert all(set(p) == {"id", "category", "prompt"} for p in prompts)
    assert len({p["id"] for p in prompts}) == len(prompts)
    counts = Counter(p["category"] for p in prompts)
    assert set(counts) == CATEGORIES
    assert max(counts.values()) - min(counts.values()) <= 1
    assert all(p["prompt"].strip() == p["prompt"] and len(p["prompt"]) > 10 for p in prompts)
    # The recipes train on a prefix (`--prompt-limit`, [adapter.train]): every prefix must mix the categories.
    first = Counter(p["category"] for p in prompts[:260])
    assert set(first) == CATEGORIES and min(first.values()) >= 10, first
    assert SHIPPED.stat().st_size < 3_000_000


def test_no_duplicate_prompts(prompts):
    texts = [p["prompt"] for p in prompts]
    assert len(set(texts)) == len(texts)
    # Case and spacing differences alone do not make a new prompt.
    normalized = [" ".join(t.lower().split()) for t in texts]
    assert len(set(normalized)) == len(normalized)


def test_templates_are_filled(prompts):
    # A leftover "{slot}" means a template was formatted with the wrong keys.
    leftovers = [p["prompt"] for p in prompts if re.search(r"\{[a-z_]+\}", p["prompt"])]
    assert not leftovers, leftovers[:3]


def test_no_overlap_with_specbench(prompts):
    # Spec-Bench evaluates and never trains: no 12-word run of a question may appear in a training prompt.
    if not SPECBENCH.is_file():
        pytest.skip(f"{SPECBENCH} not present")
    bench: set[tuple[str, ...]] = set()
    for line in SPECBENCH.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        turns = record.get("turns") or [v for v in record.values() if isinstance(v, str)]
        for turn in turns:
            bench |= _windows(str(turn))
    assert bench, "no Spec-Bench turns were read"
    leaks = [(p["id"], " ".join(w)) for p in prompts for w in _windows(p["prompt"]) if w in bench]
    assert not leaks, f"{len(leaks)} shared {WINDOW}-word windows, e.g. {leaks[:3]}"


# --------------------------------------------------------------------------------------------------
# distill_data on a tiny random Llama (the session fixture from conftest.py)
# --------------------------------------------------------------------------------------------------

TINY_PROMPTS = [
    {"id": f"t{i}", "prompt": text}
    for i, text in enumerate(
        [
            "write a haiku about the sea",
            "what is seventeen times twenty three",
            "explain how a hash table works",
            "the quick brown fox",
            "speculative decoding drafts tokens and verifies them, explain",
        ]
    )
]


def test_cut_after_eos_keeps_first_eos():
    assert distill_data.cut_after_eos([5, 6, 2, 2, 2], {2}) == [5, 6, 2]
    assert distill_data.cut_after_eos([5, 6, 7], {2}) == [5, 6, 7]
    assert distill_data.cut_after_eos([2, 9], {2, 9}) == [2]


def test_shards_write_load_and_resume(tiny_checkpoint, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "distill"
    kw = dict(max_new_tokens=6, batch_size=2, shard_size=2, threads=1)
    distill_data.generate_responses(tiny_checkpoint, TINY_PROMPTS, out, **kw)
    shards = sorted(out.glob("shard_*.npz"))
    assert [p.name for p in shards] == ["shard_00000.npz", "shard_00001.npz", "shard_00002.npz"]
    assert not list(out.glob("*.tmp"))

    with np.load(shards[0]) as data:
        assert data["tokens"].dtype == np.int32 and data["offsets"].dtype == np.int64
        assert data["prompt_lens"].dtype == np.int32 and list(data["ids"]) == ["t0", "t1"]
        assert data["offsets"][0] == 0 and data["offsets"][-1] == len(data["tokens"])

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    seqs = distill_data.load_sequences(out)
    assert len(seqs) == len(TINY_PROMPTS)
    for (ids, plen), item in zip(seqs, TINY_PROMPTS, strict=True):
        text = tok.apply_chat_template(
            [{"role": "user", "content": item["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        expected = tok(text, add_special_tokens=False)["input_ids"]
        assert ids.dtype == np.int64 and plen == len(expected)
        assert ids[:plen].tolist() == expected  # left padding was stripped
        response = ids[plen:].tolist()
        assert 0 < len(response) <= 6
        assert tok.eos_token_id not in response[:-1]

    # Left padding must not change greedy outputs: one prompt at a time gives the same tokens.
    single = tmp_path / "single"
    distill_data.generate_responses(tiny_checkpoint, TINY_PROMPTS, single, **{**kw, "batch_size": 1})
    assert all(
        np.array_equal(a, b) and pa == pb
        for (a, pa), (b, pb) in zip(seqs, distill_data.load_sequences(single), strict=True)
    )

    # Resume: only the missing shard is generated again, with the same content.
    before = {p.name: p.stat().st_mtime_ns for p in shards}
    shards[1].unlink()
    distill_data.generate_responses(tiny_checkpoint, TINY_PROMPTS, out, **kw)
    assert shards[0].stat().st_mtime_ns == before["shard_00000.npz"]
    assert all(
        np.array_equal(a, b) for (a, _), (b, _) in zip(seqs, distill_data.load_sequences(out), strict=True)
    )

    with pytest.raises(ValueError, match="different settings"):
        distill_data.generate_responses(tiny_checkpoint, TINY_PROMPTS, out, **{**kw, "max_new_tokens": 7})
