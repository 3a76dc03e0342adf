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
from dedupe_store.errors import ConfigurationError, KeoError, LedgerSchemaError
from dedupe_store.settings import env_var
from producer.errors import StreamNotFoundError
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
    """Turn every error into one line on stderr and a documented exit code (:func:`explain`).

    A bug exits 70 (internal error) with its traceback in the log, at ERROR: never read as a
    settings problem. typer's own exits and usage errors pass as they are.
    """
    try:
        yield
    except (typer.Exit, typer.Abort, typer.exceptions.TyperException):
        raise
    except Exception as exc:
        code, message = explain(exc)
        if code is ExitCode.INTERNAL:
            log.exception("internal error: a bug in keo, please report it")
        else:
            log.debug("failed", exc_info=True)
        logs.report(f"keo: {message}", event="command_failed", level=logging.ERROR)
        raise typer.Exit(code) from None


def explain(exc: Exception) -> tuple[ExitCode, str]:
    """The exit code and the message for ``exc``.

    keo's errors (:class:`~dedupe_store.errors.KeoError`, whatever the layer) by their class:
    configuration (and a missing stream or ledger table: 'keo init') -> 3, retriable -> 4,
    others -> 1. Settings pydantic refused -> 3; an AWS error no adapter translated -> 4.
    Anything else is a bug -> 70, however it reads: a ValueError from a corrupt item or a
    mistake in keo is not a setting to check.
    """
    if _caused_by_missing_credentials(exc):
        # every command, whichever call met it first and however it was wrapped
        return ExitCode.CONFIG, NO_CREDENTIALS
    if isinstance(exc, ConfigurationError | StreamNotFoundError | LedgerSchemaError):
        return ExitCode.CONFIG, str(exc)
    if isinstance(exc, KeoError):
        return (ExitCode.UNAVAILABLE if exc.retriable else ExitCode.FAILED), str(exc)
    if isinstance(exc, ValidationError):
        return ExitCode.CONFIG, str(exc)
    if isinstance(exc, botocore.exceptions.BotoCoreError | botocore.exceptions.ClientError):
        return ExitCode.UNAVAILABLE, f"AWS call failed: {exc}"
    return ExitCode.INTERNAL, (
        f"internal error, a bug in keo ({type(exc).__name__}: {exc}); "
        "its traceback is in the log above"
    )


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


def use_local_stack(
    state_dir: Path,
    command: str,
    *,
    dynamodb: str | None = None,
    for_bench: bool = False,
    quotas: str = "none",
) -> bool:
    """Point ``KEO_*_ENDPOINT_URL`` at the embedded stack under ``state_dir``, starting what is
    not running, unless both endpoints are already set. True when the local stack is used.
    ``dynamodb`` names its DynamoDB emulator (``devstack.emulators.DYNAMODB_EMULATORS``;
    default DynamoDB Local, the code path AWS runs); ``for_bench`` starts DynamoDB Local tuned for throughput
    (``devstack.emulators.JvmProfile``); ``quotas="aws"`` puts the stack behind AWS's quotas
    (``devstack.emulators.QUOTA_MODES``)."""
    if os.environ.get("KEO_KINESIS_ENDPOINT_URL") and os.environ.get("KEO_DYNAMODB_ENDPOINT_URL"):
        return False
    from devstack import emulators

    try:
        endpoints = emulators.up(
            state_dir,
            dynamodb=dynamodb or emulators.DYNAMODB_LOCAL,
            dynamodb_local_jvm=emulators.JvmProfile.THROUGHPUT
            if for_bench
            else emulators.JvmProfile.STARTUP,
            quotas=quotas,
        )
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
