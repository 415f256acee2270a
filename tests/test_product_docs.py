"""The product reads as a product: no issue numbers or run tallies in the package's code, docstrings, recipes
and tools (the journal in docs/journal/ keeps the history), and BENCHMARKS.md stays the current results and the
method, short, with the command that produced each table beside it."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# what ships (the package's directories) and what a user runs from the repository
PRODUCT_DIRS = ("runtime", "exporter", "bench", "cli", "doctor", "serve", "recipes", "tools", "samples")
TEXT_SUFFIXES = {".py", ".toml", ".md", ".sh", ".cfg", ".txt"}
# "issue 12", "issues 18 and 20", "PR #3813", "(#31)": a tracker's number. A comment's "# 0: ..." or an HTML
# entity's "&#123;" is not one.
ISSUE = re.compile(r"\b(?:issues?|PR|pull request)\s+#?\d+|(?<![\w&#/])#\d+\b", re.IGNORECASE)
# a measured ratio or speed: "1.23×", "1.05x", "τ 1.8", "45.3 tokens/s"
TALLY = re.compile(r"\b\d+\.\d+\s*[×x](?![\w])|τ\s*[≈=~]?\s*\d+\.\d|\b\d+(?:\.\d+)?\s*tokens/s\b")
MAX_BENCHMARKS_LINES = 450
COMMAND = re.compile(r"(?:^|`|\s)(?:specexport|\.venv(?:-genai)?/bin/python|python|taskset|make|rm -rf)\s")


def product_files() -> list[Path]:
    files = [REPO / "Makefile"]
    for top in PRODUCT_DIRS:
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts:
                files.append(path)
    return files


def issue_numbers(text: str) -> list[str]:
    return [m.group(0) for m in ISSUE.finditer(text)]


def prose_of_python(source: str) -> list[tuple[int, str]]:
    """(line, text) of a module's comments and docstrings: where a tally would be prose, not code."""
    out: list[tuple[int, str]] = []
    previous = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT,
                                                          tokenize.DEDENT):
            out.extend((tok.start[0] + i, line) for i, line in enumerate(tok.string.splitlines()))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    return out


def prose_of_toml(source: str) -> list[tuple[int, str]]:
    return [(n, line[line.index("#"):]) for n, line in enumerate(source.splitlines(), 1) if "#" in line]


def tallies(path: Path, text: str) -> list[str]:
    prose = prose_of_python(text) if path.suffix == ".py" else prose_of_toml(text) if path.suffix == ".toml" else []
    return [f"{n}: {line.strip()}" for n, line in prose if TALLY.search(line)]


def markdown_tables(lines: list[str]) -> list[int]:
    """0-based first line of each table (a header row followed by a |---| separator row)."""
    return [i for i in range(len(lines) - 1)
            if lines[i].startswith("|") and re.match(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$", lines[i + 1])]


def tables_without_a_command(text: str) -> list[str]:
    """Tables with no command between them and their section's heading: a fenced block holding one, or one in
    backticks in the prose."""
    lines = text.splitlines()
    fence, headings = False, set()
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            headings.add(i)
    missing = []
    for start in markdown_tables(lines):
        top = start
        while top > 0 and top - 1 not in headings:
            top -= 1
        region = lines[top:start]
        fenced = inside = False
        for line in region:
            if line.strip().startswith("```"):
                inside = not inside
            elif inside and COMMAND.search(" " + line):
                fenced = True
        inline = any(COMMAND.search(span + " ") for line in region for span in re.findall(r"`([^`]+)`", line))
        if not (fenced or inline):
            missing.append(f"line {start + 1}: {lines[start][:80]}")
    return missing


# ------------------------------------------------------------------------------------------------------------


def test_the_checks_catch_what_they_are_for():
    # each pattern on a planted example, and not on the look-alikes the code has
    assert issue_numbers("# fixed for issue 18, point 3") == ["issue 18"]
    assert issue_numbers("see PR #3813 and (#31)") == ["PR #3813", "#31"]
    assert issue_numbers("# 0: 4 x hidden; &#123; 'a#1'; the issue's bar; Issue: none") == []
    assert TALLY.search("auto made 1.23× AR") and TALLY.search("tau unchanged, τ 1.8") \
        and TALLY.search("at 45.3 tokens/s")
    assert not TALLY.search("4 x hidden, 2 x layers, 640 x 262,144; tau 1 means AR")
    planted = prose_of_python('"""Why.\n\nIt made 1.05x AR."""\nX = "1.05x"  # 2.5x faster\n')
    assert [n for n, line in planted if TALLY.search(line)] == [3, 4]
    table = "## A\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert tables_without_a_command(table) == ["line 3: | a | b |"]
    fenced = "## A\n\n```\nspecexport bench --bundle b\n# the same at int4\n```\n\n"
    assert tables_without_a_command(fenced + table[5:]) == []
    assert tables_without_a_command("## A\n\nFrom `make bench`:\n\n" + table[5:]) == []


def test_no_issue_numbers_in_the_product():
    found = []
    for path in product_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{path.relative_to(REPO)}: {hit}" for hit in issue_numbers(text)]
    assert not found, "issue numbers belong in the journal and the git history, not the product: " + "; ".join(found)


def test_no_run_tallies_in_code_comments_docstrings_or_recipes():
    found = []
    for path in product_files():
        if path.suffix in (".py", ".toml"):
            found += [f"{path.relative_to(REPO)}:{hit}" for hit in tallies(path, path.read_text(encoding="utf-8"))]
    assert not found, "measured figures go in BENCHMARKS.md; comments say why:\n" + "\n".join(found)


def test_benchmarks_is_short_and_every_table_has_its_command():
    text = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) < MAX_BENCHMARKS_LINES, f"BENCHMARKS.md has {len(lines)} lines: the journal is docs/journal/"
    assert len(markdown_tables(lines)) >= 10, "BENCHMARKS.md lost its tables: this check would be empty"
    missing = tables_without_a_command(text)
    assert not missing, "BENCHMARKS.md tables without the command that produced them: " + "; ".join(missing)
    assert "## Draft head (feature-level, EAGLE-3 shape)" in lines


@pytest.mark.parametrize("doc", ["BENCHMARKS.md", "docs/bench.md", "docs/journal/README.md"])
def test_links_resolve(doc):
    path = REPO / doc
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8"))
    assert targets, f"{doc} links nothing: this check would be empty"
    broken = [t for t in targets if "://" not in t and not (path.parent / t).exists()]
    assert not broken, f"{doc} links to missing files: {broken}"


def test_the_journal_index_lists_every_entry_file():
    journal = REPO / "docs" / "journal"
    index = (journal / "README.md").read_text(encoding="utf-8")
    files = sorted(p.name for p in journal.glob("*.md") if p.name != "README.md")
    assert files, "docs/journal/ is empty"
    assert not [f for f in files if f"]({f})" not in index], "docs/journal/README.md misses an entry file"
