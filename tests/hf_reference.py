"""Transformers' greedy choice at every step of a generation, checked in one forward pass.

Greedy decoding takes, at each step, the argmax of the logits given the prompt and the tokens chosen so far.
A causal model computes those logits for every step at once when it is given the whole generation (teacher
forcing): one call per prompt instead of `generate`'s one call per token, which on two cores made the
real-model comparison most of the suite's time. A generation equals transformers' greedy output exactly when
every token is that argmax and the generation stops where transformers would: at its length limit or where
the model's next choice is an end-of-sequence token."""

from __future__ import annotations


def first_departure(model, prompt_ids: list[int], tokens: list[int], eos: set[int],
                    max_new_tokens: int) -> int | None:
    """Where `tokens`, generated after `prompt_ids` with end-of-sequence tokens cut off, first leaves
    transformers' greedy output: the index of the first token that is not the model's argmax given the tokens
    before it, `len(tokens)` when the generation stopped short of `max_new_tokens` though the model's next
    choice is no end-of-sequence token, or None when it is transformers' greedy output."""
    import torch

    assert len(tokens) <= max_new_tokens
    sequence = torch.tensor([prompt_ids + tokens])
    with torch.inference_mode():
        # the logits at the last prompt position and after each token: step k's choice is row k
        logits = model(input_ids=sequence, attention_mask=torch.ones_like(sequence),
                       logits_to_keep=len(tokens) + 1).logits[0]
    choices = logits.argmax(-1).tolist()
    for k, token in enumerate(tokens):
        if choices[k] != token:
            return k
    if len(tokens) < max_new_tokens and choices[len(tokens)] not in eos:
        return len(tokens)
    return None
