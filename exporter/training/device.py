"""Where self-distillation and head training run: `--device auto|cpu|cuda`.

On a GPU the forward passes run under autocast (bf16 where the GPU has it, else fp16 with a gradient scaler,
since fp16 gradients of a soft cross-entropy underflow), the weights and optimizer state stay fp32, and the
batches move to the device as they are made. On the CPU everything is fp32, as before: the same code, so the
CPU path the suite tests is the GPU path's arithmetic bar the autocast.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ...runtime.errors import SpecExportError

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Device:
    torch: torch.device
    half: torch.dtype | None = None  # the autocast dtype on a GPU; None: fp32 throughout

    @property
    def is_cuda(self) -> bool:
        return self.torch.type == "cuda"

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.half is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.torch.type, dtype=self.half)

    def scaler(self) -> torch.amp.GradScaler:
        """Loss scaling for fp16 autocast; a pass-through otherwise."""
        return torch.amp.GradScaler(self.torch.type, enabled=self.half == torch.float16)

    def describe(self) -> str:
        precision = "fp32" if self.half is None else f"{str(self.half).removeprefix('torch.')} autocast"
        name = f" {torch.cuda.get_device_name(self.torch)}" if self.is_cuda else ""
        return f"{self.torch}{name} ({precision})"


def resolve_device(spec: str | Device | None = "auto") -> Device:
    """The device `spec` names; "auto" takes CUDA when PyTorch sees a GPU, else the CPU. A Device passes
    through (the tests run the autocast path on the CPU with one)."""
    if isinstance(spec, Device):
        return spec
    spec = spec or "auto"
    if spec not in DEVICES:
        raise SpecExportError(f"unknown training device {spec!r}; use one of {', '.join(DEVICES)}")
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return Device(torch.device("cpu"))
    if not torch.cuda.is_available():
        raise SpecExportError("--device cuda asked for a GPU, but this PyTorch sees none (a CPU-only build, or no"
                              " driver); install a CUDA build of torch, or use --device cpu")
    device = torch.device("cuda", torch.cuda.current_device())
    return Device(device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)


def optimizer_step(opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler, loss: torch.Tensor, module,
                   max_norm: float = 1.0) -> None:
    """One update of `module`: backward through the scaler, gradients unscaled and clipped to `max_norm`."""
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
