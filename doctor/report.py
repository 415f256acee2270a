"""doctor.json (machine-readable) and doctor.md (for people), and the exit code they both record."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
from pathlib import Path

from .checks import FAILED, PASSED, SKIPPED, Check
from .probes import BAD, WARNING, Probe

SCHEMA = 1
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 3
EXIT_MEANINGS = {
    EXIT_OK: "every check ran and passed",
    EXIT_FAILED: "a check failed (or a version problem blocks a GPU path on this machine's GPU)",
    EXIT_USAGE: "usage error",
    EXIT_SKIPPED: "every check that ran passed, but some could not run here (no GPU, no TensorRT, no exporter"
                  " extra): each is named with the reason",
}


def exit_code(checks: list[Check]) -> int:
    statuses = {c.status for c in checks}
    if FAILED in statuses:
        return EXIT_FAILED
    if SKIPPED in statuses or not checks:
        return EXIT_SKIPPED
    return EXIT_OK


def _version() -> str | None:
    try:
        return importlib.metadata.version("specexport")
    except importlib.metadata.PackageNotFoundError:
        return None


def build_report(probes: list[Probe], checks: list[Check], gpu_paths: dict, subjects: dict, command: str) -> dict:
    code = exit_code(checks)
    count = {s: sum(c.status == s for c in checks) for s in (PASSED, FAILED, SKIPPED)}
    return {
        "schema": SCHEMA,
        "specexport": _version(),
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": {"platform": platform.platform(), "machine": platform.machine(),
                    "python": platform.python_version(), "cores": os.cpu_count()},
        "exit_code": code,
        "exit_meaning": EXIT_MEANINGS[code],
        "versions": [p.as_dict() for p in probes],
        "gpu_paths": gpu_paths,
        "subjects": subjects,
        "checks": [c.as_dict() for c in checks],
        "summary": {**count, "gpu_checks_run": sum(c.gpu and c.status != SKIPPED for c in checks),
                    "seconds": round(sum(c.seconds for c in checks), 2)},
    }


def _cell(text: object) -> str:
    return str(text if text not in (None, "") else "-").replace("|", "\\|").replace("\n", " ")


def render_markdown(report: dict) -> str:
    s = report["summary"]
    lines = [
        "# specexport doctor",
        "",
        f"{report['created_at']} · specexport {report['specexport']} · {report['machine']['platform']} ·"
        f" `{report['command']}`",
        "",
        f"**Exit {report['exit_code']}: {report['exit_meaning']}.** {s['passed']} passed, {s['failed']} failed,"
        f" {s['skipped']} skipped; {s['gpu_checks_run']} GPU check(s) ran ({s['seconds']} s in checks).",
        "",
        "## Versions",
        "",
        "| component | version | verdict | why |",
        "|---|---|---|---|",
    ]
    lines += [f"| {p['name']} | {_cell(p['version'])} | {p['verdict']} | {_cell(p['why'])} |"
              for p in report["versions"]]
    todo = [p for p in report["versions"] if p["verdict"] in BAD or p["verdict"] == WARNING]
    if todo:
        lines += ["", "To do:", ""] + [f"- **{p['name']}** ({p['verdict']}): {p['why']}" for p in todo]
    lines += ["", "## Checks", "", "| check | status | seconds | what | reason |", "|---|---|---|---|---|"]
    lines += [f"| {c['name']} | {c['status']} | {c['seconds']:.2f} | {_cell(c['what'])} | {_cell(c['reason'])} |"
              for c in report["checks"]]
    for name, subject in report["subjects"].items():
        blocked = subject.get("modes_not_applicable") or {}
        if blocked:
            lines += ["", f"Not checked on {name} ({subject['bundle']}): "
                      + "; ".join(f"{m} ({why})" for m, why in blocked.items()) + "."]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict) -> None:
    out = Path(out)
    (out / "doctor.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "doctor.md").write_text(render_markdown(report))
