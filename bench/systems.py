"""The systems `specexport bench` times: the interface, and the bundle's own modes.

Every system takes the same prompt token ids (tokenized once by the bundle) and returns a RunResult:
new token ids without the EOS, the wall time of the call, and the step counts it can expose. The Hugging
Face baselines need PyTorch, so they live with the exporter (exporter/hf_baseline.py).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .metrics import RunResult

if TYPE_CHECKING:
    from ..runtime.session import Session

class Skip(Exception):
    """A system cannot run here; the message says why, in one sentence."""


def missing(module: str) -> bool:
    """True when `module` cannot be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def no_checkpoint(checkpoint: Path | None, source_sha256: str) -> Skip:
    """Why a baseline that starts from the bundle's source checkpoint cannot run: the checkpoint given has no
    config.json, or none was found from the source's hash (and where it was looked for)."""
    if checkpoint is not None:
        return Skip(f"the bundle's source checkpoint {checkpoint} is not on this machine (no config.json there);"
                    " rebuild the bundle here with `specexport build`")
    from ..exporter.model_source import missing_checkpoint

    return Skip(missing_checkpoint(source_sha256))


def strip_eos(tokens: Iterable[int], eos_ids: set[int], limit: int) -> tuple[list[int], str]:
    """New tokens up to (not including) the first EOS, at most `limit`; and why they ended."""
    out = []
    for t in tokens:
        if t in eos_ids:
            return out, "eos"
        out.append(int(t))
        if len(out) >= limit:
            break
    return out, "length"


class System:
    """One contestant. `setup` is untimed and raises Skip when the system cannot run here."""

    name = "system"
    label = "system"
    kind = "baseline"
    mode = "ar"
    precision = "fp32"
    note = ""
    ignore_eos = False  # generate max_new_tokens past any EOS (bench --ignore-eos: runs of equal length)

    def setup(self) -> None:
        """Load what the system needs; raise Skip with a reason if it cannot run."""

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
        raise NotImplementedError

    def close(self) -> None:
        """Free what `setup` loaded."""

    def describe(self) -> dict:
        return {"label": self.label, "kind": self.kind, "mode": self.mode, "precision": self.precision,
                "note": self.note}


class SpecExportSystem(System):
    """One decoding mode of the bundle's runtime session (greedy), optionally with a schedule and a
    draft-length policy (then named specexport-MODE-SCHEDULE-POLICY)."""

    kind = "specexport"

    def __init__(self, session: Session, mode: str, threads: int | None = None, schedule: str | None = None,
                 policy: str | None = None, note: str | None = None, tree: str | None = None) -> None:
        self.session = session
        self.mode, self.schedule, self.policy, self.tree = mode, schedule, policy, tree
        variant = [schedule or "sequential", policy or "confidence"] if schedule or policy else []
        if tree:
            variant = [f"tree{tree}"]
        self.name = "-".join(["specexport", mode, *variant])
        self.label = "specexport AR" if mode == "ar" else " · ".join([f"specexport {mode}", *variant])
        self.precision = session.bundle.manifest.precision
        self.note = note or (f"ONNX Runtime, intra-op threads: {threads}" if threads else "ONNX Runtime")
        self.note += f"; one-token calls {session.one_row_calls_note}"

    def options(self) -> dict:
        """The session options this system runs with (but the length)."""
        return dict(mode=self.mode, temperature=0.0, top_k=0, top_p=1.0, schedule=self.schedule, policy=self.policy,
                    tree=self.tree, ignore_eos=self.ignore_eos)

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
        t0 = time.perf_counter()
        g = self.session.generate_ids(prompt_ids, max_new_tokens=max_new_tokens, **self.options())
        seconds = time.perf_counter() - t0
        s = g.stats
        # drafted/accepted are 0 for AR; make_record turns "nothing drafted" into a null acceptance rate
        return RunResult(list(g.tokens), seconds, steps=s.steps, drafted=s.drafted, accepted=s.accepted,
                         finish_reason="eos" if g.finish_reason == "eos" else "length",
                         auto_steps=s.extra.get("auto_steps"))
