"""`specexport check` and `specexport engines ...`: the TensorRT commands, registered on the main group by
`register(main)`. TensorRT and the exporter load only inside the commands that need them."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..runtime.errors import SpecExportError


def _exporter(what: str):
    try:
        from ..exporter.tensorrt import opcheck as trt_opcheck
        from ..exporter.tensorrt import plan as trt_plan
        from ..exporter.tensorrt import targets as trt_targets
    except ImportError as exc:
        raise SpecExportError(f"{what} needs the exporter extra ({exc.name} is missing); install it with"
                              " `pip install 'specexport[export]'`") from None
    return trt_opcheck, trt_plan, trt_targets


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--target", required=True, help="TensorRT target: a name in recipes/targets (orin-nano, agx-orin,"
              " thor, rtx-4090, or an alias such as jetpack6) or a target .toml file.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def check(bundle, target, as_json) -> None:
    """Check every node of every piece against the target's TensorRT operator matrix (no TensorRT needed);
    exit 1 naming the nodes TensorRT cannot parse."""
    from ..runtime.bundle import read_manifest

    trt_opcheck, _, _ = _exporter("the TensorRT operator check")
    manifest = read_manifest(bundle)
    report = trt_opcheck.check_pieces(bundle, manifest.pieces, target)
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else report.render())
    report.raise_if_failed()


@click.group()
def engines() -> None:
    """TensorRT engines of a bundle: plan them anywhere, build them on the device."""


@engines.command("build")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--piece", "pieces", multiple=True, help="Build only this piece (repeatable). Default: all.")
@click.option("--timing-cache", type=click.Path(path_type=Path), default=None,
              help="Timing cache file to load and update (default: the bundle's tensorrt/timing.cache).")
@click.option("--adopt", is_flag=True, help="Record engines the plan's trtexec scripts already built instead of"
              " building them.")
@click.option("--any-device", is_flag=True, help="Build even if this GPU's compute capability is not the plan's.")
def engines_build(bundle, pieces, timing_cache, adopt, any_device) -> None:
    """Build one TensorRT engine per piece on this device (needs TensorRT and an NVIDIA GPU) and record their
    TensorRT version, compute capability and SHA-256 in the manifest."""
    from ..exporter.tensorrt.engines import build_engines

    manifest = build_engines(bundle, pieces=list(pieces) or None, timing_cache=timing_cache, adopt=adopt,
                             any_device=any_device, log=lambda m: click.echo(m, err=True))
    for e in manifest.tensorrt.engines:
        click.echo(f"{e.piece}: {e.file} (TensorRT {e.tensorrt_version}, compute capability"
                   f" {e.compute_capability}, {e.size_bytes / 1e6:.1f} MB)")


@engines.command("plan")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--target", required=True, help="TensorRT target name, alias or .toml file.")
def engines_plan(bundle, target) -> None:
    """(Re)write the TensorRT plan and trtexec scripts of an existing fp16 standard-flavour bundle; engines
    built for an earlier plan are dropped from the manifest."""
    _exporter("planning TensorRT engines")
    from ..exporter.tensorrt.engines import plan_bundle
    from ..exporter.tensorrt.memory import describe_memory

    section = plan_bundle(bundle, target).tensorrt
    click.echo(f"planned {', '.join(section.plan)} for {section.target['name']}; device memory:", err=True)
    for line in describe_memory(section.memory):
        click.echo(line, err=True)
    click.echo(f"build on the device with `specexport engines build {bundle}` or sh {bundle}/tensorrt/build_all.sh",
               err=True)


@engines.command("list")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest's tensorrt section as JSON.")
def engines_list(bundle, as_json) -> None:
    """Show the bundle's TensorRT plan and engines (no TensorRT needed)."""
    from ..runtime.bundle import read_manifest

    section = read_manifest(bundle).to_dict()["tensorrt"]
    if as_json:
        click.echo(json.dumps(section, indent=2))
        return
    if not section.get("plan"):
        click.echo(f"{bundle}: no TensorRT plan")
        return
    t = section["target"]
    click.echo(f"target {t['name']}: TensorRT {t['tensorrt_version']}, compute capability {t['compute_capability']}")
    built = {e["piece"]: e for e in section.get("engines", [])}
    for name, plan in section["plan"].items():
        e = built.get(name)
        state = (f"built with TensorRT {e['tensorrt_version']} for {e['compute_capability']} ({e['device']})"
                 if e else "not built")
        click.echo(f"  {name}: profiles {', '.join(p['name'] for p in plan['profiles'])}; {state}")


def register(main: click.Group) -> None:
    """Add `check` and the `engines` group to the specexport command."""
    main.add_command(check)
    main.add_command(engines)

