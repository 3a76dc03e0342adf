"""Producer stacks for integration tests: settings on the session's emulators, and the stream
and table created the way ``keo init`` does, without pynamodb's 2 s polling of a table that is
ready in 50 ms. Imported by path, like ``streamcheck``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

from cli.init import _create_stream
from devstack import emulators as local_stack
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
    _create_stream(kinesis_client(settings, for_put=False), settings.stream, shards, 30.0)
    ledger = ledger_from(settings)
    ledger.create_table(wait=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        table = ledger.model.describe_table()
        indexes = table.get("GlobalSecondaryIndexes", [])
        if table["TableStatus"] == "ACTIVE" and all(
            i.get("IndexStatus", "ACTIVE") == "ACTIVE" for i in indexes
        ):
            return
        time.sleep(0.05)
    pytest.fail(f"table {settings.table} not ACTIVE")
