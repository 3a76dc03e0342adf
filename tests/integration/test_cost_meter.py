"""The billing meter on a real dynalite: its bill equals a hand computation with ``billing``.

dynalite answers the calls; the meter prices what AWS would bill for them. Each test works the
expected bill out from the item images with :mod:`dedupe_store.billing`, and states the numbers
it comes to, so a change in either the meter or the model shows up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import boto3
import botocore.config
import botocore.exceptions
import pytest
import stacks
from ledger_contract.staging import in_two_halves

from dedupe_store.billing import (
    Consistency,
    TableSpec,
    WriteCost,
    batch_get_read_cost,
    get_item_read_cost,
    index_entry,
    item_size_bytes,
    query_read_cost,
    table_spec_from_description,
    write_cost,
)
from dedupe_store.ledger import DynamoDBLedger, group_pk, ledger_pk
from dedupe_store.records import ClaimRequest, ClaimStatus, Group, Position
from devstack import emulators as local_stack
from devstack.cost_meter import BillingMeter, ledger_table_spec
from producer.wiring import ledger_from

if TYPE_CHECKING:
    from conftest import Names

SPEC: TableSpec = ledger_table_spec()
STREAM = "orders"
NOW_MS = 1_732_345_678_901
LEASE_MS = 60_000


@pytest.fixture
def ledger(emulators: local_stack.Endpoints, names: Names) -> DynamoDBLedger:
    """An empty ledger table (hash key ``pk``, the in-flight index), as ``keo init`` makes it."""
    settings = stacks.settings_for(emulators, names, {})
    stacks.create_stream_and_table(settings, shards=1)
    return ledger_from(settings)


@pytest.fixture
def dynamodb(emulators: local_stack.Endpoints) -> Any:
    """A plain botocore DynamoDB client on the session's dynalite."""
    return boto3.session.Session().client(
        "dynamodb",
        endpoint_url=emulators.dynamodb,
        region_name=local_stack.REGION,
        aws_access_key_id=local_stack.DUMMY_ACCESS_KEY_ID,
        aws_secret_access_key=local_stack.DUMMY_SECRET_ACCESS_KEY,
    )


def _s(text: str) -> dict[str, str]:
    return {"S": text}


def _n(number: int) -> dict[str, str]:
    return {"N": str(number)}


def test_the_ledger_spec_matches_the_table_keo_creates(
    ledger: DynamoDBLedger, dynamodb: Any, names: Names
) -> None:
    """GIVEN the ledger table as ``keo init`` creates it
    WHEN its DescribeTable is read as a billing schema
    THEN it is the schema the meter is given: the two cannot drift apart unnoticed."""
    description = dynamodb.describe_table(TableName=names.table)["Table"]
    assert table_spec_from_description(description) == SPEC


def test_the_meter_bills_index_writes_and_failed_conditions_like_aws(
    ledger: DynamoDBLedger, dynamodb: Any, names: Names
) -> None:
    """GIVEN a meter on a client, and an empty ledger table
    WHEN the client puts an item that enters the in-flight index, updates it out of the index,
    fails a conditional update on it, and reads it back strongly consistent
    THEN the meter bills what AWS would: the table writes by the larger image, one index write
    for entering and one for leaving, one unit for the failed condition, one read unit."""
    meter = BillingMeter({names.table: SPEC})
    meter.attach(dynamodb)
    key = {"pk": _s(ledger_pk(STREAM, "k-1"))}
    claimed = {
        **key,
        "state": _s("IN_FLIGHT"),
        "attempt": _n(1),
        "inflight_bucket": _s(f"{STREAM}#3"),
        "lease_expires_at_ms": _n(NOW_MS + LEASE_MS),
        "payload": {"B": b"x" * 1500},
    }
    in_flight = {
        "ConditionExpression": "#state = :in_flight",
        "ExpressionAttributeNames": {"#state": "state"},
    }

    dynamodb.put_item(
        TableName=names.table, Item=claimed, ConditionExpression="attribute_not_exists(pk)"
    )
    delivered = dynamodb.update_item(
        TableName=names.table,
        Key=key,
        UpdateExpression="SET #state = :delivered REMOVE inflight_bucket, lease_expires_at_ms, payload",
        ExpressionAttributeValues={":delivered": _s("DELIVERED"), ":in_flight": _s("IN_FLIGHT")},
        ReturnValues="ALL_NEW",
        **in_flight,
    )["Attributes"]
    with pytest.raises(dynamodb.exceptions.ConditionalCheckFailedException):
        dynamodb.update_item(
            TableName=names.table,
            Key=key,
            UpdateExpression="SET #state = :released",
            ExpressionAttributeValues={":released": _s("RELEASED"), ":in_flight": _s("IN_FLIGHT")},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
            **in_flight,
        )
    read = dynamodb.get_item(TableName=names.table, Key=key, ConsistentRead=True)["Item"]

    expected_writes = (
        write_cost(SPEC, None, claimed)
        + write_cost(SPEC, claimed, delivered)
        + write_cost(SPEC, delivered, None, condition_failed=True)
    )
    expected_read = get_item_read_cost(read, Consistency.STRONG)
    # by hand: the claimed item is 1,592 bytes (2 units to put, 2 to shrink), its index entry
    # far under 1 KB (1 to enter, 1 to leave); the failed condition reads the 35-byte item (1)
    assert (item_size_bytes(claimed), item_size_bytes(delivered)) == (1592, 35)
    assert expected_writes == WriteCost(table_units=5, index_units=2, index_writes=2)
    assert expected_read.units == 1.0
    reading = meter.snapshot()
    assert reading.billed_write_units == expected_writes.table_units
    assert reading.billed_index_write_units == expected_writes.index_units
    assert reading.index_writes == expected_writes.index_writes
    assert reading.billed_read_units == expected_read.units
    assert reading.requests_by_operation == {"PutItem": 1, "UpdateItem": 2, "GetItem": 1}
    assert (reading.write_requests, reading.read_requests) == (3, 1)
    assert reading.conditional_check_failures == 1
    assert (reading.inexact_calls, reading.failed_calls) == (0, 0)


def test_the_meter_follows_the_ledgers_own_calls(
    ledger: DynamoDBLedger, dynamodb: Any, names: Names
) -> None:
    """GIVEN a meter on the ledger's own client (pynamodb's dispatch path)
    WHEN the ledger opens a claim group, claims a key for it, settles the group with the
    key's position, and a second producer opens a group and loses its claim of the same key
    THEN the meter bills the two PutItems, the three UpdateItems and any consistent read-back
    of the loser by the item images, read here on an unmetered client after each step: the
    groups enter the in-flight index when they open and leave it when they settle; the key's
    claim touches no index. The claim asks only for the old values, so the meter reads the
    new image itself, on the unmetered client, as the benchmark does."""

    def read_item(table: str, item_key: Any) -> Any:
        return dynamodb.get_item(TableName=table, Key=item_key, ConsistentRead=True).get("Item")

    meter = BillingMeter({names.table: SPEC}, read_item=read_item)
    meter.attach(ledger.client)
    key = {"pk": _s(ledger_pk(STREAM, "k-1"))}

    def image(item_key: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = dynamodb.get_item(
            TableName=names.table, Key=item_key, ConsistentRead=True
        )["Item"]
        return found

    def group_key(group: Group) -> dict[str, Any]:
        return {"pk": _s(group_pk(STREAM, group.group_id))}

    group = ledger.open_group(STREAM, ["k-1"], owner="producer-a", now_ms=NOW_MS, lease_ms=LEASE_MS)
    opened = image(group_key(group))
    request = ClaimRequest(STREAM, "k-1", "digest", "123", payload=b"p" * 2000)
    won = ledger.claim(request, group, now_ms=NOW_MS)
    assert won.status is ClaimStatus.WON
    claimed = image(key)
    position = Position(
        "shardId-000000000000", "49590338271490256608559692538361571095921575989136588898"
    )
    assert ledger.record_positions(group, {"k-1": position}, settle=True, now_ms=NOW_MS + 1).applied
    settled = image(group_key(group))
    other = ledger.open_group(
        STREAM, ["k-1"], owner="producer-b", now_ms=NOW_MS + 2, lease_ms=LEASE_MS
    )
    other_opened = image(group_key(other))
    lost = ledger.claim(request, other, now_ms=NOW_MS + 2)
    assert lost.status is ClaimStatus.LOST
    assert image(key) == claimed  # the lost claim wrote nothing

    reading = meter.snapshot()
    expected_writes = (
        write_cost(SPEC, None, opened)
        + write_cost(SPEC, None, claimed)
        + write_cost(SPEC, opened, settled)
        + write_cost(SPEC, None, other_opened)
        + write_cost(SPEC, claimed, None, condition_failed=True)
    )
    reads = reading.requests_by_operation.get("GetItem", 0)
    expected_read_units = reads * get_item_read_cost(claimed, Consistency.STRONG).units
    # by hand: the key item is its 2,000-byte payload (7 + 2000) and 157 bytes of attributes:
    # 3 units to claim, and the lost claim is billed by it (3 units); it has no index
    # attribute, so the claim touches no index
    assert item_size_bytes(claimed) == 2007 + 157
    assert not {"inflight_bucket", "lease_expires_at_ms"} & set(claimed)
    # a group item is 186 bytes + its inflight_bucket ("orders#0" .. "orders#15": 15 + 8 or 9)
    # while OPEN: 1 unit to open; SETTLED, it is 211 bytes + its positions (9 + 49: a 52-byte
    # payload, 48 as a zlib stream, and the header): 1 unit. Its index entry (pk 39, bucket 23
    # or 24, lease 27) is under 1 KB: 1 unit to enter at each open, 1 to leave at the settle
    for group_item in (opened, other_opened):
        bucket = group_item["inflight_bucket"]["S"]
        assert item_size_bytes(group_item) == 186 + 15 + len(bucket)
        entry = index_entry(SPEC, SPEC.indexes[0], group_item)
        assert entry is not None
        assert item_size_bytes(entry) == 39 + 15 + len(bucket) + 27
    assert "inflight_bucket" not in settled
    assert item_size_bytes(settled) == 211 + 9 + 49
    assert expected_writes == WriteCost(
        table_units=1 + 3 + 1 + 1 + 3, index_units=3, index_writes=3
    )
    assert reading.billed_write_units == expected_writes.table_units
    assert reading.billed_index_write_units == expected_writes.index_units
    assert reading.index_writes == expected_writes.index_writes
    assert reading.billed_read_units == expected_read_units
    assert reading.requests_by_operation.get("PutItem") == 2
    assert reading.requests_by_operation.get("UpdateItem") == 3
    assert reading.conditional_check_failures == 1
    assert reading.inexact_calls == 0


def test_the_meter_bills_batches_and_index_queries_and_flags_a_blind_update(
    ledger: DynamoDBLedger, dynamodb: Any, names: Names
) -> None:
    """GIVEN a meter on a client, and an empty ledger table
    WHEN the client batch-writes an item in the index and one outside it, batch-gets both and
    an absent key, queries the index, then updates an item without asking for its new image
    THEN each batched item is billed on its own, the query by the index entries it returns,
    and the blind update by the old image (a lower bound) and counted inexact, until a
    consistent read shows the meter the item again."""
    meter = BillingMeter({names.table: SPEC})
    meter.attach(dynamodb)
    keys = [{"pk": _s(ledger_pk(STREAM, f"k-{n}"))} for n in (1, 2, 3)]
    indexed = {
        **keys[0],
        "inflight_bucket": _s(f"{STREAM}#0"),
        "lease_expires_at_ms": _n(NOW_MS),
        "payload": {"B": b"x" * 1200},
    }
    outside = {**keys[1], "state": _s("DELIVERED")}

    dynamodb.batch_write_item(
        RequestItems={names.table: [{"PutRequest": {"Item": item}} for item in (indexed, outside)]}
    )
    dynamodb.batch_get_item(RequestItems={names.table: {"Keys": keys, "ConsistentRead": True}})
    entries = dynamodb.query(
        TableName=names.table,
        IndexName=SPEC.indexes[0].name,
        KeyConditionExpression="inflight_bucket = :bucket",
        ExpressionAttributeValues={":bucket": _s(f"{STREAM}#0")},
    )["Items"]
    dynamodb.update_item(
        TableName=names.table,
        Key=keys[1],
        UpdateExpression="SET attempt = :one",
        ExpressionAttributeValues={":one": _n(1)},
    )
    blind = meter.snapshot()
    updated = dynamodb.get_item(TableName=names.table, Key=keys[1], ConsistentRead=True)["Item"]
    dynamodb.delete_item(TableName=names.table, Key=keys[1])

    assert entries == [index_entry(SPEC, SPEC.indexes[0], indexed)]  # KEYS_ONLY: keys only
    expected_writes = (
        write_cost(SPEC, None, indexed)
        + write_cost(SPEC, None, outside)
        + write_cost(SPEC, outside, outside)  # the blind update: what the meter can know
        + write_cost(SPEC, updated, None)
    )
    expected_reads = (
        batch_get_read_cost([indexed, outside, None], Consistency.STRONG)
        + query_read_cost(entries, Consistency.EVENTUAL)
        + get_item_read_cost(updated, Consistency.STRONG)
    )
    # by hand: the 1,269-byte indexed item costs 2 units and enters the index (1); the others
    # are tiny (1 each); reads are 1 + 1 + 1 (the absent key) + 0.5 (query) + 1
    assert item_size_bytes(indexed) == 12 + 23 + 27 + 1207
    assert expected_writes == WriteCost(table_units=2 + 1 + 1 + 1, index_units=1, index_writes=1)
    assert expected_reads.units == 4.5
    reading = meter.snapshot()
    assert reading.billed_write_units == expected_writes.table_units
    assert reading.billed_index_write_units == expected_writes.index_units
    assert reading.billed_read_units == expected_reads.units
    assert (reading.write_requests, reading.read_requests) == (4, 5)
    # the blind update is the one inexact call; the read after it made the delete exact again
    assert (blind.inexact_calls, reading.inexact_calls) == (1, 1)


def test_a_detached_meter_stops_counting(dynamodb: Any, names: Names) -> None:
    """GIVEN a meter attached twice to a client, then detached
    WHEN the client makes a call
    THEN the meter counts nothing: attaching is idempotent and detaching removes every hook."""
    meter = BillingMeter({names.table: SPEC})
    meter.attach(dynamodb)
    meter.attach(dynamodb)
    dynamodb.list_tables(Limit=1)
    meter.detach(dynamodb)
    dynamodb.list_tables(Limit=1)
    assert meter.snapshot().requests_by_operation == {"ListTables": 1}


def test_a_call_that_got_no_response_is_counted_failed_and_inexact(names: Names) -> None:
    """GIVEN a meter on a client whose endpoint does not answer (nothing listens there)
    WHEN a write is tried
    THEN the meter counts it as failed and inexact (it may have been applied), and lets the
    client's error through."""
    unreachable = boto3.session.Session().client(
        "dynamodb",
        endpoint_url="http://127.0.0.1:9",
        region_name=local_stack.REGION,
        aws_access_key_id=local_stack.DUMMY_ACCESS_KEY_ID,
        aws_secret_access_key=local_stack.DUMMY_SECRET_ACCESS_KEY,
        config=botocore.config.Config(retries={"total_max_attempts": 1}, connect_timeout=1),
    )
    meter = BillingMeter({names.table: SPEC})
    meter.attach(unreachable)
    with pytest.raises(botocore.exceptions.EndpointConnectionError):
        unreachable.put_item(TableName=names.table, Item={"pk": _s("k")})
    reading = meter.snapshot()
    assert reading.requests_by_operation == {"PutItem": 1}
    assert (reading.failed_calls, reading.inexact_calls, reading.write_requests) == (1, 1, 0)


def test_the_meter_bills_a_batch_of_claims_statement_by_statement(
    emulators: local_stack.Endpoints, dynamodb_local_endpoint: str, names: Names
) -> None:
    """GIVEN a meter on a ledger on DynamoDB Local, which claims in PartiQL batches
    WHEN 30 new keys are claimed (two requests), then claimed again by another group
    THEN each INSERT is billed as its item's write (1 unit each: the items are under 1 KB),
    each refused one as a failed condition on the item that exists (1 unit), the read-back as
    30 consistent reads: the same units as 30 single claims and 30 lost ones, in 2 + 3
    requests rather than 30 + 30."""
    settings = stacks.settings_for(
        emulators, names, {}, dynamodb_endpoint_url=dynamodb_local_endpoint
    )
    ledger = ledger_from(settings)
    assert ledger.create_table(wait=True)
    meter = BillingMeter({names.table: SPEC})
    keys = [f"k-{i:02d}" for i in range(30)]
    first = ledger.open_group(STREAM, keys, owner="a", now_ms=NOW_MS, lease_ms=LEASE_MS)
    second = ledger.open_group(STREAM, keys, owner="b", now_ms=NOW_MS, lease_ms=LEASE_MS)
    requests = [ClaimRequest(STREAM, k, "digest", "123") for k in keys]
    meter.attach(ledger.client)
    won = in_two_halves(ledger, requests, first, now_ms=NOW_MS)
    lost = in_two_halves(ledger, requests, second, now_ms=NOW_MS)
    reading = meter.snapshot()
    assert [getattr(r, "status", r) for r in won] == [ClaimStatus.WON] * 30
    assert [getattr(r, "status", r) for r in lost] == [ClaimStatus.LOST] * 30
    assert dict(reading.requests_by_operation) == {"BatchExecuteStatement": 4, "BatchGetItem": 1}
    assert (reading.billed_write_units, reading.conditional_check_failures) == (60, 30)
    assert reading.billed_index_write_units == 0
    assert (reading.read_requests, reading.inexact_calls) == (30, 0)
