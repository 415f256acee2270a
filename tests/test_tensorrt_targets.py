"""TensorRT targets (recipes/targets/*.toml) and the operator matrix they point at (recipes/data/trt_ops.json)."""

from __future__ import annotations

import pytest
from specexport.exporter.tensorrt.targets import available_targets, describe, load_target, matrix_version, ops_matrix
from specexport.runtime.errors import SpecExportError


def test_the_four_targets_and_their_facts():
    assert {"orin-nano", "agx-orin", "thor", "rtx-4090"} <= set(available_targets())
    nano, agx, thor, desk = (load_target(n) for n in ("orin-nano", "agx-orin", "thor", "rtx-4090"))
    for jp6 in (nano, agx):
        assert jp6["tensorrt"]["version"] == "10.3" and jp6["tensorrt"]["compute_capability"] == "8.7"
        assert jp6["tensorrt"]["sm"] == "sm_87" and jp6["software"]["cuda"] == "12.6"
    assert nano["software"]["python"] == "3.10"
    assert thor["tensorrt"]["version"] == "10.13" and thor["tensorrt"]["sm"] == "sm_110"
    assert thor["software"]["cuda"] == "13.0" and thor["software"]["jetpack"] == "7.0"
    assert desk["tensorrt"]["compute_capability"] == "8.9" and desk["tensorrt"]["matrix"] == "10.15"
    for t in (nano, agx, thor, desk):
        b = t["build"]
        assert b["precision"] == "fp16" and b["max_context"] >= 2048 and b["max_batch"] >= 1
        assert 0 <= b["builder_optimization_level"] <= 5 and b["workspace_mib"] > 0
        assert t["memory"]["budget"]
        lo, hi = t["tensorrt"]["parses_opsets"]
        assert lo <= t["tensorrt"]["opset"] <= hi
    # in place where the TensorRT version parses TensorScatter (10.15), the two-buffer swap where it does not
    for swap in (nano, agx, thor):
        assert swap["build"]["kv_update"] == "swap" and swap["tensorrt"]["opset"] == 17
    assert desk["build"]["kv_update"] == "inplace" and desk["tensorrt"]["opset"] == 24
    assert nano["tensorrt"]["parses_opsets"] == [9, 20] and thor["tensorrt"]["parses_opsets"] == [9, 22]
    # the 8 GB Orin Nano shares its memory with the CPU: its workspace cap is the lowest
    assert nano["build"]["workspace_mib"] <= 512 < agx["build"]["workspace_mib"]
    assert "orin-nano" in describe(nano) and "sm_87" in describe(nano)


def test_aliases_and_paths(tmp_path):
    assert load_target("jetpack6")["name"] == "orin-nano"
    assert load_target("jetpack7")["name"] == "thor"
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\n[tensorrt]\nversion = "10.3.0.30"\ncompute_capability = "8.7"\n'
                    '[build]\nmax_context = 1024\nworkspace_mib = 256\n')
    mine = load_target(str(path))
    assert mine["name"] == "mine" and mine["tensorrt"]["matrix"] == "10.3"
    assert mine["build"]["max_batch"] == 1 and mine["build"]["prefill_opt"] == 256
    assert mine["build"]["kv_update"] == "swap" and mine["tensorrt"]["opset"] == 17  # auto on 10.3: swap
    newer = tmp_path / "newer.toml"
    newer.write_text('[tensorrt]\nversion = "10.15.1"\ncompute_capability = "12.0"\n'
                     '[build]\nmax_context = 1024\nworkspace_mib = 256\n')
    assert load_target(str(newer))["build"]["kv_update"] == "inplace"  # auto on 10.15: in place
    assert load_target(str(newer))["tensorrt"]["opset"] == 24


def test_unknown_target_names_the_available_ones():
    with pytest.raises(SpecExportError) as exc:
        load_target("xavier-nx")
    message = str(exc.value)
    assert "unknown TensorRT target 'xavier-nx'" in message
    for name in ("agx-orin", "orin-nano", "rtx-4090", "thor", "jetpack6"):
        assert name in message


@pytest.mark.parametrize("body, words", [
    ('[tensorrt]\nversion = "10.3"\ncompute_capability = "8.7"\n[build]\nmax_context = 1\nworkspace_mib = 1\n'
     'precision = "fp32"\n', "precision 'fp32'"),
    ('[tensorrt]\nversion = "10.3"\n[build]\nmax_context = 1\nworkspace_mib = 1\n', "compute_capability"),
    ('[tensorrt]\nversion = "9.2"\ncompute_capability = "8.7"\n[build]\nmax_context = 8\nworkspace_mib = 1\n',
     "TensorRT 9.2 has no operator matrix"),
    ('[tensorrt]\nversion = "10.3"\ncompute_capability = "sm87"\n[build]\nmax_context = 8\nworkspace_mib = 1\n',
     "compute_capability must look like"),
    ('[tensorrt]\nversion = "10.13"\ncompute_capability = "11.0"\n[build]\nmax_context = 8\nworkspace_mib = 1\n'
     'kv_update = "inplace"\n', r"TensorScatter \(TensorRT 10\.15 and later\) but the target runs TensorRT 10\.13"),
    ('[tensorrt]\nversion = "10.3"\ncompute_capability = "8.7"\nopset = 24\n[build]\nmax_context = 8\n'
     'workspace_mib = 1\n', "opset is 24, but swap KV updates are exported at opset 17"),
    ('[tensorrt]\nversion = "10.3"\ncompute_capability = "8.7"\n[build]\nmax_context = 8\nworkspace_mib = 1\n'
     'kv_update = "ring"\n', "kv_update 'ring'"),
    ('[tensorrt]\nversion = "10.3"\ncompute_capability = "8.7"\nprecisions = ["fp16", "int4"]\n[build]\n'
     'max_context = 8\nworkspace_mib = 1\n', "lists int4, but TensorRT 10.3 parses opsets up to 20"),
    ('[tensorrt]\nversion = "10.13"\ncompute_capability = "11.0"\nprecisions = ["fp8"]\n[build]\nmax_context = 8\n'
     'workspace_mib = 1\n', r"precisions = \['fp8'\]; list some of fp16, int8, int4"),
])
def test_bad_target_files_say_what_is_wrong(tmp_path, body, words):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(SpecExportError, match=words):
        load_target(str(path))


def test_matrix_cites_its_source_and_dates_operators():
    m = ops_matrix()
    repos = {(s["repository"], s["file"]) for s in m["sources"]}
    assert ("onnx/onnx-tensorrt", "docs/operators.md") in repos
    assert ("onnx/onnx-tensorrt", "docs/Changelog.md") in repos
    assert any("10.15" in s["version"] for s in m["sources"])
    assert set(m["versions"]) == {"10.3", "10.13", "10.15"}
    ops = m["operators"]
    for late, since in (("RMSNormalization", "10.15"), ("RotaryEmbedding", "10.15"), ("TensorScatter", "10.15"),
                        ("Attention", "10.14")):
        assert ops[late]["since"] == since
    topk = {r["check"]: r for r in ops["TopK"]["restrictions"]}
    assert topk["input_below"]["limit"] == 3840
    for gone in ("SequenceAt", "OptionalHasElement", "Unique", "BitShift", "MatMulInteger", "DynamicQuantizeLinear"):
        assert gone in m["unsupported"]
    assert "com.microsoft" in m["domains"]
    assert matrix_version("10.3.0.30") == "10.3" and matrix_version("10.13.3") == "10.13"


@pytest.mark.parametrize(("target", "precision", "fragment"), [
    ("orin-nano", "int4", "target orin-nano's TensorRT 10.3 builds fp16 and int8 pieces, not int4 (INT4 weight-only"
                          " graphs need opset 21, blocked DequantizeLinear, and it parses up to 20); use --precision"
                          " fp16 or int8"),
    ("thor", "fp32", "target thor's TensorRT 10.13 builds fp16, int8 and int4 pieces, not fp32"),
])
def test_a_precision_the_target_lacks_is_refused_before_anything_is_written(tmp_path, target, precision, fragment):
    from .test_cli import assert_one_sentence_error, cli

    out = tmp_path / "b"
    proc = cli("build", "--backend", "tensorrt", "--target", target, "--precision", precision, "--plan-only",
               "--out", str(out))
    assert_one_sentence_error(proc, fragment)
    assert not out.exists() and not list(tmp_path.iterdir())
