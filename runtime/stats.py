"""Per-generation counters: tokens/s, mean accepted tokens per step (tau), acceptance, time split."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Stats:
    mode: str = "ar"
    prompt_tokens: int = 0
    new_tokens: int = 0
    # 1 when an end-of-sequence token ended the answer: a step decoded it though nobody sees it, so tau counts it
    # (else AR's tau, one token a step by definition, reads below 1 on every answer that ends)
    eos_tokens: int = 0
    steps: int = 0  # target (deep) calls after the prefill: one per verification step
    drafted: int = 0
    accepted: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    lossy: bool = False
    extra: dict = field(default_factory=dict)
    # by draft position (index 0: a step's first drafted token): the steps that drafted a token there, and the
    # steps whose verification kept it
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list, repr=False)  # each step's seconds, drafting included

    def record_step(self, drafted: int, accepted: int, draft_s: float, verify_s: float,
                    depth: int | None = None) -> None:
        """One verification step; `depth` is how many positions its draft reaches when that is not `drafted`
        (a token tree's depth)."""
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.draft_s += draft_s
        self.verify_s += verify_s
        reach = max(drafted if depth is None else depth, accepted)
        if reach > len(self.drafted_at):
            self.drafted_at += [0] * (reach - len(self.drafted_at))
            self.accepted_at += [0] * (reach - len(self.accepted_at))
        for i in range(reach):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1
        self.step_s.append(draft_s + verify_s)

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
        """Tokens decoded per target step, the target's own token and an ending EOS included (1.00 for AR)."""
        return (self.new_tokens + self.eos_tokens) / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        del d["step_s"]  # one number a step: the totals above say what a summary needs
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
