"""tools/experiments/ar_profile.py on a tiny bundle: the parts of a decode token add up to its wall time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "experiments" / "ar_profile.py"


def test_ours_parts_sum_to_the_wall(tiny_bundles, tmp_path):
    out = tmp_path / "profile.json"
    # a process of its own: the tool sets ONNX Runtime's process-wide thread pool
    run = subprocess.run([sys.executable, str(TOOL), "ours", str(tiny_bundles()), "--tokens", "4", "--rounds", "1",
                          "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (result,) = json.loads(out.read_text())
    assert result["decode_tokens"] == 3
    parts = result["parts_ms"]
    wall = parts.pop("wall, all")
    # the rest is the wall less the timed calls: none may be counted twice or outside the decode tokens
    for part in ("ONNX Runtime run: shallow", "ONNX Runtime run: deep", "binding round the run (OrtPiece.run)",
                 "session's row padding (two-row wrapper)", "rest (decode loop, sampling, detokenizing)"):
        assert 0 <= parts[part] < wall, (part, parts)
    assert parts["ONNX Runtime run: deep"] > 0
    assert abs(sum(parts.values()) - wall) <= 1e-6 * wall
    ops = result["ops_ms"]
    assert ops["MatMul" if "MatMul" in ops else "MatMulNBits"]["all"] > 0
    # the nodes found inside the decode runs take no more than those runs
    assert all(v >= 0 for k, v in ops["(run outside its nodes)"].items() if k in ("shallow", "deep")), ops
    assert result["one_row_calls"] in ("graph", "attention", "session", "none")
    assert "### specexport" in run.stdout and "| ONNX Runtime run: deep |" in run.stdout


def test_a_path_that_is_no_bundle_is_refused(tmp_path):
    run = subprocess.run([sys.executable, str(TOOL), "ours", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert "not a specexport bundle" in run.stderr and "Traceback" not in run.stderr
