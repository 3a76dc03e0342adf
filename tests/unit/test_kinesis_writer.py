"""``KinesisWriter`` translates every botocore failure of a put once, into results that carry
their kind (written, not written, ambiguous), a stable code and whether to resend.

A stub client raises what botocore raises; nothing here opens a socket.
"""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest

from kinesis_store.entries import put_entry
from kinesis_store.results import PutResultKind
from kinesis_store.writer import KinesisWriter
from producer.errors import StreamNotFoundError

WRITTEN = PutResultKind.WRITTEN
NOT_WRITTEN = PutResultKind.NOT_WRITTEN
AMBIGUOUS = PutResultKind.AMBIGUOUS
URL = "https://kinesis.us-east-1.amazonaws.com"
ENTRIES = [put_entry("k1", b"one"), put_entry("k2", b"two")]


class RaisingClient:
    """A Kinesis client whose every PutRecords raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def put_records(self, **_: Any) -> Any:
        raise self.error


class AnsweringClient:
    """A Kinesis client whose every PutRecords returns ``response``."""

    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response

    def put_records(self, **_: Any) -> Any:
        return self.response


def client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} (test)"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "PutRecords",
    )


TRANSPORT = [
    # (what botocore raises, our code, kind, retriable)
    (
        botocore.exceptions.ConnectTimeoutError(endpoint_url=URL),
        "ConnectTimeout",
        NOT_WRITTEN,
        True,
    ),
    (
        botocore.exceptions.EndpointConnectionError(endpoint_url=URL),
        "ConnectionNotMade",
        NOT_WRITTEN,
        True,
    ),
    (botocore.exceptions.ReadTimeoutError(endpoint_url=URL), "ReadTimeout", AMBIGUOUS, False),
    (
        botocore.exceptions.ConnectionClosedError(endpoint_url=URL),
        "ConnectionLost",
        AMBIGUOUS,
        False,
    ),
    (
        botocore.exceptions.ProxyConnectionError(proxy_url="http://proxy:3128"),
        "ConnectionLost",
        AMBIGUOUS,
        False,
    ),
    (
        botocore.exceptions.SSLError(endpoint_url=URL, error="bad record mac"),
        "ConnectionLost",
        AMBIGUOUS,
        False,
    ),
    (
        botocore.exceptions.ResponseStreamingError(error="connection broken"),
        "ConnectionLost",
        AMBIGUOUS,
        False,
    ),
    (botocore.exceptions.HTTPClientError(error="reset"), "ConnectionLost", AMBIGUOUS, False),
]


@pytest.mark.parametrize(
    ("error", "code", "kind", "retriable"),
    TRANSPORT,
    ids=[type(row[0]).__name__ for row in TRANSPORT],
)
def test_each_transport_failure_is_one_kind_with_a_code_of_ours(
    error: Exception, code: str, kind: PutResultKind, retriable: bool
) -> None:
    # GIVEN a put whose request fails in transport the way botocore reports it
    writer = KinesisWriter(RaisingClient(error), "orders")
    # WHEN the writer puts two records
    results = writer.put_entries(ENTRIES)
    # THEN each record gets the same result: the kind the failure proves, our stable code (not
    # the SDK's class name), its message, and whether it may be resent under the same claim
    assert len(results) == 2
    for result in results:
        assert (result.kind, result.error_code, result.retriable) == (kind, code, retriable)
        assert result.error_message == str(error)


@pytest.mark.parametrize(
    ("status", "code", "kind", "retriable"),
    [
        (400, "ProvisionedThroughputExceededException", NOT_WRITTEN, True),
        (400, "ThrottlingException", NOT_WRITTEN, True),
        (400, "KMSThrottlingException", NOT_WRITTEN, True),
        (400, "ValidationException", NOT_WRITTEN, False),
        (400, "InvalidSignatureException", NOT_WRITTEN, False),
        (403, "AccessDeniedException", NOT_WRITTEN, False),
        (500, "InternalFailure", AMBIGUOUS, False),
        (503, "ServiceUnavailable", AMBIGUOUS, False),
    ],
)
def test_each_error_answer_keeps_the_aws_code_and_decides_kind_and_retriability(
    status: int, code: str, kind: PutResultKind, retriable: bool
) -> None:
    # GIVEN a put Kinesis answers with an error
    writer = KinesisWriter(RaisingClient(client_error(status, code)), "orders")
    # WHEN the writer puts two records
    results = writer.put_entries(ENTRIES)
    # THEN each record carries AWS's code as AWS spells it, its kind and retriability
    assert [(r.kind, r.error_code, r.retriable) for r in results] == [(kind, code, retriable)] * 2
    assert results[0].error_message == f"{code} (test)"


def test_a_missing_stream_is_an_error_not_a_result() -> None:
    # GIVEN a put to a stream that does not exist
    writer = KinesisWriter(RaisingClient(client_error(400, "ResourceNotFoundException")), "gone")
    # WHEN the writer puts
    # THEN the caller cannot continue: it is told to run 'keo init'
    with pytest.raises(StreamNotFoundError, match="keo init"):
        writer.put_entries(ENTRIES)


def test_per_record_errors_keep_their_aws_codes_and_positions() -> None:
    # GIVEN a partially failed response
    response = {
        "FailedRecordCount": 1,
        "Records": [
            {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "slow down"},
            {"ShardId": "shardId-000000000000", "SequenceNumber": "42"},
        ],
    }
    writer = KinesisWriter(AnsweringClient(response), "orders")
    # WHEN the writer puts two records
    first, second = writer.put_entries(ENTRIES)
    # THEN the first is not written (resend it), the second is written at its position
    assert (first.kind, first.error_code, first.retriable) == (
        NOT_WRITTEN,
        "ProvisionedThroughputExceededException",
        True,
    )
    assert (second.kind, second.shard_id, second.sequence_number) == (
        WRITTEN,
        "shardId-000000000000",
        "42",
    )
