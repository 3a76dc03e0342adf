"""``DynamoDBLedger`` translates every DynamoDB error in one place, keeping it as the cause.

No socket: the ledger's botocore client is a stub whose calls raise what DynamoDB or botocore
would.
"""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest
from pynamodb.exceptions import PutError, TableDoesNotExist

from dedupe_store.connection import ConnectionOptions
from dedupe_store.errors import (
    KeoError,
    LedgerError,
    LedgerSchemaError,
    LedgerThrottledError,
    LedgerUnavailableError,
)
from dedupe_store.ledger import DynamoDBLedger, _Translated
from dedupe_store.records import ClaimRequest, ClaimStatus, Group
from dedupe_store.states import GroupState

TABLE = "orders-ledger"
T0_MS = 1_700_000_000_000


def client_error(code: str, status: int = 400, **response: Any) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
        | response,
        "UpdateItem",
    )


# (the vendor error, the ledger error it becomes)
MAPPING = [
    (client_error("ResourceNotFoundException"), LedgerSchemaError),
    (TableDoesNotExist(TABLE), LedgerSchemaError),
    (client_error("ProvisionedThroughputExceededException"), LedgerThrottledError),
    (client_error("ThrottlingException"), LedgerThrottledError),
    (client_error("RequestLimitExceeded"), LedgerThrottledError),
    (client_error("InternalServerError", 500), LedgerUnavailableError),
    (client_error("ServiceUnavailable", 503), LedgerUnavailableError),
    (client_error("ValidationException"), LedgerUnavailableError),
    (botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"), LedgerUnavailableError),
    (botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"), LedgerUnavailableError),
    (botocore.exceptions.ConnectTimeoutError(endpoint_url="http://x"), LedgerUnavailableError),
    # pynamodb wraps botocore's error: the code is read from its cause
    (PutError("put failed", client_error("ThrottlingException")), LedgerThrottledError),
    (PutError("put failed", client_error("InternalServerError", 500)), LedgerUnavailableError),
]


class StubClient:
    """A botocore DynamoDB client whose every call raises ``error`` (or returns ``answer``)."""

    def __init__(self, error: Exception | None = None, answer: Any = None) -> None:
        self.error = error
        self.answer = answer if answer is not None else {}
        self.calls: list[str] = []

    def __getattr__(self, operation: str) -> Any:
        def call(**_kwargs: Any) -> Any:
            self.calls.append(operation)
            if self.error is not None:
                raise self.error
            return self.answer

        return call


def ledger_on(client: StubClient) -> DynamoDBLedger:
    ledger = DynamoDBLedger(ConnectionOptions(table_name=TABLE, region="us-east-1"))
    ledger._client = client
    return ledger


def group() -> Group:
    return Group(
        stream="orders",
        group_id="g-1",
        state=GroupState.OPEN,
        epoch=1,
        owner="alice",
        claimed_at_ms=T0_MS,
        lease_expires_at_ms=T0_MS + 30_000,
        members=("k-1",),
    )


def claimed_item(*, group_id: str, token: str) -> dict[str, Any]:
    """Key item ``orders#k-1`` as DynamoDB returns it: CLAIMED by ``group_id``."""
    return {
        "pk": {"S": "orders#k-1"},
        "state": {"S": "CLAIMED"},
        "attempt": {"N": "1"},
        "group": {"S": group_id},
        "claimed_at_ms": {"N": str(T0_MS)},
        "payload_digest": {"S": "digest"},
        "routing_hash_key": {"S": "1"},
        "expires_at": {"N": "9999999999"},
        "write_token": {"S": token},
    }


def request() -> ClaimRequest:
    return ClaimRequest("orders", "k-1", "digest", "1")


@pytest.mark.parametrize(("vendor", "expected"), MAPPING)
def test_every_vendor_error_becomes_its_ledger_error_with_the_cause_kept(
    vendor: Exception, expected: type[LedgerError]
) -> None:
    # GIVEN a block that meets a vendor error
    # WHEN it leaves the translation
    with pytest.raises(LedgerError) as caught, _Translated(TABLE, "update", "k-1"):
        raise vendor
    # THEN it is the ledger error mapped to it (exactly that class), raised from the vendor
    # error, naming the table and the key, retriable as the class says
    error = caught.value
    assert type(error) is expected
    assert error.__cause__ is vendor
    assert (error.table, error.key) == (TABLE, "k-1")
    assert error.retriable is (expected is not LedgerSchemaError)
    assert isinstance(error, KeoError)


@pytest.mark.parametrize(
    ("vendor", "code"),
    [
        (client_error("ThrottlingException"), "ThrottlingException"),
        (PutError("put failed", client_error("InternalServerError", 500)), "InternalServerError"),
        (botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"), None),
    ],
)
def test_the_cause_response_code_is_the_vendor_errors(vendor: Exception, code: str | None) -> None:
    with pytest.raises(LedgerError) as caught, _Translated(TABLE, "update", None):
        raise vendor
    assert caught.value.cause_response_code == code


def test_an_error_that_is_not_a_vendor_error_passes_as_it_is() -> None:
    # GIVEN a block that raises something else (a ledger error, a bug)
    # WHEN it leaves the translation
    # THEN it is not translated
    already = LedgerSchemaError("no table", table=TABLE)
    with pytest.raises(LedgerSchemaError) as caught, _Translated(TABLE, "update", None):
        raise already
    assert caught.value is already
    with pytest.raises(KeyError), _Translated(TABLE, "update", None):
        raise KeyError("attempt")


@pytest.mark.parametrize(("vendor", "expected"), MAPPING[:1] + MAPPING[2:11])
@pytest.mark.parametrize(
    "operation",
    [
        lambda ledger: ledger.claim(request(), group(), now_ms=T0_MS),
        lambda ledger: ledger.get_claim("orders", "k-1"),
        lambda ledger: ledger.batch_get_claims("orders", ["k-1"]),
        lambda ledger: list(ledger.scan_items("orders")),
        lambda ledger: list(ledger.stale_groups("orders", now_ms=T0_MS)),
        lambda ledger: ledger.open_group("orders", ["k-1"], owner="a", now_ms=T0_MS, lease_ms=1),
        lambda ledger: ledger.record_run("orders", started_ms=1, finished_ms=2, outcomes={}),
        lambda ledger: ledger.last_run("orders"),
        lambda ledger: ledger.completed_batch("orders", "q", 1, now_ms=T0_MS),
        lambda ledger: ledger.mark_batch_complete("orders", "q", 1, counts={}, now_ms=T0_MS),
        lambda ledger: ledger.delete("orders", "k-1"),
        lambda ledger: ledger.schema_version(),
    ],
    ids=[
        "claim",
        "get_claim",
        "batch_get_claims",
        "scan_items",
        "stale_groups",
        "open_group",
        "record_run",
        "last_run",
        "completed_batch",
        "mark_batch_complete",
        "delete",
        "schema_version",
    ],
)
def test_every_ledger_call_translates_what_dynamodb_raises(
    operation: Any, vendor: Exception, expected: type[LedgerError]
) -> None:
    # GIVEN DynamoDB answering every call with a vendor error
    ledger = ledger_on(StubClient(vendor))
    # WHEN the ledger is asked anything
    with pytest.raises(LedgerError) as caught:
        operation(ledger)
    # THEN the caller meets the ledger error it maps to, with the vendor error as its cause
    assert type(caught.value) is expected
    assert caught.value.__cause__ is vendor
    assert caught.value.table == TABLE


def test_a_failed_condition_is_a_lost_claim_not_an_error() -> None:
    # GIVEN DynamoDB refusing the claim's condition, returning the holder's item
    holder = claimed_item(group_id="g-other", token="theirs")
    ledger = ledger_on(StubClient(client_error("ConditionalCheckFailedException", Item=holder)))
    # WHEN the key is claimed
    result = ledger.claim(request(), group(), now_ms=T0_MS)
    # THEN the claim is lost to the holder: a value, never an error
    assert result.status is ClaimStatus.LOST
    assert result.claim is not None
    assert result.claim.group_id == "g-other"


def test_a_failed_condition_on_our_own_retried_write_is_applied() -> None:
    # GIVEN a claim whose first try was applied, and whose SDK retry fails its condition
    # (the token is found in the item: the write is ours)
    ledger = ledger_on(StubClient())
    tokens: list[str] = []

    def update_item(**kwargs: Any) -> Any:
        token = kwargs["ExpressionAttributeValues"][":token"]["S"]
        tokens.append(token)
        item = claimed_item(group_id="g-1", token=token)
        raise client_error("ConditionalCheckFailedException", Item=item)

    ledger._client.update_item = update_item
    # WHEN the key is claimed
    result = ledger.claim(request(), group(), now_ms=T0_MS)
    # THEN it is won, as the item stands
    assert result.status is ClaimStatus.WON
    assert result.claim is not None
    assert result.claim.write_token == tokens[0]


def test_a_missing_table_is_told_by_the_ledgers_own_client_and_its_other_errors_translated() -> (
    None
):
    # GIVEN DynamoDB answering that the table does not exist
    missing = StubClient(client_error("ResourceNotFoundException"))
    # WHEN a producer checks the table is ready
    with pytest.raises(LedgerSchemaError, match="does not exist: run 'keo init'"):
        ledger_on(missing).ensure_ready(stamp_new=True)
    # THEN it asked the ledger's own client (pynamodb's is only the table's creation's)
    assert missing.calls == ["describe_table"]
    # AND a DynamoDB that throttles the description is a throttle, its cause kept
    throttled = client_error("ThrottlingException")
    with pytest.raises(LedgerThrottledError) as caught:
        ledger_on(StubClient(throttled)).ensure_ready()
    assert caught.value.__cause__ is throttled
