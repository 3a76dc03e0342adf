"""``keo init``: create the stream and the ledger table (idempotent, waits until ACTIVE)."""

from __future__ import annotations

from typing import Annotated

import botocore.exceptions
import typer

from cli.exit_codes import ExitCode
from cli.options import (
    DynamoEndpointOpt,
    KinesisEndpointOpt,
    StreamOpt,
    TableOpt,
    exit_on_errors,
    load_settings,
)
from dedupe_store.errors import aws_error_code
from dedupe_store.ledger import TtlStatus
from kinesis_store.provisioning import StreamSpec, provision_stream
from producer.clients import kinesis_client
from producer.wiring import ledger_from

DEFAULT_SHARDS = 4


def init(
    stream: StreamOpt = None,
    shards: Annotated[
        int | None,
        typer.Option(
            "--shards",
            "-n",
            min=1,
            max=10_000,
            help=f"shards of a new provisioned stream \\[default {DEFAULT_SHARDS}]",
            show_default=False,
        ),
    ] = None,
    on_demand: Annotated[
        bool,
        typer.Option(
            "--on-demand", help="a new stream in on-demand mode (Kinesis scales its shards)"
        ),
    ] = False,
    retention_hours: Annotated[
        int | None,
        typer.Option(
            "--retention-hours",
            min=24,
            max=8760,
            help="retention of a new stream (the exactly-once window is min(dedupe TTL, "
            "retention)) \\[default 24]",
            show_default=False,
        ),
    ] = None,
    kms_key: Annotated[
        str | None,
        typer.Option(
            "--kms-key",
            help="encrypt a new stream with this KMS key (id, ARN, or alias such as "
            "alias/aws/kinesis) \\[default: not encrypted]",
            show_default=False,
        ),
    ] = None,
    table: TableOpt = None,
    kinesis_endpoint_url: KinesisEndpointOpt = None,
    dynamodb_endpoint_url: DynamoEndpointOpt = None,
    timeout_s: Annotated[float, typer.Option(help="how long to wait for ACTIVE")] = 120.0,
) -> None:
    """Create the Kinesis stream and the DynamoDB ledger table, and wait until both are ACTIVE.

    Safe to run again: what exists is left as it is (an existing stream keeps its shards,
    mode, retention and encryption; where they differ from what was asked, it says so on
    stderr). The table is on demand, gets the sparse in-flight index, the ledger schema
    stamp, and TTL on 'expires_at' where the backend has the TTL API (dynalite has none:
    expired items are then treated as absent by the claim condition, and never deleted).

    Example: keo init --stream orders --on-demand --retention-hours 168 --table orders-ledger
    """
    if on_demand and shards is not None:
        typer.echo("keo init: give --shards or --on-demand, not both", err=True)
        raise typer.Exit(ExitCode.USAGE)
    settings = load_settings(
        stream=stream,
        table=table,
        kinesis_endpoint_url=kinesis_endpoint_url,
        dynamodb_endpoint_url=dynamodb_endpoint_url,
    )
    spec = StreamSpec(
        shards=None if on_demand else (shards or DEFAULT_SHARDS),
        retention_hours=retention_hours,
        kms_key=kms_key,
    )
    with exit_on_errors():
        client = kinesis_client(settings, for_put=False)
        try:
            stream_state = provision_stream(
                client,
                settings.stream,
                spec,
                shards_given=shards is not None,
                timeout_s=timeout_s,
            )
        except botocore.exceptions.ClientError as exc:
            if aws_error_code(exc) != "ValidationException":
                raise
            typer.echo(f"keo init: Kinesis refused the stream as asked: {exc}", err=True)
            if on_demand:
                typer.echo(
                    "keo init: (kinesalite has no on-demand streams: give --shards, or use "
                    "kinesis-local)",
                    err=True,
                )
            raise typer.Exit(ExitCode.CONFIG) from None
        ledger = ledger_from(settings)
        created_table = ledger.create_table(wait=True)
        ttl = ledger.enable_ttl()
    for difference in stream_state.differences:
        typer.echo(
            f"keo init: stream {settings.stream} exists and is left as it is: {difference}",
            err=True,
        )
    if ttl is TtlStatus.OTHER_ATTRIBUTE:
        typer.echo(f"keo init: table {settings.table}: TTL {ttl.value}", err=True)
    typer.echo(
        f"stream {settings.stream}: {'created' if stream_state.created else 'exists'}, ACTIVE, "
        f"{stream_state.state.describe()}\n"
        f"table {settings.table}: {'created' if created_table else 'exists'}, ACTIVE, "
        f"TTL {ttl.value}"
    )
