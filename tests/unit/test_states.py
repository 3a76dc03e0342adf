"""The ledger's state machine, checked exhaustively against the design's transition diagram.

Every (state or absent) x transition pair is listed here on its own, written from DESIGN.md
rather than copied from the code's table, so a wrong edge in either shows up.
"""

from __future__ import annotations

import itertools

import pytest

from dedupe_store.errors import InvalidTransitionError, LedgerError
from dedupe_store.states import LedgerState, Transition, is_allowed, next_state

IN_FLIGHT = LedgerState.IN_FLIGHT
DELIVERED = LedgerState.DELIVERED
RELEASED = LedgerState.RELEASED
UNVERIFIABLE = LedgerState.UNVERIFIABLE

# From DESIGN.md "The ledger":
#   (none) --claim--> IN_FLIGHT --mark--> DELIVERED
#   IN_FLIGHT --takeover--> IN_FLIGHT (attempt+1)
#   IN_FLIGHT --release--> RELEASED --claim--> IN_FLIGHT
#   IN_FLIGHT --past retention--> UNVERIFIABLE
DESIGN_EDGES: dict[tuple[LedgerState | None, Transition], LedgerState] = {
    (None, Transition.CLAIM): IN_FLIGHT,
    (RELEASED, Transition.CLAIM): IN_FLIGHT,
    (IN_FLIGHT, Transition.MARK_DELIVERED): DELIVERED,
    (IN_FLIGHT, Transition.TAKE_OVER): IN_FLIGHT,
    (IN_FLIGHT, Transition.RELEASE): RELEASED,
    (IN_FLIGHT, Transition.MARK_UNVERIFIABLE): UNVERIFIABLE,
}

ALL_SOURCES: list[LedgerState | None] = [None, *LedgerState]
ALL_PAIRS = list(itertools.product(ALL_SOURCES, Transition))
FORBIDDEN_PAIRS = [pair for pair in ALL_PAIRS if pair not in DESIGN_EDGES]


def _id(pair: tuple[LedgerState | None, Transition]) -> str:
    current, transition = pair
    return f"{current or 'ABSENT'}-{transition}"


def test_the_pairs_cover_every_state_and_transition() -> None:
    # GIVEN the states and transitions the code defines
    # THEN the exhaustive tests below cover them all: 5 sources x 5 transitions, 6 allowed
    assert len(ALL_PAIRS) == 5 * 5
    assert len(FORBIDDEN_PAIRS) == len(ALL_PAIRS) - 6


@pytest.mark.parametrize(
    ("pair", "expected"), list(DESIGN_EDGES.items()), ids=[_id(p) for p in DESIGN_EDGES]
)
def test_allowed_transition_gives_the_designed_next_state(
    pair: tuple[LedgerState | None, Transition], expected: LedgerState
) -> None:
    # GIVEN an edge of the design's diagram
    current, transition = pair
    # WHEN the machine is asked for the next state
    # THEN it is the one the diagram names, and the edge is reported as allowed
    assert next_state(current, transition) is expected
    assert is_allowed(current, transition)


@pytest.mark.parametrize("pair", FORBIDDEN_PAIRS, ids=[_id(p) for p in FORBIDDEN_PAIRS])
def test_forbidden_transition_raises_with_current_state_and_transition(
    pair: tuple[LedgerState | None, Transition],
) -> None:
    # GIVEN a pair that is not an edge of the diagram
    current, transition = pair
    # WHEN the machine is asked for the next state
    with pytest.raises(InvalidTransitionError) as excinfo:
        next_state(current, transition)
    # THEN the error names where it was and what was attempted, and is a non-retriable ledger error
    error = excinfo.value
    assert error.current == current
    assert error.transition == transition
    assert str(transition) in str(error)
    assert (str(current) if current is not None else "ABSENT") in str(error)
    assert isinstance(error, LedgerError)
    assert error.retriable is False
    assert not is_allowed(current, transition)


def test_delivered_key_cannot_be_claimed_again_while_its_ttl_runs() -> None:
    # GIVEN a key that is DELIVERED (its dedupe TTL not passed: the item still counts)
    # WHEN a producer tries to claim it
    # THEN the machine refuses: a delivered key is never sent twice
    with pytest.raises(InvalidTransitionError):
        next_state(DELIVERED, Transition.CLAIM)


def test_in_flight_key_cannot_be_claimed_by_a_second_producer() -> None:
    # GIVEN a key IN_FLIGHT under someone's claim
    # WHEN another producer tries a plain claim (not a takeover after read-back)
    # THEN the machine refuses
    with pytest.raises(InvalidTransitionError):
        next_state(IN_FLIGHT, Transition.CLAIM)


@pytest.mark.parametrize("transition", list(Transition))
def test_unverifiable_is_terminal(transition: Transition) -> None:
    # GIVEN a key whose read-back window fell past the stream's retention
    # WHEN anything at all is attempted on it
    # THEN nothing is allowed: it is surfaced, never resent or released
    assert not is_allowed(UNVERIFIABLE, transition)


def test_absent_key_error_message_says_absent() -> None:
    # GIVEN no ledger item for the key
    # WHEN it is marked delivered without a claim
    with pytest.raises(InvalidTransitionError) as excinfo:
        next_state(None, Transition.MARK_DELIVERED)
    # THEN the message reads as a person would say it
    assert str(excinfo.value) == "transition mark_delivered is not allowed from state ABSENT"
    assert excinfo.value.current is None
