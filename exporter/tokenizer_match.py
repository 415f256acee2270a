"""Is a drafter's tokenizer the target's? Draft tokens are handed to the target as ids, so the two must
map every token to the same id and agree on what the special tokens are.

The comparison reads the tokenizers' own JSON (``tokenizer.json`` as the tokenizers library serialises
it), so it is exact: sizes, token -> id entries, special and added tokens, then the BPE merges. The
normalizer and pre-tokenizer are not compared: the drafter only ever sees ids the target's tokenizer
made, so they change what text it was trained on, never what an id means.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..runtime.errors import SpecExportError

SPECIAL = ("bos", "eos", "unk", "pad")


def load_tokenizer(checkpoint: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(checkpoint))
    except Exception as exc:  # missing or unreadable tokenizer files
        raise SpecExportError(f"{checkpoint} has no readable tokenizer ({type(exc).__name__}: {exc}); a drafter"
                              " checkpoint needs the tokenizer files it was trained with") from None


def _backend_json(tok) -> dict:
    backend = getattr(tok, "backend_tokenizer", None)
    return json.loads(backend.to_str()) if backend is not None else {}


def _merges(model: dict) -> list[str]:
    # older files store "a b", newer ones ["a", "b"]: compare one spelling
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]


def _added(tok) -> dict[int, tuple[str, bool]]:
    return {i: (t.content, bool(t.special)) for i, t in tok.added_tokens_decoder.items()}


def tokenizer_difference(drafter, target) -> str | None:
    """How the drafter's tokenizer differs from the target's, as one clause, or None if they match."""
    if len(drafter) != len(target):
        return f"the drafter's tokenizer has {len(drafter)} tokens, the target's {len(target)}"
    dv, tv = drafter.get_vocab(), target.get_vocab()
    differing = sorted((t for t in dv.keys() | tv.keys() if dv.get(t) != tv.get(t)), key=lambda t: (tv.get(t, -1), t))
    if differing:
        t = differing[0]
        where = lambda v: "missing" if v.get(t) is None else f"id {v[t]}"  # noqa: E731
        return (f"{len(differing)} token→id entries differ, e.g. {t!r} is {where(dv)} in the drafter's tokenizer"
                f" and {where(tv)} in the target's")
    for name in SPECIAL:
        d, t = getattr(drafter, f"{name}_token", None), getattr(target, f"{name}_token", None)
        if str(d) != str(t):
            return f"the drafter's {name} token is {d!r}, the target's {t!r}"
    da, ta = _added(drafter), _added(target)
    if da != ta:
        ids = sorted(i for i in da.keys() | ta.keys() if da.get(i) != ta.get(i))
        show = lambda a: "none" if a.get(ids[0]) is None else f"{a[ids[0]][0]!r}" + (  # noqa: E731
            " (special)" if a[ids[0]][1] else " (not special)")
        return (f"their added tokens differ at {len(ids)} id(s), e.g. id {ids[0]} is {show(da)} in the drafter's"
                f" tokenizer and {show(ta)} in the target's")
    dm, tm = _backend_json(drafter).get("model", {}), _backend_json(target).get("model", {})
    if dm.get("type") != tm.get("type"):
        return f"the drafter's tokenizer is a {dm.get('type')} model, the target's a {tm.get('type')} model"
    dmerges, tmerges = _merges(dm), _merges(tm)
    if dmerges != tmerges:
        first = next((i for i, (a, b) in enumerate(zip(dmerges, tmerges, strict=False)) if a != b),
                     min(len(dmerges), len(tmerges)))
        at = lambda m: repr(m[first]) if first < len(m) else "none"  # noqa: E731
        return (f"their BPE merges differ ({len(dmerges)} vs {len(tmerges)} merges, first difference at rank"
                f" {first}: {at(dmerges)} in the drafter's tokenizer, {at(tmerges)} in the target's)")
    return None


def require_same_tokenizer(drafter_checkpoint: Path, target_checkpoint: Path, what: str) -> None:
    """Refuses, in one sentence naming the difference, a drafter whose tokenizer is not the target's."""
    diff = tokenizer_difference(load_tokenizer(drafter_checkpoint), load_tokenizer(target_checkpoint))
    if diff is not None:
        raise SpecExportError(f"{what} does not use the target's tokenizer: {diff}; pick a drafter trained with the"
                              " target's tokenizer, or distil one with `specexport train-drafter`")
