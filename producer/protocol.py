"""The protocol's pure decisions: validation, routing, digests, lease arithmetic and the
signature fence's check, batching. No I/O; every function here is unit-tested without sockets.

What Kinesis itself counts (its limits, the MD5 hash key, a record's size, an entry's shape)
is :mod:`kinesis_store.entries`; the classification of PutRecords results is
:mod:`kinesis_store.results`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dedupe_store.records import MAX_KEY_CHARS
from kinesis_store.entries import (
    MAX_PUT_REQUEST_BYTES,
    MAX_RECORDS_PER_PUT,
    hash_key_of,
    put_entry,
    record_size,
)

_T = TypeVar("_T")

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

    @property
    def send_margin_ms(self) -> int:
        """The lease a put needs left to be sent now (:meth:`safe_to_send`): the signature
        window and the skew with the fence, else the put's timeouts and the skew."""
        if self.signature_window_ms is not None:
            return self.signature_window_ms + self.skew_ms
        return self.put_timeout_ms + self.skew_ms

    def safe_to_send(self, lease_expires_at_ms: int, now_ms: int) -> bool:
        """True while the lease outlasts a put sent now, with the skew margin to spare
        (:attr:`send_margin_ms`): with the fence, the fence's own check at ``now_ms`` (a put
        checked here then passes it unless its process stalls before signing); without, a
        put's timeout plus the skew."""
        return lease_expires_at_ms - now_ms >= self.send_margin_ms

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
