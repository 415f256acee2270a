"""How varied a prompt set is: near-duplicates found and dropped, then the distinct word 4-grams left.

Near-duplicates are prompts whose word 3-gram sets overlap by a Jaccard of at least `threshold`, found by
MinHash banding (so the pairs compared are the likely ones, not all n² of them) and confirmed exactly; the
first of a group is kept. Distinct 4-grams over all 4-grams is the diversity figure: a set that repeats
itself has few distinct 4-grams for its size.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

BANDS, ROWS = 8, 2  # 16 min-hashes: pairs at Jaccard 0.7 share a band with probability 1 - (1 - 0.49)^8 > 0.99


@dataclass(frozen=True)
class Diversity:
    prompts: int
    near_duplicates: int  # dropped before the figures below
    four_grams: int
    distinct_four_grams: int

    @property
    def distinct_ratio(self) -> float:
        return self.distinct_four_grams / self.four_grams if self.four_grams else 0.0

    def line(self) -> str:
        return (f"{self.prompts} prompts, {self.near_duplicates} near-duplicates dropped;"
                f" {self.distinct_four_grams} distinct word 4-grams of {self.four_grams}"
                f" ({self.distinct_ratio:.1%})")


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _grams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(max(1, len(words) - n + 1))} if words else set()


def _signature(shingles: set[tuple[str, ...]]) -> tuple[int, ...]:
    hashes = [int.from_bytes(hashlib.blake2b(" ".join(s).encode(), digest_size=8).digest(), "little")
              for s in shingles]
    # salted by xor with fixed odd constants: cheap independent-enough permutations for banding
    return tuple(min(h ^ (0x9E3779B97F4A7C15 * (k + 1) & (1 << 64) - 1) for h in hashes) if hashes else 0
                 for k in range(BANDS * ROWS))


def _matches(texts: list[str], against: list[str], threshold: float, within: bool) -> set[int]:
    """Indices of `texts` at Jaccard >= threshold (word 3-grams) to one of `against`, or, `within`, to an
    earlier text kept."""
    pool = [_grams(_words(t), 3) for t in against]
    buckets: dict[tuple, list[int]] = {}

    def add(j: int, sig: tuple[int, ...]) -> None:
        for b in range(BANDS):
            buckets.setdefault((b, sig[b * ROWS:(b + 1) * ROWS]), []).append(j)

    for j, sh in enumerate(pool):
        add(j, _signature(sh))
    hit: set[int] = set()
    for i, text in enumerate(texts):
        sh = _grams(_words(text), 3)
        sig = _signature(sh)
        candidates = {j for b in range(BANDS) for j in buckets.get((b, sig[b * ROWS:(b + 1) * ROWS]), ())}
        for j in sorted(candidates):
            union = len(sh | pool[j])
            if union and len(sh & pool[j]) / union >= threshold:
                hit.add(i)
                break
        if within and i not in hit:
            pool.append(sh)
            add(len(pool) - 1, sig)
    return hit


def near_duplicates(texts: list[str], threshold: float = 0.7) -> set[int]:
    """Indices of the prompts that repeat an earlier one at Jaccard >= threshold (word 3-grams)."""
    return _matches(texts, [], threshold, within=True)


def overlapping(texts: list[str], held_out: list[str], threshold: float = 0.7) -> set[int]:
    """Indices of the prompts that near-duplicate a held-out one (an evaluation set's)."""
    return _matches(texts, held_out, threshold, within=False)


def diversity(texts: list[str], threshold: float = 0.7) -> Diversity:
    dropped = near_duplicates(texts, threshold)
    kept = [t for i, t in enumerate(texts) if i not in dropped]
    total, distinct = 0, set()
    for t in kept:
        words = _words(t)
        grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
        total += len(grams)
        distinct.update(grams)
    return Diversity(len(texts), len(dropped), total, len(distinct))
