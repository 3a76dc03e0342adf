"""``ShardPages``: the read calls on one stream: a shard's pages from a position, and every
other call a read makes (the description, the shard map, iterators).

Reads are idempotent: a throttled call is tried again in place, after a jittered backoff
(:func:`kinesis_store.read_pacing.throttle_backoff_s`), and an expired iterator is renewed
right after the last record read; every other botocore error is translated once into
:mod:`kinesis_store.errors`, keeping the cause. Given a
:class:`kinesis_store.read_pacing.ReadPacer`, GetRecords calls keep within each shard's 5
calls and 2 MB a second; :class:`ShardReads` counts what the calls on a shard brought back.
A read's first page may be read ahead of the read (:meth:`ShardPages.read_ahead`), several
shards' at once: the read then begins with it (:class:`Ahead`).

A read that goes on after a record already read (``AFTER_SEQUENCE_NUMBER``) first asks for
that record itself (``AT_SEQUENCE_NUMBER``): when the shard no longer holds it, it is past the
trim horizon and what came after it may be lost. The caller's ``on_lost`` decides: raise
(:func:`raise_lost`, the default) or go on from the oldest record the shard still holds.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
from tenacity import (
    RetryCallState,
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
)

from dedupe_store.errors import aws_error_code
from kinesis_store.errors import (
    ShardPositionLostError,
    StaleSignatureError,
    StreamNotFoundError,
    StreamThrottledError,
    StreamUnavailableError,
)
from kinesis_store.kpl import arrival_ms_of
from kinesis_store.positions import SeenRecord, ShardStart, StartKind
from kinesis_store.read_pacing import ReadPacer, throttle_backoff_s
from kinesis_store.results import signature_expired

__all__ = ["Ahead", "Page", "ShardPages", "ShardReads", "cause_code_of", "raise_lost", "seen"]

log = logging.getLogger(__name__)


def raise_lost(error: ShardPositionLostError) -> None:
    """The default ``on_lost``: a read never skips records silently."""
    raise error


@dataclass(frozen=True, slots=True)
class Page:
    """One GetRecords answer: its records, and whether it reached the tip (or, ``ended``, the
    end of a closed shard): nothing is read after such a page. ``caught_up``: it held records,
    fewer than asked for, and Kinesis said it was 0 ms behind the tip: its last record was the
    shard's last when it was read (the empty page that would make it ``tip`` adds nothing).
    ``next_iterator``: where the next page would be read from (None once ``ended``)."""

    records: list[dict[str, Any]]
    tip: bool
    ended: bool
    caught_up: bool = False
    next_iterator: str | None = None


@dataclass(slots=True)
class _Cursor:
    """Where a read of one shard is: the iterator of its next page (None: the shard ended),
    whether the record it goes on after is still to be checked, and the last record read."""

    iterator: str | None
    checking: bool
    last_seen: str | None = None


@dataclass(frozen=True, slots=True)
class Ahead:
    """The first page of a read of ``shard_id`` from ``start``, read ahead of the read
    (:meth:`ShardPages.read_ahead`), and where the read goes on after it: the read's
    :meth:`ShardPages.pages` begins with it, as if it had read it then."""

    shard_id: str
    start: ShardStart
    page: Page
    cursor: _Cursor


@dataclass(slots=True)
class ShardReads:
    """What this reader's GetRecords calls on one shard brought back: Kinesis records (an
        aggregate counts once) and their bytes (data and partition key), and the last answer's
        ``MillisBehindLatest``: how far the read was behind the shard's tip (None: no answer); the
    malformed aggregates its reads met (:class:`kinesis_store.kpl.MalformedAggregate`)."""

    calls: int = 0
    records: int = 0
    bytes: int = 0
    millis_behind_latest: int | None = None
    malformed_aggregates: int = 0

    def add(self, page: dict[str, Any]) -> int:
        """Count one GetRecords answer; its bytes."""
        records = page.get("Records", [])
        page_bytes = sum(_record_bytes(raw) for raw in records)
        self.calls += 1
        self.records += len(records)
        self.bytes += page_bytes
        behind = page.get("MillisBehindLatest")
        if behind is not None:
            self.millis_behind_latest = int(behind)
        return page_bytes


_READ_THROTTLED = frozenset(
    {"ProvisionedThroughputExceededException", "LimitExceededException", "KMSThrottlingException"}
)


class ShardPages:
    """The read calls on one stream, retried while throttled, their errors translated; what
    GetRecords brought back counted per shard. Several shards may be read on several threads
    at once, never one shard on two threads."""

    def __init__(
        self,
        client: Any,
        stream: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        max_throttle_retries: int = 20,
        page_limit: int = 10_000,
        pacer: ReadPacer | None = None,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._client = client
        self.stream = stream
        self._sleep = sleep
        self._max_throttle_retries = max_throttle_retries
        self.page_limit = page_limit
        self._pacer = pacer
        self._jitter = jitter
        self._reads: dict[str, ShardReads] = {}
        self._counting = threading.Lock()  # a planner looks for tails on several threads
        self.get_records_calls = 0

    def shard_reads(self, shard_id: str) -> ShardReads:
        """What the GetRecords calls on ``shard_id`` brought back so far."""
        return self._reads.setdefault(shard_id, ShardReads())

    def count_malformed(self, shard_id: str) -> None:
        """Counts a malformed aggregate read from ``shard_id``."""
        with self._counting:
            self.shard_reads(shard_id).malformed_aggregates += 1

    def call(self, operation: str, **kwargs: Any) -> Any:
        return self._read_retrying()(self._call_once, operation, kwargs)

    def pages(
        self,
        shard_id: str,
        start: ShardStart,
        *,
        on_lost: Callable[[ShardPositionLostError], None] = raise_lost,
        limit: Callable[[], int] | None = None,
        check: bool = True,
        iterator: str | None = None,
        ahead: Ahead | None = None,
    ) -> Iterator[Page]:
        """Pages from ``start`` on, until the tip or the end of a closed shard. After a
        sequence number, the first page is checked to start with that record (``check``).
        Given ``iterator`` (one at ``start``, a page's next), reads with it and checks nothing.
        Given ``ahead`` (read ahead from ``start`` on this shard), begins with its page."""
        if ahead is None:
            cursor = self._cursor(shard_id, start, check=check, iterator=iterator, on_lost=on_lost)
        else:
            if (ahead.shard_id, ahead.start) != (shard_id, start):
                raise ValueError(
                    f"a page read ahead from {ahead.start} on {ahead.shard_id} is not the first "
                    f"of a read from {start} on {shard_id}"
                )
            yield ahead.page
            if ahead.page.tip:
                return
            cursor = replace(ahead.cursor)
        while cursor.iterator is not None:
            page = self._next_page(shard_id, start, cursor, limit, on_lost)
            if page is None:
                continue
            yield page
            if page.tip:
                return

    def read_ahead(
        self,
        shard_id: str,
        start: ShardStart,
        *,
        limit: int,
        on_lost: Callable[[ShardPositionLostError], None] = raise_lost,
    ) -> Ahead:
        """The first page of a read from ``start`` (``limit`` records at most, after the record
        checked), for :meth:`pages` to begin with later, maybe on another thread."""
        cursor = self._cursor(shard_id, start, check=True, iterator=None, on_lost=on_lost)
        while True:
            page = self._next_page(shard_id, start, cursor, lambda: limit, on_lost)
            if page is not None:
                return Ahead(shard_id, start, page, replace(cursor))

    def _cursor(
        self,
        shard_id: str,
        start: ShardStart,
        *,
        check: bool,
        iterator: str | None,
        on_lost: Callable[[ShardPositionLostError], None],
    ) -> _Cursor:
        """Where a read from ``start`` begins: at ``iterator`` (nothing checked), else at a new
        iterator (at the record a start after one names, when checking it)."""
        if iterator is not None:
            return _Cursor(iterator, checking=False)
        checking = check and start.kind is StartKind.AFTER_SEQUENCE_NUMBER
        opened, checking = self._open(shard_id, start, checking, on_lost)
        return _Cursor(opened, checking)

    def _next_page(
        self,
        shard_id: str,
        start: ShardStart,
        cursor: _Cursor,
        limit: Callable[[], int] | None,
        on_lost: Callable[[ShardPositionLostError], None],
    ) -> Page | None:
        """The page at ``cursor``, which moves on after it; None when the iterator had expired:
        ``cursor`` then holds a new one, after the last record seen."""
        iterator = cursor.iterator
        if iterator is None:
            raise ValueError(f"shard {shard_id} ended: no page follows")
        size = limit() if limit is not None else self.page_limit
        if cursor.checking and limit is not None:
            size += 1  # the record checked comes first and is dropped: a page's worth after it
        if self._pacer is not None:  # the size asked for: a page under it is not full
            size = self._pacer.page_limit(shard_id, size)
        page = self._read_retrying()(self._get_page, shard_id, iterator, size)
        if page is None:
            # iterators live 5 minutes: go on right after the last record seen
            last_seen = cursor.last_seen
            resume = ShardStart.after(last_seen) if last_seen is not None else start
            cursor.iterator, cursor.checking = self._open(
                shard_id, resume, cursor.checking and last_seen is None, on_lost
            )
            return None
        raw_records: list[dict[str, Any]] = page["Records"]
        cursor.iterator = page.get("NextShardIterator")
        ended = cursor.iterator is None
        tip = ended or (not raw_records and page.get("MillisBehindLatest", 0) == 0)
        records = raw_records
        if cursor.checking and (records or tip):
            records = self._checked(shard_id, start, records, on_lost)
            cursor.checking = False
        if raw_records:
            cursor.last_seen = str(raw_records[-1]["SequenceNumber"])
        caught_up = 0 < len(raw_records) < size and page.get("MillisBehindLatest") == 0
        return Page(
            records, tip=tip, ended=ended, caught_up=caught_up, next_iterator=cursor.iterator
        )

    def _open(
        self,
        shard_id: str,
        start: ShardStart,
        checking: bool,
        on_lost: Callable[[ShardPositionLostError], None],
    ) -> tuple[str, bool]:
        """An iterator at ``start``; when checking, at the record itself. Kinesis may refuse a
        sequence number it no longer holds: that is a lost position too."""
        arguments = start.iterator_arguments()
        if checking:
            arguments = {
                "ShardIteratorType": "AT_SEQUENCE_NUMBER",
                "StartingSequenceNumber": start.sequence_number,
            }
        try:
            answer = self.call(
                "get_shard_iterator", StreamName=self.stream, ShardId=shard_id, **arguments
            )
        except StreamUnavailableError as exc:
            if not (checking and cause_code_of(exc.__cause__) == "InvalidArgumentException"):
                raise
            on_lost(self._lost(shard_id, start, None))
            return self._open(shard_id, ShardStart.trim_horizon(), False, on_lost)
        return str(answer["ShardIterator"]), checking

    def _checked(
        self,
        shard_id: str,
        start: ShardStart,
        records: list[dict[str, Any]],
        on_lost: Callable[[ShardPositionLostError], None],
    ) -> list[dict[str, Any]]:
        """The first page read at the record a read goes on after: without that record."""
        if records and str(records[0]["SequenceNumber"]) == start.sequence_number:
            return records[1:]
        on_lost(self._lost(shard_id, start, seen(records[0]) if records else None))
        return records

    def _lost(
        self, shard_id: str, start: ShardStart, first: SeenRecord | None
    ) -> ShardPositionLostError:
        return ShardPositionLostError(
            stream=self.stream,
            shard_id=shard_id,
            sequence_number=start.sequence_number,
            since_ms=start.timestamp_ms,
            first_sequence_number=first.sequence_number if first else None,
            first_arrival_ms=first.arrival_ms if first else None,
        )

    def iterator_at_timestamp(self, shard_id: str, start_ms: int) -> str | None:
        return self.call(  # type: ignore[no-any-return]
            "get_shard_iterator",
            StreamName=self.stream,
            ShardId=shard_id,
            ShardIteratorType="AT_TIMESTAMP",
            Timestamp=datetime.fromtimestamp(start_ms / 1000, tz=UTC),
        )["ShardIterator"]

    def get_records(
        self, shard_id: str, iterator: str, last_sequence: str | None, start_ms: int | None
    ) -> tuple[dict[str, Any], str | None]:
        while True:
            page = self._read_retrying()(self._get_page, shard_id, iterator)
            if page is None:
                # iterators live 5 minutes: resume right after the last record seen
                iterator = self._resume(shard_id, last_sequence, start_ms)
                continue
            return page, page.get("NextShardIterator")

    def _get_page(
        self, shard_id: str, iterator: str, limit: int | None = None
    ) -> dict[str, Any] | None:
        """One GetRecords call, paced when the reader has a pacer; None when the iterator has
        expired."""
        with self._counting:
            self.get_records_calls += 1
        wanted = limit or self.page_limit
        left_at_s = 0.0
        if self._pacer is not None:
            if limit is None:  # a size given was cut to the pacer's share by the caller
                wanted = self._pacer.page_limit(shard_id, wanted)
            left_at_s = self._pacer.before_call(shard_id)
        try:
            page: dict[str, Any] = self._client.get_records(ShardIterator=iterator, Limit=wanted)
        except botocore.exceptions.ClientError as exc:
            if aws_error_code(exc) == "ExpiredIteratorException":
                return None
            raise self._translate(exc, "get records", shard_id) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StreamUnavailableError(
                f"Kinesis failed to get records: {exc}", stream=self.stream, shard_id=shard_id
            ) from exc
        page_bytes = self.shard_reads(shard_id).add(page)
        if self._pacer is not None:
            self._pacer.after_call(shard_id, left_at_s, page_bytes, len(page.get("Records", ())))
        return page

    def _resume(self, shard_id: str, last_sequence: str | None, start_ms: int | None) -> str:
        if last_sequence is not None:
            kwargs: dict[str, Any] = {
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                "StartingSequenceNumber": last_sequence,
            }
        elif start_ms is not None:
            kwargs = {
                "ShardIteratorType": "AT_TIMESTAMP",
                "Timestamp": datetime.fromtimestamp(start_ms / 1000, tz=UTC),
            }
        else:
            kwargs = {"ShardIteratorType": "TRIM_HORIZON"}
        return self.call(  # type: ignore[no-any-return]
            "get_shard_iterator", StreamName=self.stream, ShardId=shard_id, **kwargs
        )["ShardIterator"]

    def _read_retrying(self) -> Retrying:
        """Reads are idempotent: a throttled one, or one whose signature arrived stale (a
        process stalled between signing and sending), is tried again after a jittered backoff
        (0.4 s doubling to 5 s, half of it drawn), up to ``max_throttle_retries`` times. Other
        failures are raised at once: the SDK has retried them already."""

        def backoff_s(state: RetryCallState) -> float:
            return throttle_backoff_s(state.attempt_number, draw=self._jitter)

        return Retrying(
            retry=retry_if_exception_type((StreamThrottledError, StaleSignatureError)),
            wait=backoff_s,
            stop=stop_after_attempt(self._max_throttle_retries + 1),
            sleep=self._sleep,
            before_sleep=before_sleep_log(log, logging.INFO),
            reraise=True,
        )

    def _call_once(self, operation: str, kwargs: dict[str, Any]) -> Any:
        try:
            return getattr(self._client, operation)(**kwargs)
        except botocore.exceptions.ClientError as exc:
            raise self._translate(exc, operation, kwargs.get("ShardId")) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StreamUnavailableError(
                f"Kinesis failed to {operation}: {exc}", stream=self.stream
            ) from exc

    def _translate(
        self, exc: botocore.exceptions.ClientError, doing: str, shard_id: str | None
    ) -> StreamNotFoundError | StreamUnavailableError:
        code = aws_error_code(exc)
        if signature_expired(code, exc.response.get("Error", {}).get("Message")):
            return StaleSignatureError(
                f"Kinesis failed to {doing}: {code} (the request arrived after its signature "
                "expired: the process stalled)",
                stream=self.stream,
                shard_id=shard_id,
            )
        if code == "ResourceNotFoundException":
            return StreamNotFoundError(
                f"stream {self.stream!r} does not exist: run 'keo init'",
                stream=self.stream,
                shard_id=shard_id,
            )
        if code in _READ_THROTTLED:
            return StreamThrottledError(
                f"Kinesis failed to {doing}: {code}", stream=self.stream, shard_id=shard_id
            )
        return StreamUnavailableError(
            f"Kinesis failed to {doing}: {code}", stream=self.stream, shard_id=shard_id
        )


def _record_bytes(raw: dict[str, Any]) -> int:
    return len(raw.get("Data", b"")) + len(str(raw.get("PartitionKey", "")).encode())


def seen(raw: dict[str, Any]) -> SeenRecord:
    """Where a Kinesis record is: its sequence number and arrival time."""
    return SeenRecord(
        str(raw["SequenceNumber"]), arrival_ms_of(raw.get("ApproximateArrivalTimestamp"))
    )


def cause_code_of(cause: BaseException | None) -> str | None:
    """The AWS error code of the vendor error a translated error was raised from."""
    if isinstance(cause, botocore.exceptions.ClientError):
        return aws_error_code(cause)
    return None
