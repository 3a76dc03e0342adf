"""What happened to each message: one :class:`Outcome` per message sent."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dedupe_store.records import Position
from producer.protocol import PreparedMessage


class OutcomeStatus(StrEnum):
    SENT = "SENT"  # written once by this call, at ``position``
    DUPLICATE = "DUPLICATE"  # already delivered (or in this call already): nothing sent
    CONFLICT = "CONFLICT"  # the key was used for another payload: nothing sent
    REJECTED = "REJECTED"  # invalid input, never claimed: ``reason`` says why
    IN_FLIGHT = "IN_FLIGHT"  # not resolved yet (ambiguous put, or held by another producer)
    TAKEN_OVER = "TAKEN_OVER"  # sent, but another party took the claim over before our mark
    UNVERIFIABLE = "UNVERIFIABLE"  # the claim is older than the stream's retention
    FAILED = "FAILED"  # the ledger or the stream failed; not sent, safe to retry later


# Final for the caller: sent once or proven already there.
DELIVERED_STATUSES = frozenset({OutcomeStatus.SENT, OutcomeStatus.DUPLICATE})
# Settled for a batch: nothing more will happen to these rows by retrying.
SETTLED_STATUSES = DELIVERED_STATUSES | {OutcomeStatus.CONFLICT, OutcomeStatus.REJECTED}


@dataclass(frozen=True, slots=True)
class Outcome:
    index: int
    key: str | None
    status: OutcomeStatus
    position: Position | None = None
    reason: str | None = None
    attempt: int | None = None
    ledger_marked: bool = True

    @property
    def delivered(self) -> bool:
        return self.status in DELIVERED_STATUSES

    @property
    def settled(self) -> bool:
        return self.status in SETTLED_STATUSES

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"index": self.index, "key": self.key, "status": self.status.value}
        if self.position is not None:
            body["shard_id"] = self.position.shard_id
            body["sequence_number"] = self.position.sequence_number
            if self.position.sub_sequence_number is not None:
                body["sub_sequence_number"] = self.position.sub_sequence_number
        if self.attempt is not None:
            body["attempt"] = self.attempt
        if self.reason is not None:
            body["reason"] = self.reason
        if not self.ledger_marked:
            body["ledger_marked"] = False
        return body


# --- the outcomes of a send, by what became of a message ----------------------------------------


def duplicate(item: PreparedMessage, position: Position, attempt: int) -> Outcome:
    """Already in the stream once, at ``position``: nothing sent."""
    return Outcome(
        item.index, item.key, OutcomeStatus.DUPLICATE, position=position, attempt=attempt
    )


def failed(item: PreparedMessage, reason: str) -> Outcome:
    """Not sent (or released): safe to send again later."""
    return Outcome(item.index, item.key, OutcomeStatus.FAILED, reason=reason)


def in_flight(item: PreparedMessage, attempt: int, reason: str) -> Outcome:
    """Not resolved by this call: the reconciler (or a later send) settles it."""
    return Outcome(item.index, item.key, OutcomeStatus.IN_FLIGHT, reason=reason, attempt=attempt)


def conflict(
    item: PreparedMessage, reason: str, *, attempt: int | None, position: Position | None = None
) -> Outcome:
    """The key is used for other data: nothing sent."""
    return Outcome(
        item.index,
        item.key,
        OutcomeStatus.CONFLICT,
        position=position,
        reason=reason,
        attempt=attempt,
    )


def unverifiable(item: PreparedMessage, reason: str, attempt: int) -> Outcome:
    return Outcome(item.index, item.key, OutcomeStatus.UNVERIFIABLE, reason=reason, attempt=attempt)


def written(
    item: PreparedMessage,
    position: Position,
    attempt: int,
    failure: str | None,
    *,
    taken: bool,
) -> Outcome:
    """Written by this call at ``position``: SENT, or TAKEN_OVER when its group was taken over
    before we settled it; ``failure`` says why the ledger does not record it yet."""
    if taken:
        return Outcome(
            item.index,
            item.key,
            OutcomeStatus.TAKEN_OVER,
            position=position,
            attempt=attempt,
            reason="written, but the group was taken over before it was settled: the new "
            "owner records it from the stream",
        )
    return Outcome(
        item.index,
        item.key,
        OutcomeStatus.SENT,
        position=position,
        attempt=attempt,
        reason=failure,
        ledger_marked=failure is None,
    )


def repeat_outcome(item: PreparedMessage, first: PreparedMessage, outcome: Outcome) -> Outcome:
    """A key repeated in one input: what became of its first occurrence, said of it."""
    if item.payload_digest != first.payload_digest:
        return conflict(
            item,
            f"the same key appears earlier in this input (#{first.index}) with other data",
            attempt=None,
        )
    # delivered once already: DUPLICATE; else whatever became of the first occurrence
    status = OutcomeStatus.DUPLICATE if outcome.delivered else outcome.status
    why = "" if outcome.delivered else f": {outcome.reason}"
    return Outcome(
        item.index,
        item.key,
        status,
        position=outcome.position,
        attempt=outcome.attempt,
        reason=f"repeat of message #{first.index} in this input{why}",
    )
