"""`specexport serve`: registered on the main group by `register(main)`. The server (Starlette, uvicorn) loads
only inside the command, so the rest of the CLI runs without the `serve` extra."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..runtime.errors import SpecExportError
from . import process


def register(main: click.Group) -> None:
    @main.command()
    @click.option("--bundle", required=True, type=click.Path(path_type=Path), help="Bundle directory.")
    @click.option("--host", default="127.0.0.1", show_default=True,
                  help="Address to listen on (0.0.0.0 exposes the server to the network: it has no authentication).")
    @click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
                  help="Port to listen on (0: a free one, printed at start).")
    @click.option("--model-name", default=None, help="The model id clients send and /v1/models lists."
                  " Default: the bundle's name.")
    @click.option("--max-body-bytes", type=click.IntRange(1), default=4 << 20, show_default=True,
                  help="Largest request body; a larger one gets 413.")
    @click.option("--shutdown-timeout", type=click.FloatRange(0), default=30.0, show_default=True,
                  help="On SIGTERM, seconds that requests in flight may take to finish before they are cancelled.")
    @click.option("--threads", type=int, default=None, help="Threads for ONNX Runtime (default: all cores).")
    @click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
                  default="info", show_default=True)
    @click.option("--batch", type=click.IntRange(1), default=None, metavar="N",
                  help="Decode up to N requests at once, verified together (a bundle built with --attention rowwise"
                  " or --flavour standard; modes ar, lookup, model, self and auto, without token trees)."
                  " Default: one at a time.")
    @click.option("--ray", "use_ray", is_flag=True, help="Serve through Ray Serve: replicas (each with its own"
                  " Session) behind Ray's HTTP proxy on --host/--port (the ray extra).")
    @click.option("--replicas", type=click.IntRange(1), default=1, show_default=True,
                  help="With --ray: fixed replicas.")
    @click.option("--autoscale", default=None, metavar="MIN:MAX", help="With --ray: between MIN and MAX replicas,"
                  " added while requests wait (one request in flight per replica is Ray's target).")
    @click.option("--replica-cpus", type=click.FloatRange(0), default=1.0, show_default=True,
                  help="With --ray: CPUs Ray reserves per replica.")
    @click.option("--replica-gpus", type=click.FloatRange(0), default=0.0, show_default=True,
                  help="With --ray: GPUs per replica (1: one replica per GPU).")
    @click.option("--ray-address", default=None, help="With --ray: the cluster to join (default: RAY_ADDRESS, else"
                  " a local Ray instance).")
    def serve(bundle, host, port, model_name, max_body_bytes, shutdown_timeout, threads, log_level, batch, use_ray,
              replicas, autoscale, replica_cpus, replica_gpus, ray_address) -> None:
        """Serve a bundle over HTTP with OpenAI's API: /v1/chat/completions and /v1/completions (streaming or
        not), /v1/models, /health. One request runs at a time, the others wait their turn. specexport's options
        (mode, tree, policy, ...) go in the request's "specexport" object."""
        if use_ray and batch:
            raise click.BadParameter("--batch does not run under --ray yet; drop one of them", param_hint="--batch")
        if use_ray:
            _serve_on_ray(bundle, host, port, model_name, max_body_bytes, shutdown_timeout, threads, replicas,
                          autoscale, replica_cpus, replica_gpus, ray_address)
            return
        try:
            from ..serve.server import serve as run_server
        except ImportError as exc:
            raise SpecExportError(f"serving needs the serve extra ({exc.name} is missing); install it with"
                                  " `pip install 'specexport[serve]'`") from None
        from ..runtime.session import load

        if process.OWNS_PROCESS:
            from ..runtime.backends.ort import use_shared_thread_pool

            use_shared_thread_pool(threads or os.cpu_count())  # the pieces run one after another: one warm pool
        session = load(bundle, threads=threads)
        run_server(session, host=host, port=port, model_name=model_name, max_body_bytes=max_body_bytes,
                   shutdown_timeout=shutdown_timeout, log_level=log_level, batch=batch)


def _autoscaling(spec: str | None) -> dict | None:
    if spec is None:
        return None
    try:
        low, high = (int(v) for v in spec.split(":"))
    except ValueError:
        raise click.BadParameter(f"{spec!r} is not MIN:MAX, such as 1:4", param_hint="--autoscale") from None
    if not 0 <= low <= high or high < 1:
        raise click.BadParameter(f"{spec!r} needs 0 <= MIN <= MAX and MAX >= 1", param_hint="--autoscale")
    return {"min_replicas": low, "max_replicas": high, "target_ongoing_requests": 1}


def _serve_on_ray(bundle, host, port, model_name, max_body_bytes, shutdown_timeout, threads, replicas, autoscale,
                  replica_cpus, replica_gpus, ray_address) -> None:
    autoscaling = _autoscaling(autoscale)
    try:
        from ..serve.scaleout import run
    except ImportError as exc:
        raise SpecExportError(f"serving on Ray needs the ray extra ({exc.name} is missing); install it with"
                              " `pip install 'specexport[ray]'`") from None
    if not (Path(bundle) / "manifest.json").is_file():  # the replicas would fail one by one, far from here
        raise SpecExportError(f"{bundle} is not a specexport bundle (no manifest.json); build one with"
                              " `specexport build`")
    if port == 0:
        raise click.BadParameter("Ray's proxy needs a fixed port", param_hint="--port")
    actor = {"num_cpus": replica_cpus, **({"num_gpus": replica_gpus} if replica_gpus else {})}
    run(bundle, host, port, address=ray_address, num_replicas=replicas, autoscaling=autoscaling,
        ray_actor_options=actor, model_name=model_name, threads=threads, max_body_bytes=max_body_bytes,
        shutdown_timeout=shutdown_timeout)
