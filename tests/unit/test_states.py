"""The ledger's state machines, checked exhaustively against the design's transition diagrams.

Every (state or absent) x transition pair is listed here on its own, written from DESIGN.md
("The ledger") rather than copied from the code's tables, so a wrong edge in either shows up.
"""

from __future__ import annotations

import itertools

import pytest

from dedupe_store.errors import InvalidTransitionError, LedgerError
from dedupe_store.states import (
    GroupState,
    GroupTransition,
    KeyState,
    KeyTransition,
    LedgerState,
    delivery_state,
    next_group_state,
    next_key_state,
)

CLAIMED, RELEASED, UNVERIFIABLE = KeyState.CLAIMED, KeyState.RELEASED, KeyState.UNVERIFIABLE
OPEN, SETTLED = GroupState.OPEN, GroupState.SETTLED

# From DESIGN.md "The ledger":
#   key:   (none|RELEASED|expired) --claim--> CLAIMED(attempt n, group G)
#          CLAIMED(n, G) --takeover--> CLAIMED(n+1, G2)   CLAIMED --release--> RELEASED
#          CLAIMED --past retention--> UNVERIFIABLE
#   group: OPEN(epoch e) --settle--> SETTLED    OPEN(e) --renew lease / reconciler takeover--> OPEN(e+1)
KEY_EDGES: dict[tuple[KeyState | None, KeyTransition], KeyState] = {
    (None, KeyTransition.CLAIM): CLAIMED,
    (RELEASED, KeyTransition.CLAIM): CLAIMED,
    (CLAIMED, KeyTransition.TAKE_OVER): CLAIMED,
    (CLAIMED, KeyTransition.RELEASE): RELEASED,
    (CLAIMED, KeyTransition.MARK_UNVERIFIABLE): UNVERIFIABLE,
}
GROUP_EDGES: dict[tuple[GroupState | None, GroupTransition], GroupState] = {
    (None, GroupTransition.OPEN): OPEN,
    (OPEN, GroupTransition.RENEW): OPEN,
    (OPEN, GroupTransition.TAKE_OVER): OPEN,
    (OPEN, GroupTransition.RECORD): OPEN,  # positions recorded so far; members still open
    (OPEN, GroupTransition.SETTLE): SETTLED,
}

KEY_PAIRS = list(itertools.product([None, *KeyState], KeyTransition))
GROUP_PAIRS = list(itertools.product([None, *GroupState], GroupTransition))
KEY_FORBIDDEN = [pair for pair in KEY_PAIRS if pair not in KEY_EDGES]
GROUP_FORBIDDEN = [pair for pair in GROUP_PAIRS if pair not in GROUP_EDGES]


def _id(pair: tuple[object, object]) -> str:
    current, transition = pair
    return f"{current or 'ABSENT'}-{transition}"


def test_the_pairs_cover_every_state_and_transition() -> None:
    # GIVEN the states and transitions the code defines
    # THEN the exhaustive tests below cover them all
    assert len(KEY_PAIRS) == 4 * 4
    assert len(GROUP_PAIRS) == 3 * 5
    assert len(KEY_FORBIDDEN) == len(KEY_PAIRS) - 5
    assert len(GROUP_FORBIDDEN) == len(GROUP_PAIRS) - 5


@pytest.mark.parametrize(("pair", "expected"), list(KEY_EDGES.items()), ids=map(_id, KEY_EDGES))
def test_an_allowed_key_transition_gives_the_designed_state(
    pair: tuple[KeyState | None, KeyTransition], expected: KeyState
) -> None:
    # GIVEN an edge of the key diagram
    # WHEN the machine is asked for the next state
    # THEN it is the one the diagram names
    assert next_key_state(*pair) is expected


@pytest.mark.parametrize(("pair", "expected"), list(GROUP_EDGES.items()), ids=map(_id, GROUP_EDGES))
def test_an_allowed_group_transition_gives_the_designed_state(
    pair: tuple[GroupState | None, GroupTransition], expected: GroupState
) -> None:
    # GIVEN an edge of the group diagram
    # WHEN the machine is asked for the next state
    # THEN it is the one the diagram names
    assert next_group_state(*pair) is expected


@pytest.mark.parametrize("pair", KEY_FORBIDDEN, ids=map(_id, KEY_FORBIDDEN))
def test_a_forbidden_key_transition_raises_naming_state_and_transition(
    pair: tuple[KeyState | None, KeyTransition],
) -> None:
    # GIVEN a pair that is not an edge of the key diagram
    current, transition = pair
    # WHEN the machine is asked for the next state
    with pytest.raises(InvalidTransitionError) as excinfo:
        next_key_state(current, transition)
    # THEN the error names where it was and what was attempted, and is never retried
    assert (excinfo.value.current, excinfo.value.transition) == (current, transition)
    assert (str(current) if current is not None else "ABSENT") in str(excinfo.value)
    assert isinstance(excinfo.value, LedgerError)
    assert excinfo.value.retriable is False


@pytest.mark.parametrize("pair", GROUP_FORBIDDEN, ids=map(_id, GROUP_FORBIDDEN))
def test_a_forbidden_group_transition_raises(
    pair: tuple[GroupState | None, GroupTransition],
) -> None:
    # GIVEN a pair that is not an edge of the group diagram (a settled group is final)
    # WHEN the machine is asked for the next state
    # THEN it raises
    with pytest.raises(InvalidTransitionError):
        next_group_state(*pair)


@pytest.mark.parametrize("transition", list(KeyTransition))
def test_unverifiable_is_terminal(transition: KeyTransition) -> None:
    # GIVEN a key whose read-back window fell past the stream's retention
    # WHEN anything at all is attempted on it
    # THEN nothing is allowed: it is surfaced, never resent or released
    with pytest.raises(InvalidTransitionError):
        next_key_state(UNVERIFIABLE, transition)


@pytest.mark.parametrize(
    ("key_state", "has_position", "seen"),
    [
        (CLAIMED, True, LedgerState.DELIVERED),
        (CLAIMED, False, LedgerState.IN_FLIGHT),
        (RELEASED, False, LedgerState.RELEASED),
        (RELEASED, True, LedgerState.RELEASED),
        (UNVERIFIABLE, False, LedgerState.UNVERIFIABLE),
    ],
)
def test_a_key_is_delivered_when_claimed_and_its_group_records_a_position(
    key_state: KeyState, has_position: bool, seen: LedgerState
) -> None:
    # GIVEN a key item's state and whether the group it names records its position
    # WHEN a reader derives the delivery state
    # THEN only a claimed key with a position is DELIVERED
    assert delivery_state(key_state, has_position=has_position) is seen


def test_absent_key_error_message_says_absent() -> None:
    # GIVEN no ledger item for the key
    # WHEN it is released without a claim
    with pytest.raises(InvalidTransitionError) as excinfo:
        next_key_state(None, KeyTransition.RELEASE)
    # THEN the message reads as a person would say it
    assert str(excinfo.value) == "transition release is not allowed from state ABSENT"
    assert excinfo.value.current is None
