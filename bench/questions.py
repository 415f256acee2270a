"""The questions `specexport bench` asks: the project's own prompt set by default, or Spec-Bench's
question.jsonl (the same jsonl shape); find the file, read first turns, cut long prompts."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..runtime.errors import SpecExportError

REPO = Path(__file__).resolve().parents[1]
# chat prompts written for the bench, in Spec-Bench's shape and categories, none of them Spec-Bench's or a
# training prompt's; it ships with the package (recipes/data), so a fresh clone or a wheel has questions
DEFAULT_QUESTIONS = REPO / "recipes" / "data" / "bench_prompts.jsonl"
SPEC_BENCH = "the Spec-Bench repository's data/spec_bench/question.jsonl (github.com/hemingkx/Spec-Bench)"
DEFAULT_MAX_PROMPT_TOKENS = 1500


@dataclass
class Question:
    question_id: int | str
    category: str
    text: str  # the first user turn


def resolve_questions(path: str | os.PathLike | None = None) -> Path:
    """The questions file: as given, else relative to the current directory, else to the repository;
    without one, the shipped prompt set."""
    given = Path(path or DEFAULT_QUESTIONS)
    candidates = [given] if given.is_absolute() else [Path.cwd() / given, REPO / given]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    tried = " or ".join(str(c) for c in candidates)
    raise SpecExportError(f"no questions file at {tried}; pass --questions FILE, a jsonl of Spec-Bench's shape"
                          f" such as {SPEC_BENCH}, or leave it out for the shipped prompt set")


def load_questions(path: str | os.PathLike, categories: Sequence[str] | None = None,
                   limit: int | None = None) -> list[Question]:
    """First turns in the file's order; `limit` keeps the first N questions of each category."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
                rows.append(Question(q["question_id"], q["category"], q["turns"][0]))
            except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
                raise SpecExportError(f"{path}:{n} is not a Spec-Bench question ({type(exc).__name__}: {exc})"
                                      ) from None
    known = list(dict.fromkeys(q.category for q in rows))
    if categories:
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise SpecExportError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)};"
                                  f" {path} has {', '.join(known)}")
        wanted = set(categories)
        rows = [q for q in rows if q.category in wanted]
    if limit is not None:
        if limit < 1:
            raise SpecExportError("--limit must be at least 1")
        seen: dict[str, int] = {}
        kept = []
        for q in rows:
            seen[q.category] = seen.get(q.category, 0) + 1
            if seen[q.category] <= limit:
                kept.append(q)
        rows = kept
    if not rows:
        raise SpecExportError(f"no questions selected from {path}")
    return rows


def cut_text(text: str, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
             max_tokens: int) -> tuple[str, bool]:
    """Keep the last `max_tokens` tokens of `text`; returns (text, whether it was cut).

    Spec-Bench's summarization and RAG questions run to several thousand tokens; its own harness keeps
    their end (where the instruction is), and so do we, before the chat template wraps the text."""
    ids = encode(text)
    if max_tokens <= 0 or len(ids) <= max_tokens:
        return text, False
    return decode(ids[-max_tokens:]), True
