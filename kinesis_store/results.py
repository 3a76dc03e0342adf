"""The classification of PutRecords results: each record written, definitely not written
(and then whether to resend it), or ambiguous (resolved by read-back, never resent blindly).
Pure: :class:`kinesis_store.writer.KinesisWriter` feeds it what Kinesis (or the wire) answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "INVALID_SIGNATURE",
    "LEASE_FENCE",
    "RETRIABLE_NOT_WRITTEN_CODES",
    "SIGNATURE_FENCE",
    "STALE_SHARD_MAP",
    "THROTTLED",
    "PutResultKind",
    "RecordResult",
    "TransportFailure",
    "ambiguous",
    "classify_record",
    "classify_request_error",
    "classify_response",
    "classify_transport_failure",
    "not_written",
    "signature_expired",
    "stale_signature",
]


class PutResultKind(StrEnum):
    WRITTEN = "WRITTEN"
    NOT_WRITTEN = "NOT_WRITTEN"  # safe to resend under the same claim
    AMBIGUOUS = "AMBIGUOUS"  # may be in the stream: resolve by read-back, never resend blindly


class TransportFailure(StrEnum):
    """A PutRecords request that got no HTTP answer, by what the client can know of it.

    Our own codes, not the SDK's class names: they are stable data that users see in outcomes
    and metrics. :class:`kinesis_store.writer.KinesisWriter` maps botocore's exceptions onto them.
    """

    CONNECTION_NOT_MADE = "ConnectionNotMade"  # no connection: the request never left
    CONNECT_TIMEOUT = "ConnectTimeout"  # no connection in time: the request never left
    READ_TIMEOUT = "ReadTimeout"  # sent, no answer in time: it may have been applied
    CONNECTION_LOST = "ConnectionLost"  # reset, closed, TLS or proxy failure, answer cut short

    @property
    def sent(self) -> bool:
        """Whether the request may have reached Kinesis (and been applied)."""
        return self not in _NEVER_SENT


_NEVER_SENT = frozenset({TransportFailure.CONNECTION_NOT_MADE, TransportFailure.CONNECT_TIMEOUT})

# An aggregate landed on a shard that does not cover all its user records: the KCL drops it
# whole, so each of them is resent (packed on a fresh shard map), though the stray is written.
STALE_SHARD_MAP = "StaleShardMap"
# The signature fence kept a request from leaving: its lease would not outlive its signature.
# Nothing was sent; the next attempt checks the lease again (renews it, or moves the keys).
SIGNATURE_FENCE = "SignatureFence"
# With the signature fence off, the before-send check kept a request from leaving: sent now, it
# could land after its lease (less than the put's timeouts plus the skew left). Nothing was
# sent; the next attempt renews the lease first, or moves the keys to a fresh group.
LEASE_FENCE = "LeaseFence"
# Kinesis refused a request whose signature was too old (or too new) on arrival: not written,
# and the next attempt is signed anew. Any other InvalidSignatureException (a wrong secret key)
# would fail the same way again.
INVALID_SIGNATURE = "InvalidSignatureException"
# A shard refused the record for its write quota (per record, in a PutRecords answer).
THROTTLED = "ProvisionedThroughputExceededException"
_EXPIRED_SIGNATURE_MESSAGE = "Signature expired"
_STALE_SIGNATURE_MESSAGES = (_EXPIRED_SIGNATURE_MESSAGE, "Signature not yet current")

# Not-written results worth resending under the same claim: load, a failure on Kinesis' side,
# a connection never made, a stale shard map. Any other (a 4xx such as ValidationException or
# AccessDenied, an unknown per-record code) would fail the same way again.
RETRIABLE_NOT_WRITTEN_CODES = frozenset(
    {
        STALE_SHARD_MAP,
        SIGNATURE_FENCE,
        LEASE_FENCE,
        THROTTLED,
        "InternalFailure",
        "LimitExceededException",
        "KMSThrottlingException",
        "ThrottlingException",
        *(failure.value for failure in _NEVER_SENT),
    }
)

# Error codes that prove the whole request was refused, whatever its HTTP status says.
_REFUSED_CODES = frozenset({THROTTLED, "LimitExceededException"})


@dataclass(frozen=True, slots=True)
class RecordResult:
    """What became of one record of a PutRecords request.

    ``retriable``: it was not written, and sending it again under the same claim may succeed.
    Decided once, when the result is classified; nothing downstream looks at codes again.
    """

    kind: PutResultKind
    shard_id: str | None = None
    sequence_number: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    retriable: bool = False

    def __post_init__(self) -> None:
        if self.retriable and self.kind is not PutResultKind.NOT_WRITTEN:
            # resending a written or possibly written record is the duplicate we prevent
            raise ValueError(f"a {self.kind} result cannot be retriable")

    @property
    def throttled(self) -> bool:
        """Whether the shard refused the record for its write quota."""
        return self.error_code == THROTTLED

    @property
    def failure_reason(self) -> str:
        """What an outcome says of a record given up: ``not written: <code>: <message>``."""
        return f"not written: {self.error_code}: {self.error_message or ''}".rstrip(": ")


def not_written(code: str, message: str | None = None) -> RecordResult:
    """Definitely not written; retriable when ``code`` is one the same record may pass next time."""
    return RecordResult(
        PutResultKind.NOT_WRITTEN,
        error_code=code,
        error_message=message,
        retriable=code in RETRIABLE_NOT_WRITTEN_CODES,
    )


def ambiguous(code: str, message: str | None = None) -> RecordResult:
    """Maybe written: never resent blindly, resolved by read-back."""
    return RecordResult(PutResultKind.AMBIGUOUS, error_code=code, error_message=message)


def classify_record(entry: dict[str, Any]) -> RecordResult:
    """One entry of a PutRecords response's ``Records``, aligned with the request by position."""
    shard_id = entry.get("ShardId")
    sequence_number = entry.get("SequenceNumber")
    if shard_id and sequence_number:
        return RecordResult(PutResultKind.WRITTEN, shard_id, str(sequence_number))
    code = entry.get("ErrorCode")
    if code:
        # Every per-record ErrorCode means this record was not written (API reference).
        return not_written(str(code), entry.get("ErrorMessage"))
    # A record with neither a position nor an error: the response cannot be trusted.
    return ambiguous("MalformedResult")


def classify_response(response: dict[str, Any], sent: int) -> list[RecordResult]:
    """Classify a whole PutRecords response; a response that does not align is ambiguous."""
    entries = response.get("Records")
    if not isinstance(entries, list) or len(entries) != sent:
        return [ambiguous("MalformedResponse")] * sent
    return [classify_record(entry) for entry in entries]


def stale_signature(error_code: str | None, message: str | None) -> bool:
    """Whether Kinesis refused a request's signature as expired or not yet current on arrival
    (the request was not applied: one signed anew may be)."""
    return error_code == INVALID_SIGNATURE and (message or "").startswith(_STALE_SIGNATURE_MESSAGES)


def signature_expired(error_code: str | None, message: str | None) -> bool:
    """Whether Kinesis refused a request's signature as expired on arrival: its process stalled
    between signing and sending, and one signed anew passes. (Not yet current: the signer's
    clock runs ahead of Kinesis', and one signed anew by it is refused the same way.)"""
    return error_code == INVALID_SIGNATURE and (message or "").startswith(
        _EXPIRED_SIGNATURE_MESSAGE
    )


def classify_request_error(
    status_code: int | None, error_code: str | None, message: str | None = None
) -> RecordResult:
    """A PutRecords request Kinesis answered with an error, for each of its records: a 4xx
    (or a throttle, whatever the status) refused it whole; a 5xx may have applied it. A
    signature refused as expired or not yet current is worth another attempt (signed anew)."""
    code = error_code or str(status_code)
    if stale_signature(code, message):
        # refused on arrival, so not written; the next attempt carries a fresh signature
        return RecordResult(
            PutResultKind.NOT_WRITTEN, error_code=code, error_message=message, retriable=True
        )
    if (status_code is not None and 400 <= status_code < 500) or error_code in _REFUSED_CODES:
        return not_written(code, message)
    return ambiguous(code, message)


def classify_transport_failure(failure: TransportFailure, message: str | None) -> RecordResult:
    """A PutRecords request without an HTTP answer, for each of its records."""
    if failure.sent:
        return ambiguous(failure.value, message)
    return not_written(failure.value, message)
