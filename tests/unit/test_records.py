"""Expiry arithmetic of a ledger record: the dedupe TTL and the claim's lease, at their edges."""

from __future__ import annotations

import dataclasses

import pytest

from dedupe_store.records import Group, LedgerRecord, Position
from dedupe_store.states import GroupState, LedgerState

CLAIMED_AT_MS = 1_700_000_000_000


def make_record(
    *, expires_at_s: int | None = None, lease_expires_at_ms: int | None = None
) -> LedgerRecord:
    return LedgerRecord(
        stream="orders",
        key="order-1",
        state=LedgerState.IN_FLIGHT,
        attempt=1,
        owner="producer-a",
        claimed_at_ms=CLAIMED_AT_MS,
        payload_digest="d" * 64,
        routing_hash_key="1",
        lease_expires_at_ms=lease_expires_at_ms,
        expires_at_s=expires_at_s,
    )


# --- dedupe TTL ---------------------------------------------------------------------------------


def test_record_without_ttl_never_expires() -> None:
    # GIVEN a record with no TTL attribute (an IN_FLIGHT claim has none)
    record = make_record(expires_at_s=None)
    # WHEN asked at any time, however late
    # THEN it still counts: only a TTL can make an item absent
    assert not record.is_expired(0)
    assert not record.is_expired(2**62)


@pytest.mark.parametrize(
    ("now_ms", "expired"),
    [
        (1_800_000_000_000 - 1, False),  # one millisecond before the TTL second
        (1_800_000_000_000, True),  # exactly at it: the window is closed
        (1_800_000_000_000 + 1, True),
    ],
    ids=["1ms-before", "exactly-at", "1ms-after"],
)
def test_ttl_expires_exactly_at_its_second(now_ms: int, expired: bool) -> None:
    # GIVEN a DELIVERED record whose TTL (in epoch seconds) is 1_800_000_000
    record = dataclasses.replace(
        make_record(expires_at_s=1_800_000_000), state=LedgerState.DELIVERED
    )
    # WHEN asked at a time in milliseconds
    # THEN it counts as absent from that second on, not a millisecond earlier
    assert record.is_expired(now_ms) is expired


# --- lease --------------------------------------------------------------------------------------


def test_record_without_lease_is_never_lease_expired() -> None:
    # GIVEN a record without a lease (a DELIVERED item)
    record = make_record(lease_expires_at_ms=None)
    # WHEN asked, with or without a skew margin
    # THEN its lease is not expired: there is none to take over
    assert not record.lease_expired(2**62)
    assert not record.lease_expired(2**62, skew_ms=5_000)


@pytest.mark.parametrize(
    ("now_ms", "expired"),
    [(CLAIMED_AT_MS + 59_999, False), (CLAIMED_AT_MS + 60_000, True)],
    ids=["1ms-before", "exactly-at"],
)
def test_lease_expires_at_its_end_without_skew(now_ms: int, expired: bool) -> None:
    # GIVEN a claim with a 60 s lease
    record = make_record(lease_expires_at_ms=CLAIMED_AT_MS + 60_000)
    # WHEN asked with no skew margin
    # THEN it expires exactly at its end
    assert record.lease_expired(now_ms) is expired


@pytest.mark.parametrize(
    ("now_ms", "expired"),
    [
        (CLAIMED_AT_MS + 60_000, False),  # the lease's end: not yet, skew still running
        (CLAIMED_AT_MS + 64_999, False),
        (CLAIMED_AT_MS + 65_000, True),  # end + skew
    ],
    ids=["at-lease-end", "1ms-before-end-plus-skew", "exactly-end-plus-skew"],
)
def test_lease_expiry_waits_for_the_skew_margin(now_ms: int, expired: bool) -> None:
    # GIVEN a claim with a 60 s lease, and a 5 s clock skew margin
    record = make_record(lease_expires_at_ms=CLAIMED_AT_MS + 60_000)
    # WHEN asked with that margin
    # THEN it counts as expired only once the margin has also passed
    assert record.lease_expired(now_ms, skew_ms=5_000) is expired


def test_a_groups_positions_by_key_are_what_position_of_gives_each_member() -> None:
    # GIVEN a group listing "k-a" twice, a position at its second index only, and "k-b" placed
    first, second = Position("shardId-0", "1"), Position("shardId-0", "2")
    group = Group(
        stream="orders",
        group_id="g",
        state=GroupState.OPEN,
        epoch=1,
        owner="producer-a",
        claimed_at_ms=CLAIMED_AT_MS,
        lease_expires_at_ms=CLAIMED_AT_MS + 60_000,
        members=("k-a", "k-b", "k-a"),
        positions={1: first, 2: second},
    )
    # THEN by key, as by position_of: a key counts at its first index
    assert group.positions_by_key() == {"k-b": first}
    assert group.position_of("k-a") is None
