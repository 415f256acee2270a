"""report.json, report.md (the tables) and report.png (speedup and τ per category) from a bench report."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from .ortgenai import PRECISIONS as GENAI_PRECISIONS
from .systems import missing


def _f(value, fmt: str = "{:.1f}", none: str = "–") -> str:
    return none if value is None else fmt.format(value)


def _flag(value, lossless: bool = True) -> str:
    # a specexport mode that differs from AR is a bug and stands out; a baseline differing is expected
    return "–" if value is None else ("yes" if value else "**no**" if lossless else "no")


def _length(settings: dict) -> str:
    if settings.get("ignore_eos"):
        return f"exactly {settings['max_new_tokens']} new tokens (EOS ignored)"
    return f"up to {settings['max_new_tokens']} new tokens"


def _systems(report: dict) -> list[str]:
    return [s for s in report["settings"]["systems"] if s in report["results"]]


def genai_best(report: dict) -> dict[str, dict]:
    """Each specexport system against ONNX Runtime GenAI at its best, per precision where both GenAI's AR
    (ortgenai-P) and its n-gram speculation (ortgenai-ngram-P) ran: on each question the faster of the two
    (tokens/s) is the yardstick, since either may win a question (n-gram lookup pays off where the answer
    copies the prompt and costs a little where it does not). precision -> {ar, ngram (the two system names),
    questions (those both ran), ngram_wins (of them, where n-gram was the faster), ratio: system -> median over
    the questions it ran too of its tokens/s / the faster GenAI's}."""
    records = report["records"]
    tps = {(r["system"], r["question_id"]): r["tokens_per_s"] for r in records if r["tokens_per_s"] is not None}
    spec = [s for s in report["settings"]["systems"]
            if report["systems"].get(s, {}).get("kind") == "specexport"]
    questions = list(dict.fromkeys(r["question_id"] for r in records))
    out: dict[str, dict] = {}
    for precision in GENAI_PRECISIONS:
        ar, ngram = f"ortgenai-{precision}", f"ortgenai-ngram-{precision}"
        best: dict = {}
        wins = 0
        for q in questions:
            a, n = tps.get((ar, q)), tps.get((ngram, q))
            if a is not None and n is not None:
                best[q] = max(a, n)
                wins += n > a
        if not best:
            continue
        ratio = {}
        for s in spec:
            ratios = [tps[(s, q)] / b for q, b in best.items() if (s, q) in tps and b > 0]
            if ratios:
                ratio[s] = statistics.median(ratios)
        out[precision] = {"ar": ar, "ngram": ngram, "questions": len(best), "ngram_wins": wins, "ratio": ratio}
    return out


def render_markdown(report: dict) -> str:
    results = report["results"]
    systems = _systems(report)
    labels = {s: report["systems"][s]["label"] for s in systems}
    st, m = report["settings"], report["machine"]
    ref_label = labels.get(st["reference"], st["reference"])
    n_q = results[systems[0]]["overall"]["questions"] if systems else 0
    lines = [
        f"# specexport bench: {report['bundle']['name']} ({report['bundle']['precision']})",
        "",
        f"{report['created']} · {m['cpu_model']}, {m['cores']} cores, threads per system: {st['threads']} ·"
        f" {n_q} questions of {question_set(st)}"
        f" ({'first ' + str(st['limit']) + ' per category' if st['limit'] else 'all'}),"
        f" first turn, chat template, prompts cut to their last {st['max_prompt_tokens']} tokens · greedy,"
        f" batch 1, {_length(st)} · tokens/s include the prefill; speedup is over"
        f" {ref_label} on the same question, systems interleaved per question · load average"
        f" {m.get('loadavg_start')} → {m.get('loadavg_end')}",
        "",
    ]
    if report["command"]:
        lines.extend([f"`{report['command']}`", ""])
    pearl = [labels[s] for s in systems if "pearl" in report["systems"][s].get("note", "").lower()]
    if pearl:
        pool = "per-session thread pools" if st.get("thread_pool") != "shared" else "the shared thread pool"
        lines.extend([f"PEARL ({', '.join(pearl)}) runs the drafter and `deep` side by side on two threads, so this"
                      f" run used {pool} for every system (the specexport commands otherwise share one pool);"
                      " the threads of PEARL's pieces are under Systems.", ""])
    lines.extend([
        "## Overall",
        "",
        "| system | tokens/s (median) | tokens/s (total) | speedup (median) | speedup (total) | speedup (Spec-Bench)"
        " | τ | acceptance | identical to AR |",
        "|---|---|---|---|---|---|---|---|---|",
    ])
    for s in systems:
        o = results[s]["overall"]
        lossless = report["systems"][s]["kind"] == "specexport"
        ident = _flag(o["identical_to_ar"], lossless) + f" ({o['identical_count']}/{o['questions']})"
        lines.append(f"| {labels[s]} | {_f(o['tokens_per_s'])} | {_f(o['tokens_per_s_total'])} |"
                     f" {_f(o['speedup'], '{:.2f}×')} | {_f(o['speedup_total'], '{:.2f}×')} |"
                     f" {_f(o['speedup_specbench'], '{:.2f}×')} |"
                     f" {_f(o['mean_accepted_tokens'], '{:.2f}')} | {_f(o['acceptance_rate'], '{:.1%}')} | {ident} |")
    side_by_side = (("ratio_to", "Side by side (median over questions of row tokens/s ÷ column tokens/s)"),
                    ("ratio_to_specbench", "Side by side, Spec-Bench's way (mean tokens/s of row ÷ mean of column,"
                                           " over the same questions)"))
    for key, title in side_by_side if len(systems) > 2 else ():
        lines.extend(["", f"## {title}", "",
                      "| | " + " | ".join(labels[s] for s in systems) + " |", "|---|" + "---|" * len(systems)])
        for s in systems:
            ratios = results[s]["overall"].get(key, {})
            cells = ["1" if other == s else _f(ratios.get(other), "{:.2f}×") for other in systems]
            lines.append(f"| {labels[s]} | " + " | ".join(cells) + " |")
    best = genai_best(report)
    rows = list(dict.fromkeys(s for b in best.values() for s in b["ratio"]))
    if rows:
        lines.extend(["", "## Against ONNX Runtime GenAI's best (per question the faster of its AR and its n-gram"
                      " speculation; median over questions of row tokens/s ÷ that)", "",
                      "| | " + " | ".join(f"GenAI best {p}" for p in best) + " |", "|---|" + "---|" * len(best)])
        for s in rows:
            lines.append(f"| {labels.get(s, s)} | "
                         + " | ".join(_f(b["ratio"].get(s), "{:.2f}×") for b in best.values()) + " |")
        lines.extend(["", "; ".join(f"GenAI best {p}: n-gram was the faster on {b['ngram_wins']} of"
                                    f" {b['questions']} questions" for p, b in best.items()) + "."])
    categories = st["categories"]

    def table(title: str, key: str, fmt: str, only: Sequence[str]) -> None:
        if not only:
            return
        lines.extend(["", f"## {title}", "", "| category | " + " | ".join(labels[s] for s in only) + " |",
                      "|---|" + "---|" * len(only)])
        lines.append("| overall | " + " | ".join(_f(results[s]["overall"][key], fmt) for s in only) + " |")
        for cat in categories:
            cells = [_f(results[s]["categories"].get(cat, {}).get(key), fmt) for s in only]
            lines.append(f"| {cat} | " + " | ".join(cells) + " |")

    table("tokens/s per category (median over questions)", "tokens_per_s", "{:.1f}", systems)
    others = [s for s in systems if s != st["reference"]]
    table(f"Speedup over {ref_label} per category (median over questions)", "speedup", "{:.2f}×", others)
    table(f"Speedup over {ref_label} per category, Spec-Bench's way (mean tokens/s ÷ {ref_label}'s mean)",
          "speedup_specbench", "{:.2f}×", others)
    table("Mean accepted tokens τ per category", "mean_accepted_tokens", "{:.2f}",
          [s for s in systems if results[s]["overall"]["mean_accepted_tokens"] is not None])
    spec = [s for s in systems if report["systems"][s]["kind"] == "specexport" and s != st["reference"]]
    if spec:
        bad = [f"{labels[s]} ({results[s]['overall']['identical_count']}/{results[s]['overall']['questions']})"
               for s in spec if not results[s]["overall"]["identical_to_ar"]]
        lines.extend(["", "Lossless check: " + ("every speculative output equals specexport AR's." if not bad
                      else "**outputs differ from specexport AR** for " + ", ".join(bad) + ".")])
    if report["skipped"]:
        lines.extend(["", "## Skipped", ""])
        lines.extend(f"- {name}: {reason}" for name, reason in report["skipped"].items())
    if report.get("errors"):
        lines.extend(["", "## Failed runs (each system went on with the next question)", ""])
        lines.extend(f"- {e['system']}, question {e['question_id']} ({e['category']}): {e['error']}"
                     for e in report["errors"])
    mem = report.get("memory")
    if mem:
        mb = 1e6
        lines.extend(["", "## Memory", ""])
        if mem.get("error"):
            lines.append(f"`specexport generate` failed: {mem['error']}")
        else:
            ratio = (f" = {mem['ratio']:.2f}× the fp32 weights on disk ({mem['weights_fp32_bytes'] / mb:.0f} MB)"
                     if mem.get("ratio") else "")
            lines.append(f"Peak resident memory of `specexport generate --mode {mem['mode']}`"
                         f" ({st['max_new_tokens']} new tokens): {mem['peak_rss_bytes'] / mb:.0f} MB{ratio};"
                         f" the bundle's files: {mem['bundle_bytes'] / mb:.0f} MB.")
    v = report["versions"]
    lines.extend(["", "## Versions", "", ", ".join(f"{k} {val}" for k, val in v.items()
                                                    if val and not isinstance(val, dict))])
    genai = v.get("ortgenai_env")
    if genai:
        lines.extend(["", "ONNX Runtime GenAI's interpreter: " + ", ".join(
            f"{k} {val}" for k, val in genai.items() if val and k != "executable")])
    lines.extend(["", "Systems: " + "; ".join(
        f"{labels[s]} = `{s}`" + (f" ({report['systems'][s]['note']})" if report["systems"][s]["note"] else "")
        for s in systems), ""])
    return "\n".join(lines)


def question_set(settings: dict) -> str:
    """What the questions were, for titles: Spec-Bench's file, the shipped prompts, or the file's name."""
    path = Path(settings.get("questions") or "")
    if path.name == "bench_prompts.jsonl":
        return "the shipped bench prompts"
    if path.name == "question.jsonl" or "spec_bench" in path.parts or "specbench" in str(path).lower():
        return "Spec-Bench"
    return path.name or "questions"


def render_chart(report: dict, path: Path) -> str | None:
    """Speedup and τ per category, all systems side by side, into `path`; returns why not, or None."""
    if missing("matplotlib"):
        return "matplotlib is not installed (pip install 'matplotlib>=3.8', or `make bench-env`)"
    import matplotlib.pyplot as plt

    fig = chart_figure(report)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def chart_figure(report: dict):
    """The chart as a matplotlib figure (render_chart saves it)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render straight to the file
    import matplotlib.pyplot as plt
    import numpy as np

    results = report["results"]
    systems = _systems(report)
    labels = {s: report["systems"][s]["label"] for s in systems}
    reference = report["settings"]["reference"]
    categories = report["settings"]["categories"]
    # "overall" is the one category's own figures where there is only one: drawn once, under its name
    cats = [*(["overall"] if len(categories) > 1 else []), *categories]
    colors = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(systems)}  # same colour in both panels

    def value(s: str, cat: str, key: str) -> float:
        block = results[s]["overall"] if cat == "overall" else results[s]["categories"].get(cat, {})
        v = block.get(key)
        return np.nan if v is None else v

    panels = [("speedup", f"Speedup over {labels.get(reference, reference)} (median over questions; higher is"
                          " faster)", systems),
              ("mean_accepted_tokens", "Mean accepted tokens τ per target forward pass (1 = autoregressive)",
               [s for s in systems if results[s]["overall"]["mean_accepted_tokens"] is not None])]
    # wide enough for 14 groups of six bars, narrow enough to read on a laptop screen without zooming
    fig, axes = plt.subplots(2, 1, figsize=(min(16.0, max(9.0, 0.95 * len(cats) + 3)), 9.5), constrained_layout=True)
    x = np.arange(len(cats))
    handles = {}
    for ax, (key, title, only) in zip(axes, panels, strict=True):
        width = 0.84 / max(len(only), 1)
        for j, s in enumerate(only):
            vals = [value(s, c, key) for c in cats]
            bars = ax.bar(x + (j - (len(only) - 1) / 2) * width, vals, width, label=labels[s], color=colors[s])
            handles.setdefault(s, bars)
            if len(cats) * len(only) <= 24:  # numbers on the bars only while they stay legible
                ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
        ax.axhline(1.0, color="black", linewidth=0.8)
        if cats[0] == "overall":
            ax.axvline(0.5, color="grey", linewidth=0.6, linestyle=":")  # 'overall' apart from the categories
        ax.set_xticks(x, cats, rotation=30, ha="right")
        ax.set_xlim(-0.6, len(cats) - 0.4)
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        top = np.nanmax([value(s, c, key) for s in only for c in cats] or [1.0])
        ax.set_ylim(0, max(1.2, float(top) * 1.12))
    st = report["settings"]
    fig.suptitle(f"{question_set(st)} · {report['bundle']['name']} ({report['bundle']['precision']}) ·"
                 f" {report['machine']['cpu_model']}, threads: {st['threads']} · greedy, {st['max_new_tokens']}"
                 " new tokens", fontsize=11)
    # one legend for both panels: a system keeps its colour in each; as many columns as fit the figure's width
    shown = [s for s in systems if s in handles]
    for ncols in range(min(len(shown), 6), 0, -1):
        legend = fig.legend([handles[s] for s in shown], [labels[s] for s in shown], loc="outside lower center",
                            ncols=ncols, fontsize=9, frameon=False)
        fig.canvas.draw()
        box, page = legend.get_window_extent(), fig.bbox
        if ncols == 1 or (box.x0 >= page.x0 and box.x1 <= page.x1):
            break
        legend.remove()
    return fig


def write_report(report: dict, out: Path) -> dict[str, Path | str]:
    """report.json, report.md and report.png in `out`; paths["png"] is the reason instead when no chart."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path | str] = {}
    note = render_chart(report, out / "report.png") if report["results"] else "no results to chart"
    report["chart"] = None if note else "report.png"
    if note:
        report["chart_note"] = note
    paths["png"] = note or out / "report.png"
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    md = render_markdown(report)
    md += f"\n_No chart: {note}._\n" if note else "\n![speedup and τ per category](report.png)\n"
    (out / "report.md").write_text(md)
    paths["json"] = out / "report.json"
    paths["md"] = out / "report.md"
    return paths
