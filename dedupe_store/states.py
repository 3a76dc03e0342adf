"""The ledger's state machine: states, transitions and the table that allows them.

::

    (absent) --claim--> IN_FLIGHT --mark_delivered--> DELIVERED
    IN_FLIGHT --take_over (lease expired, read-back: not found)--> IN_FLIGHT (attempt + 1)
    IN_FLIGHT --release (not found, no data to resend)--> RELEASED --claim--> IN_FLIGHT
    IN_FLIGHT --mark_unverifiable (window past retention)--> UNVERIFIABLE
    DELIVERED past its dedupe TTL counts as absent, so it can be claimed again.

Pure: no I/O. The DynamoDB conditions in :mod:`dedupe_store.ledger` encode the same table.
"""

from __future__ import annotations

from enum import StrEnum

from dedupe_store.errors import InvalidTransitionError


class LedgerState(StrEnum):
    IN_FLIGHT = "IN_FLIGHT"
    DELIVERED = "DELIVERED"
    RELEASED = "RELEASED"
    UNVERIFIABLE = "UNVERIFIABLE"


class Transition(StrEnum):
    CLAIM = "claim"
    MARK_DELIVERED = "mark_delivered"
    TAKE_OVER = "take_over"
    RELEASE = "release"
    MARK_UNVERIFIABLE = "mark_unverifiable"


# None stands for "no item", and for a DELIVERED item whose dedupe TTL has passed.
TRANSITIONS: dict[tuple[LedgerState | None, Transition], LedgerState] = {
    (None, Transition.CLAIM): LedgerState.IN_FLIGHT,
    (LedgerState.RELEASED, Transition.CLAIM): LedgerState.IN_FLIGHT,
    (LedgerState.IN_FLIGHT, Transition.MARK_DELIVERED): LedgerState.DELIVERED,
    (LedgerState.IN_FLIGHT, Transition.TAKE_OVER): LedgerState.IN_FLIGHT,
    (LedgerState.IN_FLIGHT, Transition.RELEASE): LedgerState.RELEASED,
    (LedgerState.IN_FLIGHT, Transition.MARK_UNVERIFIABLE): LedgerState.UNVERIFIABLE,
}


def next_state(current: LedgerState | None, transition: Transition) -> LedgerState:
    """The state after ``transition`` from ``current``; raises if the machine forbids it."""
    try:
        return TRANSITIONS[(current, transition)]
    except KeyError:
        raise InvalidTransitionError(current, transition) from None


def is_allowed(current: LedgerState | None, transition: Transition) -> bool:
    return (current, transition) in TRANSITIONS
