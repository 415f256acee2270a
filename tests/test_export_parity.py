"""Each piece matches PyTorch, in both graph flavours, through prefill, decode, verify and rollback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from specexport.runtime.decode import Pieces, target_step
from specexport.runtime.session import load
from transformers import AutoModelForCausalLM


def _reference(checkpoint, ids):
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([ids]), output_hidden_states=True)


@pytest.mark.parametrize("flavour", ["ort", "standard"])
@pytest.mark.parametrize("exit_layer", [1, 2, 3])
def test_pieces_match_pytorch_across_cache_use(tiny_checkpoint, tiny_bundles, flavour, exit_layer):
    session = load(tiny_bundles(flavour, exit_layer))
    p: Pieces = session.pieces
    rng = np.random.default_rng(exit_layer)
    ids = rng.integers(0, 300, size=40).tolist()
    ref = _reference(tiny_checkpoint, ids)
    want_logits, want_h = ref.logits.numpy()[0], ref.hidden_states[exit_layer].numpy()[0]

    # prefill 20, decode 1, then a 6-token "verification" on garbage that is rolled back
    h, logits = target_step(p, ids[:20], 0, keep=20)
    np.testing.assert_allclose(h[0], want_h[:20], atol=1e-4)
    np.testing.assert_allclose(logits[0], want_logits[:20], atol=1e-3)
    _, logits = target_step(p, ids[20:21], 20)
    np.testing.assert_allclose(logits[0, -1], want_logits[20], atol=1e-3)
    target_step(p, rng.integers(0, 300, size=6).tolist(), 21, keep=6)
    # rollback: the same positions again with the true tokens; stale cache entries must not leak
    _, logits = target_step(p, ids[21:30], 21, keep=9)
    np.testing.assert_allclose(logits[0], want_logits[21:30], atol=1e-3)
    _, logits = target_step(p, ids[30:40], 30, keep=1)
    np.testing.assert_allclose(logits[0, -1], want_logits[39], atol=1e-3)


def test_manifest_records_parity_and_contract(tiny_bundles):
    import json

    manifest = json.loads((tiny_bundles("ort", 2) / "manifest.json").read_text())
    assert manifest["graph"]["opset"] == 17
    assert set(manifest["pieces"]) == {"shallow", "deep"}
    for name, piece in manifest["pieces"].items():
        err = piece["parity"]["max_relative_error"]
        assert err and all(v <= piece["parity"]["tolerance"] for v in err.values()), name
        assert piece["kv"]["mode"] == "shared"
    assert manifest["pieces"]["shallow"]["layers"] == [0, 2]
    assert manifest["pieces"]["deep"]["layers"] == [2, 4]
    assert set(manifest["files"]) >= {"shallow.onnx", "shallow.onnx.data", "deep.onnx", "tokenizer.json"}
