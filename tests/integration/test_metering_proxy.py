"""The metering proxy on a real dynalite: it bills what the meter bills in-process.

The demo meters Spark's executors through :class:`devstack.metering_proxy.MeteringProxy`,
whose bill is only worth what the in-process meter's is: so each test sends a workload
through the proxy while a second meter watches the same client in-process, and compares.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import stacks

from devstack import emulators as local_stack
from devstack.cost_meter import BillingMeter, MeterReading, ledger_table_spec
from devstack.demo import messages
from devstack.metering_proxy import MeteringProxy
from producer.outcomes import OutcomeStatus
from producer.wiring import build_stack, ledger_from

if TYPE_CHECKING:
    from conftest import Names


def test_the_proxy_bills_key_and_replay_mode_as_the_meter_does_in_process(
    emulators: local_stack.Endpoints, names: Names
) -> None:
    """GIVEN a producer whose DynamoDB client reaches dynalite through the proxy, and a second
    meter attached to that client in-process (reading new images with a botocore client)
    WHEN it sends 40 messages in key mode, sends them again (every claim lost: a failed
    condition each), and sends a replay-mode run twice (the second sends nothing)
    THEN both meters bill the same requests, writes, failed conditions and units, exactly."""
    # no call given up on a busy machine: an SDK retry is one call in-process, two at the proxy
    settings = stacks.fresh(emulators, names, shards=1, ledger_read_timeout_s=60)
    unwatched = ledger_from(settings).client

    def read_item(table: str, key: Any) -> Any:
        return unwatched.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")

    in_process = BillingMeter({settings.table: ledger_table_spec()}, read_item=read_item)
    batch = messages(40)
    with MeteringProxy(str(settings.dynamodb_endpoint_url), settings.table) as proxy:
        through_proxy = proxy.meter
        stack = build_stack(settings.model_copy(update={"dynamodb_endpoint_url": proxy.endpoint}))
        in_process.attach(stack.ledger.client)
        before = through_proxy.snapshot()  # the stack's own start: before the meter watched
        with stack.producer(owner="first") as producer:
            assert {o.status for o in producer.send(batch)} == {OutcomeStatus.SENT}
        with stack.producer(owner="again") as producer:
            assert {o.status for o in producer.send(batch)} == {OutcomeStatus.DUPLICATE}
        replay = stack.replay_producer()
        for _ in range(2):
            replay.send_run("run-1", batch)

    billed, seen = _since(through_proxy.snapshot(), before), in_process.snapshot()
    assert seen.failed_calls == seen.retried_attempts == 0
    assert billed == seen
    assert billed.requests_by_operation["UpdateItem"] >= 80
    assert billed.conditional_check_failures >= 40
    assert billed.total_write_units >= 80
    assert billed.inexact_calls == 0


def _since(now: MeterReading, before: MeterReading) -> MeterReading:
    """What ``now`` billed past ``before``."""
    requests = Counter(now.requests_by_operation)
    requests.subtract(before.requests_by_operation)
    counts = {
        f.name: getattr(now, f.name) - getattr(before, f.name)
        for f in fields(MeterReading)
        if f.name != "requests_by_operation"
    }
    return MeterReading(requests_by_operation=+requests, **counts)
