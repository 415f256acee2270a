"""Which token each position of a row's drafter cache holds, so that a batched step feeds a row's drafter only
the history its cache lacks."""

from __future__ import annotations

from ..drafters import fed_prefix


class DrafterCache:
    """Which token each position of a row's drafter cache holds (ModelDrafter's bookkeeping), so that a step
    feeds only the history the cache lacks: after a rejection the positions past the accepted prefix are
    simply written again."""

    def __init__(self) -> None:
        self.fed: list[int] = []
        self.final = 0  # the positions known final at the last drafting: the agreement check starts there

    def cached(self, history: list[int]) -> int:
        """How many leading history positions the cache holds; never history[-1], whose logits draft."""
        k = fed_prefix(self.fed, history, min(self.final, len(self.fed)), min(len(self.fed), len(history)))
        return min(k, len(history) - 1)

    def wrote(self, at: int, tokens: list[int]) -> None:
        del self.fed[at:]
        self.fed.extend(tokens)
