"""A request's options resolved once, against what its bundle can run, into a `Plan`: the mode that runs, its
token tree, schedule, draft-length policy and verification rule, with the bundle's defaults applied.

`options.py` checks each option alone (its type and range); `make_plan` checks them together and against the
bundle, so that the Python API, the CLI, the server and the bench refuse a request with the same sentence (an
OptionError), and `assemble.decoder` builds the loop from the plan without checking anything. The batch
scheduler resolves its requests with the same function, then refuses what batching cannot run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .context import DecodeContext
from .drafters import LOOKUP_MAX_TOKENS
from .manifest import SpeculativeDefaults
from .options import OptionError, Options, check_options, parsed
from .policies import GOODPUT_MODES
from .sampling import SamplingParams
from .tree import TreeShape, trees_supported
from .verification import SPECDEC_BETA, SPECDEC_TAU

DRAFTING_PIECES = ("adapter", "drafter", "head")
MODE_PIECES = {"self": ("adapter",), "model": ("drafter",), "head": ("head",), "hier": ("drafter", "adapter")}
PIECE_FIXES = {"adapter": "an adapter (`specexport build --adapter auto`)",
               "drafter": "a drafter (`specexport build --drafter DIR`, a same-tokenizer checkpoint)",
               "head": "a draft head (`specexport build --head DIR`, trained with `specexport train-head`)"}
TREE_GROWERS = {"model": "drafter", "head": "head"}  # mode -> the piece that grows its token trees
# mode -> the piece PEARL's drafter thread runs: the modes whose drafters draft one token at a time (OneByOne)
PEARL_MODES = {"self": "adapter", "model": "drafter", "head": "head"}
TREE_INPUT = "attention_bias"  # pieces built before token trees do not take it


@dataclass(frozen=True)
class Capabilities:
    """What a bundle can run: its drafting pieces, the modes whose pieces take token trees, and the recipe's
    speculative defaults."""

    root: Path  # for messages
    pieces: frozenset[str]  # the drafting pieces it has (DRAFTING_PIECES)
    tree_modes: frozenset[str]  # the modes of TREE_GROWERS whose pieces all take token trees
    speculative: SpeculativeDefaults

    @classmethod
    def of(cls, ctx: DecodeContext) -> Capabilities:
        """A loaded session's, read off its opened pieces."""
        p = ctx.pieces
        return cls(ctx.root, frozenset(n for n in DRAFTING_PIECES if getattr(p, n, None) is not None),
                   frozenset(m for m in TREE_GROWERS if trees_supported(p, m)), ctx.speculative)


@dataclass(frozen=True)
class Plan:
    """How one request decodes, resolved and checked: `assemble.decoder` builds its loop from this alone."""

    mode: str  # the mode that runs: the one asked for, except that PEARL runs auto as a drafter it has
    schedule: str  # sequential | pearl
    tree: TreeShape | None  # token-tree speculation's shape, or None for chains
    policy: str  # the draft-length policy's name (runtime/policies.py) ...
    policy_value: int | float  # ... and its number, the bundle's gamma or eta when the spec gives none
    verify: str  # exact | specdec
    beta: int | None  # specdec's top-beta and log-probability gap, defaults applied (None under exact)
    tau: float | None
    gamma: int  # most drafts per step, the bundle's unless given
    eta: float  # the draft probability below which drafting stops, the bundle's unless given
    lookup_tokens: int  # prompt lookup's most drafts: its own cap (its drafts cost nothing) unless gamma is given
    greedy: bool
    label: str  # the mode as the stats name it

    @property
    def lossy(self) -> bool:
        return self.verify != "exact"


def make_plan(opts: Options, caps: Capabilities, lookup_max: int = LOOKUP_MAX_TOKENS) -> Plan:
    """The plan for options on a bundle that can do `caps` (checked here unless `check_options` has: the plan
    keeps the policy and tree it parsed); whatever the bundle cannot run, or the options cannot run together,
    raises OptionError, one sentence."""
    done = parsed(opts) or parsed(check_options(opts))
    spec = caps.speculative
    gamma = spec.gamma if opts.gamma is None else opts.gamma
    eta = spec.eta if opts.eta is None else opts.eta
    greedy = SamplingParams(opts.temperature, opts.top_k, opts.top_p).greedy
    mode = opts.mode
    _check_pieces(mode, caps)
    tree = _tree(opts, greedy, caps, done.tree) if opts.tree is not None else None
    if mode == "ar" and opts.verify != "exact":
        raise OptionError(f"verify {opts.verify} judges drafts, and mode ar drafts nothing; use a speculative"
                          " mode such as mode auto")
    if opts.schedule == "pearl":
        if opts.verify != "exact":
            raise OptionError(f"schedule pearl is lossless only; verify {opts.verify} needs schedule sequential")
        mode = _pearl_mode(mode, caps)
    if opts.verify == "specdec" and not greedy:
        raise OptionError("verify specdec is for greedy decoding only (under sampling it would change the"
                          " distribution); use temperature 0 or verify exact")
    policy, value = done.policy.resolve(gamma, eta)
    if policy == "goodput" and mode != "ar" and mode not in GOODPUT_MODES:
        raise OptionError(f"the goodput policy has a cost model for modes {', '.join(GOODPUT_MODES)}, not {mode};"
                          " use another policy or one of those modes")
    specdec = opts.verify == "specdec"
    label = (f"{mode}-tree{opts.tree}" if tree is not None else f"{mode}, pearl" if opts.schedule == "pearl"
             else mode)
    return Plan(mode, opts.schedule, tree, policy, value, opts.verify,
                (SPECDEC_BETA if opts.beta is None else opts.beta) if specdec else None,
                (SPECDEC_TAU if opts.tau is None else opts.tau) if specdec else None,
                gamma, eta, opts.gamma or lookup_max, greedy, label)


def _check_pieces(mode: str, caps: Capabilities) -> None:
    missing = [p for p in MODE_PIECES.get(mode, ()) if p not in caps.pieces]
    if missing:
        raise OptionError(f"bundle {caps.root} has no {' or '.join(missing)} piece, so mode {mode} is not"
                          f" available; rebuild it with {' and '.join(PIECE_FIXES[p] for p in missing)}, or use"
                          " mode auto (it uses what the bundle has)")


def _tree(opts: Options, greedy: bool, caps: Capabilities, shape: TreeShape) -> TreeShape:
    if opts.mode not in TREE_GROWERS:
        raise OptionError(f"tree grows its trees with the bundle's drafter piece or its draft head, so it needs"
                          f" mode model or mode head (not {opts.mode})")
    if opts.schedule != "sequential" or opts.verify != "exact" or opts.policy:
        raise OptionError("tree sets its own draft shape and verifies exactly: drop schedule, verify and policy,"
                          " or drop tree")
    if not greedy:
        raise OptionError("tree verifies greedy decoding only; drop temperature (or set it to 0), or drop tree")
    if opts.mode not in caps.tree_modes:
        raise OptionError(f"bundle {caps.root} predates token trees (its pieces take no {TREE_INPUT}); rebuild"
                          " it with `specexport build` to use tree")
    return shape


def _pearl_mode(mode: str, caps: Capabilities) -> str:
    """The mode PEARL runs: auto becomes the self-draft (or, lacking an adapter, the drafter piece, then the head)."""
    if mode == "auto":
        ran = next((m for m, piece in PEARL_MODES.items() if piece in caps.pieces), None)
        if ran is None:
            raise OptionError("schedule pearl needs a drafter to run beside deep, and this bundle has no adapter or"
                              " drafter piece; rebuild it with one or use schedule sequential")
        return ran
    if mode not in PEARL_MODES:
        raise OptionError(f"schedule pearl drafts one token at a time on a thread of its own, which modes"
                          f" {', '.join(PEARL_MODES)} do, not {mode}; use schedule sequential")
    return mode
