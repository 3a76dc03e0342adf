"""Producer stacks for integration tests: settings on the session's emulators, and the stream
and table created the way ``keo init`` does, without pynamodb's 2 s polling of a table that is
ready in 50 ms. Imported by path, like ``streamcheck``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from dedupe_store.ledger import DynamoDBLedger
from devstack import emulators as local_stack
from devstack.dynamodb_quota_proxy import DynamoDbQuotaProxy
from devstack.quota_proxy import KinesisQuotaProxy
from kinesis_store.provisioning import create_stream
from producer.clients import kinesis_client
from producer.retries import poll_until
from producer.settings import ProducerSettings
from producer.wiring import ledger_from

if TYPE_CHECKING:
    from conftest import Names


# Short leases, so that read-back and stale groups come quickly: put timeouts 1 s + 1 s, skew
# 0.5 s, lease 3 s (the shortest these allow), waits on another owner's claim from 50 ms.
# Short timeouts and a short lease, the signature fence off (a lease of seconds is below the
# fence's minimum of window + timeouts + 2 x skew); tests of the fence set a window of seconds.
FAST: dict[str, Any] = {
    "put_connect_timeout_s": 1.0,
    "put_read_timeout_s": 1.0,
    "clock_skew_s": 0.5,
    "lease_s": 3.0,
    "put_fence": "off",
    "wait_initial_s": 0.05,
    "wait_max_s": 0.5,
}
# The same, as the environment of a `keo` subprocess.
FAST_ENV: dict[str, str] = {f"KEO_{name.upper()}": str(value) for name, value in FAST.items()}


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


def fresh(
    emulators: local_stack.Endpoints, names: Names, *, shards: int = 2, **overrides: Any
) -> ProducerSettings:
    """Settings on this test's own stream and table, both created."""
    settings = settings_for(emulators, names, {}, **overrides)
    create_stream_and_table(settings, shards=shards)
    return settings


def create_stream_and_table(settings: ProducerSettings, shards: int) -> None:
    create_stream(kinesis_client(settings, for_put=False), settings.stream, shards, timeout_s=30)
    create_table(settings)


def create_table(settings: ProducerSettings) -> None:
    """The ledger table, ACTIVE with its index."""
    ledger = ledger_from(settings)
    ledger.create_table(wait=False)
    wait_table_active(ledger)


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


@contextmanager
def quota_mode(emulators: local_stack.Endpoints) -> Iterator[local_stack.Endpoints]:
    """The session's emulators behind quota proxies of their own (AWS's quotas), as the quota
    mode's stack names them: the proxies, and the emulators they front."""
    with (
        KinesisQuotaProxy(emulators.kinesis) as kinesis,
        DynamoDbQuotaProxy(emulators.dynamodb) as dynamodb,
    ):
        yield local_stack.Endpoints(
            kinesis=kinesis.endpoint,
            dynamodb=dynamodb.endpoint,
            kinesis_emulator=emulators.kinesis,
            dynamodb_emulator_endpoint=emulators.dynamodb,
        )
