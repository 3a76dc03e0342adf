"""The ledger contract of ``tests/integration/test_ledger_contract.py``, run on ``InMemoryLedger``.

A fake store must pass the same contract as the real one. Every case here mirrors the
integration case of the same name, GIVEN/WHEN/THEN for GIVEN/WHEN/THEN; only the ways of
getting there differ where the fake has no DynamoDB under it (a lost response is the fake's
``apply_then_retry`` knob instead of botocore's fault injector; bulk items are claimed).

The shared cases live in ``tests/ledger_contract.py``; here are the fake's fixture, its
versions of the backend-specific cases, and its own fault knobs.
"""

from __future__ import annotations

import pytest
from fakes.ledger import InMemoryLedger, LedgerFault

# the cases every Ledger backend passes, collected by pytest from this module's namespace
from ledger_contract import *  # noqa: F403
from ledger_contract import (
    ALICE,
    BOB,
    LEASE_MS,
    POSITION,
    STREAM,
    T0_MS,
    TTL_S,
    claim,
    request_for,
)

from dedupe_store.errors import LedgerUnavailableError
from dedupe_store.records import ClaimStatus
from dedupe_store.states import LedgerState


@pytest.fixture
def ledger() -> InMemoryLedger:
    return InMemoryLedger(dedupe_ttl_s=TTL_S, inflight_buckets=4)


# --- a request retried by the SDK after its first try applied -----------------------------------
#
# The response of an applied write is lost on the wire; the SDK (3 retries here) sends the very
# same request again, whose condition now fails on its own effect. Each write must recognise it.


def test_a_claim_retried_by_the_sdk_after_its_first_try_applied_reports_won(
    ledger: InMemoryLedger,
) -> None:
    # GIVEN the response of the next claim is lost after it applied
    ledger.inject("*", LedgerFault.APPLY_THEN_RETRY)
    # WHEN a producer claims a new key
    result = ledger.claim(request_for("k-retried"), owner=ALICE, now_ms=T0_MS, lease_ms=LEASE_MS)
    # THEN the SDK's retry is recognised: the claim is won, once, attempt 1
    assert [fault for _, fault in ledger.injected] == [LedgerFault.APPLY_THEN_RETRY]
    assert result.status is ClaimStatus.WON
    assert result.record is not None
    assert (result.record.attempt, result.record.owner) == (1, ALICE)
    assert ledger.get(STREAM, "k-retried") == result.record


def test_a_mark_retried_by_the_sdk_after_its_first_try_applied_reports_applied(
    ledger: InMemoryLedger,
) -> None:
    # GIVEN a claim, and the response of the next write lost after it applied
    held = claim(ledger, "k-mark-retried")
    ledger.inject("*", LedgerFault.APPLY_THEN_RETRY)
    # WHEN it is marked delivered
    result = ledger.mark_delivered(held, POSITION, now_ms=T0_MS + 1)
    # THEN the retried mark is recognised as applied
    assert [fault for _, fault in ledger.injected] == [LedgerFault.APPLY_THEN_RETRY]
    assert result.applied
    assert result.current is not None
    assert (result.current.state, result.current.position) == (LedgerState.DELIVERED, POSITION)


def test_a_take_over_retried_by_the_sdk_after_its_first_try_applied_reports_won(
    ledger: InMemoryLedger,
) -> None:
    # GIVEN an expired claim, and the response of the next write lost after it applied
    seen = claim(ledger, "k-take-retried")
    ledger.inject("*", LedgerFault.APPLY_THEN_RETRY)
    # WHEN bob takes it over
    result = ledger.take_over(seen, owner=BOB, now_ms=T0_MS + LEASE_MS + 1, lease_ms=LEASE_MS)
    # THEN the retried take-over is recognised as won: attempt 2, bob's
    assert [fault for _, fault in ledger.injected] == [LedgerFault.APPLY_THEN_RETRY]
    assert result.status is ClaimStatus.WON
    assert result.record is not None
    assert (result.record.attempt, result.record.owner) == (2, BOB)


def test_a_release_retried_by_the_sdk_after_its_first_try_applied_reports_applied(
    ledger: InMemoryLedger,
) -> None:
    # GIVEN a claim, and the response of the next write lost after it applied
    seen = claim(ledger, "k-release-retried")
    ledger.inject("*", LedgerFault.APPLY_THEN_RETRY)
    # WHEN it is released
    result = ledger.release(seen)
    # THEN the retried release is recognised as applied
    assert [fault for _, fault in ledger.injected] == [LedgerFault.APPLY_THEN_RETRY]
    assert result.applied
    assert result.current is not None
    assert result.current.state is LedgerState.RELEASED


# --- the fake's own knobs (no integration twin) -------------------------------------------------


def test_apply_then_raise_applies_the_write_and_raises(ledger: InMemoryLedger) -> None:
    # GIVEN the response of the next claim is lost after it applied, with no retry
    ledger.inject("claim", LedgerFault.APPLY_THEN_RAISE)
    # WHEN a producer claims a new key
    with pytest.raises(LedgerUnavailableError):
        ledger.claim(request_for("k-lost"), owner=ALICE, now_ms=T0_MS, lease_ms=LEASE_MS)
    # THEN the claim is in the ledger all the same, and the next claim loses to it
    record = ledger.get(STREAM, "k-lost")
    assert record is not None
    assert (record.state, record.attempt, record.owner) == (LedgerState.IN_FLIGHT, 1, ALICE)
    again = ledger.claim(request_for("k-lost"), owner=ALICE, now_ms=T0_MS, lease_ms=LEASE_MS)
    assert again.status is ClaimStatus.LOST


def test_unavailable_applies_nothing(ledger: InMemoryLedger) -> None:
    # GIVEN the ledger is unavailable for the next mark
    held = claim(ledger, "k-down")
    ledger.inject("mark_delivered", LedgerFault.UNAVAILABLE)
    # WHEN the claim is marked
    with pytest.raises(LedgerUnavailableError):
        ledger.mark_delivered(held, POSITION, now_ms=T0_MS + 1)
    # THEN it is still IN_FLIGHT, and a second mark applies
    assert ledger.get(STREAM, "k-down") == held
    assert ledger.mark_delivered(held, POSITION, now_ms=T0_MS + 2).applied


# --- batched reads (items written the way this backend can) ------------------------------


def test_batch_get_reads_250_keys_and_leaves_absent_ones_out(ledger: InMemoryLedger) -> None:
    # GIVEN 250 keys in the ledger (more than one BatchGetItem of 100), all claimed
    keys = [f"k-batch-{i:03d}" for i in range(250)]
    claimed = {key: claim(ledger, key) for key in keys}
    # WHEN they are read in one call, with absent keys and repeats mixed in
    found = ledger.batch_get(STREAM, [*keys, "k-absent-1", keys[0], "k-absent-2"])
    # THEN every claimed key comes back once, absent ones are left out
    assert sorted(found) == keys
    assert all(r.state is LedgerState.IN_FLIGHT and r.attempt == 1 for r in found.values())
    assert all(found[key] == record for key, record in claimed.items())
    assert found["k-batch-249"].lease_expires_at_ms == T0_MS + LEASE_MS
    assert ledger.get(STREAM, "k-absent-1") is None
