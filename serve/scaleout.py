"""Scale-out on Ray Serve: the same app, one copy per replica (a Ray actor with its own Session), behind Ray's
HTTP proxy. Each replica serves one request at a time, so Ray routes the next request to an idle replica and,
with `autoscaling`, adds replicas while requests wait.

    import ray
    from ray import serve
    from specexport.serve.scaleout import application

    ray.init()                                          # or ray.init(address="auto") on a cluster
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    serve.run(application("bundles/smollm2", autoscaling={"min_replicas": 1, "max_replicas": 4}), route_prefix="/")

`specexport serve --ray` does the same from the command line. On a cluster every node that may hold a replica
needs the bundle at the same path, and `ray_actor_options` places the replicas: {"num_gpus": 1} for one per GPU,
{"resources": {"jetson": 1}} for one per Jetson that was started with `ray start --resources '{"jetson": 1}'`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .app import MAX_BODY_BYTES, create_app

# Ray's autoscaler aims at this many requests in flight per replica: one runs, the rest queue behind it
DEFAULT_AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1}


def application(bundle: str | Path, *, num_replicas: int = 1, autoscaling: dict[str, Any] | None = None,
                ray_actor_options: dict[str, Any] | None = None, max_ongoing_requests: int = 4,
                model_name: str | None = None, threads: int | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                shutdown_timeout: float = 30.0, name: str = "specexport") -> Any:
    """A Ray Serve application (pass it to `serve.run`). `num_replicas` fixed replicas, or `autoscaling` (Ray's
    AutoscalingConfig fields, such as DEFAULT_AUTOSCALING); `max_ongoing_requests` caps what Ray sends one replica
    (the rest wait in Ray's queue, from where an idle or new replica takes them)."""
    from ray import serve

    root = str(Path(bundle).resolve())  # the replicas may start in another working directory

    def build():  # runs in each replica: the Session is loaded there, not shipped
        from ..runtime import load

        return create_app(load(root, threads=threads), model_name, max_body_bytes, shutdown_timeout)

    options: dict[str, Any] = {"name": name, "max_ongoing_requests": max_ongoing_requests,
                               "ray_actor_options": ray_actor_options or {"num_cpus": 1},
                               "graceful_shutdown_timeout_s": shutdown_timeout}
    if autoscaling is not None:
        options["autoscaling_config"] = autoscaling
    else:
        options["num_replicas"] = num_replicas
    return serve.deployment(serve.ingress(build)(), **options).bind()


def run(bundle: str | Path, host: str = "127.0.0.1", port: int = 8000, address: str | None = None,
        **options: Any) -> None:
    """Starts (or joins, with `address`) a Ray instance, serves `application(bundle, **options)` through Ray's
    proxy at host:port until SIGINT or SIGTERM, then takes the application down."""
    import signal
    import sys
    import threading

    import ray
    from ray import serve

    ray.init(address=address, include_dashboard=False, logging_level="warning")
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application(bundle, **options), route_prefix="/")
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):  # set after Ray's start, so ours are the handlers that count
            signal.signal(sig, lambda *_: stop.set())
        shown = f"[{host}]" if ":" in host else host
        print(f"specexport serve: {Path(bundle).name} on Ray Serve at http://{shown}:{port}/v1 (Ctrl-C or SIGTERM"
              " stops)", file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        serve.shutdown()  # each replica drains for up to its graceful_shutdown_timeout_s
        ray.shutdown()
