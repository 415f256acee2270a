"""Options more than one command takes."""

from __future__ import annotations

import click

EXPECT_DIGEST = click.option(
    "--expect-digest", default=None, metavar="SHA256",
    help="Refuse the bundle unless its digest (SHA-256 of manifest.json, as `specexport inspect` prints it) is"
         " this one: pins the exact bundle a deployment tested.")
