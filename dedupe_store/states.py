"""The ledger's state machines (ledger schema v2: claim groups), and the delivery state readers see.

A key item is written once per attempt; the group item it names holds the lease and, once
known, the key's position::

    key:   (none | RELEASED | expired) --claim--> CLAIMED(attempt n, group G)
           CLAIMED(n, G) --take_over--> CLAIMED(n + 1, G2)
           CLAIMED --release--> RELEASED          CLAIMED --mark_unverifiable--> UNVERIFIABLE
    group: (none) --open--> OPEN(epoch 1)
           OPEN(e) --renew (lease still valid) / take_over (lease expired)--> OPEN(e + 1)
           OPEN(e) --record (positions so far)--> OPEN(e)    OPEN(e) --settle--> SETTLED

A replay-mode run (a Spark micro-batch, a batch write, a named CLI run) is one item: each
execution of it (a driver run, a CLI process) is counted on it with its bounds, each task's
attempts are on an item of their own; attempts renew their lease within their execution's
until a replay supersedes the execution, and the run ends COMPLETE::

    run:   (none) --register--> OPEN    OPEN --register / renew / supersede--> OPEN
           OPEN --complete--> COMPLETE  COMPLETE --complete--> COMPLETE (every writer agrees)

A key is DELIVERED when its key item is CLAIMED by group G and G records a position for it:
:func:`delivery_state` derives what readers (the API, the audit) see from the two items.
Pure: no I/O. The DynamoDB conditions in :mod:`dedupe_store.ledger` encode the same tables.
"""

from __future__ import annotations

from enum import StrEnum

from dedupe_store.errors import InvalidTransitionError

__all__ = [
    "GroupState",
    "GroupTransition",
    "KeyState",
    "KeyTransition",
    "LedgerState",
    "RunState",
    "RunTransition",
    "delivery_state",
    "next_group_state",
    "next_key_state",
    "next_run_state",
]


class LedgerState(StrEnum):
    """A key's delivery state, as readers see it (derived from its key item and group)."""

    IN_FLIGHT = "IN_FLIGHT"
    DELIVERED = "DELIVERED"
    RELEASED = "RELEASED"
    UNVERIFIABLE = "UNVERIFIABLE"


class KeyState(StrEnum):
    CLAIMED = "CLAIMED"
    RELEASED = "RELEASED"
    UNVERIFIABLE = "UNVERIFIABLE"


class GroupState(StrEnum):
    OPEN = "OPEN"
    SETTLED = "SETTLED"


class RunState(StrEnum):
    OPEN = "OPEN"
    COMPLETE = "COMPLETE"


class KeyTransition(StrEnum):
    CLAIM = "claim"
    TAKE_OVER = "take_over"
    RELEASE = "release"
    MARK_UNVERIFIABLE = "mark_unverifiable"


class GroupTransition(StrEnum):
    OPEN = "open"
    RENEW = "renew"
    TAKE_OVER = "take_over"
    RECORD = "record"
    SETTLE = "settle"


class RunTransition(StrEnum):
    REGISTER = "register"
    RENEW = "renew"
    SUPERSEDE = "supersede"
    COMPLETE = "complete"


# None stands for "no item", and for an item past its dedupe TTL.
KEY_TRANSITIONS: dict[tuple[KeyState | None, KeyTransition], KeyState] = {
    (None, KeyTransition.CLAIM): KeyState.CLAIMED,
    (KeyState.RELEASED, KeyTransition.CLAIM): KeyState.CLAIMED,
    (KeyState.CLAIMED, KeyTransition.TAKE_OVER): KeyState.CLAIMED,
    (KeyState.CLAIMED, KeyTransition.RELEASE): KeyState.RELEASED,
    (KeyState.CLAIMED, KeyTransition.MARK_UNVERIFIABLE): KeyState.UNVERIFIABLE,
}

GROUP_TRANSITIONS: dict[tuple[GroupState | None, GroupTransition], GroupState] = {
    (None, GroupTransition.OPEN): GroupState.OPEN,
    (GroupState.OPEN, GroupTransition.RENEW): GroupState.OPEN,
    (GroupState.OPEN, GroupTransition.TAKE_OVER): GroupState.OPEN,
    (GroupState.OPEN, GroupTransition.RECORD): GroupState.OPEN,
    (GroupState.OPEN, GroupTransition.SETTLE): GroupState.SETTLED,
}


RUN_TRANSITIONS: dict[tuple[RunState | None, RunTransition], RunState] = {
    (None, RunTransition.REGISTER): RunState.OPEN,
    (RunState.OPEN, RunTransition.REGISTER): RunState.OPEN,
    (RunState.OPEN, RunTransition.RENEW): RunState.OPEN,
    (RunState.OPEN, RunTransition.SUPERSEDE): RunState.OPEN,
    (None, RunTransition.COMPLETE): RunState.COMPLETE,
    (RunState.OPEN, RunTransition.COMPLETE): RunState.COMPLETE,
    (RunState.COMPLETE, RunTransition.COMPLETE): RunState.COMPLETE,
}


def next_key_state(current: KeyState | None, transition: KeyTransition) -> KeyState:
    """The key item's state after ``transition``; raises if the machine forbids it."""
    try:
        return KEY_TRANSITIONS[(current, transition)]
    except KeyError:
        raise InvalidTransitionError(current, transition) from None


def next_group_state(current: GroupState | None, transition: GroupTransition) -> GroupState:
    """The group item's state after ``transition``; raises if the machine forbids it."""
    try:
        return GROUP_TRANSITIONS[(current, transition)]
    except KeyError:
        raise InvalidTransitionError(current, transition) from None


def next_run_state(current: RunState | None, transition: RunTransition) -> RunState:
    """A replay run's state after ``transition``; raises if the machine forbids it."""
    try:
        return RUN_TRANSITIONS[(current, transition)]
    except KeyError:
        raise InvalidTransitionError(current, transition) from None


def delivery_state(key_state: KeyState, *, has_position: bool) -> LedgerState:
    """What a reader sees: a claimed key with a position in its group is delivered."""
    if key_state is KeyState.RELEASED:
        return LedgerState.RELEASED
    if key_state is KeyState.UNVERIFIABLE:
        return LedgerState.UNVERIFIABLE
    return LedgerState.DELIVERED if has_position else LedgerState.IN_FLIGHT
