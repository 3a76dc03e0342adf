"""The signature fence: a put leaves only if Kinesis would refuse it before its lease ends.

The check is pure (``signature_fence_admits``: signing time, window, skew, lease end), and so
is the lease policy built on it; the ``before-send`` handler of ``producer.fence`` and the
writer's translation of its refusal are tested here with plain objects, no socket (the handler
on a real botocore client is tested against the emulators in
``integration/test_signature_fence.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dedupe_store.clock import ManualClock
from kinesis_store.entries import put_entry
from kinesis_store.put_lease import sending_under
from kinesis_store.results import (
    LEASE_FENCE,
    SIGNATURE_FENCE,
    PutResultKind,
    classify_request_error,
)
from kinesis_store.writer import KinesisWriter
from producer.errors import PutFencedError
from producer.fence import LeaseDeadline, SignatureFence, fence_for, signed_at_ms
from producer.protocol import LeasePolicy, signature_fence_admits

# the design's defaults with the fence: 300 s window, 2 + 5 s put timeouts, 5 s skew, 360 s lease
WINDOW_MS = 300_000
PUT_TIMEOUT_MS = 7_000
SKEW_MS = 5_000
LEASE_MS = 360_000
CLAIMED_AT_MS = 1_700_000_000_000
LEASE_END_MS = CLAIMED_AT_MS + LEASE_MS
LAST_ADMITTED_MS = LEASE_END_MS - WINDOW_MS - SKEW_MS  # signed then: lands at the lease's end
ENTRIES = [put_entry("k1", b"one"), put_entry("k2", b"two")]


def fenced(
    lease_ms: int = LEASE_MS, window_ms: int = WINDOW_MS, skew_ms: int = SKEW_MS
) -> LeasePolicy:
    return LeasePolicy(lease_ms, PUT_TIMEOUT_MS, skew_ms, signature_window_ms=window_ms)


def admits(signed_at_ms: int, lease_end_ms: int = LEASE_END_MS) -> bool:
    return signature_fence_admits(
        signed_at_ms=signed_at_ms,
        signature_window_ms=WINDOW_MS,
        skew_ms=SKEW_MS,
        lease_expires_at_ms=lease_end_ms,
    )


# --- the pure check -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signed_at_ms", "admitted"),
    [
        (CLAIMED_AT_MS, True),
        (LAST_ADMITTED_MS - 1, True),
        (LAST_ADMITTED_MS, True),  # lands at the latest exactly when the lease ends
        (LAST_ADMITTED_MS + 1, False),  # one millisecond later could land after it
        (LEASE_END_MS - SKEW_MS, False),
        (LEASE_END_MS, False),
        (LEASE_END_MS + 60_000, False),  # a process that woke up long after its lease
    ],
    ids=[
        "at-claim",
        "1ms-early",
        "exactly-at-the-limit",
        "1ms-late",
        "skew-left",
        "at-end",
        "late",
    ],
)
def test_a_request_leaves_only_if_its_signature_expires_before_its_lease(
    signed_at_ms: int, admitted: bool
) -> None:
    # GIVEN a lease end, and a request signed at some time
    # WHEN the fence checks it
    # THEN it may leave only if signed_at + window + skew <= the lease's end
    assert admits(signed_at_ms) is admitted


@given(
    signed_at_ms=st.integers(0, 2**42),
    window_ms=st.integers(1, 3_600_000),
    skew_ms=st.integers(0, 300_000),
    lease_end_ms=st.integers(0, 2**42),
)
def test_the_check_is_the_inequality_and_nothing_else(
    signed_at_ms: int, window_ms: int, skew_ms: int, lease_end_ms: int
) -> None:
    # GIVEN any signing time, window, skew and lease end
    # WHEN the fence checks the request
    admitted = signature_fence_admits(
        signed_at_ms=signed_at_ms,
        signature_window_ms=window_ms,
        skew_ms=skew_ms,
        lease_expires_at_ms=lease_end_ms,
    )
    # THEN it admits exactly the requests Kinesis refuses (by a clock up to skew off) no later
    # than the lease's end
    assert admitted is (signed_at_ms + window_ms + skew_ms <= lease_end_ms)


@given(
    signed_at_ms=st.integers(0, 2**42),
    later_ms=st.integers(0, 2**22),
    longer_ms=st.integers(0, 2**22),
)
def test_signing_later_never_helps_and_a_longer_lease_never_hurts(
    signed_at_ms: int, later_ms: int, longer_ms: int
) -> None:
    # GIVEN a request, the same one signed later, and the same lease made longer
    # WHEN the fence checks them
    # THEN a refused request stays refused when signed later, and an admitted one stays
    # admitted under a longer lease
    if not admits(signed_at_ms):
        assert not admits(signed_at_ms + later_ms)
    if admits(signed_at_ms):
        assert admits(signed_at_ms, LEASE_END_MS + longer_ms)


@given(
    # around the last admitted time: most draws admitted (a draw the fence refuses is thrown
    # away, and Hypothesis fails a test that throws away most of its draws)
    signed_at_ms=st.integers(CLAIMED_AT_MS - 10_000, LAST_ADMITTED_MS + 10_000),
    aws_clock_off_ms=st.integers(-SKEW_MS, SKEW_MS),
    others_clock_off_ms=st.integers(-SKEW_MS, SKEW_MS),
)
def test_an_admitted_request_lands_before_anyone_may_take_its_keys_over(
    signed_at_ms: int, aws_clock_off_ms: int, others_clock_off_ms: int
) -> None:
    # GIVEN a request the fence admitted, however long its process stalls afterwards
    policy = fenced()
    assume(policy.fence_admits(signed_at_ms, LEASE_END_MS))
    # WHEN it lands as late as Kinesis accepts it: the window after its signing time by a
    # Kinesis clock up to skew off ours (told here in our clock)
    latest_landing_ms = signed_at_ms + WINDOW_MS + aws_clock_off_ms
    # THEN it lands by the lease's end, so by the time any party (its clock up to skew off)
    # may take the keys over, lease end + skew; and the read-back window covers it
    assert latest_landing_ms <= LEASE_END_MS
    assert latest_landing_ms + others_clock_off_ms <= LEASE_END_MS + SKEW_MS
    assert latest_landing_ms <= policy.read_back_window(CLAIMED_AT_MS, LEASE_END_MS)[1]


# --- the lease policy with the fence ------------------------------------------------------------


def test_with_the_fence_the_lease_must_cover_the_window_too() -> None:
    # GIVEN the fence on: the minimum is window + put timeout + 2 x skew = 317 s
    # WHEN a lease 1 ms short of it is made
    with pytest.raises(ValueError, match="signature window") as excinfo:
        fenced(lease_ms=316_999)
    # THEN it is refused with both figures; exactly the minimum is accepted
    assert "316999" in str(excinfo.value)
    assert "317000" in str(excinfo.value)
    assert fenced(lease_ms=317_000).minimum_lease_ms == 317_000


def test_a_policy_without_a_window_has_no_fence() -> None:
    # GIVEN the fence off
    policy = LeasePolicy(60_000, PUT_TIMEOUT_MS, SKEW_MS)
    # WHEN asked about any request
    # THEN it is not fenced and admits everything (the lease check before the put is all)
    assert not policy.fenced
    assert policy.fence_admits(LEASE_END_MS + 10**9, LEASE_END_MS)


@pytest.mark.parametrize("window_ms", [0, -1])
def test_a_window_that_is_not_positive_is_refused(window_ms: int) -> None:
    with pytest.raises(ValueError, match="not positive"):
        fenced(window_ms=window_ms)


@pytest.mark.parametrize(
    ("now_ms", "safe"),
    [
        (CLAIMED_AT_MS, True),
        (LAST_ADMITTED_MS, True),  # exactly the window + skew left
        (LAST_ADMITTED_MS + 1, False),  # a put timeout + skew would still be left: not enough
        (LEASE_END_MS - PUT_TIMEOUT_MS - SKEW_MS, False),
        (LEASE_END_MS, False),
    ],
    ids=["at-claim", "exactly-window-and-skew-left", "1ms-short", "put-timeout-left", "at-end"],
)
def test_with_the_fence_a_put_may_leave_only_while_the_window_and_skew_fit(
    now_ms: int, safe: bool
) -> None:
    # GIVEN the fence on
    # WHEN the producer checks its lease before a request
    # THEN it sends only while the lease has the window plus the skew left
    assert fenced().safe_to_send(LEASE_END_MS, now_ms) is safe


@st.composite
def fenced_policies(draw: st.DrawFn) -> LeasePolicy:
    put_timeout_ms = draw(st.integers(1, 120_000))
    skew_ms = draw(st.integers(0, 300_000))
    window_ms = draw(st.integers(1, 900_000))
    extra_ms = draw(st.integers(0, 3_600_000))
    lease_ms = window_ms + put_timeout_ms + 2 * skew_ms + extra_ms
    return LeasePolicy(lease_ms, put_timeout_ms, skew_ms, signature_window_ms=window_ms)


@given(policy=fenced_policies(), claimed_at_ms=st.integers(0, 2**42))
def test_a_fresh_fenced_claim_is_safe_to_send(policy: LeasePolicy, claimed_at_ms: int) -> None:
    # GIVEN any valid fenced policy
    # WHEN a producer sends right after claiming
    # THEN it may: the minimum lease leaves the window and the skew, and then some
    assert policy.safe_to_send(policy.lease_expires_at_ms(claimed_at_ms), claimed_at_ms)


@given(
    policy=fenced_policies(),
    claimed_at_ms=st.integers(0, 2**42),
    checked_after_ms=st.integers(0, 2**22),
    signed_after_ms=st.integers(0, 999),
)
def test_a_request_signed_when_its_lease_was_checked_passes_the_fence(
    policy: LeasePolicy, claimed_at_ms: int, checked_after_ms: int, signed_after_ms: int
) -> None:
    # GIVEN a lease checked safe to send, and the request signed within the same second (its
    # X-Amz-Date is truncated to the second, so it never reads later than the check)
    lease_end = policy.lease_expires_at_ms(claimed_at_ms)
    checked_at = claimed_at_ms + checked_after_ms
    assume(policy.safe_to_send(lease_end, checked_at))
    signed_at_header = (checked_at + signed_after_ms) // 1000 * 1000
    assume(signed_at_header <= checked_at)
    # WHEN the fence checks the signed request
    # THEN it is admitted: the fence refuses only a process that stalled in between
    assert policy.fence_admits(signed_at_header, lease_end)


# --- the request's signing time -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Amz-Date": "20231114T221320Z"}, 1_700_000_000_000),
        ({"X-Amz-Date": b"20231114T221320Z"}, 1_700_000_000_000),
        ({"X-Amz-Date": "20231114T221321Z"}, 1_700_000_001_000),
        ({}, None),
        ({"X-Amz-Date": "Tue, 14 Nov 2023 22:13:20 GMT"}, None),
        ({"X-Amz-Date": "yesterday"}, None),
        ({"X-Amz-Date": 1_700_000_000}, None),
    ],
    ids=["str", "bytes", "next-second", "missing", "http-date", "garbage", "not-text"],
)
def test_the_signing_time_is_the_x_amz_date_header_in_utc(
    headers: dict[str, Any], expected: int | None
) -> None:
    assert signed_at_ms(headers) == expected


def _stamp(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y%m%dT%H%M%SZ")


@given(epoch_s=st.integers(0, 2**33))
def test_the_signing_time_round_trips_to_the_second(epoch_s: int) -> None:
    assume(epoch_s < 253_402_300_800)  # before year 10000: strftime's range
    assert signed_at_ms({"X-Amz-Date": _stamp(epoch_s * 1000)}) == epoch_s * 1000


# --- the before-send handler --------------------------------------------------------------------


class Request:
    """What botocore hands a before-send handler: the prepared, signed request."""

    def __init__(self, signed_at_ms: int | None) -> None:
        self.headers = {} if signed_at_ms is None else {"X-Amz-Date": _stamp(signed_at_ms)}


def test_the_handler_lets_a_request_go_when_the_fence_admits_it() -> None:
    fence = SignatureFence(fenced())
    with sending_under(LEASE_END_MS):
        assert fence.check(Request(LAST_ADMITTED_MS)) is None


def test_the_handler_refuses_a_request_signed_too_late_for_its_lease() -> None:
    # GIVEN a request signed one second after the last admitted time
    fence = SignatureFence(fenced())
    # WHEN the handler checks it
    with sending_under(LEASE_END_MS), pytest.raises(PutFencedError) as excinfo:
        fence.check(Request(LAST_ADMITTED_MS + 1_000))
    # THEN it is not sent: the error says when it was signed and when its lease ends
    assert excinfo.value.signed_at_ms == LAST_ADMITTED_MS + 1_000
    assert excinfo.value.lease_expires_at_ms == LEASE_END_MS
    assert excinfo.value.retriable


@pytest.mark.parametrize(
    ("lease_end_ms", "signed", "reason"),
    [(None, CLAIMED_AT_MS, "no lease was given"), (LEASE_END_MS, None, "it is not signed")],
    ids=["no-lease", "unsigned"],
)
def test_the_handler_fails_closed(
    lease_end_ms: int | None, signed: int | None, reason: str
) -> None:
    # GIVEN a request with no lease to check it against, or no signing time
    fence = SignatureFence(fenced())
    # WHEN the handler checks it
    # THEN it is not sent
    with sending_under(lease_end_ms), pytest.raises(PutFencedError, match=reason):
        fence.check(Request(signed))


def test_the_lease_given_is_the_one_of_the_call_in_progress_only() -> None:
    # GIVEN a lease given for one call, then that call over
    fence = SignatureFence(fenced())
    with sending_under(LEASE_END_MS):
        fence.check(Request(CLAIMED_AT_MS))
    # WHEN another request is sent outside it
    # THEN it has no lease: refused
    with pytest.raises(PutFencedError, match="no lease"):
        fence.check(Request(CLAIMED_AT_MS))


def test_a_fence_needs_a_window() -> None:
    with pytest.raises(ValueError, match="signature window"):
        SignatureFence(LeasePolicy(60_000, PUT_TIMEOUT_MS, SKEW_MS))


# --- with the fence off: the lease deadline ------------------------------------------------------

UNFENCED_LEASE_MS = 60_000


def unfenced() -> LeasePolicy:
    return LeasePolicy(UNFENCED_LEASE_MS, PUT_TIMEOUT_MS, SKEW_MS)


# the last moment a put may leave: its timeouts and the skew still fit in the lease
LAST_SENDABLE_MS = CLAIMED_AT_MS + UNFENCED_LEASE_MS - PUT_TIMEOUT_MS - SKEW_MS


def deadline_at(now_ms: int) -> LeaseDeadline:
    return LeaseDeadline(unfenced(), ManualClock(now_ms))


def test_without_the_fence_a_put_leaves_while_its_lease_has_its_timeouts_and_the_skew_left() -> (
    None
):
    with sending_under(CLAIMED_AT_MS + UNFENCED_LEASE_MS):
        assert deadline_at(LAST_SENDABLE_MS).check(Request(None)) is None


def test_without_the_fence_a_put_sent_later_is_refused_with_a_code_of_its_own() -> None:
    # GIVEN a put about to leave one millisecond after the last moment its lease allows
    # (its process was slowed by a ledger call retried under throttling, say)
    deadline = deadline_at(LAST_SENDABLE_MS + 1)
    # WHEN the handler checks it
    with (
        sending_under(CLAIMED_AT_MS + UNFENCED_LEASE_MS),
        pytest.raises(PutFencedError, match="lease deadline") as excinfo,
    ):
        deadline.check(Request(None))
    # THEN it is not sent: LeaseFence, retriable (the next attempt renews the lease first)
    assert (excinfo.value.code, excinfo.value.retriable) == (LEASE_FENCE, True)
    assert excinfo.value.lease_expires_at_ms == CLAIMED_AT_MS + UNFENCED_LEASE_MS


def test_without_the_fence_a_put_with_no_lease_is_refused() -> None:
    with pytest.raises(PutFencedError, match="no lease"):
        deadline_at(CLAIMED_AT_MS).check(Request(None))


def test_the_put_client_gets_the_fence_or_the_deadline_by_the_policy() -> None:
    clock = ManualClock(CLAIMED_AT_MS)
    assert isinstance(fence_for(fenced(), clock), SignatureFence)
    assert isinstance(fence_for(unfenced(), clock), LeaseDeadline)


# --- the writer's translation -------------------------------------------------------------------


class FencedClient:
    """A put client whose request is signed at ``signed_at_ms`` and checked by ``fence`` before
    it is sent, as botocore's before-send event does; ``sent`` counts what left."""

    def __init__(self, fence: SignatureFence | LeaseDeadline, signed_at_ms: int) -> None:
        self._fence = fence
        self._signed_at_ms = signed_at_ms
        self.sent = 0

    def put_records(self, *, Records: list[Any], **_: Any) -> dict[str, Any]:  # noqa: N803
        self._fence.check(Request(self._signed_at_ms))
        self.sent += 1
        return {
            "FailedRecordCount": 0,
            "Records": [{"ShardId": "shardId-000000000000", "SequenceNumber": "1"}] * len(Records),
        }


def test_a_fenced_put_is_not_written_and_retriable_with_a_code_of_ours() -> None:
    # GIVEN a put client whose request would be signed too late for the lease
    client = FencedClient(SignatureFence(fenced()), LAST_ADMITTED_MS + 1_000)
    writer = KinesisWriter(client, "orders")
    # WHEN the writer puts two records under that lease
    results = writer.put_entries(ENTRIES, lease_expires_at_ms=LEASE_END_MS)
    # THEN nothing was sent, and each record is NOT_WRITTEN, SignatureFence, retriable
    assert client.sent == 0
    assert [(r.kind, r.error_code, r.retriable) for r in results] == [
        (PutResultKind.NOT_WRITTEN, SIGNATURE_FENCE, True)
    ] * 2
    assert "signature fence" in str(results[0].error_message)


def test_a_put_past_its_deadline_is_not_written_and_retriable_as_lease_fence() -> None:
    client = FencedClient(deadline_at(LAST_SENDABLE_MS + 1), CLAIMED_AT_MS)
    results = KinesisWriter(client, "orders").put_entries(
        ENTRIES, lease_expires_at_ms=CLAIMED_AT_MS + UNFENCED_LEASE_MS
    )
    assert client.sent == 0
    assert [(r.kind, r.error_code, r.retriable) for r in results] == [
        (PutResultKind.NOT_WRITTEN, LEASE_FENCE, True)
    ] * 2


def test_a_put_within_its_lease_goes_through_the_fence() -> None:
    client = FencedClient(SignatureFence(fenced()), CLAIMED_AT_MS)
    writer = KinesisWriter(client, "orders")
    results = writer.put_entries(ENTRIES, lease_expires_at_ms=LEASE_END_MS)
    assert client.sent == 1
    assert {r.kind for r in results} == {PutResultKind.WRITTEN}


# --- Kinesis refusing an expired signature ------------------------------------------------------

EXPIRED = (
    "Signature expired: 20231114T221320Z is now earlier than 20231114T221821Z "
    "(20231114T222321Z - 5 min.)"
)
NOT_YET_CURRENT = (
    "Signature not yet current: 20231114T223320Z is still later than 20231114T222821Z "
    "(20231114T222321Z + 5 min.)"
)


@pytest.mark.parametrize("message", [EXPIRED, NOT_YET_CURRENT], ids=["expired", "not-yet-current"])
def test_a_signature_refused_for_its_time_is_not_written_and_retriable(message: str) -> None:
    # GIVEN Kinesis refused a request for its signing time (too old, or too far ahead)
    error = botocore.exceptions.ClientError(
        {
            "Error": {"Code": "InvalidSignatureException", "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": 400},
        },
        "PutRecords",
    )

    class Refusing:
        def put_records(self, **_: Any) -> Any:
            raise error

    # WHEN the writer puts
    results = KinesisWriter(Refusing(), "orders").put_entries(ENTRIES)
    # THEN nothing was written, and the next attempt (signed anew) may go
    assert [(r.kind, r.error_code, r.retriable) for r in results] == [
        (PutResultKind.NOT_WRITTEN, "InvalidSignatureException", True)
    ] * 2


def test_any_other_invalid_signature_is_not_worth_another_attempt() -> None:
    # GIVEN a signature refused because it does not match (a wrong secret key)
    result = classify_request_error(
        400,
        "InvalidSignatureException",
        "The request signature we calculated does not match the signature you provided.",
    )
    # THEN it is not written, and sending it again would fail the same way
    assert (result.kind, result.retriable) == (PutResultKind.NOT_WRITTEN, False)
