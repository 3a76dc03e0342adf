"""What one chunk's delivery holds: its own claim groups, the messages it claimed or waits on,
and their outcomes (:class:`ChunkState`). Plain data with the few rules that keep it
consistent; the protocol's steps (:mod:`producer.key.delivery` and its parts) act on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dedupe_store.records import Group, KeyClaim, LedgerRecord, Position
from producer import outcomes
from producer.key.decisions import LostClaim, judge_lost_claim
from producer.outcomes import Outcome
from producer.protocol import PreparedMessage

__all__ = ["ChunkState", "ClaimedMessage", "OwnGroup"]


@dataclass(slots=True)
class OwnGroup:
    """One of this chunk's claim groups: the group as we hold it (a renewal replaces it), the
    positions its members' puts landed at, and the members claimed for it not yet settled."""

    group: Group
    positions: dict[str, Position] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)  # of the keys with a position
    unresolved: set[str] = field(default_factory=set)  # claimed for it, not settled by us

    @property
    def group_id(self) -> str:
        return self.group.group_id


@dataclass(slots=True)
class ClaimedMessage:
    """A message and the key item that claims it: ours (``own`` is the group of this chunk
    that holds it), or another party's we wait on (``holder`` is its group as last read)."""

    item: PreparedMessage
    claim: KeyClaim
    # another party's (or an earlier call's) group; None: gone (expired), its lease long over
    holder: Group | None = None
    # ours: its lease is read from there, renewals included, since a put sent under a renewed
    # lease may land until that lease's end
    own: OwnGroup | None = None

    @property
    def is_ours(self) -> bool:
        return self.own is not None

    @property
    def group(self) -> Group | None:
        return self.own.group if self.own is not None else self.holder

    @property
    def key(self) -> str:
        return self.item.key

    @property
    def lease_expires_at_ms(self) -> int:
        group = self.group
        return group.lease_expires_at_ms if group is not None else 0

    @property
    def record(self) -> LedgerRecord:
        """The claim as read-back sees it: its window runs from the claim to the group's lease."""
        return LedgerRecord.of(self.claim, self.group)

    def held_by(self, own: OwnGroup, claim: KeyClaim) -> None:
        """Now claimed for ``own`` (``claim`` is the new attempt): ours to send."""
        self.claim, self.holder, self.own = claim, None, own


class ChunkState:
    """The groups of one chunk's delivery and the outcomes decided so far, by input index."""

    def __init__(self) -> None:
        self.groups: dict[str, OwnGroup] = {}
        self.outcomes: dict[int, Outcome] = {}

    def add_group(self, group: Group) -> OwnGroup:
        own = OwnGroup(group)
        self.groups[group.group_id] = own
        return own

    def report(self, outcome: Outcome) -> None:
        self.outcomes[outcome.index] = outcome

    def claimed(self, own: OwnGroup, message: ClaimedMessage, claim: KeyClaim) -> None:
        """``message`` is now claimed for ``own``: a group of ours that held it before no
        longer does."""
        before = self.groups.get(message.claim.group_id)
        if before is not None:
            before.unresolved.discard(message.key)
        own.unresolved.add(message.key)
        message.held_by(own, claim)

    def left(self, message: ClaimedMessage) -> None:
        """``message``'s key left our group (another party moved it first)."""
        before = self.groups.get(message.claim.group_id)
        if before is not None:
            before.unresolved.discard(message.key)

    def resolved(self, message: ClaimedMessage, position: Position | None) -> bool:
        """Our claim is settled as far as we are concerned: written at ``position``, or
        released (None). Its group records the position when it is settled. False when the
        claim's group is not one of this chunk's."""
        own = self.groups.get(message.claim.group_id)
        if own is None:
            return False
        own.unresolved.discard(message.key)
        if position is not None:
            own.positions[message.key] = position
            own.attempts[message.key] = message.claim.attempt
        return True

    def judge_lost(
        self, item: PreparedMessage, current: KeyClaim | None, holder: Group | None
    ) -> ClaimedMessage | None:
        """A claim of ``item`` we lost (or that moved on): its outcome when the holder's items
        decide it, else the claim to wait on."""
        judged = judge_lost_claim(item.key, item.payload_digest, current, holder)
        verdict = judged.verdict
        if current is None or verdict is LostClaim.VANISHED:
            self.report(outcomes.failed(item, "claim lost and the item vanished; send again"))
        elif verdict is LostClaim.CONFLICT:
            reason = f"key already used for another payload (state {current.state})"
            self.report(
                outcomes.conflict(item, reason, attempt=current.attempt, position=judged.position)
            )
        elif verdict is LostClaim.UNVERIFIABLE:
            reason = "an earlier claim of this key could not be verified within retention"
            self.report(outcomes.unverifiable(item, reason, current.attempt))
        elif verdict is LostClaim.RELEASED:
            # released again between our claim and our read: a later call claims it
            self.report(outcomes.failed(item, "claim raced a release; send again"))
        elif verdict is LostClaim.DELIVERED and judged.position is not None:
            self.report(outcomes.duplicate(item, judged.position, current.attempt))
        else:
            return ClaimedMessage(item, current, holder)
        return None

    def in_flight(self, message: ClaimedMessage, reason: str) -> None:
        self.report(outcomes.in_flight(message.item, message.claim.attempt, reason))
