"""What the CLI's commands share: how a command fails, and whether this process belongs to the CLI."""

from __future__ import annotations

import sys

import click

EXIT_FAILURE = 1
EXIT_USAGE = 2  # a bad option value, as click exits on its own usage errors

# Set by `entry()`, the console script: only a process of its own may switch ONNX Runtime to one shared
# thread pool, which it then imposes on every session. Embedded (click's test runner, an application
# calling `main`), the CLI leaves that alone.
OWNS_PROCESS = False


def fail(message: str, code: int = EXIT_FAILURE) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
