"""Claims 25 to a request: the PartiQL INSERT of a claim's item, what each statement's result
means, and what a pending claim's item says (``dedupe_store.batch_claims``; the ledger's I/O
is test_ledger_contract.py's)."""

from __future__ import annotations

import pytest

from dedupe_store.batch_claims import (
    MAX_STATEMENTS,
    StatementResult,
    insert_statement,
    judged,
    result_of,
    split,
)
from dedupe_store.records import ClaimRequest, ClaimResult, KeyClaim, PendingClaim
from dedupe_store.states import KeyState

REQUEST = ClaimRequest("orders", "k-1", "digest-1", "12345")
NOW_MS = 1_700_000_000_500
PENDING = PendingClaim(REQUEST, token="ours")


def item(
    state: KeyState = KeyState.CLAIMED, *, holder: str = "theirs", expires_at_s: int = 1_700_003_600
) -> KeyClaim:
    """The key item as read; ``holder``: the token of the write that made it."""
    return KeyClaim(
        stream="orders",
        key="k-1",
        state=state,
        attempt=1,
        group_id="g-1",
        claimed_at_ms=1_699_999_000_000,
        payload_digest="digest-1",
        routing_hash_key="12345",
        expires_at_s=expires_at_s,
        write_token=holder,
    )


def test_an_insert_writes_the_item_a_claim_of_an_absent_key_writes() -> None:
    # GIVEN a claim request without a payload
    # WHEN its statement is built
    statement = insert_statement(
        "keo-ledger", "orders#k-1", REQUEST, group_id="g-1", now_ms=1_000, expires_at_s=9, token="t"
    )
    # THEN it INSERTs CLAIMED at attempt 1, for the group, with the digest, the routing key,
    # the TTL and the token, each a parameter (never text in the statement)
    assert statement["Statement"] == (
        "INSERT INTO \"keo-ledger\" VALUE {'pk': ?, 'state': ?, 'attempt': ?, 'group': ?, "
        "'claimed_at_ms': ?, 'payload_digest': ?, 'routing_hash_key': ?, 'expires_at': ?, "
        "'write_token': ?}"
    )
    assert statement["Parameters"] == [
        {"S": "orders#k-1"},
        {"S": "CLAIMED"},
        {"N": "1"},
        {"S": "g-1"},
        {"N": "1000"},
        {"S": "digest-1"},
        {"S": "12345"},
        {"N": "9"},
        {"S": "t"},
    ]


def test_an_insert_carries_the_payload_when_the_request_stores_it() -> None:
    request = ClaimRequest("orders", "k-1", "digest-1", "12345", payload=b"p")
    statement = insert_statement(
        "keo-ledger", "orders#k-1", request, group_id="g", now_ms=1, expires_at_s=2, token="t"
    )
    assert statement["Statement"].endswith("'write_token': ?, 'payload': ?}")
    assert statement["Parameters"][-1] == {"B": b"p"}


@pytest.mark.parametrize(
    ("response", "meaning"),
    [
        ({"TableName": "t"}, StatementResult.WON),
        ({"Error": {"Code": "DuplicateItem"}}, StatementResult.EXISTS),
        ({"Error": {"Code": "ConditionalCheckFailed"}}, StatementResult.EXISTS),
        ({"Error": {"Code": "ProvisionedThroughputExceeded"}}, StatementResult.RETRY),
        ({"Error": {"Code": "ThrottlingError"}}, StatementResult.RETRY),
        ({"Error": {"Code": "RequestLimitExceeded"}}, StatementResult.RETRY),
        ({"Error": {"Code": "InternalServerError"}}, StatementResult.UNKNOWN),
        ({"Error": {"Code": "TransactionConflict"}}, StatementResult.UNKNOWN),
    ],
    ids=[
        "applied",
        "duplicate",
        "condition",
        "throughput",
        "throttling",
        "request-limit",
        "5xx",
        "conflict",
    ],
)
def test_a_statements_result_is_won_exists_retry_or_unknown(
    response: dict[str, object], meaning: StatementResult
) -> None:
    # GIVEN one statement's response
    # WHEN it is read
    # THEN applied is won; the key exists: judge its item; throttled: send it again; anything
    # else may have applied: read the item back
    assert result_of(response) is meaning


@pytest.mark.parametrize(
    ("count", "sizes"), [(0, []), (25, [25]), (26, [25, 1]), (60, [25, 25, 10])]
)
def test_requests_are_split_25_to_a_batch_in_order(count: int, sizes: list[int]) -> None:
    items = list(range(count))
    batches = split(items)
    assert [len(b) for b in batches] == sizes
    assert [i for b in batches for i in b] == items
    assert all(len(b) <= MAX_STATEMENTS for b in batches)


def test_a_pending_claim_whose_item_holds_its_token_is_won() -> None:
    # GIVEN a pending claim whose INSERT's answer was lost, and the item it wrote
    ours = item(holder="ours")
    # WHEN it is judged
    # THEN it is won, as the item says
    assert judged(PENDING, ours, now_ms=NOW_MS) == ClaimResult.won(ours)


@pytest.mark.parametrize(
    "current",
    [
        None,
        item(KeyState.RELEASED),
        item(expires_at_s=NOW_MS // 1000),
        item(KeyState.UNVERIFIABLE, expires_at_s=NOW_MS // 1000 - 1),
    ],
    ids=["absent", "released", "ttl-this-second", "expired-unverifiable"],
)
def test_a_pending_claim_a_claim_can_take_is_handed_back_to_claim_singly(
    current: KeyClaim | None,
) -> None:
    # GIVEN a pending claim whose key is absent, RELEASED, or at or past its TTL second
    # WHEN it is judged
    # THEN its request comes back: a single conditional claim takes it (or loses the race)
    assert judged(PENDING, current, now_ms=NOW_MS) is REQUEST


@pytest.mark.parametrize(
    "current",
    [
        item(),
        item(expires_at_s=NOW_MS // 1000 + 1),
        item(KeyState.UNVERIFIABLE),
    ],
    ids=["held", "ttl-next-second", "unverifiable"],
)
def test_a_pending_claim_another_holds_is_lost_to_its_holder(current: KeyClaim) -> None:
    # GIVEN a pending claim whose key another write holds, within its TTL
    # WHEN it is judged
    # THEN it is lost, with the holder's item (its group says DUPLICATE, CONFLICT or wait)
    assert judged(PENDING, current, now_ms=NOW_MS) == ClaimResult.lost(current)
