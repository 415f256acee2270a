"""The distillation decode loop on the tiny random Llama: its choices are the target's (checked against the
Hugging Face model's own forward), its batch refills as answers end, and what it hands training (the chosen
layers' states, the top-k log-probabilities) is the target's.

Not token-for-token against `generate`: this loop trades bit-exact rows for speed (batched GEMMs round
differently from one row), so agreement is measured, as it is for the real model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from specexport.exporter.hf_weights import extract
from specexport.exporter.model_source import load_model
from specexport.exporter.training.distill.decoder import BatchedDecoder, Job


@pytest.fixture(scope="module")
def target(tiny_checkpoint):
    model, _ = load_model(tiny_checkpoint)
    return model, extract(model, 512)


def _prompts(n: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(3, vocab, size=int(rng.integers(3, 40))).tolist() for _ in range(n)]


def test_greedy_answers_are_the_targets_choices_with_slots_refilled(target):
    model, weights = target
    prompts = _prompts(12, model.config.vocab_size)
    # 4 slots for 12 jobs of different lengths: the batch refills as answers end
    lengths = [5 + 3 * (i % 5) for i in range(12)]
    decoder = BatchedDecoder(weights, slots=4, context=128)
    done = {d.key: d for d in decoder.run([Job(i, p, lengths[i]) for i, p in enumerate(prompts)])}
    assert sorted(done) == list(range(12))
    agree = total = 0
    for i, d in done.items():
        assert len(d.response) == lengths[i] and d.prompt == prompts[i]
        seq = torch.tensor([d.prompt + d.response])
        with torch.inference_mode():
            best = model(seq).logits[0].argmax(-1).tolist()  # position t predicts token t + 1
        ref = best[len(d.prompt) - 1:len(seq[0]) - 1]
        agree += sum(a == b for a, b in zip(ref, d.response, strict=True))
        total += len(ref)
    assert agree / total >= 0.98, f"{agree}/{total} of the loop's choices are the target's argmax"


def test_it_hands_training_the_targets_states_and_soft_labels(target):
    model, weights = target
    layers = (0, 1, len(weights.layers))
    decoder = BatchedDecoder(weights, slots=3, context=96, feature_layers=layers, top_k=8)
    prompts = _prompts(5, model.config.vocab_size)
    for d in decoder.run([Job(i, p, 6) for i, p in enumerate(prompts)]):
        n = len(d.prompt) + len(d.response) - 1  # the last token was never fed back
        assert d.features.shape == (n, len(layers), weights.dims.hidden) and d.features.dtype == np.float16
        assert d.top_ids.shape == d.top_logp.shape == (len(d.response), 8)
        assert (np.diff(d.top_logp.astype(np.float32), axis=1) <= 0).all()  # best first
        with torch.inference_mode():
            out = model(torch.tensor([d.prompt + d.response[:-1]]), output_hidden_states=True)
        for f, layer in enumerate(layers[:-1]):  # the last hidden state is after the final norm in HF's output
            want = out.hidden_states[layer][0].numpy()
            assert np.allclose(d.features[:, f].astype(np.float32), want, atol=2e-2, rtol=2e-2)
        logp = torch.log_softmax(out.logits[0, len(d.prompt) - 1:], -1)
        assert (d.top_ids[:, 0] == logp.argmax(-1).numpy()).mean() >= 0.8
        assert np.allclose(d.top_logp[:, 0], logp.max(-1).values.numpy(), atol=2e-2)


def test_sampled_draws_follow_the_job_not_the_batch(target):
    """A job's draws come from its own generator seeded (seed, key): alone or among others, the same."""
    model, weights = target
    prompt = _prompts(1, model.config.vocab_size)[0]
    jobs = [Job(k, prompt, 10, temperature=1.0, top_p=0.9, seed=7) for k in range(6)]
    together = {d.key: d.response for d in BatchedDecoder(weights, slots=6, context=96).run(jobs)}
    alone = {d.key: d.response for d in BatchedDecoder(weights, slots=1, context=96).run(jobs[2:3])}
    assert alone[2] == together[2]
    assert len({tuple(r) for r in together.values()}) > 1  # different keys, different draws
