"""The prompt set's diversity report: near-duplicates found by MinHash banding and confirmed exactly."""

from __future__ import annotations

import random

from specexport.exporter.training.distill.diversity import diversity, near_duplicates, overlapping

WORDS = ("sea sky night river stone code list table tree graph bird song city road light paper glass"
         " garden winter letter story market train cloud").split()


def _prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(14)) for _ in range(n)]


def test_repeats_and_light_edits_are_found_and_distinct_prompts_are_not():
    base = _prompts(200)
    # every 10th prompt again, its case and punctuation changed or one word swapped at its end
    edited = [p.upper() + "!" if i % 2 else p.rsplit(" ", 1)[0] + " zebra" for i, p in enumerate(base[::10])]
    found = near_duplicates(base + edited)
    assert found == set(range(200, 200 + len(edited)))


def test_overlap_with_an_evaluation_set_counts_only_its_near_copies():
    train, held = _prompts(100, seed=1), _prompts(30, seed=2)
    mixed = [*train[:50], held[3], held[7].replace(" ", "  "), *train[50:]]
    assert overlapping(mixed, held) == {50, 51}


def test_the_figures_drop_near_duplicates_first():
    prompts = ["one two three four five", "one two three four five", "six seven eight nine"]
    d = diversity(prompts)
    assert (d.prompts, d.near_duplicates, d.four_grams, d.distinct_four_grams) == (3, 1, 3, 3)
    assert "1 near-duplicates dropped" in d.line()
