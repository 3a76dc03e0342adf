"""Registers the subcommands of ``keo``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    from producer.cli.audit import audit
    from producer.cli.bench import bench
    from producer.cli.demo import demo
    from producer.cli.init import init
    from producer.cli.reconcile import reconcile
    from producer.cli.send import send
    from producer.cli.serve import register as register_serve

    app.command("init")(init)
    app.command("send")(send)
    app.command("reconcile")(reconcile)
    app.command("audit")(audit)
    app.command("demo")(demo)
    app.command("bench")(bench)
    register_serve(app)
