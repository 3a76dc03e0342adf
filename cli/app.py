"""The ``keo`` entry point: one typer app, a module per subcommand group."""

from __future__ import annotations

import logging
import os

import typer

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
    verbose: int = typer.Option(
        0, "--verbose", "-v", count=True, help="more logs on stderr (-v info, -vv debug)"
    ),
) -> None:
    level = os.environ.get("KEO_LOG_LEVEL") or (
        "DEBUG" if verbose >= 2 else "INFO" if verbose == 1 else "WARNING"
    )
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        force=True,
    )
    # botocore's own chatter is noise at info level
    logging.getLogger("botocore").setLevel(max(logging.getLogger().level, logging.WARNING))


def _register() -> None:
    from cli import commands, emulators

    app.add_typer(emulators.app, name="emulators")
    commands.register(app)


_register()


def main() -> None:
    app()
