"""Options shared by subcommands, and the translation of errors into exit codes."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import botocore.exceptions
import typer
from pydantic import ValidationError

from cli.exit_codes import ExitCode
from dedupe_store.errors import LedgerError, LedgerSchemaError
from dedupe_store.settings import env_var
from producer.errors import KeoError, StreamNotFoundError
from producer.settings import ProducerSettings

log = logging.getLogger(__name__)

StreamOpt = Annotated[
    str | None, typer.Option("--stream", "-s", help="Kinesis stream [env KEO_STREAM]")
]
TableOpt = Annotated[
    str | None, typer.Option("--table", "-t", help="DynamoDB ledger table [env KEO_TABLE]")
]
KinesisEndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--kinesis-endpoint-url",
        help="Kinesis endpoint [env KEO_KINESIS_ENDPOINT_URL; unset: real AWS]",
    ),
]
DynamoEndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--dynamodb-endpoint-url",
        help="DynamoDB endpoint [env KEO_DYNAMODB_ENDPOINT_URL; unset: real AWS]",
    ),
]


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
            typer.echo(f"keo: invalid setting{where}: {message}", err=True)
        raise typer.Exit(ExitCode.CONFIG) from None


@contextlib.contextmanager
def exit_on_errors() -> Iterator[None]:
    """Turn the errors a user can act on into one line on stderr and a documented exit code."""
    try:
        yield
    except (StreamNotFoundError, LedgerSchemaError) as exc:
        typer.echo(f"keo: {exc}", err=True)
        raise typer.Exit(ExitCode.CONFIG) from None
    except (KeoError, LedgerError) as exc:
        log.debug("failed", exc_info=True)
        typer.echo(f"keo: {exc}", err=True)
        code = ExitCode.UNAVAILABLE if getattr(exc, "retriable", False) else ExitCode.FAILED
        raise typer.Exit(code) from None
    except botocore.exceptions.NoCredentialsError as exc:
        typer.echo(f"keo: {exc}: configure AWS credentials the standard way", err=True)
        raise typer.Exit(ExitCode.CONFIG) from None
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        typer.echo(f"keo: AWS call failed: {exc}", err=True)
        raise typer.Exit(ExitCode.UNAVAILABLE) from None
    except ValueError as exc:
        typer.echo(f"keo: {exc}", err=True)
        raise typer.Exit(ExitCode.CONFIG) from None


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
