"""Training on a GPU when there is one (`--device auto|cpu|cuda`). Here there is none: the CPU path runs for
real, and the mixed-precision path runs too, with bf16 autocast on the CPU standing in for the GPU's."""

from __future__ import annotations

import json

import pytest
import torch
from specexport.exporter.model_source import resolve
from specexport.exporter.training.adapter_source import train_for_target
from specexport.exporter.training.device import Device, resolve_device
from specexport.runtime.errors import SpecExportError
from transformers import AutoModelForCausalLM

from .test_cli import cli
from .test_train_adapter import SETTINGS

NO_GPU = not torch.cuda.is_available()


def test_auto_and_cpu_resolve_to_fp32_on_the_cpu():
    for spec in ("cpu", None) + (("auto",) if NO_GPU else ()):
        device = resolve_device(spec)
        assert device.torch.type == "cpu" and device.half is None and not device.scaler().is_enabled()
        assert device.describe() == "cpu (fp32)"


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: --device cuda is not refused here")
def test_cuda_without_a_gpu_is_one_sentence():
    with pytest.raises(SpecExportError, match="--device cuda asked for a GPU, but this PyTorch sees none"):
        resolve_device("cuda")
    with pytest.raises(SpecExportError, match="unknown training device 'tpu'"):
        resolve_device("tpu")


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: --device cuda is not refused here")
def test_the_cli_refuses_cuda_before_any_work(tiny_checkpoint, tmp_path):
    out = cli("train-adapter", "--model", str(tiny_checkpoint), "--out", str(tmp_path / "a"), "--device", "cuda")
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --device cuda asked for a GPU"), out.stderr
    assert not (tmp_path / "a").exists()


def test_the_autocast_path_trains(tiny_checkpoint, tmp_path):
    # bf16 autocast, fp32 weights and optimizer: what a GPU without fp16 loss scaling runs, on the CPU
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
    sha = resolve(tiny_checkpoint).origin_sha256
    half = Device(torch.device("cpu"), torch.bfloat16)
    train_for_target(model, tiny_checkpoint, sha, 2, {**SETTINGS, "device": half}, tmp_path / "bf16")
    meta = json.loads((tmp_path / "bf16" / "adapter.json").read_text())
    assert meta["device"] == "cpu (bfloat16 autocast)"
    assert meta["heldout"]["loss"] < meta["heldout_before"]["loss"]
    assert meta["heldout"]["agreement"] > meta["heldout_before"]["agreement"]
    # the model is handed back on the host, in fp32, whatever the device did
    assert next(model.parameters()).device.type == "cpu" and next(model.parameters()).dtype == torch.float32
