"""Run the app under uvicorn on a socket of our own: a port taken is one sentence, port 0 picks a free one
(the line printed says which), and SIGTERM drains in-flight requests, then exits 0."""

from __future__ import annotations

import errno
import signal
import socket
import sys
from pathlib import Path

from ..runtime import Session, SpecExportError, load
from .app import MAX_BODY_BYTES, create_app


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SpecExportError(f"port {port} on {host} is in use; pass another --port (0 picks a free one)") \
                from None
        raise SpecExportError(f"cannot listen on {host}:{port} ({exc.strerror}); check --host and --port") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(session: Session, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          max_body_bytes: int = MAX_BODY_BYTES, shutdown_timeout: float = 30.0, log_level: str = "info",
          batch: int | None = None) -> None:
    """Serves `session` until SIGINT or SIGTERM. On SIGTERM the server stops accepting connections, lets the
    requests in flight finish for up to `shutdown_timeout` seconds, cancels the rest, and returns."""
    import uvicorn

    app = create_app(session, model_name, max_body_bytes, shutdown_timeout, batch)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout, lifespan="on")
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    print(f"specexport serve: {app.state.model.name} on http://{shown}:{bound}/v1 (Ctrl-C or SIGTERM stops)",
          file=sys.stderr, flush=True)
    # uvicorn raises the signal it caught again once it has shut down; for SIGTERM that would end the process
    # by the signal (exit -15) after a clean drain: a handler of ours makes that repeat a no-op, so we exit 0
    previous = signal.signal(signal.SIGTERM, lambda *_: None) if _main_thread() else None
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run(bundle: str | Path, host: str = "127.0.0.1", port: int = 8000, **kwargs) -> None:
    """Loads `bundle` and serves it (see `serve`)."""
    serve(load(bundle), host, port, **kwargs)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
