"""``keo init``: create the stream and the ledger table (idempotent, waits until ACTIVE)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.options import (
    DynamoEndpointOpt,
    KinesisEndpointOpt,
    StreamOpt,
    TableOpt,
    exit_on_errors,
    load_settings,
)
from producer.kinesis import create_stream
from producer.wiring import kinesis_client, ledger_from


def init(
    stream: StreamOpt = None,
    shards: Annotated[
        int, typer.Option("--shards", "-n", min=1, max=10_000, help="shards of a new stream")
    ] = 4,
    table: TableOpt = None,
    kinesis_endpoint_url: KinesisEndpointOpt = None,
    dynamodb_endpoint_url: DynamoEndpointOpt = None,
    timeout_s: Annotated[float, typer.Option(help="how long to wait for ACTIVE")] = 120.0,
) -> None:
    """Create the Kinesis stream and the DynamoDB ledger table, and wait until both are ACTIVE.

    Safe to run again: what exists is left as it is (an existing stream keeps its shard
    count). The table gets the sparse in-flight index and TTL on 'expires_at' where the
    backend has the TTL API (dynalite has none: expired items are then treated as absent by
    the claim condition, and never deleted).

    Example: keo init --stream orders --shards 4 --table orders-ledger
    """
    settings = load_settings(
        stream=stream,
        table=table,
        kinesis_endpoint_url=kinesis_endpoint_url,
        dynamodb_endpoint_url=dynamodb_endpoint_url,
    )
    with exit_on_errors():
        client = kinesis_client(settings, for_put=False)
        created_stream = create_stream(client, settings.stream, shards, timeout_s=timeout_s)
        ledger = ledger_from(settings)
        created_table = ledger.create_table(wait=True)
        ttl = ledger.enable_ttl()
    typer.echo(
        f"stream {settings.stream}: {'created' if created_stream else 'exists'}, ACTIVE\n"
        f"table {settings.table}: {'created' if created_table else 'exists'}, ACTIVE, "
        f"TTL {'on (expires_at)' if ttl else 'not supported by this backend'}"
    )
