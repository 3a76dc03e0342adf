"""The contract of ``DynamoDBLedger``, run against two DynamoDBs: dynalite and moto (server mode).

dynalite ignores ``ReturnValuesOnConditionCheckFailure`` (the ledger reads the item back after a
lost condition); moto returns the old item with the error. Both paths must keep the contract:
every transition is conditional on the state and attempt its caller saw, a lost condition
returns the record that won, and a request repeated after its first try applied says "applied".

The cases every backend passes live in ``tests/ledger_contract.py``; here are the fixture and
the cases only DynamoDB can stage (a response lost on the wire, items written in bulk).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import stacks
from moto.server import ThreadedMotoServer

from dedupe_store.errors import LedgerSchemaError
from dedupe_store.inflight import bucket_of, bucket_partition
from dedupe_store.ledger import LEDGER_SCHEMA_VERSION, SCHEMA_PK, DynamoDBLedger, ledger_pk
from dedupe_store.model import ConnectionOptions
from dedupe_store.records import ClaimStatus
from dedupe_store.states import LedgerState
from devstack import emulators as local_stack
from devstack.faults import FaultInjector, FaultKind

if TYPE_CHECKING:
    from conftest import Names

# the cases every Ledger backend passes, collected by pytest from this module's namespace
from ledger_contract import *  # noqa: F403
from ledger_contract import (
    ALICE,
    BOB,
    LEASE_MS,
    POSITION,
    STREAM,
    T0_MS,
    TTL_S,
    claim,
    request_for,
)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(params=["dynalite", "moto"])
def ledger(request: pytest.FixtureRequest, names: Names) -> DynamoDBLedger:
    if request.param == "dynalite":
        endpoint: str = request.getfixturevalue("emulators").dynamodb
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
    options = ConnectionOptions(
        table_name=names.table,
        region=local_stack.REGION,
        host=endpoint,
        aws_access_key_id=local_stack.DUMMY_ACCESS_KEY_ID,
        aws_secret_access_key=local_stack.DUMMY_SECRET_ACCESS_KEY,
    )
    ledger = DynamoDBLedger(options, dedupe_ttl_s=TTL_S, inflight_buckets=4)
    assert ledger.create_table(wait=False)
    stacks.wait_table_active(ledger)
    return ledger


# --- a request retried by the SDK after its first try applied -----------------------------------
#
# The response of an applied write is lost on the wire; the SDK (3 retries here) sends the very
# same request again, whose condition now fails on its own effect. Each write must recognise it.


def test_a_claim_retried_by_the_sdk_after_its_first_try_applied_reports_won(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN the response of the next claim is lost after it applied
    with FaultInjector(ledger.client, seed=1) as faults:
        faults.response_lost_in_transit(operations=["UpdateItem"], count=1)
        # WHEN a producer claims a new key
        result = ledger.claim(
            request_for("k-retried"), owner=ALICE, now_ms=T0_MS, lease_ms=LEASE_MS
        )
    # THEN the SDK's retry is recognised: the claim is won, once, attempt 1
    assert faults.injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 1}
    assert result.status is ClaimStatus.WON
    assert result.record is not None
    assert (result.record.attempt, result.record.owner) == (1, ALICE)
    assert ledger.get(STREAM, "k-retried") == result.record


def test_a_mark_retried_by_the_sdk_after_its_first_try_applied_reports_applied(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN a claim, and the response of the next write lost after it applied
    held = claim(ledger, "k-mark-retried")
    with FaultInjector(ledger.client, seed=2) as faults:
        faults.response_lost_in_transit(operations=["UpdateItem"], count=1)
        # WHEN it is marked delivered
        result = ledger.mark_delivered(held, POSITION, now_ms=T0_MS + 1)
    # THEN the retried mark is recognised as applied
    assert faults.injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 1}
    assert result.applied
    assert result.current is not None
    assert (result.current.state, result.current.position) == (LedgerState.DELIVERED, POSITION)


def test_a_take_over_retried_by_the_sdk_after_its_first_try_applied_reports_won(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN an expired claim, and the response of the next write lost after it applied
    seen = claim(ledger, "k-take-retried")
    with FaultInjector(ledger.client, seed=3) as faults:
        faults.response_lost_in_transit(operations=["UpdateItem"], count=1)
        # WHEN bob takes it over
        result = ledger.take_over(seen, owner=BOB, now_ms=T0_MS + LEASE_MS + 1, lease_ms=LEASE_MS)
    # THEN the retried take-over is recognised as won: attempt 2, bob's
    assert faults.injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 1}
    assert result.status is ClaimStatus.WON
    assert result.record is not None
    assert (result.record.attempt, result.record.owner) == (2, BOB)


def test_a_release_retried_by_the_sdk_after_its_first_try_applied_reports_applied(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN a claim, and the response of the next write lost after it applied
    seen = claim(ledger, "k-release-retried")
    with FaultInjector(ledger.client, seed=4) as faults:
        faults.response_lost_in_transit(operations=["UpdateItem"], count=1)
        # WHEN it is released
        result = ledger.release(seen)
    # THEN the retried release is recognised as applied
    assert faults.injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 1}
    assert result.applied
    assert result.current is not None
    assert result.current.state is LedgerState.RELEASED


# --- batched reads (items written the way this backend can) ------------------------------


def test_batch_get_reads_250_keys_and_leaves_absent_ones_out(ledger: DynamoDBLedger) -> None:
    # GIVEN 250 keys in the ledger (more than one BatchGetItem of 100): a few claimed, the rest
    # written in bulk (moto takes ~60 ms per conditional write)
    keys = [f"k-batch-{i:03d}" for i in range(250)]
    claimed = {key: claim(ledger, key) for key in keys[:5]}
    with ledger.model.batch_write() as batch:
        for key in keys[5:]:
            request = request_for(key)
            batch.save(
                ledger.model(
                    ledger_pk(STREAM, key),
                    stream=STREAM,
                    msg_key=key,
                    state=LedgerState.IN_FLIGHT.value,
                    attempt=1,
                    owner=ALICE,
                    claimed_at_ms=T0_MS,
                    lease_expires_at_ms=T0_MS + LEASE_MS,
                    inflight_bucket=bucket_partition(
                        STREAM, bucket_of(key, ledger.inflight_buckets)
                    ),
                    payload_digest=request.payload_digest,
                    routing_hash_key=request.routing_hash_key,
                )
            )
    # WHEN they are read in one call, with absent keys and repeats mixed in
    found = ledger.batch_get(STREAM, [*keys, "k-absent-1", keys[0], "k-absent-2"])
    # THEN every claimed key comes back once, absent ones are left out
    assert sorted(found) == keys
    assert all(r.state is LedgerState.IN_FLIGHT and r.attempt == 1 for r in found.values())
    assert all(found[key] == record for key, record in claimed.items())
    assert found["k-batch-249"].lease_expires_at_ms == T0_MS + LEASE_MS
    assert ledger.get(STREAM, "k-absent-1") is None


# --- the schema version -------------------------------------------------------------------------


def test_a_table_stamped_by_another_ledger_version_is_refused_not_misread(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN a table created and stamped by this version: it is accepted
    ledger.create_table(wait=True)
    assert ledger.schema_version() == LEDGER_SCHEMA_VERSION
    ledger.ensure_ready()
    # WHEN another ledger version's stamp is found in it
    ledger.client.put_item(
        TableName=ledger.table_name,
        Item={"pk": {"S": SCHEMA_PK}, "schema_version": {"N": str(LEDGER_SCHEMA_VERSION + 1)}},
    )
    # THEN every process that checks the table refuses it, naming both versions
    newer, ours = LEDGER_SCHEMA_VERSION + 1, LEDGER_SCHEMA_VERSION
    with pytest.raises(
        LedgerSchemaError, match=f"schema version {newer}; this keo reads version {ours}"
    ):
        ledger.ensure_ready()
    with pytest.raises(LedgerSchemaError):
        ledger.create_table(wait=True)
