"""Producer stacks for integration tests: settings on the session's emulators, and the stream
and table created the way ``keo init`` does, without pynamodb's 2 s polling of a table that is
ready in 50 ms. Imported by path, like ``streamcheck``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

from dedupe_store.ledger import DynamoDBLedger
from devstack import emulators as local_stack
from producer.kinesis import create_stream
from producer.retries import poll_until
from producer.settings import ProducerSettings
from producer.wiring import kinesis_client, ledger_from

if TYPE_CHECKING:
    from conftest import Names


def settings_for(
    emulators: local_stack.Endpoints,
    names: Names,
    timing: Mapping[str, Any],
    **overrides: Any,
) -> ProducerSettings:
    values: dict[str, Any] = {
        "stream": names.stream,
        "table": names.table,
        "kinesis_endpoint_url": emulators.kinesis,
        "dynamodb_endpoint_url": emulators.dynamodb,
        "region": local_stack.REGION,
        **timing,
        **overrides,
    }
    return ProducerSettings(**values)


def create_stream_and_table(settings: ProducerSettings, shards: int) -> None:
    create_stream(kinesis_client(settings, for_put=False), settings.stream, shards, timeout_s=30)
    create_table(settings)


def create_table(settings: ProducerSettings) -> None:
    """The ledger table, ACTIVE with its index, stamped with this ledger's schema version
    (as 'keo init' leaves it: a table with items and no stamp would read as version 1)."""
    ledger = ledger_from(settings)
    ledger.create_table(wait=False)
    wait_table_active(ledger)
    ledger.ensure_ready()


def wait_table_active(ledger: DynamoDBLedger, timeout_s: float = 10) -> None:
    """Polled every 50 ms: pynamodb's own wait polls every 2 s, the emulators take 50 ms."""

    def active() -> bool:
        table = ledger.model.describe_table()
        indexes = table.get("GlobalSecondaryIndexes", [])
        return bool(table["TableStatus"] == "ACTIVE") and all(
            i.get("IndexStatus", "ACTIVE") == "ACTIVE" for i in indexes
        )

    if not poll_until(active, timeout_s=timeout_s, interval_s=0.05):
        pytest.fail(f"table {ledger.table_name} not ACTIVE after {timeout_s:g} s")
