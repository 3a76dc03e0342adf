"""Registers the subcommands; those not built yet print so and exit non-zero."""

from __future__ import annotations

from collections.abc import Callable

import typer

from producer.cli.app import not_built


def register(app: typer.Typer) -> None:
    from producer.cli.audit import audit
    from producer.cli.bench import bench
    from producer.cli.demo import demo
    from producer.cli.init import init
    from producer.cli.reconcile import reconcile
    from producer.cli.send import send

    app.command("init")(init)
    app.command("send")(send)
    app.command("reconcile")(reconcile)
    app.command("audit")(audit)
    app.command("demo")(demo)
    app.command("bench")(bench)
    for name in ("serve",):
        app.command(name, help=f"({name}: not built yet)")(_stub(name))


def _stub(name: str) -> Callable[[], None]:
    def command() -> None:
        not_built(name)

    return command
