"""The ``keo`` entry point: one typer app, a module per subcommand group, each imported only
when its command runs or shows its own help (``keo --version`` and ``keo --help`` import none:
boto3, pydantic and the producer are most of a command's start)."""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import os
import sys
from dataclasses import dataclass
from typing import Annotated, Any, Final

import typer

from cli import logs
from cli.exit_codes import ExitCode
from cli.help_format import KeoCommand, KeoGroup
from cli.logs import LogFormat


@dataclass(frozen=True)
class _Command:
    """A subcommand by where it lives: ``module``'s ``attribute`` (a command function, or a
    typer app when ``group``), and its line in ``keo --help`` (``summary``: listed without
    importing the module; its own help is the function's docstring)."""

    module: str
    attribute: str
    summary: str
    group: bool = False

    def load(self, name: str) -> Any:
        target = getattr(importlib.import_module(self.module), self.attribute)
        alone = typer.Typer(rich_markup_mode="rich", add_completion=False)
        if self.group:  # under a root of its own, as the root would add it
            alone.add_typer(target, name=name, short_help=self.summary)
            commands: dict[str, Any] = getattr(typer.main.get_command(alone), "commands", {})
            return commands[name]
        alone.command(name, cls=KeoCommand, short_help=self.summary)(target)
        return typer.main.get_command(alone)


# in the order ``keo --help`` lists them
COMMANDS: Final = {
    "init": _Command(
        "cli.init",
        "init",
        "Create the stream and the ledger table, and wait until both are ACTIVE.",
    ),
    "send": _Command(
        "cli.send",
        "send",
        "Send JSON lines exactly once: per key (--dedupe key) or per run (--dedupe replay).",
    ),
    "reconcile": _Command(
        "cli.reconcile",
        "reconcile",
        "Resolve claims whose lease expired: delivered, resent, released or unverifiable.",
    ),
    "audit": _Command(
        "cli.audit",
        "audit",
        "Read the stream as a consumer does: duplicates, losses, records the ledger lacks.",
    ),
    "demo": _Command(
        "cli.demo",
        "demo",
        "The same events at least once, per key and per run, under faults; each audited.",
    ),
    "bench": _Command(
        "cli.bench",
        "bench",
        "Measure throughput, cost and each writer's share of AWS's quotas; figures to a file.",
    ),
    "serve": _Command(
        "cli.serve",
        "serve",
        "Serve the delivery-state API: was key X delivered, where, and when?",
    ),
    "emulators": _Command(
        "cli.emulators",
        "app",
        "Start, stop and inspect the embedded local stack (127.0.0.1 only).",
        group=True,
    ),
}


class _StartCollector:
    """The garbage collector through keo's start, in a process of its own (:func:`main`).

    What a command's modules make (classes, functions, pydantic's and typer's schemas) lives as
    long as the process: collecting while they load finds next to nothing, and each full
    collection after looks at all of it again. So the collector is off until the command is
    loaded, then back on with what exists frozen out of its sight; at the end everything is
    frozen, for the process frees it at once, without the exit's collections. That was a
    quarter of ``keo send``'s start on an empty input (docs/performance.md, issue 38).
    """

    def __init__(self) -> None:
        self._paused = False

    def pause(self) -> None:
        gc.disable()
        self._paused = True

    def resume(self) -> None:
        """A command's modules are loaded: what exists now is frozen, the collector back on.
        Nothing to do where :meth:`pause` was not called (a test runs the app in its own
        process)."""
        if self._paused:
            self._paused = False
            gc.freeze()
            gc.enable()

    @staticmethod
    def freeze_all() -> None:
        gc.freeze()


_COLLECTOR: Final = _StartCollector()


class _KeoApp(KeoGroup):
    """``keo``'s root group: its subcommands (:data:`COMMANDS`) load on first use; its help
    lists them by their summaries."""

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:  # noqa: ARG002 - click's signature
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:  # noqa: ARG002 - click's signature
        loaded = self.commands.get(cmd_name)
        lazy = COMMANDS.get(cmd_name)
        if loaded is not None or lazy is None:
            return loaded
        if self._listing:  # the help's list of commands: a summary, nothing imported
            return KeoCommand(name=cmd_name, short_help=lazy.summary)
        command = lazy.load(cmd_name)
        self.add_command(command, cmd_name)
        _COLLECTOR.resume()
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="keo",
    help=(
        "Deliver every message into an Amazon Kinesis data stream exactly once, and prove it.\n\n"
        "Endpoints come from KEO_KINESIS_ENDPOINT_URL and KEO_DYNAMODB_ENDPOINT_URL (or flags); "
        "with none set, the AWS defaults apply (real AWS). Start the embedded local stack with "
        "'keo emulators up' and source .keo/endpoints.env to use it."
    ),
    no_args_is_help=True,
    add_completion=False,
    # help text is rich markup: a literal '[' is written '\\[' (the env hints)
    rich_markup_mode="rich",
    cls=_KeoApp,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"keo {importlib.metadata.version('kinesis-exactly-once')}")
        raise typer.Exit(ExitCode.OK)


@app.callback()
def _root(
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            help="more logs on stderr (-v info, -vv debug); wins over KEO_LOG_LEVEL",
            show_default=False,
        ),
    ] = 0,
    log_format: Annotated[
        LogFormat | None,
        typer.Option(
            "--log-format",
            help="logs on stderr as text (rich on a terminal, plain lines otherwise) or JSON "
            "lines (fields time, level, logger, message, exception) "
            "\\[env KEO_LOG_FORMAT; default text]",
            show_default=False,
        ),
    ] = None,
    version: Annotated[  # noqa: ARG001 - handled by its callback, which exits
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            expose_value=True,
            help="print keo's version and exit",
        ),
    ] = False,
) -> None:
    try:
        level = logs.log_level(verbose, os.environ.get("KEO_LOG_LEVEL"))
        fmt = logs.log_format(log_format, os.environ.get("KEO_LOG_FORMAT"))
    except logs.LogSettingError as exc:
        typer.echo(f"keo: invalid setting {exc.setting}: {exc}", err=True)
        raise typer.Exit(ExitCode.CONFIG) from None
    logs.configure(level, fmt, terminal=sys.stderr.isatty())


def main() -> None:
    """``keo`` in a process of its own (the console script), the collector paused through its
    start (:class:`_StartCollector`)."""
    _COLLECTOR.pause()
    try:
        app()
    finally:
        _COLLECTOR.freeze_all()
