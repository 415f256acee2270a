"""Experiment (issue 6): does the Spec-Drafter lose agreement on long prompts because it reads them whole?

The drafter was distilled on short chat prompts; Spec-Bench's summarization and RAG prompts run to 600-800
tokens after the chat template. If reading far-away context hurt it, a sliding attention window (the
pieces' `attention_bias` could mask old slots without a rebuild) would raise its agreement there. This
measures the drafter's top-1 agreement with the target's greedy answers on the bench's questions, reading
the whole prompt and only its last W tokens, teacher-forced over the answer:

    .venv/bin/python tools/experiments/drafter_context.py --bundle bundles/smollm2 --limit 3

Nothing here ships: it answers whether the window is worth building (recipes/smollm2-135m.toml, drafter).
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
from specexport.bench.questions import DEFAULT_MAX_PROMPT_TOKENS, cut_text, load_questions, resolve_questions
from specexport.runtime import load
from tqdm import tqdm


def agreement(session, prompt: list[int], answer: list[int]) -> int:
    """How many of answer[1:] the drafter's argmax gets right, reading prompt + answer in one call."""
    piece, vocab = session.pieces.drafter, session.pieces.drafter_vocab
    logits = piece.run(np.asarray([prompt + answer], dtype=np.int64), 0, keep=len(answer))["logits"][0]
    top = logits.argmax(-1)
    top = vocab[top] if vocab is not None else top
    return int((top[:-1] == np.asarray(answer[1:])).sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default="bundles/smollm2")
    ap.add_argument("--limit", type=int, default=3, help="first N questions per category")
    ap.add_argument("--windows", default="512,256,128", help="prompt tokens kept, comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    session = load(args.bundle, threads=1)
    windows = [None, *(int(w) for w in args.windows.split(","))]
    hits = {w: Counter() for w in windows}
    total: Counter = Counter()
    for q in tqdm(load_questions(resolve_questions(None), limit=args.limit), desc="questions"):
        text, _ = cut_text(q.text, session.codec.encode, session.codec.decode, DEFAULT_MAX_PROMPT_TOKENS)
        prompt = session.prompt_ids(text, session.options())
        answer = session.generate_ids(prompt, max_new_tokens=args.max_new_tokens, mode="ar").tokens
        for w in windows:
            h = agreement(session, prompt if w is None else prompt[-w:], answer)
            hits[w].update({q.category: h, "overall": h})
        total.update({q.category: len(answer) - 1, "overall": len(answer) - 1})
    print("category".ljust(16) + "".join(f"{'whole' if w is None else f'last {w}':>10}" for w in windows))
    for c in total:
        print(c.ljust(16) + "".join(f"{100 * hits[w][c] / total[c]:9.1f}%" for w in windows))


if __name__ == "__main__":
    main()
