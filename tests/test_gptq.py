"""GPTQ rounding (exporter/gptq.py): weights on the int4 block grid that the quantizer keeps, and a layer's
output on calibration-like inputs closer to the float layer's than each block rounded on its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from specexport.exporter import gptq, quantize


def _inputs(rng: np.random.Generator, rows: int, k: int) -> torch.Tensor:
    """Correlated inputs with a few loud channels, as a transformer's activations are."""
    mix = rng.standard_normal((k, k)) / np.sqrt(k) + np.eye(k)
    loud = np.ones(k)
    loud[rng.choice(k, 4, replace=False)] = 8.0
    return torch.from_numpy(rng.standard_normal((rows, k)) @ mix * loud).float()


@pytest.mark.parametrize("symmetric", [False, True])
def test_gptq_rounds_onto_the_grid_and_moves_the_output_less(symmetric):
    rng = np.random.default_rng(0)
    k, n = 96, 40
    weight = torch.from_numpy(rng.standard_normal((n, k)) * 0.05).float()  # a Linear's [out, in]
    x = _inputs(rng, 512, k)
    spec = quantize.spec_for("int4", symmetric=symmetric, rounding="gptq")
    rounded = gptq.round_weight(weight, x.double().T @ x.double(), spec)
    each_block = quantize.spec_for("int4", symmetric=symmetric, rounding="least_squares")
    plain = torch.from_numpy(quantize.fake_quantize(weight.numpy().T, each_block).T.copy())
    # on the grid: the quantizer's own rounding of the GPTQ weights moves them by float rounding at most
    again = quantize.fake_quantize(rounded.numpy().T, spec).T
    np.testing.assert_allclose(again, rounded.numpy(), rtol=0, atol=1e-6)
    err_gptq = torch.linalg.norm(x @ (rounded - weight).T)
    err_plain = torch.linalg.norm(x @ (plain - weight).T)
    assert err_gptq < 0.8 * err_plain, (float(err_gptq), float(err_plain))


def test_a_tied_head_stays_tied_and_only_linears_change(tiny_checkpoint):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    rng = np.random.default_rng(1)
    sequences = [rng.integers(0, model.config.vocab_size, 48).tolist() for _ in range(4)]
    calls = []
    rounded = gptq.rounded_copy(model, sequences, quantize.spec_for("int4"), progress=lambda: calls.append(1))
    assert len(calls) == gptq.linear_count(model)
    assert rounded.get_input_embeddings().weight is rounded.get_output_embeddings().weight
    assert not torch.equal(rounded.lm_head.weight, model.lm_head.weight)
    norms = {n: p for n, p in rounded.named_parameters() if "norm" in n}
    assert norms and all(torch.equal(p, dict(model.named_parameters())[n]) for n, p in norms.items())
