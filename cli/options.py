"""Options shared by subcommands, and the translation of errors into exit codes."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import botocore.exceptions
import typer
from pydantic import ValidationError

from cli import logs
from cli.exit_codes import ExitCode
from dedupe_store.errors import LedgerError, LedgerSchemaError
from dedupe_store.settings import env_var
from producer.errors import KeoError, StreamNotFoundError
from producer.settings import ProducerSettings

log = logging.getLogger(__name__)

_DEFAULTS = ProducerSettings.model_fields
StreamOpt = Annotated[
    str | None,
    typer.Option(
        "--stream",
        "-s",
        help=f"Kinesis stream \\[env KEO_STREAM; default {_DEFAULTS['stream'].default}]",
    ),
]
TableOpt = Annotated[
    str | None,
    typer.Option(
        "--table",
        "-t",
        help=f"DynamoDB ledger table \\[env KEO_TABLE; default {_DEFAULTS['table'].default}]",
    ),
]
KinesisEndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--kinesis-endpoint-url",
        help="Kinesis endpoint \\[env KEO_KINESIS_ENDPOINT_URL; unset: real AWS]",
    ),
]
DynamoEndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--dynamodb-endpoint-url",
        help="DynamoDB endpoint \\[env KEO_DYNAMODB_ENDPOINT_URL; unset: real AWS]",
    ),
]
NO_CREDENTIALS = (
    "no AWS credentials found: configure them the standard way (AWS_PROFILE, "
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, 'aws configure' or 'aws sso login'), or "
    "use the local stack ('keo emulators up' and source .keo/endpoints.env)"
)


def load_settings(**overrides: Any) -> ProducerSettings:
    """Settings from the environment, flags winning; invalid ones exit 3 naming the setting."""
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return ProducerSettings(**given)
    except ValidationError as exc:
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            where = f" {env_var(field)}" if field else ""
            logs.report(
                f"keo: invalid setting{where}: {message}", event="config_error", level=logging.ERROR
            )
        raise typer.Exit(ExitCode.CONFIG) from None


@contextlib.contextmanager
def exit_on_errors() -> Iterator[None]:
    """Turn the errors a user can act on into one line on stderr and a documented exit code."""
    try:
        yield
    except Exception as exc:
        explained = _explain(exc)
        if explained is None:
            raise
        code, message = explained
        log.debug("failed", exc_info=True)
        logs.report(f"keo: {message}", event="command_failed", level=logging.ERROR)
        raise typer.Exit(code) from None


def _explain(exc: Exception) -> tuple[ExitCode, str] | None:
    """The exit code and message for ``exc``; None for a bug (its traceback is the report)."""
    if _caused_by_missing_credentials(exc):
        # every command, whichever call met it first and however it was wrapped
        return ExitCode.CONFIG, NO_CREDENTIALS
    if isinstance(exc, StreamNotFoundError | LedgerSchemaError):
        return ExitCode.CONFIG, str(exc)
    if isinstance(exc, KeoError | LedgerError):
        retriable = getattr(exc, "retriable", False)
        return (ExitCode.UNAVAILABLE if retriable else ExitCode.FAILED), str(exc)
    if isinstance(exc, botocore.exceptions.BotoCoreError | botocore.exceptions.ClientError):
        return ExitCode.UNAVAILABLE, f"AWS call failed: {exc}"
    if isinstance(exc, ValueError):
        return ExitCode.CONFIG, str(exc)
    return None


def _caused_by_missing_credentials(exc: BaseException) -> bool:
    """Whether botocore's NoCredentialsError is in ``exc``'s chain (causes, contexts, and
    pynamodb's ``cause``)."""
    pending: list[object] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        if isinstance(current, botocore.exceptions.NoCredentialsError):
            return True
        seen.add(id(current))
        pending += [getattr(current, "cause", None), current.__cause__, current.__context__]
    return False


def use_local_stack(state_dir: Path, command: str) -> bool:
    """Point ``KEO_*_ENDPOINT_URL`` at the embedded stack under ``state_dir``, starting what is
    not running, unless both endpoints are already set. True when the local stack is used."""
    if os.environ.get("KEO_KINESIS_ENDPOINT_URL") and os.environ.get("KEO_DYNAMODB_ENDPOINT_URL"):
        return False
    from devstack import emulators

    try:
        endpoints = emulators.up(state_dir)
    except emulators.EmulatorError as exc:
        typer.echo(f"keo {command}: {exc}", err=True)
        raise typer.Exit(ExitCode.UNAVAILABLE) from None
    os.environ.update(endpoints.as_env())
    return True


def exit_without_spark(command: str, exc: ImportError) -> NoReturn:
    """Spark is an extra (``spark``): say so, and how to run ``keo command`` without it."""
    typer.echo(
        f"keo {command}: Spark is not installed ({exc}); install the 'spark' extra, "
        f"or run 'keo {command} --no-spark'",
        err=True,
    )
    raise typer.Exit(ExitCode.CONFIG) from None
