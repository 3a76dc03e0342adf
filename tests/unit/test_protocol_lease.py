"""Lease arithmetic: a claim protects its key for longer than any put made under it can land."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from producer.protocol import LeasePolicy

# the design's defaults: 2 s connect + 5 s read, 5 s skew, 60 s lease
PUT_TIMEOUT_MS = 7_000
SKEW_MS = 5_000
LEASE_MS = 60_000
CLAIMED_AT_MS = 1_700_000_000_000
LEASE_END_MS = CLAIMED_AT_MS + LEASE_MS


@pytest.fixture
def policy() -> LeasePolicy:
    return LeasePolicy(lease_ms=LEASE_MS, put_timeout_ms=PUT_TIMEOUT_MS, skew_ms=SKEW_MS)


# --- the constructor ----------------------------------------------------------------------------


def test_lease_shorter_than_put_timeout_plus_twice_the_skew_is_refused() -> None:
    # GIVEN a lease one millisecond short of put timeout + 2 x skew (17 s)
    # WHEN the policy is made
    with pytest.raises(ValueError, match="shorter than put timeout") as excinfo:
        LeasePolicy(lease_ms=16_999, put_timeout_ms=PUT_TIMEOUT_MS, skew_ms=SKEW_MS)
    # THEN the message gives both figures
    assert "16999" in str(excinfo.value)
    assert "17000" in str(excinfo.value)


def test_lease_exactly_put_timeout_plus_twice_the_skew_is_accepted() -> None:
    # GIVEN a lease exactly at the minimum
    # WHEN the policy is made
    policy = LeasePolicy(lease_ms=17_000, put_timeout_ms=PUT_TIMEOUT_MS, skew_ms=SKEW_MS)
    # THEN it is accepted
    assert policy.minimum_lease_ms == 17_000


def test_lease_expires_lease_ms_after_the_claim(policy: LeasePolicy) -> None:
    # GIVEN the default 60 s lease
    # WHEN a claim is made
    # THEN its lease ends 60 s later
    assert policy.lease_expires_at_ms(CLAIMED_AT_MS) == LEASE_END_MS


# --- safe to send -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now_ms", "safe"),
    [
        (CLAIMED_AT_MS, True),
        (LEASE_END_MS - PUT_TIMEOUT_MS - SKEW_MS, True),  # exactly a put + skew left
        (LEASE_END_MS - PUT_TIMEOUT_MS - SKEW_MS + 1, False),  # one millisecond less
        (LEASE_END_MS, False),
        (LEASE_END_MS + 1, False),
    ],
    ids=["at-claim", "exactly-margin-left", "1ms-short", "at-lease-end", "after-lease-end"],
)
def test_safe_to_send_only_while_a_put_and_the_skew_still_fit(
    policy: LeasePolicy, now_ms: int, safe: bool
) -> None:
    # GIVEN a claim's lease end
    # WHEN the producer checks before sending
    # THEN it may send only while the lease outlasts a put's timeout plus the skew margin
    assert policy.safe_to_send(LEASE_END_MS, now_ms) is safe


# --- expired for everyone -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now_ms", "expired"),
    [
        (LEASE_END_MS, False),  # the holder's clock may be behind ours
        (LEASE_END_MS + SKEW_MS - 1, False),
        (LEASE_END_MS + SKEW_MS, True),
        (LEASE_END_MS + SKEW_MS + 1, True),
    ],
    ids=["at-lease-end", "1ms-before-end-plus-skew", "exactly-end-plus-skew", "after"],
)
def test_expired_for_everyone_once_the_skew_has_passed_too(
    policy: LeasePolicy, now_ms: int, expired: bool
) -> None:
    # GIVEN a claim held by another producer
    # WHEN a waiter asks whether it may resolve the claim itself
    # THEN only once the lease's end plus the skew margin has passed
    assert policy.expired_for_everyone(LEASE_END_MS, now_ms) is expired


# --- read-back window ---------------------------------------------------------------------------


def test_read_back_window_is_claim_minus_skew_to_lease_end_plus_skew(policy: LeasePolicy) -> None:
    # GIVEN a claim and its lease end
    # WHEN the read-back window is computed
    # THEN it is [claimed_at - skew, lease_expires_at + skew], as the design's table says
    assert policy.read_back_window(CLAIMED_AT_MS, LEASE_END_MS) == (
        CLAIMED_AT_MS - SKEW_MS,
        LEASE_END_MS + SKEW_MS,
    )


@st.composite
def policies(draw: st.DrawFn) -> LeasePolicy:
    put_timeout_ms = draw(st.integers(1, 120_000))
    skew_ms = draw(st.integers(0, 300_000))
    extra_ms = draw(st.integers(0, 3_600_000))
    return LeasePolicy(put_timeout_ms + 2 * skew_ms + extra_ms, put_timeout_ms, skew_ms)


@given(policy=policies(), claimed_at_ms=st.integers(0, 2**42))
def test_a_fresh_claim_is_always_safe_to_send(policy: LeasePolicy, claimed_at_ms: int) -> None:
    # GIVEN any valid policy
    # WHEN a producer sends right after claiming
    lease_end = policy.lease_expires_at_ms(claimed_at_ms)
    # THEN it is allowed to: the constructor's minimum guarantees the margin
    assert policy.safe_to_send(lease_end, claimed_at_ms)


@given(policy=policies(), claimed_at_ms=st.integers(0, 2**42), sent_after_ms=st.integers(0, 2**22))
def test_a_put_sent_while_safe_lands_inside_the_read_back_window_and_before_expiry(
    policy: LeasePolicy, claimed_at_ms: int, sent_after_ms: int
) -> None:
    # GIVEN any valid policy and a put sent some time after the claim, when safe to send
    lease_end = policy.lease_expires_at_ms(claimed_at_ms)
    sent_at = claimed_at_ms + sent_after_ms
    assume(policy.safe_to_send(lease_end, sent_at))
    # WHEN it lands as late as it can (its put timeout later, on a clock up to skew off)
    latest_landing = sent_at + policy.put_timeout_ms + policy.skew_ms
    start, end = policy.read_back_window(claimed_at_ms, lease_end)
    # THEN read-back looks where it can be, and no one thinks the lease expired before it landed
    assert start <= sent_at
    assert latest_landing <= end
    assert latest_landing <= lease_end + policy.skew_ms
    assert not policy.expired_for_everyone(lease_end, sent_at + policy.put_timeout_ms - 1)


@given(
    policy=policies(),
    window_ms=st.one_of(st.none(), st.integers(1, 600_000)),
    left_ms=st.integers(-(2**20), 2**22),
)
def test_the_send_margin_is_the_lease_safe_to_send_needs_left(
    policy: LeasePolicy, window_ms: int | None, left_ms: int
) -> None:
    # GIVEN any policy, with the signature fence or without
    fenced = LeasePolicy(
        policy.lease_ms + (window_ms or 0), policy.put_timeout_ms, policy.skew_ms, window_ms
    )
    # THEN a put may be sent exactly while the lease has the send margin left
    assert fenced.safe_to_send(CLAIMED_AT_MS + left_ms, CLAIMED_AT_MS) == (
        left_ms >= fenced.send_margin_ms
    )
