"""Error-compensating int4 rounding (GPTQ, Frantar et al. 2022) of the target's Linear weights, before export.

Each output row is rounded one input channel at a time; a channel's rounding error is pushed onto the channels of
the same row not yet rounded, weighted by the inverse of the layer's input second moments H = X^T X over a
calibration set, so that the layer's output on inputs like those moves least. Per block of `block_size` channels
the scale and zero point are the exporter's own least-squares choice (quantize._quantize_blocks), made on the
weights as updated so far. Rows are independent given H, so q, k and v (or gate and up), which read one input,
round as the fused matrices the graph holds.

The rounded weights go back into a copy of the model as floats on the block grid: the quantizer then rounds
them again (exporter/quantize.py), which keeps them to within a rounding of the float's last bit, and the parity
reference rounds that same copy, so the graph and its reference agree as before. A tied LM head stays tied: the
embedding reads the rounded head's rows (exporter/tied_rows.py).

Calibration, in order of preference: the recipe's committed corpus when it was distilled from this very model (the
target's own greedy answers: what drafting and serving see), else the chat-formatted training prompts.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np

from . import quantize

CALIBRATION_SEQUENCES = 128
CALIBRATION_LENGTH = 256
DAMPING = 0.01  # of H's mean diagonal, added to its diagonal: keeps the inverse defined on unused channels


def corpus_calibration(corpus: Path | None, target_sha: str, count: int = CALIBRATION_SEQUENCES,
                       length: int = CALIBRATION_LENGTH) -> list[list[int]] | None:
    """The first `count` prompt + answer sequences of the packed corpus's shipped part, or None when there is no
    corpus or it was distilled from another model."""
    if corpus is None or not corpus.is_file():
        return None
    data = np.load(corpus)
    if json.loads(str(data["meta"])).get("target_sha256") != target_sha:
        return None
    out: list[list[int]] = []
    for shard in sorted({k.rsplit("/", 1)[0] for k in data.files if k.startswith("shipped/shard_")}):
        tokens, offsets = data[f"{shard}/tokens"], data[f"{shard}/offsets"]
        for a, b in itertools.pairwise(offsets):
            out.append(tokens[a:min(b, a + length)].astype(np.int64).tolist())
            if len(out) == count:
                return out
    return out or None


def _second_moments(model, sequences: list[list[int]]) -> dict[str, object]:
    """X^T X (float64) of every Linear's input over the sequences, through the float model."""
    import torch

    moments: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def record(_module, inputs, _output) -> None:
            x = inputs[0].reshape(-1, inputs[0].shape[-1]).double()
            moments[name] = moments.get(name, 0) + x.T @ x
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    try:
        with torch.inference_mode():
            for seq in sequences:
                model(torch.tensor([seq]))
    finally:
        for h in handles:
            h.remove()
    return moments


def round_weight(weight, hessian, spec: quantize.QuantSpec):
    """GPTQ of one Linear weight [N, K] (torch) at `spec`, back as floats on the rounded grid."""
    import torch

    w = weight.detach().double().clone()
    n, k = w.shape
    h = hessian.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += torch.eye(k, dtype=h.dtype) * DAMPING * torch.diag(h).mean()
    # the upper Cholesky factor of H^-1: row i holds how channel i's error spreads onto the later ones
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    qmax, block = (1 << spec.bits) - 1, spec.block_size
    out = torch.zeros_like(w)
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        cols = np.ascontiguousarray(w[:, b0:b1].T.float().numpy())  # [block, N]: one block per row of the weight
        _, scale, zero = quantize._quantize_blocks(cols, spec)
        scale, zero = torch.from_numpy(scale[:, 0, 0]).double(), torch.from_numpy(zero[:, 0, 0]).double()
        errors = torch.zeros((n, b1 - b0), dtype=w.dtype)
        for i in range(b0, b1):
            col = w[:, i]
            rounded = (torch.clamp(torch.round(col / scale) + zero, 0, qmax) - zero) * scale
            out[:, i] = rounded
            e = (col - rounded) / hinv[i, i]
            w[:, i + 1:b1] -= e[:, None] * hinv[i, i + 1:b1][None]
            errors[:, i - b0] = e
        w[:, b1:] -= errors @ hinv[b0:b1, b1:]
    return out.float()


def rounded_copy(model, sequences: list[list[int]], spec: quantize.QuantSpec, progress=None):
    """A copy of `model` whose Linear weights are GPTQ-rounded at `spec` (the LM head at its own spec), a tied
    embedding tied to the rounded head."""
    import copy

    import torch

    moments = _second_moments(model, sequences)
    rounded = copy.deepcopy(model)
    modules = dict(rounded.named_modules())
    tied = rounded.get_output_embeddings() is not None and (
        rounded.get_output_embeddings().weight.data_ptr() == rounded.get_input_embeddings().weight.data_ptr())
    head = rounded.get_output_embeddings()
    for name, h in moments.items():
        module = modules[name]
        own = spec.for_lm_head() if module is head else spec
        if module is head and not spec.lm_head:
            continue
        module.weight = torch.nn.Parameter(round_weight(module.weight, h, own), requires_grad=False)
        if progress is not None:
            progress()
    if tied:
        rounded.get_input_embeddings().weight = head.weight
    return rounded


def linear_count(model) -> int:
    import torch

    return sum(isinstance(m, torch.nn.Linear) for m in model.modules())
