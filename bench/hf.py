"""The Hugging Face baselines of `specexport bench`: transformers `generate` and its prompt lookup.

They run PyTorch, which belongs to the exporter's extra, so they live here and `specexport bench` loads
this module only when they are asked for. PyTorch and transformers load only in HFSystem.setup, so a
missing package is a Skip with a reason.
"""

from __future__ import annotations

import time
from pathlib import Path

from . import systems as bench_systems
from .metrics import RunResult
from .systems import Skip, System, strip_eos

HF_LOOKUP_TOKENS = 10  # prompt_lookup_num_tokens: the value Hugging Face's documentation uses


class _StepCounter:
    """A transformers streamer that counts `put` calls: one for the prompt, then one per target forward
    pass (plain greedy puts one token per pass, prompt lookup the accepted tokens plus one)."""

    def __init__(self) -> None:
        self.puts = 0

    def put(self, value) -> None:
        self.puts += 1

    def end(self) -> None:
        pass


_HF_MODELS: dict[str, object] = {}  # one PyTorch model per checkpoint, shared by hf and hf-lookup


class HFSystem(System):
    """Hugging Face transformers `generate`, PyTorch fp32 on the CPU; `lookup` = prompt lookup decoding."""

    def __init__(self, checkpoint: Path | None, eos_ids: set[int], lookup: int | None = None,
                 threads: int | None = None, source_sha256: str = "") -> None:
        self.checkpoint = checkpoint
        self.source_sha256 = source_sha256  # names the checkpoint when it was not found from the hash
        self.eos_ids = eos_ids
        self.lookup = lookup
        self.threads = threads
        self.name = "hf-lookup" if lookup else "hf"
        self.label = f"HF prompt lookup ({lookup})" if lookup else "HF transformers"
        self.mode = "prompt-lookup" if lookup else "ar"
        self.model = None

    def setup(self) -> None:
        for module in ("torch", "transformers"):
            if bench_systems.missing(module):
                raise Skip(f"{module} is not installed (pip install 'specexport[export]')")
        if self.checkpoint is None or not (self.checkpoint / "config.json").is_file():
            raise bench_systems.no_checkpoint(self.checkpoint, self.source_sha256)
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        if self.threads:
            torch.set_num_threads(self.threads)
        self.torch = torch
        key = str(self.checkpoint)
        if key not in _HF_MODELS:
            # local_files_only: the checkpoint is a directory on disk; never reach for a hub
            model = transformers.AutoModelForCausalLM.from_pretrained(key, dtype=torch.float32, local_files_only=True)
            _HF_MODELS[key] = model.eval()
        self.model = _HF_MODELS[key]
        self.note = (f"transformers {transformers.__version__}, torch {torch.__version__},"
                     f" threads: {torch.get_num_threads()}")

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
        torch = self.torch
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        counter = _StepCounter()
        # sampling knobs set to None: the checkpoint's generation_config may carry some, and greedy must
        # not warn about (or apply) them
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, streamer=counter,
                      attention_mask=torch.ones_like(ids), eos_token_id=sorted(self.eos_ids),
                      pad_token_id=min(self.eos_ids), temperature=None, top_k=None, top_p=None)
        if self.lookup:
            kwargs["prompt_lookup_num_tokens"] = self.lookup
        if self.ignore_eos:  # EOS held off until max_new_tokens: every run that long
            kwargs["min_new_tokens"] = max_new_tokens
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, **kwargs)
        seconds = time.perf_counter() - t0
        tokens, reason = strip_eos(out[0, len(prompt_ids):].tolist(), self.eos_ids, max_new_tokens)
        return RunResult(tokens, seconds, steps=max(counter.puts - 1, 0), finish_reason=reason)

    def close(self) -> None:
        self.model = None
        _HF_MODELS.pop(str(self.checkpoint), None)
