"""KV-cache bytes a decode step moves on a TensorRT target, against the position: a CPU-side calculation from
the pieces' cache shapes and the target's context and precision.

Per layer and call, with C the bound cache (keys and values, kv_heads x slots x head_dim each):
* swap (TensorRT before 10.15): the graph reads `past_*` and writes the whole `present_*` copy with the new
  entries scattered in, then attention reads it: 3 C. Bound at the full context (before) or at the bucket
  that holds the position (after, runtime/backends/buckets.py).
* in place (TensorScatter, TensorRT 10.15+): the new entries are written where they live and attention reads
  the cache: C + the call's own entries, at the full context.
A decode step is one call of each output-path piece (`shallow`, `deep`) at two rows (exporter/multirow.py).
"""

from __future__ import annotations

from ...runtime.backends.buckets import bucket
from ...runtime.manifest import Piece

ROWS = 2  # a decode call's rows (the one-row call's copy)


def cache_layers(pieces: dict[str, Piece]) -> dict[str, tuple[int, int, int]]:
    """Per output-path piece: (layers, kv_heads, head_dim) from its `past_key.*` inputs in the manifest."""
    out = {}
    for name in ("shallow", "deep"):
        spec = pieces.get(name)
        keys = [t for t in (spec.inputs if spec else ()) if t.name.startswith("past_key.")]
        if keys:
            out[name] = (len(keys), int(keys[0].shape[1]), int(keys[0].shape[3]))
    return out


def step_bytes(layers: dict[str, tuple[int, int, int]], itemsize: int, position: int, context: int) -> dict:
    """KV bytes one decode step at `position` moves: swap at the full context, swap bucketed, in place."""
    out = {"swap, whole context": 0, "swap, bucketed": 0, "in place (10.15+)": 0}
    slots_now = bucket(position + ROWS, context)
    for n_layers, kv_heads, head_dim in layers.values():
        per_slot = 2 * kv_heads * head_dim * itemsize  # keys and values
        out["swap, whole context"] += n_layers * 3 * per_slot * context
        out["swap, bucketed"] += n_layers * 3 * per_slot * slots_now
        out["in place (10.15+)"] += n_layers * per_slot * (context + ROWS)
    return out


def table(pieces: dict[str, Piece],
          targets: list[dict], positions: tuple[int, ...] = (0, 100, 500, 1000, 2000, 4000)) -> str:
    """A Markdown table of MB per decode step against position, per target."""
    layers = cache_layers(pieces)
    lines = ["| target | position | swap, whole context (MB) | swap, bucketed (MB) | in place, 10.15+ (MB) |",
             "|---|---|---|---|---|"]
    for target in targets:
        build = target["build"]
        context, itemsize = int(build["max_context"]), 2 if build["precision"] == "fp16" else 4
        for position in positions:
            if position + ROWS > context:
                continue
            mb = {k: v / 1e6 for k, v in step_bytes(layers, itemsize, position, context).items()}
            lines.append(f"| {target['name']} | {position} | {mb['swap, whole context']:.1f} |"
                         f" {mb['swap, bucketed']:.1f} | {mb['in place (10.15+)']:.1f} |")
    return "\n".join(lines)
