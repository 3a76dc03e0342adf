"""Registers the subcommands of ``keo``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    from cli.audit import audit
    from cli.bench import bench
    from cli.demo import demo
    from cli.init import init
    from cli.reconcile import reconcile
    from cli.send import send
    from cli.serve import register as register_serve

    app.command("init")(init)
    app.command("send")(send)
    app.command("reconcile")(reconcile)
    app.command("audit")(audit)
    app.command("demo")(demo)
    app.command("bench")(bench)
    register_serve(app)
