"""The ``keo`` entry point: one typer app, a module per subcommand group."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from cli import logs
from cli.exit_codes import ExitCode
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
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            help="more logs on stderr (-v info, -vv debug); wins over KEO_LOG_LEVEL",
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
