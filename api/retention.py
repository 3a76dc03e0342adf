"""The streams' retention, for the exactly-once window the summary reports.

``KEO_STREAM_RETENTION_HOURS`` (``keo serve --stream-retention-hours``) when it is set: one
value for every stream. Otherwise each stream's own, read from Kinesis (DescribeStreamSummary,
one small call) the first time a stream's summary is asked for, and kept for
:data:`KEEP_MS`: a retention changes rarely, and a summary must not cost a Kinesis call each
time. A stream Kinesis cannot describe (missing, not allowed, unreachable) has no known
retention: the window is then reported as unknown (at most the dedupe TTL), and asked again
after :data:`KEEP_FAILED_MS`.

The API reads the ledger and, here, the streams' description: never a record of a stream.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

import botocore.exceptions
from botocore.config import Config

from api.settings import ApiSettings
from dedupe_store.clock import Clock, SystemClock
from kinesis_store.client import kinesis_client_for

log = logging.getLogger(__name__)

# a stream name -> its retention in hours, None when unknown
RetentionLookup: TypeAlias = Callable[[str], int | None]
KEEP_MS: Final = 5 * 60 * 1000
KEEP_FAILED_MS: Final = 30 * 1000


class StreamRetention:
    """Each stream's retention from ``describe`` (DescribeStreamSummary's summary), kept a
    while. Thread-safe: the routes run on a thread pool."""

    def __init__(self, describe: Callable[[str], Mapping[str, Any]], clock: Clock) -> None:
        self._describe = describe
        self._clock = clock
        self._known: dict[str, tuple[int | None, int]] = {}  # stream -> (hours, until_ms)
        self._lock = threading.Lock()

    def __call__(self, stream: str) -> int | None:
        now_ms = self._clock.now_ms()
        with self._lock:
            known = self._known.get(stream)
        if known is not None and now_ms < known[1]:
            return known[0]
        hours = self._read(stream)
        until_ms = now_ms + (KEEP_MS if hours is not None else KEEP_FAILED_MS)
        with self._lock:
            self._known[stream] = (hours, until_ms)
        return hours

    def _read(self, stream: str) -> int | None:
        try:
            summary = self._describe(stream)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            log.warning(
                "stream retention unknown stream=%s error=%s",
                stream,
                type(exc).__name__,
                extra={"stream": stream},
            )
            return None
        hours = summary.get("RetentionPeriodHours")
        return int(hours) if hours is not None else None


def retention_from(settings: ApiSettings, clock: Clock | None = None) -> RetentionLookup:
    """The configured retention, or a :class:`StreamRetention` on a Kinesis client of its own
    (short timeouts: a summary waits on it)."""
    configured = settings.stream_retention_hours
    if configured is not None:
        return lambda _stream: configured
    client = kinesis_client_for(
        settings.kinesis_endpoint_url,
        region=settings.resolved_region(),
        config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 2}),
    )

    def describe(stream: str) -> Mapping[str, Any]:
        summary: Mapping[str, Any] = client.describe_stream_summary(StreamName=stream)[
            "StreamDescriptionSummary"
        ]
        return summary

    return StreamRetention(describe, clock or SystemClock())
