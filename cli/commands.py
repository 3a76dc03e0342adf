"""Registers the subcommands of ``keo``."""

from __future__ import annotations

import typer

from cli.help_format import KeoCommand


def register(app: typer.Typer) -> None:
    from cli.audit import audit
    from cli.bench import bench
    from cli.demo import demo
    from cli.init import init
    from cli.reconcile import reconcile
    from cli.send import send
    from cli.serve import register as register_serve

    app.command("init", cls=KeoCommand)(init)
    app.command("send", cls=KeoCommand)(send)
    app.command("reconcile", cls=KeoCommand)(reconcile)
    app.command("audit", cls=KeoCommand)(audit)
    app.command("demo", cls=KeoCommand)(demo)
    app.command("bench", cls=KeoCommand)(bench)
    register_serve(app)
