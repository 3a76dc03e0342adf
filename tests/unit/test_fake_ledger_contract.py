"""The ledger contract of ``tests/integration/test_ledger_contract.py``, run on ``InMemoryLedger``.

A fake store must pass the same contract as the real one. Every case here mirrors the
integration case of the same name, GIVEN/WHEN/THEN for GIVEN/WHEN/THEN; only the ways of
getting there differ where the fake has no DynamoDB under it (a lost response is the fake's
``apply_then_retry`` knob instead of botocore's fault injector; bulk items are claimed).

The shared cases live in ``tests/ledger_contract/``; here are the fake's fixture, its
versions of the backend-specific cases, and its own fault knobs.
"""

from __future__ import annotations

import pytest
from fakes.ledger import InMemoryLedger, LedgerFault

# the cases every Ledger backend passes, collected by pytest from this module's namespace
from ledger_contract import *  # noqa: F403
from ledger_contract.staging import (
    ALICE,
    BOB,
    LEASE_MS,
    POSITION,
    SKEW_MS,
    STREAM,
    T0_MS,
    TTL_S,
    claimed,
    open_group,
    request_for,
)

from dedupe_store.errors import LedgerThrottledError, LedgerUnavailableError
from dedupe_store.records import ClaimResult, ClaimStatus, PendingClaim
from dedupe_store.states import GroupState, KeyState, LedgerState


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
    # GIVEN an open group, and the response of the next claim lost after it applied
    group = open_group(ledger, "k-retried")
    ledger.inject("*", LedgerFault.APPLY_THEN_RETRY)
    # WHEN a producer claims the key
    result = ledger.claim(request_for("k-retried"), group, now_ms=T0_MS)
    # THEN the SDK's retry is recognised: the claim is won, once, attempt 1
    assert [fault for _, fault in ledger.injected] == [LedgerFault.APPLY_THEN_RETRY]
    assert result.status is ClaimStatus.WON
    assert result.claim is not None
    assert (result.claim.attempt, result.claim.group_id) == (1, group.group_id)
    assert ledger.get_claim(STREAM, "k-retried") == result.claim


def test_an_open_retried_by_the_sdk_after_its_first_try_applied_returns_the_group(
    ledger: InMemoryLedger,
) -> None:
    # GIVEN the response of the next write lost after it applied
    ledger.inject("*", LedgerFault.APPLY_THEN_RETRY)
    # WHEN a group is opened
    group = open_group(ledger, "k-open-retried")
    # THEN the retried open is recognised: the group is there, OPEN at epoch 1
    assert ledger.get_group(STREAM, group.group_id) == group
    assert (group.state, group.epoch) == (GroupState.OPEN, 1)


def test_a_settle_retried_by_the_sdk_after_its_first_try_applied_reports_applied(
    ledger: InMemoryLedger,
) -> None:
    # GIVEN a claimed group, and the response of the next write lost after it applied
    group = claimed(ledger, "k-settle-retried")
    ledger.inject("*", LedgerFault.APPLY_THEN_RETRY)
    # WHEN it is settled
    result = ledger.record_positions(
        group, {"k-settle-retried": POSITION}, settle=True, now_ms=T0_MS + 1
    )
    # THEN the retried settle is recognised as applied
    assert [fault for _, fault in ledger.injected] == [LedgerFault.APPLY_THEN_RETRY]
    assert result.applied
    record = ledger.get(STREAM, "k-settle-retried")
    assert record is not None
    assert (record.state, record.position) == (LedgerState.DELIVERED, POSITION)


def test_a_take_over_retried_by_the_sdk_after_its_first_try_applied_reports_won(
    ledger: InMemoryLedger,
) -> None:
    # GIVEN an expired claim, bob's group, and the response of the next write lost after it applied
    claimed(ledger, "k-take-retried")
    seen = ledger.get_claim(STREAM, "k-take-retried")
    assert seen is not None
    bobs = open_group(ledger, "k-take-retried", owner=BOB, now_ms=T0_MS + LEASE_MS + 1)
    ledger.inject("*", LedgerFault.APPLY_THEN_RETRY)
    # WHEN bob takes it over
    result = ledger.take_over_key(seen, bobs, now_ms=T0_MS + LEASE_MS + 1)
    # THEN the retried take-over is recognised as won: attempt 2, in bob's group
    assert result.status is ClaimStatus.WON
    assert result.claim is not None
    assert (result.claim.attempt, result.claim.group_id) == (2, bobs.group_id)


def test_a_group_take_over_retried_by_the_sdk_after_its_first_try_applied_reports_applied(
    ledger: InMemoryLedger,
) -> None:
    # GIVEN an expired group, and the response of the next write lost after it applied
    group = claimed(ledger, "k-group-retried")
    ledger.inject("*", LedgerFault.APPLY_THEN_RETRY)
    # WHEN bob takes it over
    result = ledger.take_over_group(
        group, owner=BOB, now_ms=T0_MS + LEASE_MS + SKEW_MS, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    # THEN it applied, once: epoch 2, bob's
    assert result.applied
    assert result.current is not None
    assert (result.current.epoch, result.current.owner) == (2, BOB)


# --- the fake's own knobs (no integration twin) -------------------------------------------------


def test_apply_then_raise_applies_the_write_and_raises(ledger: InMemoryLedger) -> None:
    # GIVEN the response of the next claim is lost after it applied, with no retry
    group = open_group(ledger, "k-lost")
    ledger.inject("claim", LedgerFault.APPLY_THEN_RAISE)
    # WHEN a producer claims the key
    with pytest.raises(LedgerUnavailableError):
        ledger.claim(request_for("k-lost"), group, now_ms=T0_MS)
    # THEN the claim is in the ledger all the same, and the next claim loses to it
    held = ledger.get_claim(STREAM, "k-lost")
    assert held is not None
    assert (held.state, held.attempt, held.group_id) == (KeyState.CLAIMED, 1, group.group_id)
    again = ledger.claim(request_for("k-lost"), group, now_ms=T0_MS)
    assert again.status is ClaimStatus.LOST


def test_unavailable_applies_nothing(ledger: InMemoryLedger) -> None:
    # GIVEN the ledger is unavailable for the next settle
    group = claimed(ledger, "k-down")
    ledger.inject("record_positions", LedgerFault.UNAVAILABLE)
    # WHEN the group is settled
    with pytest.raises(LedgerUnavailableError):
        ledger.record_positions(group, {"k-down": POSITION}, settle=True, now_ms=T0_MS + 1)
    # THEN it is still OPEN, and a second settle applies
    assert ledger.get_group(STREAM, group.group_id) == group
    assert ledger.record_positions(
        group, {"k-down": POSITION}, settle=True, now_ms=T0_MS + 2
    ).applied


def test_a_throttled_renewal_applies_nothing_once_the_sdk_backoff_has_passed() -> None:
    # GIVEN an open group, and DynamoDB throttling every try of the next renewal for 12 s
    waited: list[int] = []
    ledger = InMemoryLedger(dedupe_ttl_s=TTL_S, inflight_buckets=4, sleep_ms=waited.append)
    group = open_group(ledger, "k-throttled")
    ledger.inject("renew_lease", LedgerFault.THROTTLED, delay_ms=12_000)
    # WHEN its owner renews its lease
    with pytest.raises(LedgerThrottledError):
        ledger.renew_lease(group, now_ms=T0_MS + 1, lease_ms=LEASE_MS, skew_ms=SKEW_MS)
    # THEN the backoff passed first, and the lease is what it was
    assert waited == [12_000]
    assert ledger.get_group(STREAM, group.group_id) == group


def test_a_renewal_throttled_then_applied_is_the_write_built_when_the_call_began() -> None:
    # GIVEN an open group, and the next renewal throttled, then applied by an SDK retry 12 s on
    waited: list[int] = []
    ledger = InMemoryLedger(dedupe_ttl_s=TTL_S, inflight_buckets=4, sleep_ms=waited.append)
    group = open_group(ledger, "k-late")
    ledger.inject("renew_lease", LedgerFault.THROTTLED_THEN_APPLIED, delay_ms=12_000)
    # WHEN its owner renews its lease
    renewed = ledger.renew_lease(group, now_ms=T0_MS + 1, lease_ms=LEASE_MS, skew_ms=SKEW_MS)
    # THEN it applied after the backoff, with the lease counted from the call's start
    assert waited == [12_000]
    assert renewed.applied
    assert renewed.current is not None
    assert renewed.current.lease_expires_at_ms == T0_MS + 1 + LEASE_MS


def test_a_delayed_fault_needs_a_clock_to_move(ledger: InMemoryLedger) -> None:
    with pytest.raises(ValueError, match="sleep_ms"):
        ledger.inject("renew_lease", LedgerFault.THROTTLED, delay_ms=1)


# --- batched reads (items written the way this backend can) ------------------------------


def test_a_judge_read_that_fails_gives_each_of_its_keys_the_error(ledger: InMemoryLedger) -> None:
    # GIVEN 150 keys left pending (they exist), and the first read of them refused
    keys = [f"k-{i:03d}" for i in range(150)]
    claimed(ledger, *keys)
    pending = [PendingClaim(request_for(k), "not-ours") for k in keys]
    ledger.inject("judge_claims", LedgerFault.UNAVAILABLE)
    # WHEN they are judged
    verdicts = ledger.judge_claims(pending, now_ms=T0_MS)
    # THEN the first read's 100 keys each get its ledger error, the other 50 are judged
    assert all(isinstance(v, LedgerUnavailableError) for v in verdicts[:100]), verdicts[:100]
    assert all(isinstance(v, ClaimResult) and v.status is ClaimStatus.LOST for v in verdicts[100:])


def test_batch_get_reads_250_keys_and_leaves_absent_ones_out(ledger: InMemoryLedger) -> None:
    # GIVEN 250 keys in the ledger (more than one BatchGetItem of 100), all claimed in one group
    keys = [f"k-batch-{i:03d}" for i in range(250)]
    claimed(ledger, *keys)
    # WHEN they are read in one call, with absent keys and repeats mixed in
    found = ledger.batch_get(STREAM, [*keys, "k-absent-1", keys[0], "k-absent-2"])
    # THEN every claimed key comes back once, absent ones are left out
    assert sorted(found) == keys
    assert all(r.state is LedgerState.IN_FLIGHT and r.attempt == 1 for r in found.values())
    assert found["k-batch-249"].lease_expires_at_ms == T0_MS + LEASE_MS
    assert ledger.get(STREAM, "k-absent-1") is None
    assert found["k-batch-000"].owner == ALICE
