"""The TensorRT build plan (profiles, builder settings, trtexec scripts, the manifest section) and the pure
runtime guards: engine compatibility, profile selection, KV binding mode."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner
from specexport.exporter.tensorrt.plan import plan_tensorrt, shape_tensor_inputs, trtexec_args
from specexport.runtime.backends.tensorrt import check_engine_compat, kv_binding_mode, select_profile
from specexport.runtime.bundle import load_bundle, read_manifest
from specexport.runtime.errors import SpecExportError

from .test_tensorrt_fp16 import CONTEXT, make_tiny_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_checkpoint):
    return make_tiny_bundle(tmp_path_factory.mktemp("plan") / "b", tiny_checkpoint)


@pytest.fixture()
def fresh(bundle, tmp_path):
    out = tmp_path / "b"
    shutil.copytree(bundle, out)
    return out


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def test_plan_profiles_and_section(fresh):
    section = plan_tensorrt(fresh, read_manifest(fresh).pieces, "orin-nano")
    assert section["engines"] == [] and section["context"] == CONTEXT
    assert section["target"]["name"] == "orin-nano" and section["target"]["compute_capability"] == "8.7"
    assert section["target"]["tensorrt_version"] == "10.3" and section["opcheck"]["ok"]
    b = section["builder"]
    assert b["strongly_typed"] and b["precision"] == "fp16" and b["workspace_mib"] == 512
    assert b["builder_optimization_level"] == 3 and b["timing_cache"] == "tensorrt/timing.cache"
    assert b["hardware_compatibility"] == "none" and b["version_compatible"] is False
    assert set(section["plan"]) == {"shallow", "deep", "adapter"}

    deep = section["plan"]["deep"]
    assert deep["engine"] == "tensorrt/deep.engine" and deep["onnx"] == "deep.onnx"
    assert deep["shape_tensors"] == ["logits_to_keep"] and section["plan"]["shallow"]["shape_tensors"] == []
    prefill, decode, verify = deep["profiles"]
    assert [p["name"] for p in deep["profiles"]] == ["prefill", "decode", "verify"]
    hidden = 64
    assert prefill["shapes"]["hidden_in"] == {"min": [1, 1, hidden], "opt": [1, CONTEXT, hidden],
                                              "max": [1, CONTEXT, hidden]}  # prefill_opt 256 capped at 128
    assert decode["shapes"]["hidden_in"] == {"min": [1, 1, hidden], "opt": [1, 1, hidden], "max": [1, 1, hidden]}
    assert verify["shapes"]["hidden_in"] == {"min": [1, 1, hidden], "opt": [1, 7, hidden], "max": [1, 16, hidden]}
    for prof in deep["profiles"]:  # the caches are preallocated at the full context: cache_len never varies
        kv = prof["shapes"]["past_key.0"]
        assert kv["min"] == kv["opt"] == kv["max"] == [1, 2, CONTEXT, 16]
        assert prof["shapes"]["position_ids"]["max"][1] == prof["shapes"]["hidden_in"]["max"][1]
        assert "logits_to_keep" not in prof["shapes"]
    assert prefill["values"]["logits_to_keep"] == {"min": [1], "opt": [1], "max": [16]}
    assert decode["values"]["logits_to_keep"] == {"min": [1], "opt": [1], "max": [1]}
    assert verify["values"]["logits_to_keep"] == {"min": [1], "opt": [7], "max": [16]}
    shallow = section["plan"]["shallow"]["profiles"][0]["shapes"]
    assert shallow["input_ids"]["max"] == [1, CONTEXT] and not section["plan"]["shallow"]["profiles"][0]["values"]


def test_trtexec_scripts(fresh):
    section = plan_tensorrt(fresh, read_manifest(fresh).pieces, "orin-nano")
    script = fresh / "tensorrt" / "build_deep.sh"
    assert os.access(script, os.X_OK) and (fresh / "tensorrt" / "build_all.sh").is_file()
    text = script.read_text()
    assert text.startswith("#!/bin/sh") and "TensorRT 10.3" in text and 'cd "$(dirname "$0")/.."' in text
    args = [a.strip().rstrip("\\").strip() for a in text.split('"$TRTEXEC" \\\n', 1)[1].splitlines() if a.strip()]
    assert args == trtexec_args(section["plan"]["deep"], section["builder"])
    for flag in ("--onnx=deep.onnx", "--saveEngine=tensorrt/deep.engine", "--stronglyTyped",
                 "--memPoolSize=workspace:512M", "--builderOptimizationLevel=3",
                 "--timingCacheFile=tensorrt/timing.cache", "--skipInference", "--profile=0", "--profile=2"):
        assert flag in args, flag
    assert "--fp16" not in text  # strongly typed: the precision is in the ONNX file (TensorRT 11 has no flag)
    assert args.count("--profile=1") == 1
    decode = args[args.index("--profile=1") + 1: args.index("--profile=2")]
    assert decode[0].startswith("--minShapes=") and "hidden_in:1x1x64" in decode[0]
    assert "past_key.0:1x2x128x16" in decode[2] and "logits_to_keep:1" in decode[2]  # a shape tensor's value
    verify_max = args[-1]
    assert verify_max.startswith("--maxShapes=") and "hidden_in:1x16x64" in verify_max
    assert "logits_to_keep:16" in verify_max
    assert section["plan"]["deep"]["trtexec"].startswith("trtexec --onnx=deep.onnx")
    assert set(section["files"]) == {"tensorrt/build_shallow.sh", "tensorrt/build_deep.sh",
                                     "tensorrt/build_adapter.sh", "tensorrt/build_all.sh"}


def test_desktop_target_flags(fresh, tmp_path):
    target = tmp_path / "ampere.toml"
    target.write_text('name = "any-ampere"\n[tensorrt]\nversion = "10.15"\ncompute_capability = "8.6"\n'
                      '[build]\nmax_context = 4096\nworkspace_mib = 1024\nmax_batch = 4\n'
                      'hardware_compatibility = "ampere+"\nversion_compatible = true\nbuilder_optimization_level = 5\n')
    section = plan_tensorrt(fresh, read_manifest(fresh).pieces, str(target))
    args = trtexec_args(section["plan"]["shallow"], section["builder"])
    assert "--hardwareCompatibilityLevel=ampere+" in args and "--versionCompatible" in args
    assert "--builderOptimizationLevel=5" in args
    prefill, decode, verify = section["plan"]["shallow"]["profiles"]
    assert prefill["shapes"]["input_ids"]["max"][0] == 1  # prefill stays at batch 1
    assert decode["shapes"]["input_ids"]["max"][0] == verify["shapes"]["input_ids"]["max"][0] == 4


def test_plan_refuses_what_tensorrt_cannot_build(tmp_path, tiny_checkpoint, fresh):
    ort = make_tiny_bundle(tmp_path / "ort", tiny_checkpoint, flavour="ort", precision="fp32", adapter=False)
    with pytest.raises(SpecExportError, match=r"cannot parse .*GroupQueryAttention"):
        plan_tensorrt(ort, read_manifest(ort).pieces, "orin-nano")
    assert not (ort / "tensorrt").exists()  # nothing written when the check fails
    fp32 = make_tiny_bundle(tmp_path / "fp32", tiny_checkpoint, precision="fp32", adapter=False)
    with pytest.raises(SpecExportError, match="is fp32, target orin-nano builds fp16"):
        plan_tensorrt(fp32, read_manifest(fp32).pieces, "orin-nano")
    with pytest.raises(SpecExportError, match="plans at most 2048"):
        plan_tensorrt(fresh, read_manifest(fresh).pieces, "orin-nano", context=4096)


def test_the_plan_counts_each_engine_s_memory_and_refuses_what_does_not_fit(fresh, tmp_path):
    """Weights per engine are its graph's tensors (a table two pieces share on disk is in both engines), the
    caches are the manifest's shapes at the planned context, two buffers each where they swap; a device too small
    for the total is refused in one sentence before a script is written."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    manifest = read_manifest(fresh)
    section = plan_tensorrt(fresh, manifest.pieces, "orin-nano")
    memory = section["memory"]
    for name, spec in manifest.pieces.items():
        weights = sum(numpy_helper.to_array(t).nbytes for t in onnx.load(str(fresh / spec.file)).graph.initializer)
        assert memory["pieces"][name]["weights"] >= weights > 0, name  # the graphs' constants on top
    deep = manifest.pieces["deep"]
    past = [t for t in deep.inputs if t.name.startswith("past_")]
    one = past[0].shape[1] * CONTEXT * past[0].shape[3] * np.dtype(past[0].dtype).itemsize  # batch 1
    assert memory["pieces"]["deep"]["kv_caches"] == len(past) * one * 2  # swap: two buffers per cache
    assert memory["total"] == sum(sum(p.values()) for p in memory["pieces"].values())
    assert memory["system"] == 2 * 2**30 and memory["left"] == 8 * 2**30 - memory["system"] - memory["total"]

    small = tmp_path / "small.toml"
    small.write_text('name = "tiny-device"\n[tensorrt]\nversion = "10.3"\ncompute_capability = "8.7"\n'
                     '[build]\nmax_context = 2048\nworkspace_mib = 64\n'
                     f'[memory]\ntotal_gib = {memory["total"] / 2**30 * 1.5:.6f}\n'
                     f'system_gib = {memory["total"] / 2**30:.6f}\n')
    shutil.rmtree(fresh / "tensorrt", ignore_errors=True)
    with pytest.raises(SpecExportError, match=r"more than the .* GiB target tiny-device has beside its system") as e:
        plan_tensorrt(fresh, manifest.pieces, str(small))
    assert ". " not in str(e.value).rstrip(".") and not (fresh / "tensorrt").exists()


def test_engines_plan_command_rewrites_a_verifiable_manifest(fresh):
    from specexport.cli.main import main
    from specexport.cli.tensorrt import register

    register(main)
    runner = CliRunner()
    result = runner.invoke(main, ["engines", "plan", str(fresh), "--target", "thor"])
    assert result.exit_code == 0, result.output
    manifest = _manifest(fresh)
    assert manifest["tensorrt"]["target"]["name"] == "thor" and manifest["tensorrt"]["engines"] == []
    assert "tensorrt/build_deep.sh" in manifest["files"]
    load_bundle(fresh)  # every checksum, the scripts' included, still verifies
    listed = runner.invoke(main, ["engines", "list", str(fresh)])
    assert "target thor: TensorRT 10.13" in listed.output and "deep: profiles prefill, decode, verify; not built" \
        in listed.output
    build = runner.invoke(main, ["engines", "build", str(fresh)])
    assert build.exit_code == 1
    assert "TensorRT" in build.output or "GPU" in build.output  # one sentence: no TensorRT / no GPU here


def test_shape_tensor_analysis(fresh):
    import onnx

    model = onnx.load(str(fresh / "deep.onnx"), load_external_data=False)
    assert shape_tensor_inputs(model) == ["logits_to_keep"]  # position_ids only indexes data


# -- pure runtime guards ----------------------------------------------------------------------------

ENGINE = {"file": "tensorrt/deep.engine", "tensorrt_version": "10.3.0.30", "compute_capability": "8.7",
          "hardware_compatibility": "none", "version_compatible": False}


@pytest.mark.parametrize("trt_version, cc", [("10.3.0.30", "8.7"), ("10.3.0", "8.7")])
def test_compat_accepts_the_same_tensorrt_and_gpu(trt_version, cc):
    check_engine_compat(ENGINE, trt_version, cc)


@pytest.mark.parametrize("trt_version, cc", [("10.3.0.31", "8.7"), ("10.7.0.23", "8.7"), ("10.3.0.30", "8.9"),
                                             ("10.13.3.9", "11.0"), ("9.3.0", "8.7")])
def test_compat_refuses_another_tensorrt_or_gpu(trt_version, cc):
    with pytest.raises(SpecExportError) as exc:
        check_engine_compat(ENGINE, trt_version, cc, bundle="bundles/smollm2-orin")
    message = str(exc.value)
    assert "built with TensorRT 10.3.0.30 for compute capability 8.7" in message
    assert f"TensorRT {trt_version} on compute capability {cc}" in message
    assert "rebuild them on this device with `specexport engines build bundles/smollm2-orin`" in message
    assert message.count(". ") == 0  # one sentence


def test_compat_version_and_hardware_compatible_engines():
    vc = {**ENGINE, "version_compatible": True}
    check_engine_compat(vc, "10.7.0.23", "8.7")  # newer TensorRT of the same major: fine
    with pytest.raises(SpecExportError):
        check_engine_compat(vc, "10.2.0", "8.7")  # older: no
    with pytest.raises(SpecExportError):
        check_engine_compat(vc, "11.4.1", "8.7")  # another major: no
    hw = {**ENGINE, "compute_capability": "8.6", "hardware_compatibility": "ampere+"}
    check_engine_compat(hw, "10.3.0.30", "8.9")
    with pytest.raises(SpecExportError):
        check_engine_compat(hw, "10.3.0.30", "7.5")


def test_select_profile(fresh):
    profiles = plan_tensorrt(fresh, read_manifest(fresh).pieces, "orin-nano")["plan"]["deep"]["profiles"]
    assert select_profile(profiles, 1, 1) == 1  # decode
    assert select_profile(profiles, 7, 7) == 2  # verify
    assert select_profile(profiles, 16, 1) == 2
    assert select_profile(profiles, 17, 1) == 0  # prefill
    assert select_profile(profiles, CONTEXT, 16) == 0
    assert select_profile(profiles, 1, 1, batch=1) == 1
    with pytest.raises(SpecExportError, match="no TensorRT optimization profile admits a call of 20"):
        select_profile(profiles, 20, 20)  # more logits rows than any profile keeps
    with pytest.raises(SpecExportError):
        select_profile(profiles, CONTEXT + 1, 1)


def test_kv_binding_mode():
    assert kv_binding_mode("swap", "10.3.0") == "swap" and kv_binding_mode("swap", "10.15.1") == "swap"
    assert kv_binding_mode("inplace", "10.15.1.4") == "inplace" and kv_binding_mode("inplace", "11.4.1") == "inplace"
    with pytest.raises(SpecExportError, match=r"TensorRT 10\.13\.3 cannot run \(it arrives in 10\.15\)"):
        kv_binding_mode("inplace", "10.13.3")
    for version in ("10.3.0", "10.15.1"):  # ONNX Runtime's one-buffer binding: never under TensorRT
        with pytest.raises(SpecExportError, match=r"GroupQueryAttention.*compute wrong"):
            kv_binding_mode("shared", version)
    with pytest.raises(SpecExportError, match="unknown KV cache mode 'ring'"):
        kv_binding_mode("ring", "10.15.1")


def test_inplace_plan(tmp_path, tiny_checkpoint, fresh):
    """A TensorScatter bundle plans in-place binding with a static cache length; TensorRT 10.3 refuses it, naming
    the TensorScatter nodes; a swap bundle planned for an in-place target says how to get in-place updates."""
    inplace = make_tiny_bundle(tmp_path / "inplace", tiny_checkpoint, inplace=True)
    section = plan_tensorrt(inplace, read_manifest(inplace).pieces, "rtx-4090")
    deep = section["plan"]["deep"]
    assert deep["kv"] == {"mode": "inplace", "count": 2, "cache_len": CONTEXT} and not section["notes"]
    assert all(p["shapes"]["past_key.0"]["min"] == [1, 2, CONTEXT, 16] for p in deep["profiles"])
    assert deep["shape_tensors"] == ["logits_to_keep"]
    with pytest.raises(SpecExportError) as exc:
        plan_tensorrt(inplace, read_manifest(inplace).pieces, "thor")
    assert "TensorScatter at shallow/kv_update.present_key.0" in str(exc.value)
    assert "opset 24 is outside the 9-22 range" in str(exc.value)
    with pytest.raises(SpecExportError, match="updates a 128-position cache in place but the plan is for 64"):
        plan_tensorrt(inplace, read_manifest(inplace).pieces, "rtx-4090", context=64)
    swap = plan_tensorrt(fresh, read_manifest(fresh).pieces, "rtx-4090")
    assert swap["plan"]["deep"]["kv"]["mode"] == "swap"  # the graph decides the binding, not the target
    assert any("--target rtx-4090" in n and "in place" in n for n in swap["notes"])
