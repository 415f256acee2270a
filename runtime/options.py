"""A request's options, checked where they enter: `Session.options` (the Python API) and the CLI alike. Each
option is checked alone here (its type and range, and the bundle's limits); runtime/plan.py checks them
together and against what the bundle can run, and resolves them into the plan the decoder is built from.

Every problem is one sentence naming the option, raised as `OptionError`, which the CLI turns into exit 2
(a usage error, as click's own are) instead of the 1 of a failed run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from .choices import MODES, SCHEDULES, VERIFY_RULES
from .errors import SpecExportError
from .policies import PolicySpec
from .tree import TreeShape


class OptionError(SpecExportError):
    """An option's value is out of its range or of the wrong type: the caller's mistake, not the run's."""


@dataclass
class Options:
    max_new_tokens: int = 128
    mode: str = "auto"  # one of choices.MODES (runtime/assemble.py's table says who drafts)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    chat: bool = True
    system: str | None = None
    gamma: int | None = None  # speculative settings; None = the bundle's defaults
    eta: float | None = None
    policy: str | None = None  # draft length: fixed | confidence | entropy | goodput (runtime/policies.py)
    schedule: str = "sequential"  # sequential | pearl: drafter and verifier side by side (runtime/pearl.py)
    verify: str = "exact"  # exact | specdec (relaxed, greedy only; runtime/verification.py)
    beta: int | None = None  # specdec: a draft must be in the target's top beta ...
    tau: float | None = None  # ... and within tau nats of the top token's log-probability
    tree: str | None = None  # token-tree speculation with the drafter: a TreeShape spec (runtime/tree.py)
    # generate max_new_tokens whatever comes, EOS included (vLLM's ignore_eos): timing runs of equal length
    ignore_eos: bool = False


NAMES = tuple(f.name for f in fields(Options))


@dataclass(frozen=True)
class Parsed:
    """What `check_options` parsed from one set of option values, which the plan (runtime/plan.py) keeps. It
    rides on the Options object as an attribute, not a field, so `asdict(options)` stays the options."""

    values: tuple
    policy: PolicySpec
    tree: TreeShape | None


def parsed(opts: Options) -> Parsed | None:
    """What `check_options` parsed from these very values, or None if it has not seen them (options are plain
    fields a caller may change after the check)."""
    done = getattr(opts, "_parsed", None)
    return done if done is not None and done.values == _values(opts) else None


def _values(opts: Options) -> tuple:
    return tuple(getattr(opts, name) for name in NAMES)


@dataclass(frozen=True)
class Limits:
    """What a bundle allows: the context, and the most tokens one verification call may carry."""

    max_context: int
    verify_rows: int


def make_options(defaults: dict, overrides: dict, limits: Limits | None = None) -> Options:
    """The bundle's generation defaults, then the caller's overrides (None: keep the default), checked."""
    unknown = sorted(set(overrides) - set(NAMES))
    if unknown:
        raise OptionError(f"unknown option {unknown[0]!r}; the options are {', '.join(NAMES)}")
    base = {k: v for k, v in defaults.items() if k in NAMES}
    base.update({k: v for k, v in overrides.items() if v is not None})
    return check_options(Options(**base), limits)


def check_options(opts: Options, limits: Limits | None = None) -> Options:
    _number(opts.max_new_tokens, "max_new_tokens", integer=True, low=0)
    _number(opts.temperature, "temperature", low=0.0)
    _number(opts.top_k, "top_k", integer=True, low=0)
    _number(opts.top_p, "top_p")
    if not 0.0 < opts.top_p <= 1.0:
        raise OptionError(f"top_p {opts.top_p} is outside (0, 1]: it is the probability mass sampled from"
                          " (1.0 = off)")
    _number(opts.seed, "seed", integer=True, low=0)
    _choice(opts.mode, "mode", MODES)
    _choice(opts.schedule, "schedule", SCHEDULES)
    _choice(opts.verify, "verify", VERIFY_RULES)
    if not isinstance(opts.stop, (list, tuple)) or not all(isinstance(s, str) and s for s in opts.stop):
        raise OptionError("stop must be a list of non-empty strings")
    if not isinstance(opts.chat, bool):
        raise OptionError(f"chat must be true or false, not {opts.chat!r}")
    if not isinstance(opts.ignore_eos, bool):
        raise OptionError(f"ignore_eos must be true or false, not {opts.ignore_eos!r}")
    if opts.system is not None and not isinstance(opts.system, str):
        raise OptionError(f"system must be a string, not {opts.system!r}")
    if opts.gamma is not None:
        _number(opts.gamma, "gamma", integer=True, low=1)
    if opts.eta is not None:
        _number(opts.eta, "eta", low=0.0)
        if opts.eta > 1.0:
            raise OptionError(f"eta {opts.eta} is outside [0, 1]: it is the draft probability below which"
                              " drafting stops")
    if opts.beta is not None:
        _number(opts.beta, "beta", integer=True, low=1)
    if opts.tau is not None:
        _number(opts.tau, "tau", low=0.0)
    if opts.policy is not None:
        if not isinstance(opts.policy, str):
            raise OptionError(f"policy must be a string such as confidence:0.6, not {opts.policy!r}")
    policy = _as_option_error(lambda: PolicySpec.parse(opts.policy))
    shape = None
    if opts.tree is not None:
        shape = _as_option_error(lambda: TreeShape.parse(opts.tree))
        rows = 1 + shape.nodes + shape.lookup  # the root, the drafter's tokens, lookup's branch
        if limits is not None and rows > limits.verify_rows:
            raise OptionError(f"tree {opts.tree} verifies up to {rows} tokens in one call, more than this bundle's"
                              f" {limits.verify_rows}; give fewer NODES or a shorter LOOKUP")
    if limits is not None and opts.gamma is not None and opts.gamma + 1 > limits.verify_rows:
        raise OptionError(f"gamma {opts.gamma} verifies {opts.gamma + 1} tokens in one call, more than this"
                          f" bundle's {limits.verify_rows}; give a smaller gamma")
    opts._parsed = Parsed(_values(opts), policy, shape)
    return opts


def _number(value, name: str, integer: bool = False, low: float | None = None) -> None:
    kind = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or (not integer and not math.isfinite(value)):
        raise OptionError(f"{name} must be {'an integer' if integer else 'a finite number'}, not {value!r}")
    if low is not None and value < low:
        raise OptionError(f"{name} {value} is below its least value, {low:g}")


def _choice(value, name: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionError(f"unknown {name} {value!r}; use one of {', '.join(choices)}")


def _as_option_error(check):
    try:
        return check()
    except OptionError:
        raise
    except SpecExportError as exc:
        raise OptionError(str(exc)) from None
