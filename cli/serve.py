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
    def serve(bundle, host, port, model_name, max_body_bytes, shutdown_timeout, threads, log_level) -> None:
        """Serve a bundle over HTTP with OpenAI's API: /v1/chat/completions and /v1/completions (streaming or
        not), /v1/models, /health. One request runs at a time, the others wait their turn. specexport's options
        (mode, tree, policy, ...) go in the request's "specexport" object."""
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
                   shutdown_timeout=shutdown_timeout, log_level=log_level)
