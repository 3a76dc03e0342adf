"""Classification of PutRecords results: written, definitely not written, or ambiguous.

A wrong call here is a duplicate (resending something written) or a loss (treating as written
something that was not), so every shape of result is pinned down.
"""

from __future__ import annotations

from typing import Any

import pytest

from kinesis_store.results import (
    STALE_SHARD_MAP,
    PutResultKind,
    RecordResult,
    TransportFailure,
    ambiguous,
    classify_record,
    classify_request_error,
    classify_response,
    classify_transport_failure,
    not_written,
)

WRITTEN = PutResultKind.WRITTEN
NOT_WRITTEN = PutResultKind.NOT_WRITTEN
AMBIGUOUS = PutResultKind.AMBIGUOUS

OK_ENTRY = {
    "ShardId": "shardId-000000000001",
    "SequenceNumber": "49590338271490256608559692538361571095921575989136588898",
}
THROTTLED_ENTRY = {
    "ErrorCode": "ProvisionedThroughputExceededException",
    "ErrorMessage": "Rate exceeded for shard shardId-000000000001 in stream orders",
}
INTERNAL_ENTRY = {"ErrorCode": "InternalFailure", "ErrorMessage": "Internal service failure."}


# --- one record ---------------------------------------------------------------------------------


def test_entry_with_shard_and_sequence_number_is_written_at_that_position() -> None:
    # GIVEN a result entry with a ShardId and a SequenceNumber
    # WHEN classified
    result = classify_record(OK_ENTRY)
    # THEN it is written, at that position
    assert result == RecordResult(WRITTEN, OK_ENTRY["ShardId"], OK_ENTRY["SequenceNumber"])


def test_integer_sequence_number_is_kept_as_a_string() -> None:
    # GIVEN an entry whose sequence number came back as a number
    # WHEN classified
    result = classify_record({"ShardId": "shardId-0", "SequenceNumber": 12345678901234567890123})
    # THEN the position keeps every digit, as a string
    assert result.sequence_number == "12345678901234567890123"


@pytest.mark.parametrize(
    "entry", [THROTTLED_ENTRY, INTERNAL_ENTRY], ids=["throughput-exceeded", "internal-failure"]
)
def test_entry_with_documented_error_code_is_not_written_and_retriable(
    entry: dict[str, str],
) -> None:
    # GIVEN a per-record error of the kind the API reference documents
    # WHEN classified
    result = classify_record(entry)
    # THEN it was definitely not written, keeps the code and message, and may be resent
    assert result.kind is NOT_WRITTEN
    assert result.error_code == entry["ErrorCode"]
    assert result.error_message == entry["ErrorMessage"]
    assert result.shard_id is None
    assert result.sequence_number is None
    assert result.retriable


def test_entry_with_unknown_error_code_is_not_written_but_not_retriable() -> None:
    # GIVEN a per-record error code the protocol does not know
    # WHEN classified
    result = classify_record({"ErrorCode": "SomethingNewException"})
    # THEN it is not written (any per-record ErrorCode means so) but is not resent blindly
    assert result.kind is NOT_WRITTEN
    assert not result.retriable


@pytest.mark.parametrize(
    "entry",
    [
        {},
        {"ShardId": "shardId-0"},
        {"SequenceNumber": "1"},
        {"ShardId": "", "SequenceNumber": ""},
        {"ErrorCode": "", "ErrorMessage": "no code"},
    ],
    ids=["empty", "shard-only", "sequence-only", "empty-strings", "empty-error-code"],
)
def test_entry_with_neither_position_nor_error_is_ambiguous(entry: dict[str, Any]) -> None:
    # GIVEN an entry that proves neither a write nor a rejection
    # WHEN classified
    result = classify_record(entry)
    # THEN it is ambiguous: resolved by read-back, never resent and never taken as written
    assert result.kind is AMBIGUOUS
    assert not result.retriable


# --- a whole response ---------------------------------------------------------------------------


def test_response_results_align_with_the_request_by_position() -> None:
    # GIVEN a partially failed response for three records
    response = {"FailedRecordCount": 2, "Records": [THROTTLED_ENTRY, OK_ENTRY, INTERNAL_ENTRY]}
    # WHEN classified
    results = classify_response(response, sent=3)
    # THEN the i-th result belongs to the i-th record sent
    assert [r.kind for r in results] == [NOT_WRITTEN, WRITTEN, NOT_WRITTEN]
    assert results[1].shard_id == OK_ENTRY["ShardId"]
    assert results[0].error_code == "ProvisionedThroughputExceededException"
    assert results[2].error_code == "InternalFailure"


@pytest.mark.parametrize(
    "response",
    [
        {"Records": [OK_ENTRY, OK_ENTRY]},
        {"Records": [OK_ENTRY, OK_ENTRY, OK_ENTRY, OK_ENTRY]},
        {"Records": []},
        {"FailedRecordCount": 0},
        {"Records": None},
        {"Records": {"0": OK_ENTRY}},
        {},
    ],
    ids=[
        "too-few",
        "too-many",
        "empty-list",
        "no-records",
        "records-none",
        "records-not-a-list",
        "empty",
    ],
)
def test_response_that_does_not_align_makes_every_record_ambiguous(
    response: dict[str, Any],
) -> None:
    # GIVEN a response whose Records cannot be matched to the 3 records sent
    # WHEN classified
    results = classify_response(response, sent=3)
    # THEN none is taken as written or resent: all 3 are ambiguous
    assert len(results) == 3
    assert all(r.kind is AMBIGUOUS for r in results)


def test_response_of_all_written_records_is_all_written() -> None:
    # GIVEN a fully successful response
    # WHEN classified
    results = classify_response({"FailedRecordCount": 0, "Records": [OK_ENTRY] * 2}, sent=2)
    # THEN every record is written
    assert [r.kind for r in results] == [WRITTEN, WRITTEN]


# --- a request that raised ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status_code", "error_code", "retriable"),
    [
        (400, "ValidationException", False),
        (400, "ProvisionedThroughputExceededException", True),
        (400, "LimitExceededException", True),
        (400, "ThrottlingException", True),
        (400, "KMSThrottlingException", True),
        (400, "InvalidSignatureException", False),
        (403, "AccessDeniedException", False),
        (404, None, False),
        (499, None, False),
    ],
)
def test_4xx_rejected_the_whole_request(
    status_code: int, error_code: str | None, retriable: bool
) -> None:
    # GIVEN a request Kinesis answered with a 4xx
    # WHEN classified
    result = classify_request_error(status_code, error_code, "refused")
    # THEN nothing in it was written; it is resent only when the refusal was load
    assert result.kind is NOT_WRITTEN
    assert result.retriable is retriable
    assert result.error_code == (error_code or str(status_code))
    assert result.error_message == "refused"


@pytest.mark.parametrize(
    ("status_code", "error_code"),
    [(500, "InternalFailure"), (502, None), (503, "ServiceUnavailable"), (None, None)],
)
def test_5xx_are_ambiguous(status_code: int | None, error_code: str | None) -> None:
    # GIVEN a request answered with a 5xx (or with neither a status nor a code)
    # WHEN classified
    result = classify_request_error(status_code, error_code)
    # THEN it may or may not be in the stream: never resent, resolved by read-back
    assert result.kind is AMBIGUOUS
    assert not result.retriable


@pytest.mark.parametrize(
    "error_code", ["ProvisionedThroughputExceededException", "LimitExceededException"]
)
def test_throttling_code_without_status_is_not_written(error_code: str) -> None:
    # GIVEN a throttling error whose HTTP status is not known
    # WHEN classified
    result = classify_request_error(None, error_code)
    # THEN the throttle itself proves the request was refused, and it may be resent
    assert result.kind is NOT_WRITTEN
    assert result.retriable


@pytest.mark.parametrize(
    ("failure", "kind", "retriable"),
    [
        (TransportFailure.CONNECTION_NOT_MADE, NOT_WRITTEN, True),
        (TransportFailure.CONNECT_TIMEOUT, NOT_WRITTEN, True),
        (TransportFailure.READ_TIMEOUT, AMBIGUOUS, False),
        (TransportFailure.CONNECTION_LOST, AMBIGUOUS, False),
    ],
)
def test_a_request_without_an_answer_is_not_written_only_if_it_never_left(
    failure: TransportFailure, kind: PutResultKind, retriable: bool
) -> None:
    # GIVEN a request that got no HTTP answer
    # WHEN classified
    result = classify_transport_failure(failure, "no answer")
    # THEN a connection never made proves nothing was sent (resend); any other may have landed
    assert (result.kind, result.retriable) == (kind, retriable)
    assert result.error_code == failure.value
    assert failure.sent is (kind is AMBIGUOUS)


# --- retriability -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error_code",
    [
        "ProvisionedThroughputExceededException",
        "InternalFailure",
        "LimitExceededException",
        "KMSThrottlingException",
        "ThrottlingException",
        "ConnectTimeout",
        "ConnectionNotMade",
        STALE_SHARD_MAP,
    ],
)
def test_not_written_throttles_and_unsent_connections_are_retriable(error_code: str) -> None:
    # GIVEN a definitely-not-written result caused by load, a connection never made, or a
    # shard map gone stale under an aggregate
    # WHEN asked whether to resend
    # THEN yes: the same record may succeed later
    assert not_written(error_code).retriable


@pytest.mark.parametrize(
    "error_code", ["ValidationException", "AccessDeniedException", "KMSDisabledException"]
)
def test_not_written_rejections_that_would_repeat_are_not_retriable(error_code: str) -> None:
    # GIVEN a not-written result that the same request would get again
    # WHEN asked whether to resend
    # THEN no
    assert not not_written(error_code).retriable


def test_ambiguous_results_are_never_retriable_whatever_their_code() -> None:
    # GIVEN an ambiguous result, even with a throttling code on it
    result = ambiguous("ProvisionedThroughputExceededException")
    # WHEN asked whether to resend
    # THEN never: it may already be in the stream
    assert not result.retriable


@pytest.mark.parametrize("kind", [WRITTEN, AMBIGUOUS])
def test_a_written_or_ambiguous_result_cannot_be_made_retriable(kind: PutResultKind) -> None:
    # GIVEN a written or an ambiguous result
    # WHEN one is built as retriable
    # THEN it is refused: resending either could write the record twice
    with pytest.raises(ValueError, match="cannot be retriable"):
        RecordResult(kind, retriable=True)
