"""``keo emulators up|down|status``: the embedded local stack."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Start, stop and inspect the embedded local stack (kinesalite, dynalite, kinesis-local).",
    no_args_is_help=True,
)
