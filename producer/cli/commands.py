"""Subcommands that are not built yet print so and exit non-zero."""

from __future__ import annotations

import typer

from producer.cli.app import not_built


def register(app: typer.Typer) -> None:
    for name in ("init", "send", "reconcile", "audit", "serve", "demo", "bench"):
        app.command(name, help=f"({name}: not built yet)")(_stub(name))


def _stub(name: str):  # type: ignore[no-untyped-def]
    def command() -> None:
        not_built(name)

    return command
