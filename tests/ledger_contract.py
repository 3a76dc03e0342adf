"""The ledger contract: every ``Ledger`` backend must pass these cases.

``tests/integration/test_ledger_contract.py`` runs them against DynamoDB (dynalite and moto in
server mode), ``tests/unit/test_fake_ledger_contract.py`` against the in-memory fake; each
supplies its own ``ledger`` fixture and adds the cases only its backend can stage (a response
lost on the wire). Imported with ``from ledger_contract import *`` so pytest collects them.
"""

from __future__ import annotations

from dedupe_store.contract import Ledger
from dedupe_store.records import BatchRecord, ClaimRequest, ClaimStatus, LedgerRecord, Position
from dedupe_store.states import LedgerState
from producer.protocol import Message, explicit_hash_key, payload_digest

T0_MS = 1_700_000_000_000  # a fixed "now": the ledger takes time as an argument
LEASE_MS = 30_000
TTL_S = 3_600
STREAM = "orders"
ALICE, BOB = "producer-alice", "producer-bob"


def request_for(key: str, data: bytes = b"payload") -> ClaimRequest:
    hash_key = explicit_hash_key(Message(key, data))
    return ClaimRequest(STREAM, key, payload_digest(data, hash_key), hash_key)


def claim(ledger: Ledger, key: str, *, owner: str = ALICE, now_ms: int = T0_MS) -> LedgerRecord:
    result = ledger.claim(request_for(key), owner=owner, now_ms=now_ms, lease_ms=LEASE_MS)
    assert result.status is ClaimStatus.WON, result
    assert result.record is not None
    return result.record


POSITION = Position(
    "shardId-000000000001", "49590338271490256608559692538361571095921575989136588898"
)


# --- claim --------------------------------------------------------------------------------------


def test_claim_of_a_new_key_wins_the_first_attempt(ledger: Ledger) -> None:
    # GIVEN a key never seen
    request = request_for("k-new")
    # WHEN a producer claims it
    result = ledger.claim(request, owner=ALICE, now_ms=T0_MS, lease_ms=LEASE_MS)
    # THEN it wins attempt 1, IN_FLIGHT, with its lease and the message's identity recorded
    assert result.status is ClaimStatus.WON
    record = result.record
    assert record is not None
    assert (record.state, record.attempt, record.owner) == (LedgerState.IN_FLIGHT, 1, ALICE)
    assert (record.claimed_at_ms, record.lease_expires_at_ms) == (T0_MS, T0_MS + LEASE_MS)
    assert (record.payload_digest, record.routing_hash_key) == (
        request.payload_digest,
        request.routing_hash_key,
    )
    assert record.position is None
    assert ledger.get(STREAM, "k-new") == record


def test_claim_of_an_in_flight_key_loses_and_returns_the_holders_record(
    ledger: Ledger,
) -> None:
    # GIVEN alice holds the key
    held = claim(ledger, "k-held", owner=ALICE)
    # WHEN bob claims it a second later
    result = ledger.claim(request_for("k-held"), owner=BOB, now_ms=T0_MS + 1_000, lease_ms=LEASE_MS)
    # THEN bob loses and sees alice's claim, unchanged
    assert result.status is ClaimStatus.LOST
    assert result.record == held
    assert ledger.get(STREAM, "k-held") == held


def test_claim_of_a_delivered_key_within_its_ttl_loses_with_the_position(
    ledger: Ledger,
) -> None:
    # GIVEN a key delivered a minute ago
    ledger.mark_delivered(claim(ledger, "k-done"), POSITION, now_ms=T0_MS)
    # WHEN it is claimed again inside the dedupe window
    result = ledger.claim(
        request_for("k-done"), owner=BOB, now_ms=T0_MS + 60_000, lease_ms=LEASE_MS
    )
    # THEN the claim loses and shows where the key already is
    assert result.status is ClaimStatus.LOST
    assert result.record is not None
    assert result.record.state is LedgerState.DELIVERED
    assert result.record.position == POSITION


def test_claim_of_a_released_key_wins_with_the_next_attempt(ledger: Ledger) -> None:
    # GIVEN a claim that was released (not in the stream, no data to resend)
    first = claim(ledger, "k-released", owner=ALICE)
    assert ledger.release(first).applied
    # WHEN another producer claims the key
    result = ledger.claim(
        request_for("k-released"), owner=BOB, now_ms=T0_MS + 5_000, lease_ms=LEASE_MS
    )
    # THEN it wins, one attempt later, with a fresh lease
    assert result.status is ClaimStatus.WON
    assert result.record is not None
    assert (result.record.state, result.record.attempt) == (LedgerState.IN_FLIGHT, 2)
    assert (result.record.owner, result.record.claimed_at_ms) == (BOB, T0_MS + 5_000)
    assert result.record.lease_expires_at_ms == T0_MS + 5_000 + LEASE_MS


def test_claim_of_a_delivered_key_past_its_ttl_wins(ledger: Ledger) -> None:
    # GIVEN a key delivered at T0, whose dedupe TTL has passed (the item is not deleted yet)
    ledger.mark_delivered(claim(ledger, "k-expired"), POSITION, now_ms=T0_MS)
    later_ms = T0_MS + (TTL_S + 1) * 1000
    # WHEN it is claimed after the TTL
    result = ledger.claim(request_for("k-expired"), owner=BOB, now_ms=later_ms, lease_ms=LEASE_MS)
    # THEN the expired item counts as absent: the claim wins, the old position is gone
    assert result.status is ClaimStatus.WON
    assert result.record is not None
    assert (result.record.state, result.record.attempt) == (LedgerState.IN_FLIGHT, 2)
    assert result.record.position is None
    assert result.record.expires_at_s is None


def test_a_claim_by_another_producer_with_the_same_owner_in_the_same_millisecond_loses(
    ledger: Ledger,
) -> None:
    # GIVEN alice holds the key (owner names are configurable: two processes may share one)
    held = claim(ledger, "k-same-owner", owner=ALICE, now_ms=T0_MS)
    # WHEN another process named alice claims it in the same millisecond
    result = ledger.claim(request_for("k-same-owner"), owner=ALICE, now_ms=T0_MS, lease_ms=LEASE_MS)
    # THEN it loses: only a retry of the very same request may count as the winner
    assert result.status is ClaimStatus.LOST
    assert result.record == held


# --- mark ---------------------------------------------------------------------------------------


def test_mark_with_the_claims_attempt_applies(ledger: Ledger) -> None:
    # GIVEN alice's claim
    held = claim(ledger, "k-mark")
    position = Position(POSITION.shard_id, POSITION.sequence_number, 3)
    # WHEN she marks it delivered
    result = ledger.mark_delivered(held, position, now_ms=T0_MS + 2_000)
    # THEN it is DELIVERED at that position, with a TTL, out of the in-flight index
    assert result.applied
    record = ledger.get(STREAM, "k-mark")
    assert record is not None
    assert result.current == record
    assert (record.state, record.attempt, record.position) == (LedgerState.DELIVERED, 1, position)
    assert record.delivered_at_ms == T0_MS + 2_000
    assert record.expires_at_s == (T0_MS + 2_000) // 1000 + TTL_S
    assert record.lease_expires_at_ms is None
    assert list(ledger.stale_in_flight(STREAM, now_ms=T0_MS + 10 * LEASE_MS)) == []


def test_mark_with_a_stale_attempt_loses_and_returns_the_current_record(
    ledger: Ledger,
) -> None:
    # GIVEN alice's claim was taken over by bob (attempt 2)
    stale = claim(ledger, "k-stale")
    taken = ledger.take_over(stale, owner=BOB, now_ms=T0_MS + LEASE_MS + 1, lease_ms=LEASE_MS)
    assert taken.status is ClaimStatus.WON
    # WHEN alice marks under attempt 1
    result = ledger.mark_delivered(stale, POSITION, now_ms=T0_MS + LEASE_MS + 2)
    # THEN her mark loses, bob's claim is untouched and returned
    assert not result.applied
    assert result.current == taken.record
    assert ledger.get(STREAM, "k-stale") == taken.record


def test_a_second_mark_of_the_same_position_leaves_the_delivery_as_it_was(
    ledger: Ledger,
) -> None:
    # GIVEN a mark that applied
    held = claim(ledger, "k-twice")
    assert ledger.mark_delivered(held, POSITION, now_ms=T0_MS + 1).applied
    delivered = ledger.get(STREAM, "k-twice")
    # WHEN the same mark is made again by a second call (a waiting producer, a reconciler)
    again = ledger.mark_delivered(held, POSITION, now_ms=T0_MS + 2)
    # THEN the item is unchanged and the caller sees its position delivered
    assert again.current is not None
    assert (again.current.state, again.current.position) == (LedgerState.DELIVERED, POSITION)
    assert ledger.get(STREAM, "k-twice") == delivered


def test_a_mark_at_another_position_after_delivery_is_not_applied(
    ledger: Ledger,
) -> None:
    # GIVEN a key delivered at one position
    held = claim(ledger, "k-other-pos")
    assert ledger.mark_delivered(held, POSITION, now_ms=T0_MS + 1).applied
    # WHEN the same attempt tries to mark another position (a second copy of the record)
    other = Position(POSITION.shard_id, "1")
    result = ledger.mark_delivered(held, other, now_ms=T0_MS + 2)
    # THEN the ledger keeps the first position and says so
    assert not result.applied
    assert result.current is not None
    assert result.current.position == POSITION


# --- take over, release, unverifiable -----------------------------------------------------------


def test_take_over_is_conditional_on_the_attempt_seen(ledger: Ledger) -> None:
    # GIVEN alice's claim whose lease has expired, seen by bob and by carol
    seen = claim(ledger, "k-take")
    later_ms = T0_MS + LEASE_MS + 1_000
    # WHEN bob takes it over, then carol tries with the same (now stale) view
    bob = ledger.take_over(seen, owner=BOB, now_ms=later_ms, lease_ms=LEASE_MS)
    carol = ledger.take_over(seen, owner="producer-carol", now_ms=later_ms + 1, lease_ms=LEASE_MS)
    # THEN bob wins attempt 2 with a new lease; carol loses and sees bob's claim
    assert bob.status is ClaimStatus.WON
    assert bob.record is not None
    assert (bob.record.attempt, bob.record.owner) == (2, BOB)
    assert bob.record.claimed_at_ms == later_ms
    assert bob.record.lease_expires_at_ms == later_ms + LEASE_MS
    assert bob.record.state is LedgerState.IN_FLIGHT
    assert carol.status is ClaimStatus.LOST
    assert carol.record == bob.record


def test_release_makes_the_key_claimable_and_a_stale_release_is_not_applied(
    ledger: Ledger,
) -> None:
    # GIVEN a claim taken over (attempt 2)
    first = claim(ledger, "k-release")
    second = ledger.take_over(first, owner=BOB, now_ms=T0_MS + LEASE_MS + 1, lease_ms=LEASE_MS)
    assert second.record is not None
    # WHEN the old attempt releases it, then the current one does
    stale = ledger.release(first)
    current = ledger.release(second.record)
    # THEN only the current attempt's release applies, and the item leaves the in-flight index
    assert not stale.applied
    assert stale.current == second.record
    assert current.applied
    record = ledger.get(STREAM, "k-release")
    assert record is not None
    assert (record.state, record.attempt) == (LedgerState.RELEASED, 2)
    assert record.lease_expires_at_ms is None
    assert list(ledger.stale_in_flight(STREAM, now_ms=T0_MS + 10 * LEASE_MS)) == []


def test_mark_unverifiable_settles_the_claim(ledger: Ledger) -> None:
    # GIVEN a claim whose read-back window reaches past retention
    held = claim(ledger, "k-old")
    # WHEN it is marked unverifiable
    result = ledger.mark_unverifiable(held)
    # THEN it is UNVERIFIABLE, not claimable, and out of the in-flight index
    assert result.applied
    record = ledger.get(STREAM, "k-old")
    assert record is not None
    assert (record.state, record.attempt) == (LedgerState.UNVERIFIABLE, 1)
    lost = ledger.claim(
        request_for("k-old"), owner=BOB, now_ms=T0_MS + 10 * LEASE_MS, lease_ms=LEASE_MS
    )
    assert lost.status is ClaimStatus.LOST
    assert list(ledger.stale_in_flight(STREAM, now_ms=T0_MS + 10 * LEASE_MS)) == []


# --- reads --------------------------------------------------------------------------------------


def test_stale_in_flight_returns_only_expired_in_flight_keys(ledger: Ledger) -> None:
    # GIVEN claims with leases ending at different times, one delivered, one released
    for i, key in enumerate(["k-a", "k-b", "k-c"]):
        claim(ledger, key, now_ms=T0_MS + i * 10_000)  # leases end T0+30s, +40s, +50s
    ledger.mark_delivered(claim(ledger, "k-delivered", now_ms=T0_MS), POSITION, now_ms=T0_MS + 1)
    ledger.release(claim(ledger, "k-released", now_ms=T0_MS))
    # WHEN the index is asked at T0+45s
    stale = set(ledger.stale_in_flight(STREAM, now_ms=T0_MS + 45_000))
    # THEN only the IN_FLIGHT claims whose lease ended are returned
    assert stale == {"k-a", "k-b"}
    # and once one is marked it is no longer returned
    record = ledger.get(STREAM, "k-a")
    assert record is not None
    assert ledger.mark_delivered(record, POSITION, now_ms=T0_MS + 46_000).applied
    assert set(ledger.stale_in_flight(STREAM, now_ms=T0_MS + 45_000)) == {"k-b"}
    # and a take over moves a key's lease forward, out of the stale set
    record_b = ledger.get(STREAM, "k-b")
    assert record_b is not None
    ledger.take_over(record_b, owner=BOB, now_ms=T0_MS + 46_000, lease_ms=LEASE_MS)
    assert set(ledger.stale_in_flight(STREAM, now_ms=T0_MS + 45_000)) == set()
    assert set(ledger.stale_in_flight(STREAM, now_ms=T0_MS + 80_000)) == {"k-b", "k-c"}


def test_keys_of_other_streams_are_separate(ledger: Ledger) -> None:
    # GIVEN the same key claimed in two streams
    claim(ledger, "k-shared")
    hash_key = explicit_hash_key(Message("k-shared", b"payload"))
    other = ClaimRequest("payments", "k-shared", payload_digest(b"payload", hash_key), hash_key)
    # WHEN the second stream claims it
    result = ledger.claim(other, owner=BOB, now_ms=T0_MS, lease_ms=LEASE_MS)
    # THEN both win: the ledger is per stream
    assert result.status is ClaimStatus.WON
    assert list(ledger.stale_in_flight("payments", now_ms=T0_MS + 2 * LEASE_MS)) == ["k-shared"]


# --- Spark batch records ------------------------------------------------------------------------


def test_a_batch_is_complete_once_marked_until_the_dedupe_window_ends(ledger: Ledger) -> None:
    # GIVEN a streaming query's batch 7, not yet recorded
    assert ledger.completed_batch(STREAM, "query-a", 7, now_ms=T0_MS) is None
    # WHEN its driver marks it complete
    ledger.mark_batch_complete(STREAM, "query-a", 7, counts={"sent": 3}, now_ms=T0_MS)
    # THEN a replay of that batch sees it complete with its counts, until the dedupe TTL ends
    assert ledger.completed_batch(STREAM, "query-a", 7, now_ms=T0_MS + 1) == BatchRecord(
        STREAM, "query-a", 7, T0_MS, {"sent": 3}
    )
    assert ledger.completed_batch(STREAM, "query-a", 7, now_ms=T0_MS + TTL_S * 1000) is None


def test_batch_records_are_per_query_stream_and_batch_and_never_read_as_keys(
    ledger: Ledger,
) -> None:
    # GIVEN batch 1 of query-a on STREAM is complete
    ledger.mark_batch_complete(STREAM, "query-a", 1, counts={}, now_ms=T0_MS)
    # THEN another batch, another query or another stream is not
    assert ledger.completed_batch(STREAM, "query-a", 2, now_ms=T0_MS) is None
    assert ledger.completed_batch(STREAM, "query-b", 1, now_ms=T0_MS) is None
    assert ledger.completed_batch("other-stream", "query-a", 1, now_ms=T0_MS) is None
    # AND the audit's scan of the stream's keys does not see it
    assert list(ledger.scan(STREAM)) == []
