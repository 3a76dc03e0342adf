"""The contract's claim groups (``dedupe_store.groups``): a group opened, its positions recorded
and settled, taken over once its lease expired for everyone, its lease renewed; the stale groups
of the in-flight index.
"""

from __future__ import annotations

from dedupe_store.contract import Ledger
from dedupe_store.records import Position
from dedupe_store.states import GroupState, LedgerState
from ledger_contract.staging import (
    ALICE,
    BOB,
    LATER,
    LEASE_MS,
    POSITION,
    SKEW_MS,
    STREAM,
    T0_MS,
    claimed,
    open_group,
)


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
