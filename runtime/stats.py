"""Per-generation counters: tokens/s, mean accepted tokens per step (tau), acceptance, time split."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Stats:
    mode: str = "ar"
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # target (deep) calls after the prefill: one per verification step
    drafted: int = 0
    accepted: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    lossy: bool = False
    extra: dict = field(default_factory=dict)

    def record_step(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.draft_s += draft_s
        self.verify_s += verify_s

    @property
    def tokens_per_s(self) -> float:
        """New tokens over the whole call, prefill included (as Spec-Bench counts)."""
        total = self.prefill_s + self.decode_s
        return self.new_tokens / total if total > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens emitted per target step, the target's own token included (1.00 for AR)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, decode_tokens_per_s=self.decode_tokens_per_s,
                 mean_accepted_tokens=self.mean_accepted_tokens, acceptance_rate=self.acceptance_rate)
        return d

    def summary(self) -> str:
        parts = [f"{self.new_tokens} tokens", f"{self.tokens_per_s:.1f} tokens/s",
                 f"mean accepted tokens {self.mean_accepted_tokens:.2f}"]
        if self.drafted:
            parts.append(f"acceptance {self.acceptance_rate:.1%}")
            parts.append(f"draft {self.draft_s:.2f}s ({1e3 * self.draft_s / self.drafted:.2f} ms a drafted token)"
                         f" / verify {self.verify_s:.2f}s")
        parts.append(f"prefill {self.prefill_s:.2f}s")
        if self.extra.get("auto_steps"):  # which drafter the automatic choice used, step by step
            parts.append("steps " + " ".join(f"{k} {v}" for k, v in self.extra["auto_steps"].items() if v))
        if self.extra.get("screened"):
            parts.append(f"screen cut {self.extra['screen_cut']} of {self.extra['screened']} drafts")
        line = f"[{self.mode}] " + ", ".join(parts)
        return line + (" (LOSSY: relaxed verification)" if self.lossy else "")
