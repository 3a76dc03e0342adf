"""Errors of the producer, the read-back, the reconciler and the audit.

They grow from the roots in :mod:`dedupe_store.errors` (the lowest layer), re-exported here:
``KeoError``, the root of every keo error, and ``ConfigurationError``. The tree::

    KeoError                          anything keo cannot do for its caller (dedupe_store.errors)
    ├── ConfigurationError            settings that cannot work (names the setting; dedupe_store)
    ├── LedgerError                   the ledger's branch (dedupe_store.errors)
    ├── StreamError                   Kinesis failed in a way the caller cannot continue from
    │   ├── StreamNotFoundError       the stream does not exist (run 'keo init')
    │   └── StreamUnavailableError    Kinesis could not be reached or kept failing (retriable)
    │       └── StreamThrottledError  Kinesis throttled a read (retried in place, with backoff)
    ├── PutFencedError                a before-send check kept a put from leaving: not sent
    │                                 (the signature fence, or with it off the lease deadline;
    │                                 KinesisWriter turns it into a NOT_WRITTEN result)
    ├── UnresolvedKeysError           a batch left keys neither delivered nor dead-lettered
    ├── AuditTooLargeError            more keys than one process audits (use the Spark audit)
    └── AggregationFormatError        a KPL aggregated record that cannot be read (producer.kpl;
                                      a ValueError too)

Expected outcomes (a duplicate, a conflict, a rejected message, an ambiguous put) are values
of :class:`producer.outcomes.Outcome`, never exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence

from dedupe_store.errors import ConfigurationError, KeoError

__all__ = [
    "AuditTooLargeError",
    "ConfigurationError",
    "KeoError",
    "PutFencedError",
    "StreamError",
    "StreamNotFoundError",
    "StreamThrottledError",
    "StreamUnavailableError",
    "UnresolvedKeysError",
]


class StreamError(KeoError):
    def __init__(self, message: str, *, stream: str, shard_id: str | None = None) -> None:
        super().__init__(message)
        self.stream = stream
        self.shard_id = shard_id


class StreamNotFoundError(StreamError):
    pass


class StreamUnavailableError(StreamError):
    retriable = True


class StreamThrottledError(StreamUnavailableError):
    """Kinesis throttled a read: the reader waits and tries again before raising it."""


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


class UnresolvedKeysError(KeoError):
    """Raised by batch callers (the Spark sink) so the batch is retried and nothing is lost."""

    retriable = True

    def __init__(self, stream: str, keys: Sequence[str]) -> None:
        shown = ", ".join(repr(k) for k in keys[:5])
        more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
        super().__init__(f"{len(keys)} keys left unresolved in stream {stream}: {shown}{more}")
        self.stream = stream
        self.keys = list(keys)


class AuditTooLargeError(KeoError):
    """The audit in one process stopped: ``source`` (the stream, its ledger or the expected
    keys) holds more than ``max_keys`` keys, and it would hold every one in memory. The
    Spark audit (``python -m spark_jobs.audit``) holds none on its driver."""

    def __init__(self, source: str, *, max_keys: int) -> None:
        super().__init__(
            f"{source} holds more than {max_keys:,} keys: too many to audit in one process"
        )
        self.source = source
        self.max_keys = max_keys
