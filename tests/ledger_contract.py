"""The ledger contract: every ``Ledger`` backend must pass these cases (ledger schema v2).

``tests/integration/test_ledger_contract.py`` runs them against DynamoDB (dynalite and moto in
server mode), ``tests/unit/test_fake_ledger_contract.py`` against the in-memory fake; each
supplies its own ``ledger`` fixture and adds the cases only its backend can stage (a response
lost on the wire). Imported with ``from ledger_contract import *`` so pytest collects them.
"""

from __future__ import annotations

import dataclasses

import pytest

from dedupe_store.contract import Ledger
from dedupe_store.errors import InvalidStreamNameError, LedgerError
from dedupe_store.inflight import bucket_share
from dedupe_store.records import (
    ANY_ROW,
    LATE_ROWS_MAX,
    BatchRecord,
    ClaimRequest,
    ClaimResult,
    ClaimStatus,
    Group,
    KeyClaim,
    PendingClaim,
    Position,
    RunAttempt,
    RunExecution,
)
from dedupe_store.states import GroupState, KeyState, LedgerState, RunState
from producer.protocol import Message, explicit_hash_key, payload_digest

T0_MS = 1_700_000_000_000  # a fixed "now": the ledger takes time as an argument
LEASE_MS = 30_000
SKEW_MS = 1_000
TTL_S = 3_600
STREAM = "orders"
ALICE, BOB = "producer-alice", "producer-bob"


def request_for(key: str, data: bytes = b"payload", stream: str = STREAM) -> ClaimRequest:
    hash_key = explicit_hash_key(Message(key, data))
    return ClaimRequest(stream, key, payload_digest(data, hash_key), hash_key)


def open_group(
    ledger: Ledger, *keys: str, owner: str = ALICE, now_ms: int = T0_MS, stream: str = STREAM
) -> Group:
    return ledger.open_group(stream, keys, owner=owner, now_ms=now_ms, lease_ms=LEASE_MS)


def claim(ledger: Ledger, key: str, group: Group, *, now_ms: int = T0_MS) -> KeyClaim:
    result = ledger.claim(request_for(key, stream=group.stream), group, now_ms=now_ms)
    assert result.status is ClaimStatus.WON, result
    assert result.claim is not None
    return result.claim


def claimed(ledger: Ledger, *keys: str, owner: str = ALICE, now_ms: int = T0_MS) -> Group:
    """A group of ``keys``, each claimed for it."""
    group = open_group(ledger, *keys, owner=owner, now_ms=now_ms)
    for key in keys:
        claim(ledger, key, group, now_ms=now_ms)
    return group


POSITION = Position(
    "shardId-000000000001", "49590338271490256608559692538361571095921575989136588898"
)
LATER = Position("shardId-000000000001", "49590338271490256608559692538361571095921575989136588999")


# --- groups -------------------------------------------------------------------------------------


def test_an_opened_group_is_open_at_epoch_1_with_its_lease_and_members(ledger: Ledger) -> None:
    # GIVEN nothing
    # WHEN alice opens a group for three keys
    group = open_group(ledger, "k-1", "k-2", "k-3")
    # THEN it is OPEN at epoch 1, hers, with a lease from now, listing the keys in order
    assert (group.state, group.epoch, group.owner) == (GroupState.OPEN, 1, ALICE)
    assert (group.claimed_at_ms, group.lease_expires_at_ms) == (T0_MS, T0_MS + LEASE_MS)
    assert group.members == ("k-1", "k-2", "k-3")
    assert group.positions == {}
    assert ledger.get_group(STREAM, group.group_id) == group
    # AND two groups never share an id
    assert open_group(ledger, "k-1").group_id != group.group_id


def test_recording_positions_settles_the_group_and_delivers_its_keys(ledger: Ledger) -> None:
    # GIVEN a group whose two keys are claimed
    group = claimed(ledger, "k-a", "k-b")
    aggregated = Position(POSITION.shard_id, POSITION.sequence_number, 3)
    # WHEN its owner records both positions and settles it
    result = ledger.record_positions(
        group, {"k-a": POSITION, "k-b": aggregated}, settle=True, now_ms=T0_MS + 2_000
    )
    # THEN the group is SETTLED with both positions, and readers see both keys DELIVERED
    assert result.applied
    assert result.current is not None
    assert result.current.state is GroupState.SETTLED
    assert result.current.positions_by_key() == {"k-a": POSITION, "k-b": aggregated}
    record = ledger.get(STREAM, "k-b")
    assert record is not None
    assert (record.state, record.position, record.attempt) == (
        LedgerState.DELIVERED,
        aggregated,
        1,
    )
    assert record.delivered_at_ms == T0_MS + 2_000
    assert record.group_id == group.group_id
    # AND a settled group is out of the in-flight index
    assert list(ledger.stale_groups(STREAM, now_ms=T0_MS + 10 * LEASE_MS)) == []


def test_positions_recorded_so_far_keep_the_group_open_and_are_kept(ledger: Ledger) -> None:
    # GIVEN a group of two keys, one of which is written
    group = claimed(ledger, "k-done", "k-pending")
    first = ledger.record_positions(group, {"k-done": POSITION}, settle=False, now_ms=T0_MS + 1)
    assert first.applied
    assert first.current is not None
    # THEN the group stays OPEN: one key is DELIVERED, the other still IN_FLIGHT
    assert first.current.state is GroupState.OPEN
    done, pending = ledger.get(STREAM, "k-done"), ledger.get(STREAM, "k-pending")
    assert done is not None
    assert pending is not None
    assert done.state is LedgerState.DELIVERED
    assert pending.state is LedgerState.IN_FLIGHT
    assert pending.lease_expires_at_ms == T0_MS + LEASE_MS
    # WHEN the second is recorded with the group as last written
    second = ledger.record_positions(
        first.current, {"k-pending": LATER}, settle=True, now_ms=T0_MS + 2
    )
    # THEN both positions are in the settled group
    assert second.current is not None
    assert second.current.positions_by_key() == {"k-done": POSITION, "k-pending": LATER}


def test_a_stale_epoch_can_neither_record_nor_settle(ledger: Ledger) -> None:
    # GIVEN alice's group, taken over by a reconciler once its lease expired for everyone
    group = claimed(ledger, "k-late")
    later_ms = T0_MS + LEASE_MS + SKEW_MS
    taken = ledger.take_over_group(
        group, owner=BOB, now_ms=later_ms, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    assert taken.applied
    assert taken.current is not None
    assert (taken.current.epoch, taken.current.owner) == (2, BOB)
    assert taken.current.lease_expires_at_ms == later_ms + LEASE_MS
    # WHEN alice, stalled, tries to settle under epoch 1
    result = ledger.record_positions(group, {"k-late": POSITION}, settle=True, now_ms=later_ms + 1)
    # THEN it is refused and the current group is returned, unchanged
    assert not result.applied
    assert result.current == taken.current
    assert ledger.get_group(STREAM, group.group_id) == taken.current


def test_a_group_is_taken_over_only_once_its_lease_expired_for_everyone(ledger: Ledger) -> None:
    # GIVEN alice's group
    group = claimed(ledger, "k-lease")
    # WHEN bob tries before lease + skew has passed, then after
    early = ledger.take_over_group(
        group, owner=BOB, now_ms=T0_MS + LEASE_MS, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    late = ledger.take_over_group(
        group, owner=BOB, now_ms=T0_MS + LEASE_MS + SKEW_MS, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    # THEN only the late one applies; a second taker with the same view loses to it
    assert not early.applied
    assert late.applied
    again = ledger.take_over_group(
        group, owner="carol", now_ms=T0_MS + 2 * LEASE_MS, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    assert not again.applied
    assert again.current == late.current


def test_a_lease_is_renewed_only_while_it_is_valid_by_more_than_the_skew(ledger: Ledger) -> None:
    # GIVEN alice's group
    group = claimed(ledger, "k-renew")
    # WHEN she renews it with time to spare
    renewed = ledger.renew_lease(group, now_ms=T0_MS + 10_000, lease_ms=LEASE_MS, skew_ms=SKEW_MS)
    # THEN the lease runs from then, one epoch later
    assert renewed.applied
    assert renewed.current is not None
    assert renewed.current.epoch == 2
    assert renewed.current.lease_expires_at_ms == T0_MS + 10_000 + LEASE_MS
    # AND a renewal within the skew margin of the lease's end is refused
    current = renewed.current
    late = ledger.renew_lease(
        current,
        now_ms=current.lease_expires_at_ms - SKEW_MS,
        lease_ms=LEASE_MS,
        skew_ms=SKEW_MS,
    )
    assert not late.applied
    # AND a renewal with a stale epoch is refused
    stale = ledger.renew_lease(group, now_ms=T0_MS + 11_000, lease_ms=LEASE_MS, skew_ms=SKEW_MS)
    assert not stale.applied


# --- claim --------------------------------------------------------------------------------------


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


def in_two_halves(
    ledger: Ledger, requests: list[ClaimRequest], group: Group, *, now_ms: int
) -> list[ClaimResult | LedgerError]:
    """Each request claimed as the producer claims a group (``SendContext.claim_all``, one
    call after the other here): ``insert_claims`` in batches of ``claims_per_request``,
    ``judge_claims`` of all their pending claims together, then a single ``claim`` of each
    request the judge handed back. A result or the ledger error each key got, in order."""
    size = ledger.claims_per_request
    inserted = [
        result
        for start in range(0, len(requests), size)
        for result in ledger.insert_claims(requests[start : start + size], group, now_ms=now_ms)
    ]
    verdicts = iter(
        ledger.judge_claims([r for r in inserted if isinstance(r, PendingClaim)], now_ms=now_ms)
    )
    results: list[ClaimResult | LedgerError] = []
    for result in inserted:
        verdict = next(verdicts) if isinstance(result, PendingClaim) else result
        if isinstance(verdict, ClaimRequest):
            try:
                verdict = ledger.claim(verdict, group, now_ms=now_ms)
            except LedgerError as exc:  # one key's error never fails the others'
                verdict = exc
        results.append(verdict)
    return results


def test_claims_in_a_batch_win_new_keys_and_judge_the_others_as_single_claims_do(
    ledger: Ledger,
) -> None:
    # GIVEN a key alice holds, one she released, one delivered past its TTL (each claimed one
    # at a time: an older producer's items), and thirty keys no one claimed
    later_ms = T0_MS + (TTL_S + 1) * 1000
    held = claimed(ledger, "k-held", now_ms=later_ms)
    released = claim(ledger, "k-released", open_group(ledger, "k-released", now_ms=later_ms))
    assert ledger.release(released).applied
    expired = claimed(ledger, "k-expired")
    ledger.record_positions(expired, {"k-expired": POSITION}, settle=True, now_ms=T0_MS)
    new = [f"k-new-{i:02d}" for i in range(30)]
    keys = [*new[:10], "k-held", *new[10:20], "k-released", "k-expired", *new[20:]]
    # WHEN bob claims all of them in the two halves the producer makes (batches of 25 where
    # the backend runs PartiQL)
    bobs = open_group(ledger, *keys, owner=BOB, now_ms=later_ms)
    results = in_two_halves(ledger, [request_for(k) for k in keys], bobs, now_ms=later_ms)
    # THEN each result is what a single claim would have said, in the keys' order: the new
    # keys won at attempt 1, the released and expired ones won at attempt 2, the held one lost
    # to alice's claim
    by_key = dict(zip(keys, results, strict=True))
    assert all(isinstance(r, ClaimResult) for r in results), results
    won = {
        k: r.claim
        for k, r in by_key.items()
        if isinstance(r, ClaimResult) and r.status is ClaimStatus.WON
    }
    assert sorted(won) == sorted([*new, "k-released", "k-expired"])
    assert {k: (c.attempt, c.group_id) for k, c in won.items() if c is not None} == {
        **dict.fromkeys(new, (1, bobs.group_id)),
        "k-released": (2, bobs.group_id),
        "k-expired": (2, bobs.group_id),
    }
    lost = by_key["k-held"]
    assert isinstance(lost, ClaimResult)
    assert lost.status is ClaimStatus.LOST
    assert lost.claim is not None
    assert lost.claim.group_id == held.group_id
    # AND the items are the ones single claims write: a single claim now loses to bob's
    current = ledger.get_claim(STREAM, "k-new-00")
    assert current == won["k-new-00"]
    again = ledger.claim(request_for("k-new-00"), open_group(ledger, "k-new-00"), now_ms=later_ms)
    assert (again.status, again.claim) == (ClaimStatus.LOST, current)


def test_pending_claims_are_judged_from_their_items_in_order_100_to_a_read(
    ledger: Ledger,
) -> None:
    # GIVEN keys left pending by batched claims: one whose INSERT applied (its item holds the
    # pending claim's token), one alice holds, one she released, one past its TTL, and 130
    # never claimed (more than one read of 100)
    later_ms = T0_MS + (TTL_S + 1) * 1000
    bobs = open_group(ledger, "k-ours", owner=BOB, now_ms=later_ms)
    ours = claim(ledger, "k-ours", bobs, now_ms=later_ms)
    held = claim(ledger, "k-held", open_group(ledger, "k-held", now_ms=later_ms), now_ms=later_ms)
    released = claim(ledger, "k-released", open_group(ledger, "k-released"))
    assert ledger.release(released).applied
    claimed(ledger, "k-expired")
    absent = [f"k-absent-{i:03d}" for i in range(130)]
    keys = [*absent[:60], "k-ours", "k-held", *absent[60:], "k-released", "k-expired"]
    tokens = {"k-ours": ours.write_token}
    pending = [PendingClaim(request_for(k), tokens.get(k) or f"token-{k}") for k in keys]
    # WHEN they are judged together
    verdicts = ledger.judge_claims(pending, now_ms=later_ms)
    # THEN, in order: ours won, alice's lost to her claim, and the released, expired and
    # absent keys handed back to be claimed singly; nothing was written
    by_key = dict(zip(keys, verdicts, strict=True))
    assert by_key.pop("k-ours") == ClaimResult.won(ours)
    assert by_key.pop("k-held") == ClaimResult.lost(held)
    assert by_key == {k: request_for(k) for k in [*absent, "k-released", "k-expired"]}
    assert ledger.get_claim(STREAM, absent[0]) is None
    assert ledger.judge_claims([], now_ms=later_ms) == []


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


# --- take over, release, unverifiable -----------------------------------------------------------


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


# --- reads --------------------------------------------------------------------------------------


def test_stale_groups_returns_only_open_groups_whose_lease_expired(ledger: Ledger) -> None:
    # GIVEN groups with leases ending at different times, one settled
    a, b, c = (claimed(ledger, f"k-{n}", now_ms=T0_MS + i * 10_000) for i, n in enumerate("abc"))
    settled = claimed(ledger, "k-settled")
    ledger.record_positions(settled, {"k-settled": POSITION}, settle=True, now_ms=T0_MS + 1)
    # WHEN the index is asked at T0+45s (leases end T0+30s, +40s, +50s)
    stale = set(ledger.stale_groups(STREAM, now_ms=T0_MS + 45_000))
    # THEN only the OPEN groups whose lease ended are returned
    assert stale == {a.group_id, b.group_id}
    # AND a renewed lease moves a group out of the stale set
    renewed = ledger.renew_lease(c, now_ms=T0_MS + 25_000, lease_ms=LEASE_MS, skew_ms=SKEW_MS)
    assert renewed.applied
    assert c.group_id not in set(ledger.stale_groups(STREAM, now_ms=T0_MS + 52_000))


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


# --- replay-mode runs ---------------------------------------------------------------------------

RUN = "query-a/7"


def attempt(
    attempt_id: str,
    *,
    execution: str = "exec-1",
    task: str = "0",
    task_attempt: int = 0,
    started_at_ms: int = T0_MS,
) -> RunAttempt:
    return RunAttempt(
        attempt_id=attempt_id,
        execution_id=execution,
        task=task,
        task_attempt=task_attempt,
        started_at_ms=started_at_ms,
        lease_expires_at_ms=started_at_ms + LEASE_MS,
    )


def execution(
    execution_id: str, *attempts: RunAttempt, finished: int = 0, superseded: bool = False
) -> RunExecution:
    """The execution ``attempts`` registered (the first one's bounds), ``finished`` of them
    finished."""
    first = attempts[0]
    return RunExecution(
        execution_id,
        first.started_at_ms,
        first.lease_expires_at_ms,
        superseded=superseded,
        attempts=len(attempts),
        open_tags=sum(a.tag for a in attempts[finished:]),
    )


def test_attempts_register_with_their_execution_and_their_task(ledger: Ledger) -> None:
    # GIVEN a task attempt registered on a run
    first = attempt("a1")
    registered = ledger.register_attempt(STREAM, RUN, first)
    assert registered.registered
    assert registered.run.state is RunState.OPEN
    assert registered.run.executions == (execution("exec-1", first),)
    assert (registered.task_attempts, registered.lease_expires_at_ms) == (
        (first,),
        first.lease_expires_at_ms,
    )
    # WHEN its retry registers a second later, and a sibling task
    retry = attempt("a2", task_attempt=1, started_at_ms=T0_MS + 1_000)
    again = ledger.register_attempt(STREAM, RUN, retry)
    sibling = ledger.register_attempt(STREAM, RUN, attempt("s1", task="1"))
    # THEN the retry sees its task's first attempt (what it recovers), and a lease bounded by
    # its execution's; the sibling sees only itself
    bounded = dataclasses.replace(retry, lease_expires_at_ms=first.lease_expires_at_ms)
    assert again.registered
    assert again.task_attempts == (first, bounded)
    assert again.lease_expires_at_ms == first.lease_expires_at_ms
    assert [a.attempt_id for a in sibling.task_attempts] == ["s1"]
    # AND the run counts three attempts in one execution: the run item holds no attempt
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert run.executions == (execution("exec-1", first, retry, attempt("s1", task="1")),)
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "0") == (first, bounded)


def test_a_lower_attempt_registering_after_a_higher_one_is_outranked(ledger: Ledger) -> None:
    # GIVEN attempt 11 of a task registered first (attempt 10's worker stalled)
    later = attempt("a11", task_attempt=11)
    assert ledger.register_attempt(STREAM, RUN, later).registered
    # WHEN attempt 10 registers after it
    stalled = attempt("a10", task_attempt=10, started_at_ms=T0_MS + 1_000)
    refused = ledger.register_attempt(STREAM, RUN, stalled)
    # THEN it is outranked, not registered on its task (11 owns the rows), and not left open
    # on its execution: only 11 is, and 11 sees no attempt before it
    assert (refused.registered, refused.outranked, refused.superseded) == (False, True, True)
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "0") == (later,)
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    [counted] = run.executions
    assert (counted.attempts, counted.open_tags) == (2, later.tag)
    # AND an attempt with the same number as the highest registers, after it (a later one)
    same = ledger.register_attempt(STREAM, RUN, attempt("b11", task_attempt=11))
    assert same.registered
    assert {a.attempt_id for a in same.task_attempts} == {"a11", "b11"}


def test_registering_the_same_attempt_twice_keeps_one_attempt(ledger: Ledger) -> None:
    ledger.register_attempt(STREAM, RUN, attempt("a1"))
    # an SDK retry of an applied registration, or the same process asking again
    again = ledger.register_attempt(STREAM, RUN, attempt("a1"))
    assert again.registered
    assert len(again.task_attempts) == 1
    # AND its execution never reads as finished: the tag was added twice
    [counted] = again.run.executions
    assert not counted.finished


def test_a_complete_run_takes_no_attempt_and_stays_complete(ledger: Ledger) -> None:
    # GIVEN a run its driver committed
    first = attempt("a1")
    ledger.register_attempt(STREAM, RUN, first)
    completed = ledger.complete_run(STREAM, RUN, counts={"sent": 3}, now_ms=T0_MS + 5_000)
    assert (completed.state, completed.completed_at_ms, completed.counts) == (
        RunState.COMPLETE,
        T0_MS + 5_000,
        {"sent": 3},
    )
    # WHEN a replay of it registers an attempt
    replay = ledger.register_attempt(STREAM, RUN, attempt("b1", execution="exec-2"))
    # THEN it is refused: the replay sends nothing
    assert not replay.registered
    assert replay.run.state is RunState.COMPLETE
    assert replay.run.executions == (execution("exec-1", first),)
    assert ledger.task_attempts(STREAM, RUN, "exec-2", "0") == ()
    # AND completing it again keeps the first commit's time and counts
    assert ledger.complete_run(STREAM, RUN, counts={}, now_ms=T0_MS + 9_000) == completed


def test_a_run_lives_the_streams_retention_when_it_outlasts_the_dedupe_ttl(
    ledger: Ledger,
) -> None:
    # GIVEN a stream kept longer than the ledger's dedupe TTL
    keep_s = ledger.dedupe_ttl_s + 30 * 24 * 3600
    # WHEN a run registers its first attempt
    first = attempt("a1")
    registered = ledger.register_attempt(STREAM, RUN, first, keep_s=keep_s)
    # THEN its item lives the retention past that attempt's lease (its last possible put),
    # not the TTL
    assert registered.run.expires_at_s == first.lease_expires_at_ms // 1000 + keep_s
    # AND a later execution (a replay, a day later) and its renewal move it on: the item
    # outlives the records of the run's latest execution
    later_ms = T0_MS + 24 * 3600 * 1000
    replay = attempt("b1", execution="exec-2", started_at_ms=later_ms)
    moved = ledger.register_attempt(STREAM, RUN, replay, keep_s=keep_s)
    assert moved.run.expires_at_s == replay.lease_expires_at_ms // 1000 + keep_s
    renewal = ledger.renew_attempt(
        STREAM,
        RUN,
        replay,
        now_ms=later_ms + 10_000,
        lease_ms=LEASE_MS,
        skew_ms=1_000,
        keep_s=keep_s,
    )
    assert renewal.applied
    renewed = ledger.get_run(STREAM, RUN)
    assert renewed is not None
    assert renewed.expires_at_s == (later_ms + 10_000 + LEASE_MS) // 1000 + keep_s
    # AND once completed, the retention from its completion: a re-run finds it COMPLETE while
    # the rows it put are in the stream
    done_ms = later_ms + 60_000
    completed = ledger.complete_run(STREAM, RUN, counts={}, now_ms=done_ms, keep_s=keep_s)
    assert completed.expires_at_s == done_ms // 1000 + keep_s
    found = ledger.get_run(STREAM, RUN)
    assert found is not None
    assert found.expires_at_s == completed.expires_at_s
    # AND a run of a stream kept less than the TTL lives the TTL
    short = ledger.register_attempt(STREAM, "other", attempt("c1"), keep_s=3600)
    assert short.run.expires_at_s == (T0_MS + LEASE_MS) // 1000 + ledger.dedupe_ttl_s


def test_an_attempt_renews_its_lease_and_its_executions_while_valid(ledger: Ledger) -> None:
    first = attempt("a1")
    ledger.register_attempt(STREAM, RUN, first)
    # WHEN it renews with more than the skew left
    now_ms = T0_MS + LEASE_MS - SKEW_MS - 1
    renewed = ledger.renew_attempt(
        STREAM, RUN, first, now_ms=now_ms, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    # THEN its lease runs from now, and its execution's with it
    assert (renewed.applied, renewed.lease_expires_at_ms) == (True, now_ms + LEASE_MS)
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "0") == (
        dataclasses.replace(first, lease_expires_at_ms=now_ms + LEASE_MS),
    )
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert run.executions[0].lease_expires_at_ms == now_ms + LEASE_MS
    # AND once its lease is within the skew of its end, it cannot
    late_ms = now_ms + LEASE_MS - SKEW_MS
    late = ledger.renew_attempt(
        STREAM, RUN, first, now_ms=late_ms, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    assert not late.applied


def test_a_late_task_extends_its_executions_lease_even_once_it_ran_out(ledger: Ledger) -> None:
    # GIVEN an execution whose first task registered, and whose lease ran out since (its
    # executors were lost; Spark is running its tasks again on new ones)
    ledger.register_attempt(STREAM, RUN, attempt("a1"))
    later_ms = T0_MS + 2 * LEASE_MS
    # WHEN a retry of that task registers, and a sibling half a lease before that one's end
    retry = attempt("a2", task_attempt=1, started_at_ms=later_ms)
    registered = ledger.register_attempt(STREAM, RUN, retry)
    sibling = attempt("s1", task="1", started_at_ms=later_ms + LEASE_MS // 2 - 1)
    beside = ledger.register_attempt(STREAM, RUN, sibling)
    # THEN the retry extended the execution's lease and holds a whole one; the sibling, with
    # more than half a lease left of it, takes it as it is (no write to extend it)
    assert registered.lease_expires_at_ms == later_ms + LEASE_MS
    assert beside.lease_expires_at_ms == later_ms + LEASE_MS
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert run.executions[0].lease_expires_at_ms == later_ms + LEASE_MS


def test_a_superseded_attempt_can_no_longer_renew(ledger: Ledger) -> None:
    # GIVEN a task attempt, and its retry that supersedes it
    first, retry = attempt("a1"), attempt("a2", task_attempt=1, started_at_ms=T0_MS + 1)
    ledger.register_attempt(STREAM, RUN, first)
    ledger.register_attempt(STREAM, RUN, retry)
    superseded = ledger.supersede_attempts(STREAM, RUN, retry, ["a1"])
    assert [(a.attempt_id, a.superseded) for a in superseded] == [("a1", True), ("a2", False)]
    # WHEN the first (a stalled process, waking) tries to renew
    renewal = ledger.renew_attempt(
        STREAM, RUN, first, now_ms=T0_MS + 1_000, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    # THEN it is refused: the lease the retry read is final
    assert not renewal.applied
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "0") == superseded
    # AND the retry itself still renews
    assert ledger.renew_attempt(
        STREAM, RUN, retry, now_ms=T0_MS + 1_000, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    ).applied


def test_a_superseded_execution_can_neither_grow_nor_register(ledger: Ledger) -> None:
    # GIVEN an execution's attempt, and a replay (another execution) that supersedes it
    first = attempt("a1")
    ledger.register_attempt(STREAM, RUN, first)
    replay = attempt("b1", execution="exec-2", started_at_ms=T0_MS + 2_000)
    assert ledger.register_attempt(STREAM, RUN, replay).registered
    superseded = ledger.supersede_executions(STREAM, RUN, ["exec-1"])
    assert superseded is not None
    assert superseded.executions == (
        execution("exec-1", first, superseded=True),
        execution("exec-2", replay),
    )
    # WHEN its attempt renews, and another task of it registers
    renewal = ledger.renew_attempt(
        STREAM, RUN, first, now_ms=T0_MS + 1_000, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    late = ledger.register_attempt(STREAM, RUN, attempt("a3", task="1"))
    # THEN both are refused: the bounds the replay read are final
    assert not renewal.applied
    assert (late.registered, late.superseded) == (False, True)
    assert ledger.get_run(STREAM, RUN) == superseded


def test_an_execution_is_finished_once_every_attempt_of_it_is(ledger: Ledger) -> None:
    # GIVEN two tasks of one execution
    task0, task1 = attempt("a1"), attempt("a2", task="1")
    ledger.register_attempt(STREAM, RUN, task0)
    ledger.register_attempt(STREAM, RUN, task1)
    # WHEN one finishes, then the other
    ledger.finish_attempt(STREAM, RUN, task0)
    half = ledger.get_run(STREAM, RUN)
    ledger.finish_attempt(STREAM, RUN, task1)
    done = ledger.get_run(STREAM, RUN)
    # THEN it is finished only after both: a replay waits for none of its leases then
    assert half is not None
    assert done is not None
    assert half.executions == (execution("exec-1", task0, task1, finished=1),)
    assert not half.executions[0].finished
    assert done.executions[0].finished
    assert done.leases_ended_before(T0_MS)


def test_a_finished_attempts_late_rows_are_added_to_its_execution(ledger: Ledger) -> None:
    # GIVEN two tasks of one execution, each with a row settled by a record found early
    task0, task1 = attempt("a1"), attempt("a2", task="1")
    ledger.register_attempt(STREAM, RUN, task0)
    ledger.register_attempt(STREAM, RUN, task1)
    # WHEN both finish, task0 with two late rows, task1 with more than an item should list
    ledger.finish_attempt(STREAM, RUN, task0, late_rows=frozenset({"r1", "r2"}))
    half = ledger.get_run(STREAM, RUN)
    many = frozenset(f"r{i}" for i in range(LATE_ROWS_MAX + 1))
    ledger.finish_attempt(STREAM, RUN, task1, late_rows=many)
    done = ledger.get_run(STREAM, RUN)
    # THEN the execution lists them, then every row: it is finished, but its puts have not
    # ended until its lease has
    assert half is not None
    assert done is not None
    assert half.executions[0].late_rows == {"r1", "r2"}
    assert done.executions[0].late_rows == {"r1", "r2", ANY_ROW}
    assert done.executions[0].finished
    assert not done.leases_ended_before(T0_MS)
    assert done.leases_ended_before(task0.lease_expires_at_ms + 1)


def test_runs_are_per_stream_and_never_read_as_keys(ledger: Ledger) -> None:
    ledger.register_attempt(STREAM, RUN, attempt("a1"))
    assert ledger.get_run("other-stream", RUN) is None
    assert ledger.get_run(STREAM, "query-a/8") is None
    assert list(ledger.scan(STREAM)) == []


# --- OPEN runs in the in-flight index -------------------------------------------------------------


def test_open_runs_lists_the_runs_left_open_once_every_execution_ended(
    ledger: Ledger,
) -> None:
    # GIVEN five runs: "q/1" one attempt (lease ends T0+30s); "q/2" a first execution (ends
    # T0+30s) and a replay (ends T0+50s); "q/3" whose attempt renewed twice, to T0+75s; "q/4"
    # committed; "q/5" whose one attempt finished (lease running to T0+30s)
    ledger.register_attempt(STREAM, "q/1", attempt("a1"))
    ledger.register_attempt(STREAM, "q/2", attempt("b1"))
    ledger.register_attempt(
        STREAM, "q/2", attempt("b2", execution="exec-2", started_at_ms=T0_MS + 20_000)
    )
    c1 = attempt("c1")
    ledger.register_attempt(STREAM, "q/3", c1)
    for renewed_at_ms in (T0_MS + 20_000, T0_MS + 45_000):
        assert ledger.renew_attempt(
            STREAM, "q/3", c1, now_ms=renewed_at_ms, lease_ms=LEASE_MS, skew_ms=SKEW_MS
        ).applied
    ledger.register_attempt(STREAM, "q/4", attempt("d1"))
    ledger.complete_run(STREAM, "q/4", counts={"sent": 1}, now_ms=T0_MS + 1_000)
    e1 = attempt("e1")
    ledger.register_attempt(STREAM, "q/5", e1)
    ledger.finish_attempt(STREAM, "q/5", e1)
    # WHEN the index is asked at T0+29s, T0+45s, T0+55s and T0+85s
    at_29s = ledger.open_runs(STREAM, now_ms=T0_MS + 29_000)
    at_45s = ledger.open_runs(STREAM, now_ms=T0_MS + 45_000)
    at_55s = ledger.open_runs(STREAM, now_ms=T0_MS + 55_000)
    at_85s = ledger.open_runs(STREAM, now_ms=T0_MS + 85_000)
    # THEN a run is listed once every execution of it ended (its lease, or every attempt
    # finished) and its first lease is past (the index's sort), never a committed one
    assert list(at_29s) == []
    assert sorted(run.run for run in at_45s) == ["q/1", "q/5"]
    assert sorted(run.run for run in at_55s) == ["q/1", "q/2", "q/5"]
    left_open = {run.run: run for run in at_85s}
    assert sorted(left_open) == ["q/1", "q/2", "q/3", "q/5"]
    # AND each comes back as a consistent read shows it: OPEN, with every execution's lease
    assert left_open["q/2"] == ledger.get_run(STREAM, "q/2")
    assert left_open["q/2"].state is RunState.OPEN
    assert [e.lease_expires_at_ms for e in left_open["q/2"].executions] == [
        T0_MS + LEASE_MS,
        T0_MS + 20_000 + LEASE_MS,
    ]
    # AND without a time, every OPEN run is listed, leases running or not
    assert sorted(run.run for run in ledger.open_runs(STREAM, now_ms=None)) == [
        "q/1",
        "q/2",
        "q/3",
        "q/5",
    ]


def test_replay_runs_lists_every_run_of_the_stream_open_or_complete(ledger: Ledger) -> None:
    # GIVEN two runs of the stream, one committed, and a run of another stream
    ledger.register_attempt(STREAM, "q/1", attempt("a1"))
    ledger.register_attempt(STREAM, "q/2", attempt("b1"))
    ledger.complete_run(STREAM, "q/2", counts={"sent": 1}, now_ms=T0_MS + 1_000)
    ledger.register_attempt(f"{STREAM}-other", "q/1", attempt("c1"))
    # WHEN the stream's runs are listed (a scan, small pages)
    runs = {run.run: run for run in ledger.replay_runs(STREAM, page_size=1)}
    # THEN both are there, each as a consistent read shows it, the other stream's not
    assert sorted(runs) == ["q/1", "q/2"]
    assert runs["q/1"] == ledger.get_run(STREAM, "q/1")
    assert runs["q/2"].state is RunState.COMPLETE


def test_a_run_leaves_the_index_when_it_completes(ledger: Ledger) -> None:
    # GIVEN a run left open past its lease
    ledger.register_attempt(STREAM, RUN, attempt("a1"))
    later_ms = T0_MS + 2 * LEASE_MS
    assert [run.run for run in ledger.open_runs(STREAM, now_ms=later_ms)] == [RUN]
    # WHEN a replay of it commits it
    ledger.complete_run(STREAM, RUN, counts={"sent": 2}, now_ms=later_ms)
    # THEN it is no longer listed, with or without a time
    assert list(ledger.open_runs(STREAM, now_ms=later_ms)) == []
    assert list(ledger.open_runs(STREAM, now_ms=None)) == []


def test_open_runs_are_split_by_bucket_share_and_kept_per_stream(ledger: Ledger) -> None:
    # GIVEN twelve runs left open, and one on another stream
    names = [f"query-a/{batch}" for batch in range(12)]
    for name in names:
        ledger.register_attempt(STREAM, name, attempt(f"a-{name}"))
    ledger.register_attempt("payments", "query-a/0", attempt("p1"))
    later_ms = T0_MS + 2 * LEASE_MS
    # WHEN two reconcilers each read their share of the index
    shares = [
        [run.run for run in ledger.open_runs(STREAM, now_ms=later_ms, buckets=share)]
        for share in (bucket_share(index, 2, ledger.inflight_buckets) for index in (0, 1))
    ]
    # THEN each run is in exactly one share, and the other stream's run in neither
    assert sorted(shares[0] + shares[1]) == sorted(names)
    assert not set(shares[0]) & set(shares[1])
    assert [run.run for run in ledger.open_runs("payments", now_ms=later_ms)] == ["query-a/0"]


def test_runs_in_the_in_flight_index_are_never_read_as_claim_groups(ledger: Ledger) -> None:
    # GIVEN a stale claim group, and runs left open past their leases in every bucket
    group = claimed(ledger, "k-stale")
    for batch in range(8):
        ledger.register_attempt(STREAM, f"query-a/{batch}", attempt(f"a{batch}"))
    later_ms = T0_MS + 2 * LEASE_MS
    # WHEN the reconciler's walk and the API's pages read the groups of every bucket
    stale = list(ledger.stale_groups(STREAM, now_ms=later_ms))
    keys = [
        key
        for bucket in range(ledger.inflight_buckets)
        for key in ledger.in_flight_page(STREAM, bucket, before_ms=None, limit=100)[0]
    ]
    # THEN they see the group and its key, and no run
    assert stale == [group.group_id]
    assert keys == ["k-stale"]
