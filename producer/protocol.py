"""The protocol's pure decisions: validation, routing, digests, PutRecords entries, lease
arithmetic and the signature fence's check, batching, and the classification of PutRecords
results (written, not written, ambiguous; and for those not written, whether to resend). No
I/O; every function here is unit-tested without sockets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from dedupe_store.records import MAX_KEY_CHARS

_T = TypeVar("_T")

MAX_RECORDS_PER_PUT = 500
MAX_PUT_REQUEST_BYTES = 5 * 1024 * 1024
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024
MAX_HASH_KEY = 2**128 - 1
# A claim group: the keys sent together (one PutRecords-sized chunk). Its item lists them, so
# their bytes are capped well under DynamoDB's 400 KB item limit, with room for positions.
MAX_GROUP_KEYS = MAX_RECORDS_PER_PUT
MAX_GROUP_MEMBER_BYTES = 192 * 1024


@dataclass(frozen=True, slots=True)
class Message:
    """One message to deliver: ``key`` is its identity and its Kinesis partition key."""

    key: str
    data: bytes
    routing_key: str | None = None


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    """A validated message with its routing and digest computed once."""

    index: int
    message: Message
    explicit_hash_key: str
    payload_digest: str

    @property
    def key(self) -> str:
        return self.message.key

    @property
    def record_bytes(self) -> int:
        return record_size(self.message.key, self.message.data)

    def entry(self) -> dict[str, Any]:
        """Its PutRecords entry, routed by its explicit hash key."""
        return put_entry(self.message.key, self.message.data, self.explicit_hash_key)


@dataclass(frozen=True, slots=True)
class Rejection:
    index: int
    key: str | None
    reason: str


# --- routing and identity -------------------------------------------------------------------


def hash_key_of(routing_key: str) -> int:
    """Kinesis routing: the MD5 of the key as a 128-bit unsigned integer."""
    return int.from_bytes(hashlib.md5(routing_key.encode("utf-8"), usedforsecurity=False).digest())


def explicit_hash_key(message: Message) -> str:
    """The hash key the record is routed by: the routing key's, else the message key's."""
    return str(hash_key_of(message.routing_key if message.routing_key is not None else message.key))


def payload_digest(data: bytes, routing_hash_key: str) -> str:
    """SHA-256 over routing and data: the same key sent with other data or routing conflicts."""
    digest = hashlib.sha256()
    digest.update(routing_hash_key.encode("ascii"))
    digest.update(b"\x00")
    digest.update(data)
    return digest.hexdigest()


def group_member_bytes(key: str) -> int:
    """What a key adds to its group item at most: its UTF-8 bytes and a length prefix."""
    return len(key.encode("utf-8")) + 2


def record_size(key: str, data: bytes) -> int:
    """What Kinesis counts against the record limit: data plus the UTF-8 partition key."""
    return len(data) + len(key.encode("utf-8"))


def put_entry(key: str, data: bytes, explicit_hash_key: str | None = None) -> dict[str, Any]:
    """One PutRecords entry. The message key is the partition key, so every record names its
    key; ``explicit_hash_key``, when given, routes it instead of the key's MD5."""
    entry: dict[str, Any] = {"Data": data, "PartitionKey": key}
    if explicit_hash_key is not None:
        entry["ExplicitHashKey"] = explicit_hash_key
    return entry


# --- validation -----------------------------------------------------------------------------


def validate(message: Message, max_record_bytes: int) -> str | None:
    """The reason ``message`` can never be delivered, or None when it is valid."""
    key = message.key
    if not isinstance(key, str):
        return f"key must be a string, got {type(key).__name__}"
    if len(key) == 0:
        return "key is empty: a key must have 1 to 256 Unicode characters"
    if len(key) > MAX_KEY_CHARS:
        return f"key has {len(key)} characters: a key must have 1 to {MAX_KEY_CHARS}"
    if _has_lone_surrogate(key):
        return "key contains an unpaired surrogate and cannot be encoded as UTF-8"
    if not isinstance(message.data, bytes | bytearray | memoryview):
        return f"data must be bytes, got {type(message.data).__name__}"
    if message.routing_key is not None:
        if not isinstance(message.routing_key, str) or not message.routing_key:
            return "routing_key, when given, must be a non-empty string"
        if _has_lone_surrogate(message.routing_key):
            return "routing_key contains an unpaired surrogate and cannot be encoded as UTF-8"
    size = record_size(key, bytes(message.data))
    if size > max_record_bytes:
        return (
            f"record is {size} bytes (data + partition key): the stream accepts at most "
            f"{max_record_bytes}; split the payload or store it elsewhere and send a reference"
        )
    return None


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def prepare(
    messages: Sequence[Message], max_record_bytes: int
) -> tuple[list[PreparedMessage], list[Rejection]]:
    """Validate every message and compute its routing and digest; bad ones are rejected."""
    prepared: list[PreparedMessage] = []
    rejected: list[Rejection] = []
    for index, message in enumerate(messages):
        reason = validate(message, max_record_bytes)
        if reason is not None:
            key = message.key if isinstance(message.key, str) else None
            rejected.append(Rejection(index, key, reason))
            continue
        data = bytes(message.data)
        normalized = (
            message
            if isinstance(message.data, bytes)
            else Message(message.key, data, message.routing_key)
        )
        hash_key = explicit_hash_key(normalized)
        prepared.append(
            PreparedMessage(index, normalized, hash_key, payload_digest(data, hash_key))
        )
    return prepared, rejected


# --- lease arithmetic -----------------------------------------------------------------------


def signature_fence_admits(
    *, signed_at_ms: int, signature_window_ms: int, skew_ms: int, lease_expires_at_ms: int
) -> bool:
    """The signature fence: may a request signed at ``signed_at_ms`` leave under a lease that
    ends at ``lease_expires_at_ms``?

    Kinesis refuses a request that reaches it more than ``signature_window_ms`` after the time
    it was signed with, so an admitted request lands before ``signed_at + window`` by Kinesis'
    clock, however long its process stalls after this check; the skew margin covers the
    difference between that clock and the clocks that judge the lease. It then lands before the
    lease ends, when no one can have taken its keys over.
    """
    return signed_at_ms + signature_window_ms + skew_ms <= lease_expires_at_ms


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """How long a claim protects its key, and the margins the protocol keeps around it.

    A put can still land up to ``put_timeout_ms`` after it was sent; clocks disagree by up to
    ``skew_ms``. So a lease must be at least ``put_timeout_ms + 2 * skew_ms``: when it has
    expired (by anyone's clock), no put made under it can still appear in the stream, unless
    its process stalled between the lease check and the put.

    ``signature_window_ms`` turns the signature fence on (None: off). A put then leaves only
    while the lease outlasts the window Kinesis accepts its signature in, plus the skew, and
    the lease must be at least window + put timeout + 2 x skew. That bound holds for a stalled
    process too: Kinesis refuses the request once the window has passed.
    """

    lease_ms: int
    put_timeout_ms: int
    skew_ms: int
    signature_window_ms: int | None = None

    def __post_init__(self) -> None:
        if self.signature_window_ms is not None and self.signature_window_ms <= 0:
            raise ValueError(f"signature window {self.signature_window_ms} ms is not positive")
        if self.lease_ms < self.minimum_lease_ms:
            window = " + signature window" if self.fenced else ""
            raise ValueError(
                f"lease {self.lease_ms} ms is shorter than put timeout + 2 x skew{window} "
                f"= {self.minimum_lease_ms} ms"
            )

    @property
    def fenced(self) -> bool:
        """Whether puts are fenced by their signature's window."""
        return self.signature_window_ms is not None

    @property
    def minimum_lease_ms(self) -> int:
        return self.put_timeout_ms + 2 * self.skew_ms + (self.signature_window_ms or 0)

    def lease_expires_at_ms(self, claimed_at_ms: int) -> int:
        return claimed_at_ms + self.lease_ms

    def safe_to_send(self, lease_expires_at_ms: int, now_ms: int) -> bool:
        """True while the lease outlasts a put sent now, with the skew margin to spare: with
        the fence, the fence's own check at ``now_ms`` (a put checked here then passes it
        unless its process stalls before signing); without, a put's timeout plus the skew."""
        if self.signature_window_ms is not None:
            return self.fence_admits(now_ms, lease_expires_at_ms)
        return self.outlasts_put(lease_expires_at_ms, now_ms)

    def outlasts_put(self, lease_expires_at_ms: int, now_ms: int) -> bool:
        """True while a put sent at ``now_ms`` lands (or times out) before the lease ends,
        by any clock within the skew: the lease has the put's timeouts and the skew left.
        The check the fence-off mode makes right before a request leaves."""
        return lease_expires_at_ms - now_ms >= self.put_timeout_ms + self.skew_ms

    def fence_admits(self, signed_at_ms: int, lease_expires_at_ms: int) -> bool:
        """The signature fence with this policy's window and skew (admits all when it is off)."""
        if self.signature_window_ms is None:
            return True
        return signature_fence_admits(
            signed_at_ms=signed_at_ms,
            signature_window_ms=self.signature_window_ms,
            skew_ms=self.skew_ms,
            lease_expires_at_ms=lease_expires_at_ms,
        )

    def expired_for_everyone(self, lease_expires_at_ms: int, now_ms: int) -> bool:
        """True once no clock within the skew margin can still think the lease is running."""
        return now_ms >= lease_expires_at_ms + self.skew_ms

    def read_back_window(self, claimed_at_ms: int, lease_expires_at_ms: int) -> tuple[int, int]:
        """``[claimed_at - skew, lease_expires_at + skew]``: where the claim's put can be."""
        return claimed_at_ms - self.skew_ms, lease_expires_at_ms + self.skew_ms


# --- batching -------------------------------------------------------------------------------


def batches(
    items: Iterable[PreparedMessage],
    max_records: int = MAX_RECORDS_PER_PUT,
    max_request_bytes: int = MAX_PUT_REQUEST_BYTES,
) -> Iterator[list[PreparedMessage]]:
    """Group records into PutRecords requests within the record count and request size limits."""
    return batch_by_size(items, lambda item: item.record_bytes, max_records, max_request_bytes)


def chunked(items: Iterable[_T], size: int) -> Iterator[list[_T]]:
    """``items`` in lists of ``size`` (the last one shorter), consumed lazily."""
    chunk: list[_T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def batch_by_size(
    items: Iterable[_T],
    size_of: Callable[[_T], int],
    max_records: int = MAX_RECORDS_PER_PUT,
    max_request_bytes: int = MAX_PUT_REQUEST_BYTES,
) -> Iterator[list[_T]]:
    """Group PutRecords entries, in order, within the count and request size limits."""
    batch: list[_T] = []
    batch_bytes = 0
    for item in items:
        size = size_of(item)
        if batch and (len(batch) >= max_records or batch_bytes + size > max_request_bytes):
            yield batch
            batch, batch_bytes = [], 0
        batch.append(item)
        batch_bytes += size
    if batch:
        yield batch


# --- classification of PutRecords results ---------------------------------------------------


class PutResultKind(StrEnum):
    WRITTEN = "WRITTEN"
    NOT_WRITTEN = "NOT_WRITTEN"  # safe to resend under the same claim
    AMBIGUOUS = "AMBIGUOUS"  # may be in the stream: resolve by read-back, never resend blindly


class TransportFailure(StrEnum):
    """A PutRecords request that got no HTTP answer, by what the client can know of it.

    Our own codes, not the SDK's class names: they are stable data that users see in outcomes
    and metrics. :class:`producer.kinesis.KinesisWriter` maps botocore's exceptions onto them.
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

# An aggregate landed on a shard that no longer covers some of its user records.
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
_STALE_SIGNATURE_MESSAGES = ("Signature expired", "Signature not yet current")

# Not-written results worth resending under the same claim: load, a failure on Kinesis' side,
# a connection never made, a stale shard map. Any other (a 4xx such as ValidationException or
# AccessDenied, an unknown per-record code) would fail the same way again.
RETRIABLE_NOT_WRITTEN_CODES = frozenset(
    {
        STALE_SHARD_MAP,
        SIGNATURE_FENCE,
        LEASE_FENCE,
        "ProvisionedThroughputExceededException",
        "InternalFailure",
        "LimitExceededException",
        "KMSThrottlingException",
        "ThrottlingException",
        *(failure.value for failure in _NEVER_SENT),
    }
)

# Error codes that prove the whole request was refused, whatever its HTTP status says.
_REFUSED_CODES = frozenset({"ProvisionedThroughputExceededException", "LimitExceededException"})


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


def classify_request_error(
    status_code: int | None, error_code: str | None, message: str | None = None
) -> RecordResult:
    """A PutRecords request Kinesis answered with an error, for each of its records: a 4xx
    (or a throttle, whatever the status) refused it whole; a 5xx may have applied it. A
    signature refused as expired or not yet current is worth another attempt (signed anew)."""
    code = error_code or str(status_code)
    if code == INVALID_SIGNATURE and (message or "").startswith(_STALE_SIGNATURE_MESSAGES):
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
