"""What happened to each message: one :class:`Outcome` per message sent."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dedupe_store.records import Position


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
