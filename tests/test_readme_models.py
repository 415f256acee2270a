"""The README says what each real model is: Gemma 3 270M's checkpoint is the base (pretrained) one, without a
chat template, which repeats a chat prompt; wherever the README names it, it says so, and no figure of it stands
in a speed claim. The README stays short enough to read."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_README_LINES = 250
GEMMA = re.compile(r"Gemma 3 270M|gemma3-270m", re.IGNORECASE)
BASE = re.compile(r"\bbase\b|pretrained|not instruction-tuned", re.IGNORECASE)
FIGURE = re.compile(r"\d+(?:\.\d+)?\s*×|\d+(?:\.\d+)?\s*tokens/s|τ\s*\d")


def units(text: str) -> list[str]:
    """What a reader takes in at once: each line of a code block, each table row, each list item or paragraph
    with its wrapped lines."""
    out: list[str] = []
    fence = False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fence = not fence
            continue
        if fence or line.startswith("|") or line.startswith("#") or not line.strip():
            out.append(line)
        elif line.startswith("  ") and out and out[-1].strip() and not out[-1].startswith(("|", "#")):
            out[-1] += " " + line.strip()  # a wrapped list item
        elif re.match(r"[-*] |\d+\. ", line) or not out or not out[-1].strip() or out[-1].startswith(("|", "#")):
            out.append(line)
        else:
            out[-1] += " " + line.strip()  # a wrapped paragraph
    return out


def test_units_join_wrapped_lines():
    text = "- one\n  two\n- three\n\npara\ngraph\n\n```\nx\ny\n```\n| a |\n"
    assert units(text) == ["- one two", "- three", "", "para graph", "", "x", "y", "| a |"]


def test_the_readme_is_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= MAX_README_LINES


def test_wherever_the_readme_names_gemma_3_270m_it_says_it_is_the_base_model():
    named = [u for u in units(README.read_text(encoding="utf-8")) if GEMMA.search(u)]
    assert len(named) >= 3, "the README no longer names Gemma 3 270M: this check would be empty"
    silent = [u[:100] for u in named if not BASE.search(u)]
    assert not silent, f"these name Gemma 3 270M without saying it is the base checkpoint: {silent}"


def test_no_speed_figure_of_the_base_model():
    claims = [u[:100] for u in units(README.read_text(encoding="utf-8")) if GEMMA.search(u) and FIGURE.search(u)]
    assert not claims, f"a figure of the base model stands in a speed claim: {claims}"
