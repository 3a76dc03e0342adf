"""The producer's and the reconciler's decisions, as pure functions over what was read.

No I/O: each takes the items the ledger returned (a key item, its group, the answer to a
conditional write), a read-back's resolution or a lease, and returns what to do.
:mod:`producer.key.delivery` and :mod:`producer.reconcile.reconciler` act on them;
``tests/unit/test_decisions.py`` goes through every case.

::

    a lost claim ──── judge_lost_claim ─┬─ DELIVERED     its holder's group records it: DUPLICATE
                                        ├─ CONFLICT      the key holds other data
                                        ├─ UNVERIFIABLE  an earlier claim could not be verified
                                        ├─ RELEASED      released since: a later call claims it
                                        ├─ VANISHED      gone since: send it again
                                        └─ WAIT          its holder's put is not ours to judge
    a read-back ───── read_back_action ─┬─ RECORD        found, our put: record its position
                                        ├─ DUPLICATE     found, another's put: nothing to send
                                        ├─ WAIT          not found while the lease runs
                                        ├─ RESEND        not found and cannot land: take over
                                        ├─ RELEASE       ... and no data at hand to send it
                                        └─ UNVERIFIABLE / CONFLICT
    fencing a holder  after_fence ──────┬─ TAKE_OVER     fenced (or its group is gone)
                                        ├─ DELIVERED     it recorded the key first: DUPLICATE
                                        └─ WAIT          its owner is alive (renewed), another
                                                         party holds it, or the write failed
    leases ────────── groups_to_renew:  the groups whose lease a put sent now would outlive
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from dedupe_store.records import Group, GroupUpdate, KeyClaim, Position
from dedupe_store.states import GroupState, KeyState
from producer.protocol import LeasePolicy

__all__ = [
    "FenceVerdict",
    "LostClaim",
    "LostClaimJudgement",
    "ReadBackAction",
    "Resolution",
    "after_fence",
    "due_for_read_back",
    "groups_to_renew",
    "judge_lost_claim",
    "read_back_action",
]


class Resolution(StrEnum):
    """Where a read-back places a claim's put (:class:`producer.key.readback.ReadBackResolver`)."""

    FOUND = "FOUND"  # in the stream at a position
    NOT_FOUND = "NOT_FOUND"  # not in the stream, and its put can no longer land
    PENDING = "PENDING"  # not in the stream yet, but the lease runs: it may still land
    UNVERIFIABLE = "UNVERIFIABLE"  # the window starts before the stream's trim horizon
    CONFLICT = "CONFLICT"  # the key is in the window with other data


class LostClaim(StrEnum):
    DELIVERED = "DELIVERED"
    CONFLICT = "CONFLICT"
    UNVERIFIABLE = "UNVERIFIABLE"
    RELEASED = "RELEASED"
    VANISHED = "VANISHED"
    WAIT = "WAIT"


@dataclass(frozen=True, slots=True)
class LostClaimJudgement:
    verdict: LostClaim
    position: Position | None = None  # where the holder's group records the key, if it does


def judge_lost_claim(
    key: str, payload_digest: str, current: KeyClaim | None, holder: Group | None
) -> LostClaimJudgement:
    """What a claim we lost means: ``current`` is the key item that won, ``holder`` the group
    it names (None: gone, its lease long over). Other data is a conflict whatever its state;
    a position in the holder's group is a delivery; anything else is the holder's to finish."""
    if current is None:
        return LostClaimJudgement(LostClaim.VANISHED)
    position = holder.position_of(key) if holder is not None else None
    if current.payload_digest != payload_digest:
        return LostClaimJudgement(LostClaim.CONFLICT, position)
    if current.state is KeyState.UNVERIFIABLE:
        return LostClaimJudgement(LostClaim.UNVERIFIABLE)
    if current.state is KeyState.RELEASED:
        return LostClaimJudgement(LostClaim.RELEASED)
    if position is not None:
        return LostClaimJudgement(LostClaim.DELIVERED, position)
    # held by another party, or by an earlier call of ours: its put is not this call's
    return LostClaimJudgement(LostClaim.WAIT)


class ReadBackAction(StrEnum):
    RECORD = "RECORD"
    DUPLICATE = "DUPLICATE"
    WAIT = "WAIT"
    RESEND = "RESEND"
    RELEASE = "RELEASE"
    UNVERIFIABLE = "UNVERIFIABLE"
    CONFLICT = "CONFLICT"


def read_back_action(resolution: Resolution, *, ours: bool, can_resend: bool) -> ReadBackAction:
    """What a read-back's resolution of a claim means for whoever acts on it.

    ``ours``: the claim's group is ours (a put of ours, or a group the reconciler took over):
    a record found is recorded in it; another party's record found is theirs to record.
    ``can_resend``: the message's data is at hand (the producer's; the reconciler's only when
    the claim stored it): a put that can no longer land is sent again under a new attempt,
    else the key is released for the next producer."""
    if resolution is Resolution.FOUND:
        return ReadBackAction.RECORD if ours else ReadBackAction.DUPLICATE
    if resolution is Resolution.PENDING:
        return ReadBackAction.WAIT
    if resolution is Resolution.NOT_FOUND:
        return ReadBackAction.RESEND if can_resend else ReadBackAction.RELEASE
    if resolution is Resolution.UNVERIFIABLE:
        return ReadBackAction.UNVERIFIABLE
    return ReadBackAction.CONFLICT


class FenceVerdict(StrEnum):
    TAKE_OVER = "TAKE_OVER"
    DELIVERED = "DELIVERED"
    WAIT = "WAIT"


def after_fence(key: str, update: GroupUpdate | None) -> tuple[FenceVerdict, Position | None]:
    """Whether ``key`` may be taken from another party's expired group, once we tried to take
    that group over (epoch + 1: its owner can no longer settle it). ``update`` is the answer,
    None when the write failed (it may or may not have applied).

    A take-over proceeds only when the fence holds: never while the holder may be alive. The
    fence lost means its owner renewed (alive), another party took the group first, or it
    settled: the key is a DUPLICATE if the group records it, else it is waited on again."""
    if update is None:
        return FenceVerdict.WAIT, None
    if update.current is None:
        # the group item is gone (deleted past its TTL): its lease is long over
        return FenceVerdict.TAKE_OVER, None
    position = update.current.position_of(key)
    if position is not None:
        # recorded since we read it (fenced or not): the key is in the stream
        return FenceVerdict.DELIVERED, position
    if update.applied:
        return FenceVerdict.TAKE_OVER, None
    return FenceVerdict.WAIT, None


def groups_to_renew(lease_ends_ms: Mapping[str, int], now_ms: int, lease: LeasePolicy) -> set[str]:
    """The groups (by id) whose lease a put sent now could outlive: renew them first."""
    return {
        group_id
        for group_id, lease_expires_at_ms in lease_ends_ms.items()
        if not lease.safe_to_send(lease_expires_at_ms, now_ms)
    }


def due_for_read_back(
    *,
    ours: bool,
    first_look: bool,
    lease_expires_at_ms: int,
    holder: Group | None,
    now_ms: int,
    lease: LeasePolicy,
) -> bool:
    """Whether a held claim is read back now. An ambiguous put of ours is, at once ("written,
    response lost" is common); any claim is once its lease has expired for every clock, or
    once its holder's group is SETTLED (it recorded what it wrote)."""
    if first_look and ours:
        return True
    if lease.expired_for_everyone(lease_expires_at_ms, now_ms):
        return True
    return holder is not None and holder.state is GroupState.SETTLED
