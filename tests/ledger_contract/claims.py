"""The contract's key claims one by one (``dedupe_store.claims``): a key claimed, taken over,
released or marked unverifiable, each conditional on the attempt and group its caller saw; keys
and groups read back, per stream, under a stream name Kinesis allows.
"""

from __future__ import annotations

import pytest

from dedupe_store.contract import Ledger
from dedupe_store.errors import InvalidStreamNameError
from dedupe_store.records import ClaimStatus
from dedupe_store.states import KeyState, LedgerState
from ledger_contract.staging import (
    ALICE,
    BOB,
    LEASE_MS,
    POSITION,
    STREAM,
    T0_MS,
    TTL_S,
    claimed,
    open_group,
    request_for,
)

# --- claim ---------------------------------------------------------------------------------------


def test_claim_of_a_new_key_wins_the_first_attempt_in_its_group(ledger: Ledger) -> None:
    # GIVEN a key never seen, and alice's open group listing it
    request = request_for("k-new")
    group = open_group(ledger, "k-new")
    # WHEN she claims it
    result = ledger.claim(request, group, now_ms=T0_MS)
    # THEN she wins attempt 1 in her group, with the message's identity and a TTL recorded
    assert result.status is ClaimStatus.WON
    key = result.claim
    assert key is not None
    assert (key.state, key.attempt, key.group_id) == (KeyState.CLAIMED, 1, group.group_id)
    assert (key.payload_digest, key.routing_hash_key) == (
        request.payload_digest,
        request.routing_hash_key,
    )
    assert key.expires_at_s == T0_MS // 1000 + TTL_S
    assert ledger.get_claim(STREAM, "k-new") == key
    # AND readers see it IN_FLIGHT under the group's lease, with its owner
    record = ledger.get(STREAM, "k-new")
    assert record is not None
    assert (record.state, record.owner, record.position) == (LedgerState.IN_FLIGHT, ALICE, None)
    assert record.lease_expires_at_ms == T0_MS + LEASE_MS


def test_claim_of_a_claimed_key_loses_and_returns_the_holders_item(ledger: Ledger) -> None:
    # GIVEN alice holds the key
    held = claimed(ledger, "k-held")
    holder = ledger.get_claim(STREAM, "k-held")
    # WHEN bob claims it a second later for his group
    bobs = open_group(ledger, "k-held", owner=BOB, now_ms=T0_MS + 1_000)
    result = ledger.claim(request_for("k-held"), bobs, now_ms=T0_MS + 1_000)
    # THEN bob loses and sees alice's claim, naming her group, unchanged
    assert result.status is ClaimStatus.LOST
    assert result.claim == holder
    assert result.claim is not None
    assert result.claim.group_id == held.group_id


def test_claim_of_a_released_key_wins_with_the_next_attempt(ledger: Ledger) -> None:
    # GIVEN a claim that was released (not in the stream, no data to resend)
    claimed(ledger, "k-released")
    first = ledger.get_claim(STREAM, "k-released")
    assert first is not None
    assert ledger.release(first).applied
    # WHEN bob claims the key for his group
    bobs = open_group(ledger, "k-released", owner=BOB, now_ms=T0_MS + 5_000)
    result = ledger.claim(request_for("k-released"), bobs, now_ms=T0_MS + 5_000)
    # THEN he wins, one attempt later, in his group
    assert result.status is ClaimStatus.WON
    assert result.claim is not None
    assert (result.claim.state, result.claim.attempt) == (KeyState.CLAIMED, 2)
    assert (result.claim.group_id, result.claim.claimed_at_ms) == (bobs.group_id, T0_MS + 5_000)


def test_claim_of_a_key_past_its_ttl_wins(ledger: Ledger) -> None:
    # GIVEN a key delivered at T0, whose dedupe TTL has passed (the item is not deleted yet)
    group = claimed(ledger, "k-expired")
    ledger.record_positions(group, {"k-expired": POSITION}, settle=True, now_ms=T0_MS)
    later_ms = T0_MS + (TTL_S + 1) * 1000
    # WHEN it is claimed after the TTL
    bobs = open_group(ledger, "k-expired", owner=BOB, now_ms=later_ms)
    result = ledger.claim(request_for("k-expired"), bobs, now_ms=later_ms)
    # THEN the expired item counts as absent: the claim wins, in the new group, undelivered
    assert result.status is ClaimStatus.WON
    assert result.claim is not None
    assert (result.claim.attempt, result.claim.group_id) == (2, bobs.group_id)
    record = ledger.get(STREAM, "k-expired")
    assert record is not None
    assert (record.state, record.position) == (LedgerState.IN_FLIGHT, None)


def test_a_claim_by_another_request_for_the_same_group_in_the_same_millisecond_loses(
    ledger: Ledger,
) -> None:
    # GIVEN alice's claim (two processes may even share an owner name and a group view)
    group = claimed(ledger, "k-same")
    holder = ledger.get_claim(STREAM, "k-same")
    # WHEN another request claims it for the same group in the same millisecond
    result = ledger.claim(request_for("k-same"), group, now_ms=T0_MS)
    # THEN it loses: only a retry of the very same request may count as the winner
    assert result.status is ClaimStatus.LOST
    assert result.claim == holder


# --- take over, release, unverifiable ------------------------------------------------------------


def test_take_over_of_a_key_is_conditional_on_the_attempt_and_group_seen(ledger: Ledger) -> None:
    # GIVEN alice's claim, seen by bob and by carol once her lease expired
    claimed(ledger, "k-take")
    seen = ledger.get_claim(STREAM, "k-take")
    assert seen is not None
    later_ms = T0_MS + LEASE_MS + 1_000
    bobs = open_group(ledger, "k-take", owner=BOB, now_ms=later_ms)
    carols = open_group(ledger, "k-take", owner="carol", now_ms=later_ms)
    # WHEN bob takes it over into his group, then carol tries with the same (stale) view
    bob = ledger.take_over_key(seen, bobs, now_ms=later_ms)
    carol = ledger.take_over_key(seen, carols, now_ms=later_ms + 1)
    # THEN bob wins attempt 2 in his group; carol loses and sees bob's claim
    assert bob.status is ClaimStatus.WON
    assert bob.claim is not None
    assert (bob.claim.attempt, bob.claim.group_id) == (2, bobs.group_id)
    assert bob.claim.claimed_at_ms == later_ms
    assert carol.status is ClaimStatus.LOST
    assert carol.claim == bob.claim
    # AND readers now see bob's lease, not alice's
    record = ledger.get(STREAM, "k-take")
    assert record is not None
    assert (record.owner, record.lease_expires_at_ms) == (BOB, later_ms + LEASE_MS)


def test_a_position_recorded_by_a_group_that_lost_the_key_does_not_deliver_it(
    ledger: Ledger,
) -> None:
    # GIVEN alice's key taken over by bob's group
    alices = claimed(ledger, "k-moved")
    seen = ledger.get_claim(STREAM, "k-moved")
    assert seen is not None
    bobs = open_group(ledger, "k-moved", owner=BOB, now_ms=T0_MS + LEASE_MS + 1)
    assert ledger.take_over_key(seen, bobs, now_ms=T0_MS + LEASE_MS + 1).status is ClaimStatus.WON
    # WHEN alice's group records a position for it
    assert ledger.record_positions(
        alices, {"k-moved": POSITION}, settle=True, now_ms=T0_MS + 2
    ).applied
    # THEN the key is not delivered: its key item names bob's group, which has no position
    record = ledger.get(STREAM, "k-moved")
    assert record is not None
    assert (record.state, record.group_id) == (LedgerState.IN_FLIGHT, bobs.group_id)


def test_release_makes_the_key_claimable_and_a_stale_release_is_not_applied(
    ledger: Ledger,
) -> None:
    # GIVEN a claim taken over (attempt 2)
    claimed(ledger, "k-release")
    first = ledger.get_claim(STREAM, "k-release")
    assert first is not None
    bobs = open_group(ledger, "k-release", owner=BOB, now_ms=T0_MS + LEASE_MS + 1)
    second = ledger.take_over_key(first, bobs, now_ms=T0_MS + LEASE_MS + 1)
    assert second.claim is not None
    # WHEN the old attempt releases it, then the current one does
    stale = ledger.release(first)
    current = ledger.release(second.claim)
    # THEN only the current attempt's release applies
    assert not stale.applied
    assert stale.current == second.claim
    assert current.applied
    record = ledger.get(STREAM, "k-release")
    assert record is not None
    assert (record.state, record.attempt) == (LedgerState.RELEASED, 2)


def test_mark_unverifiable_settles_the_claim(ledger: Ledger) -> None:
    # GIVEN a claim whose read-back window reaches past retention
    claimed(ledger, "k-old")
    held = ledger.get_claim(STREAM, "k-old")
    assert held is not None
    # WHEN it is marked unverifiable
    result = ledger.mark_unverifiable(held)
    # THEN it is UNVERIFIABLE, and not claimable
    assert result.applied
    record = ledger.get(STREAM, "k-old")
    assert record is not None
    assert (record.state, record.attempt) == (LedgerState.UNVERIFIABLE, 1)
    later_ms = T0_MS + 10 * LEASE_MS
    bobs = open_group(ledger, "k-old", owner=BOB, now_ms=later_ms)
    assert ledger.claim(request_for("k-old"), bobs, now_ms=later_ms).status is ClaimStatus.LOST


# --- reads ---------------------------------------------------------------------------------------


def test_batch_reads_return_what_exists(ledger: Ledger) -> None:
    # GIVEN two claimed keys in one group
    group = claimed(ledger, "k-x", "k-y")
    # WHEN they are read in batches, with a key and a group that do not exist
    claims = ledger.batch_get_claims(STREAM, ["k-x", "k-y", "k-none"])
    groups = ledger.batch_get_groups(STREAM, [group.group_id, "no-such-group"])
    records = ledger.batch_get(STREAM, ["k-x", "k-none"])
    # THEN only the existing items come back
    assert set(claims) == {"k-x", "k-y"}
    assert set(groups) == {group.group_id}
    assert set(records) == {"k-x"}
    assert records["k-x"].state is LedgerState.IN_FLIGHT
    assert {r.key for r in ledger.scan(STREAM)} == {"k-x", "k-y"}


def test_keys_and_groups_of_other_streams_are_separate(ledger: Ledger) -> None:
    # GIVEN the same key claimed in two streams
    claimed(ledger, "k-shared")
    other = ledger.open_group("payments", ["k-shared"], owner=BOB, now_ms=T0_MS, lease_ms=LEASE_MS)
    # WHEN the second stream claims it
    result = ledger.claim(request_for("k-shared", stream="payments"), other, now_ms=T0_MS)
    # THEN both win: the ledger is per stream
    assert result.status is ClaimStatus.WON
    assert list(ledger.stale_groups("payments", now_ms=T0_MS + 2 * LEASE_MS)) == [other.group_id]
    assert [r.key for r in ledger.scan("payments")] == ["k-shared"]


@pytest.mark.parametrize("stream", ["orders/k-1", "orders#k-1", "..", "", "s" * 129])
def test_a_stream_name_outside_the_rule_is_refused_where_a_key_is_built(
    ledger: Ledger, stream: str
) -> None:
    # GIVEN a stream name Kinesis refuses, or one whose "/" or "#" could make one item's key
    # another's ("__keo__/group/orders/k-1/<id>", "orders#k-1#<key>")
    group = open_group(ledger, "k-1")
    # WHEN a group is opened, a key claimed or read under it
    # THEN each is refused naming the stream, and nothing is written
    with pytest.raises(InvalidStreamNameError) as caught:
        open_group(ledger, "k-1", stream=stream)
    assert caught.value.name == stream
    with pytest.raises(InvalidStreamNameError):
        ledger.claim(request_for("k-1", stream=stream), group, now_ms=T0_MS)
    with pytest.raises(InvalidStreamNameError):
        ledger.get_claim(stream, "k-1")
    with pytest.raises(InvalidStreamNameError):
        ledger.get_group(stream, group.group_id)
    assert ledger.get_claim(STREAM, "k-1") is None
