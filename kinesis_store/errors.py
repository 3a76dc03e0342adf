"""The errors of the Kinesis adapter: the stream's branch of the one error tree.

They grow from ``KeoError`` (:mod:`dedupe_store.errors`, the lowest layer), so an entry point
maps them with the rest of the tree in one ``except KeoError``; ``retriable`` is class data.
:mod:`producer.errors` re-exports them, the public API they have always been part of. The
tree::

    KeoError                          anything keo cannot do for its caller (dedupe_store.errors)
    ├── StreamError                   Kinesis failed in a way the caller cannot continue from
    │   ├── StreamNotFoundError       the stream does not exist (run 'keo init')
    │   ├── ShardPositionLostError    a read resumes after a record the shard no longer holds
    │   │                             (past the trim horizon): records may be lost
    │   └── StreamUnavailableError    Kinesis could not be reached or kept failing (retriable)
    │       └── StreamThrottledError  Kinesis throttled a read (retried in place, with backoff)
    ├── PutFencedError                a before-send check kept a put from leaving: not sent
    │                                 (raised by producer.fence on the put client;
    │                                 KinesisWriter turns it into a NOT_WRITTEN result)
    └── AggregationFormatError        a KPL aggregated record that cannot be read
                                      (kinesis_store.kpl; a ValueError too)

Whatever else a put meets (a record not written, a timeout, a 5xx) is a classified result
(:mod:`kinesis_store.results`), never an exception.
"""

from __future__ import annotations

from datetime import UTC, datetime

from dedupe_store.errors import KeoError

__all__ = [
    "AggregationFormatError",
    "PutFencedError",
    "ShardPositionLostError",
    "StaleSignatureError",
    "StreamError",
    "StreamNotFoundError",
    "StreamThrottledError",
    "StreamUnavailableError",
]


class StreamError(KeoError):
    def __init__(self, message: str, *, stream: str, shard_id: str | None = None) -> None:
        super().__init__(message)
        self.stream = stream
        self.shard_id = shard_id


class StreamNotFoundError(StreamError):
    pass


class ShardPositionLostError(StreamError):
    """A read was to go on right after a record (``sequence_number``, arrived at ``since_ms``
    when known) that the shard no longer holds: it is past the trim horizon, or the stream was
    deleted and created again. Records written after it and before the first one the shard
    still holds (``first_sequence_number``, arrived at ``first_arrival_ms``; None when the
    shard holds nothing after it, or is gone) may be lost; Kinesis cannot say how many, only
    since when. ``sequence_number`` is None when the whole shard is gone before it was read to
    its end."""

    def __init__(
        self,
        *,
        stream: str,
        shard_id: str,
        sequence_number: str | None,
        since_ms: int | None,
        first_sequence_number: str | None,
        first_arrival_ms: int | None,
    ) -> None:
        where = (
            f"right after sequence number {sequence_number}"
            if sequence_number is not None
            else "where it stopped"
        )
        since = f" (a record that arrived at {_utc(since_ms)})" if since_ms is not None else ""
        if first_sequence_number is not None:
            until = (
                f"up to the oldest record it still holds (sequence number "
                f"{first_sequence_number}, arrived at {_utc(first_arrival_ms)})"
            )
        elif sequence_number is None:
            until = "to the shard's end: the shard itself is past the stream's retention"
        else:
            until = "up to the trim horizon (the shard holds nothing after it now)"
        super().__init__(
            f"shard {shard_id} of stream {stream!r}: the read was to go on {where}{since}, "
            f"which is past the trim horizon: records written after it, {until}, may be lost",
            stream=stream,
            shard_id=shard_id,
        )
        self.sequence_number = sequence_number
        self.since_ms = since_ms
        self.first_sequence_number = first_sequence_number
        self.first_arrival_ms = first_arrival_ms


def _utc(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return "an unknown time"
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


class StreamUnavailableError(StreamError):
    retriable = True


class StreamThrottledError(StreamUnavailableError):
    """Kinesis throttled a read: the reader waits and tries again before raising it."""


class StaleSignatureError(StreamUnavailableError):
    """Kinesis refused a read's signature as expired on arrival: the process stalled between
    signing and sending longer than the signature window. The reader tries again, signed anew,
    before raising it (one not yet current, a clock ahead, fails at once)."""


class PutFencedError(KeoError):
    """Raised by a before-send check on the put client, before the request is sent: it was
    signed (or, with the signature fence off, checked) at ``signed_at_ms`` and might land after
    its lease (``lease_expires_at_ms``), or it has no lease or no signature time to check
    (None). ``code`` is the result code the writer reports (``SignatureFence``, ``LeaseFence``).
    Retriable: the next attempt checks the lease again, renews it or moves its keys to a fresh
    group."""

    retriable = True

    def __init__(
        self,
        reason: str,
        *,
        code: str,
        signed_at_ms: int | None,
        lease_expires_at_ms: int | None,
    ) -> None:
        super().__init__(reason)
        self.code = code
        self.signed_at_ms = signed_at_ms
        self.lease_expires_at_ms = lease_expires_at_ms


class AggregationFormatError(KeoError, ValueError):
    """A record carries the KPL magic and a valid digest but its user records cannot be read
    (a keo error, and a ValueError for callers that catch those)."""

    def __init__(self, shard_id: str, sequence_number: str, reason: str) -> None:
        super().__init__(
            f"aggregated record {shard_id}/{sequence_number} cannot be deaggregated: {reason}"
        )
        self.shard_id = shard_id
        self.sequence_number = sequence_number
