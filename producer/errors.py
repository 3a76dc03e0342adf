"""Errors of the producer, the read-back, the reconciler and the audit.

They grow from the roots in :mod:`dedupe_store.errors` (the lowest layer), re-exported here:
``KeoError``, the root of every keo error, and ``ConfigurationError``; so are the Kinesis
adapter's (:mod:`kinesis_store.errors`), which the producer's callers meet. The tree::

    KeoError                          anything keo cannot do for its caller (dedupe_store.errors)
    ├── ConfigurationError            settings that cannot work (names the setting; dedupe_store)
    ├── LedgerError                   the ledger's branch (dedupe_store.errors)
    ├── StreamError                   Kinesis' branch (kinesis_store.errors): not found,
    │                                 unavailable, throttled
    ├── PutFencedError                a before-send check kept a put from leaving: not sent
    │                                 (kinesis_store.errors; raised by producer.fence)
    ├── AggregationFormatError        a KPL aggregate that cannot be read (kinesis_store.errors)
    ├── UnresolvedKeysError           a batch left keys neither delivered nor dead-lettered
    ├── ReplayWindowTrimmedError      a replay's recovery window reaches past the stream's
    │                                 retention: what it would read is gone; nothing sent
    └── AuditTooLargeError            more keys (rows) than one process audits (use the Spark audit)

Expected outcomes (a duplicate, a conflict, a rejected message, an ambiguous put) are values
of :class:`producer.outcomes.Outcome`, never exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence

from dedupe_store.errors import ConfigurationError, KeoError
from kinesis_store.errors import (
    AggregationFormatError,
    PutFencedError,
    StreamError,
    StreamNotFoundError,
    StreamThrottledError,
    StreamUnavailableError,
)

__all__ = [
    "AggregationFormatError",
    "AuditTooLargeError",
    "ConfigurationError",
    "KeoError",
    "PutFencedError",
    "ReplayWindowTrimmedError",
    "StreamError",
    "StreamNotFoundError",
    "StreamThrottledError",
    "StreamUnavailableError",
    "UnresolvedKeysError",
]


class ReplayWindowTrimmedError(KeoError):
    """A replay of ``run`` must read back earlier attempts' puts from ``window_start_ms``, but
    the stream holds records only from ``trim_horizon_ms`` (its retention): rows put before
    then cannot be found, and sending them again could write them twice. Nothing was sent.
    Not retriable: the horizon only moves on. ``KEO_REPLAY_PAST_RETENTION=send`` accepts the
    risk."""

    retriable = False

    def __init__(self, stream: str, run: str, *, window_start_ms: int, trim_horizon_ms: int):
        super().__init__(
            f"replay of run {run!r} on stream {stream} cannot be recovered: its earlier "
            f"attempts' puts began at {window_start_ms} (epoch ms), before the stream's trim "
            f"horizon {trim_horizon_ms}, so what they wrote is partly gone; nothing sent. "
            "Set KEO_REPLAY_PAST_RETENTION=send (option replay_past_retention) to send the "
            "rows not found anyway, at the risk of duplicates"
        )
        self.stream = stream
        self.run = run
        self.window_start_ms = window_start_ms
        self.trim_horizon_ms = trim_horizon_ms


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
    keys) holds more than ``max_keys`` keys (``unit``: rows, for the replay audit), and it would
    hold every one in memory. The Spark audit (``python -m spark_jobs.audit``) holds none on its
    driver."""

    def __init__(self, source: str, *, max_keys: int, unit: str = "keys") -> None:
        super().__init__(
            f"{source} holds more than {max_keys:,} {unit}: too many to audit in one process"
        )
        self.source = source
        self.max_keys = max_keys
        self.unit = unit
