"""The ``keo`` entry point: one typer app, a module per subcommand group."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from typing import Annotated

import typer

from cli import logs
from cli.exit_codes import ExitCode
from cli.help_format import KeoGroup
from cli.logs import LogFormat

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
    cls=KeoGroup,
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


def _register() -> None:
    from cli import commands, emulators

    app.add_typer(emulators.app, name="emulators")
    commands.register(app)


_register()


def main() -> None:
    app()
