"""``KinesisReader``: reads a stream back: its description, its shard map with lineage, a
shard's records in a time window, whole, or between two positions, deaggregated as a KCL
consumer sees them; a shard's tail; its records counted forward from a position.

Reads are idempotent: a throttled one is tried again in place, after a jittered backoff
(:func:`kinesis_store.read_pacing.throttle_backoff_s`), and an expired iterator is renewed
right after the last record read; every other botocore error is translated once into
:mod:`kinesis_store.errors`, keeping the cause. Given a
:class:`kinesis_store.read_pacing.ReadPacer`, GetRecords calls keep within each shard's 5
calls and 2 MB a second; :meth:`KinesisReader.shard_reads` says what the reads of a shard
brought back (records, bytes, and how far behind the tip the last page was). One reader may
read several shards on several threads at once (a planner looks for their tails together),
never one shard on two threads.

A read that goes on after a record already read (``AFTER_SEQUENCE_NUMBER``) first asks for
that record itself (``AT_SEQUENCE_NUMBER``): when the shard no longer holds it, it is past the
trim horizon and what came after it may be lost. The caller's ``on_lost`` decides: raise
(the default) or go on from the oldest record the shard still holds.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
import botocore.utils
from tenacity import (
    RetryCallState,
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
)

from dedupe_store.errors import aws_error_code
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from kinesis_store.errors import (
    ShardPositionLostError,
    StreamNotFoundError,
    StreamThrottledError,
    StreamUnavailableError,
)
from kinesis_store.kpl import (
    MalformedAggregate,
    UserRecord,
    arrival_ms_of,
    deaggregate,
    user_record_count,
)
from kinesis_store.positions import Counted, SeenRecord, ShardStart, StartKind, sequence_key
from kinesis_store.read_pacing import ReadPacer, throttle_backoff_s
from kinesis_store.shards import Shard, StreamInfo

__all__ = ["KinesisReader", "ShardReads", "shard_of", "stop_on_malformed", "utc_timestamp"]

log = logging.getLogger(__name__)

# The tail of a shard is looked for in the last 10 s first, then in windows 10 times wider.
_TAIL_WINDOW_MS = 10_000
_TAIL_WIDENING = 10
# A window holding more records than this is halved, down to a second, before it is read.
_TAIL_PAGE = 1_000
_TAIL_NARROWEST_MS = 1_000


def raise_lost(error: ShardPositionLostError) -> None:
    """The default ``on_lost``: a read never skips records silently."""
    raise error


def stop_on_malformed(fault: MalformedAggregate) -> None:
    """An ``on_malformed`` that stops the read at a malformed aggregate, before any of its user
    records is given out, instead of going on as the KCL does."""
    raise fault.error()


@dataclass(frozen=True, slots=True)
class _Page:
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


@dataclass(frozen=True, slots=True)
class _Reading:
    """What a read of a few records found: its first and last records (None: none), and where
    to go on when it stopped short of the tip (None: it reached the tip)."""

    first: SeenRecord | None
    last: SeenRecord | None
    resume: _Resume | None


@dataclass(frozen=True, slots=True)
class _Resume:
    """Where a tail search can go on reading with no new iterator: the iterator a page
    returned, right after ``record``, its last record (a new AT_TIMESTAMP iterator would make
    kinesalite scan the shard again, and costs a call on AWS)."""

    record: SeenRecord
    iterator: str | None  # None: the shard is closed and ends at ``record``

    @classmethod
    def after(cls, page: _Page) -> _Resume:
        return cls(_seen(page.records[-1]), page.next_iterator)


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


class KinesisReader:
    """Reads shards: the shard map with lineage, time windows, and whole shards.

    A malformed KPL aggregate is read as the KCL reads it (:func:`kinesis_store.kpl.deaggregate`:
    the user records before the fault, or the record raw), logged with its shard and sequence
    number, counted in :meth:`shard_reads`, then given to ``on_malformed``: count it, or raise
    (:func:`stop_on_malformed`) to stop at it."""

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
        on_malformed: Callable[[MalformedAggregate], None] | None = None,
    ) -> None:
        self._client = client
        self._on_malformed = on_malformed
        self.stream = stream
        self._sleep = sleep
        self._max_throttle_retries = max_throttle_retries
        self._page_limit = page_limit
        self._pacer = pacer
        self._jitter = jitter
        self._reads: dict[str, ShardReads] = {}
        self._counting = threading.Lock()  # a planner looks for tails on several threads
        self.get_records_calls = 0

    @property
    def client(self) -> Any:
        """The botocore client, for event hooks (metrics, injected faults)."""
        return self._client

    def shard_reads(self, shard_id: str) -> ShardReads:
        """What this reader's GetRecords calls on ``shard_id`` brought back so far."""
        return self._reads.setdefault(shard_id, ShardReads())

    def describe(self) -> StreamInfo:
        summary = self._call("describe_stream_summary", StreamName=self.stream)[
            "StreamDescriptionSummary"
        ]
        max_kib = summary.get("MaxRecordSizeInKiB")
        return StreamInfo(
            name=self.stream,
            retention_hours=int(summary.get("RetentionPeriodHours", 24)),
            max_record_bytes=int(max_kib) * 1024 if max_kib else DEFAULT_MAX_RECORD_BYTES,
            open_shard_count=int(summary.get("OpenShardCount", 0)),
        )

    def shards(self) -> list[Shard]:
        """Every shard the stream still has, open and closed, with their lineage."""
        found: list[Shard] = []
        kwargs: dict[str, Any] = {"StreamName": self.stream}
        while True:
            page = self._call("list_shards", **kwargs)
            found.extend(shard_of(raw) for raw in page.get("Shards", []))
            token = page.get("NextToken")
            if not token:
                return found
            kwargs = {"NextToken": token}

    def read_window(
        self, shard_id: str, start_ms: int, end_ms: int, *, now_ms: Callable[[], int]
    ) -> Iterator[UserRecord]:
        """User records that arrived in ``[start_ms, end_ms]``, read once from ``start_ms``.

        Stops at the first record that arrived after ``end_ms``, at a closed shard's end,
        or at the tip once ``end_ms`` has passed. Arrival times are not monotonic, hence
        callers pad the window with the skew margin.
        """
        iterator = self._iterator_at_timestamp(shard_id, start_ms)
        last_sequence: str | None = None
        while iterator is not None:
            page, iterator = self._get_records(shard_id, iterator, last_sequence, start_ms)
            for raw in page["Records"]:
                last_sequence = str(raw["SequenceNumber"])
                arrival = arrival_ms_of(raw.get("ApproximateArrivalTimestamp"))
                if arrival > end_ms:
                    return
                yield from self._user_records(shard_id, raw)
            if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                if now_ms() > end_ms:
                    return
                self._sleep(0.2)  # the window is still open: wait for late arrivals

    def read_all(self, shard_id: str) -> Iterator[UserRecord]:
        """Every user record of a shard from TRIM_HORIZON to its end (closed) or the tip."""
        iterator: str | None = self._call(
            "get_shard_iterator",
            StreamName=self.stream,
            ShardId=shard_id,
            ShardIteratorType="TRIM_HORIZON",
        )["ShardIterator"]
        last_sequence: str | None = None
        while iterator is not None:
            page, iterator = self._get_records(shard_id, iterator, last_sequence, None)
            for raw in page["Records"]:
                last_sequence = str(raw["SequenceNumber"])
                yield from self._user_records(shard_id, raw)
            if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                return

    # --- reads between positions: what a streaming read plans and reads ------------------------

    def read_range(
        self,
        shard_id: str,
        start: ShardStart,
        through: str | None,
        *,
        on_lost: Callable[[ShardPositionLostError], None] = raise_lost,
    ) -> Iterator[UserRecord]:
        """The user records of the Kinesis records after ``start`` up to the one numbered
        ``through`` (inclusive), or to the end of the shard (``through`` None: a closed shard).
        The same positions read the same records, whenever they are read."""
        for page in self._pages(shard_id, start, on_lost=on_lost):
            for raw in page.records:
                sequence_number = str(raw["SequenceNumber"])
                if through is not None and sequence_key(sequence_number) > sequence_key(through):
                    return
                yield from self._user_records(shard_id, raw)
                if through is not None and sequence_key(sequence_number) == sequence_key(through):
                    return
            if page.tip and through is not None:
                raise StreamUnavailableError(
                    f"shard {shard_id}: the read reached the shard's tip or end without meeting "
                    "sequence number "
                    f"{through}, the end its batch was planned with (was the stream deleted and "
                    "created again?)",
                    stream=self.stream,
                    shard_id=shard_id,
                )

    def count_forward(
        self,
        shard_id: str,
        start: ShardStart,
        *,
        max_user_records: int,
        through: str | None = None,
        oversized_up_to: int | None = 0,
        on_lost: Callable[[ShardPositionLostError], None] = raise_lost,
    ) -> Counted:
        """Reads forward from ``start`` (to ``through`` at most, inclusive) and takes whole
        Kinesis records while their user records fit in ``max_user_records``; a first record
        that holds more is taken alone when it holds at most ``oversized_up_to`` (None: however
        many; by default it is not taken). GetRecords is asked for no more records than are
        still wanted."""
        taken = 0
        last: SeenRecord | None = None

        def wanted() -> int:
            return max(1, min(self._page_limit, max_user_records - taken))

        for page in self._pages(shard_id, start, on_lost=on_lost, limit=wanted):
            for index, raw in enumerate(page.records):
                sequence_number = str(raw["SequenceNumber"])
                if through is not None and sequence_key(sequence_number) > sequence_key(through):
                    return Counted(last, taken, ended=False, full=False)
                count = user_record_count(shard_id, raw)
                alone = taken == 0 and (oversized_up_to is None or count <= oversized_up_to)
                if taken + count > max_user_records and not alone:
                    return Counted(last, taken, ended=False, full=True)
                taken += count
                last = SeenRecord(
                    sequence_number, arrival_ms_of(raw.get("ApproximateArrivalTimestamp"))
                )
                if through is not None and sequence_key(sequence_number) == sequence_key(through):
                    return Counted(last, taken, ended=False, full=False)
                at_page_end = index == len(page.records) - 1
                if taken >= max_user_records and not (at_page_end and page.tip):
                    return Counted(last, taken, ended=False, full=True)
            if page.tip:
                return Counted(last, taken, ended=page.ended, full=False)
        return Counted(last, taken, ended=False, full=False)

    def _user_records(self, shard_id: str, raw: dict[str, Any]) -> tuple[UserRecord, ...]:
        """What a KCL consumer gets of one Kinesis record, before the shard's hash-range rule
        (:func:`kinesis_store.shards.kcl_view`); a malformed aggregate is reported first."""
        read = deaggregate(shard_id, raw)
        fault = read.fault
        if fault is not None:
            log.warning(
                "malformed KPL aggregate stream=%s shard=%s sequence_number=%s delivered=%s "
                "dropped=%d reason=%s",
                self.stream,
                fault.shard_id,
                fault.sequence_number,
                "raw" if fault.raw else fault.delivered,
                fault.dropped,
                fault.reason,
            )
            with self._counting:
                self.shard_reads(shard_id).malformed_aggregates += 1
            if self._on_malformed is not None:
                self._on_malformed(fault)
        return read.records

    def tail(
        self, shard_id: str, start: ShardStart, *, now_ms: int, margin_ms: int
    ) -> SeenRecord | None:
        """The last record the shard holds after ``start``; None when it holds nothing after it.

        A start after a record (a running query's last end) is read on from first, a page of
        ``_TAIL_PAGE`` records: a query's next tail is near its last, and a page that reaches
        the tip ends the search with one call. Otherwise, or when more than a page follows it,
        read from a little before now (the last 10 s, then windows 10 times wider), so that
        finding the tip of a busy shard reads seconds of it, not all of it. A window that finds
        nothing is widened only while records after ``start`` may lie before it: one record read
        from ``start`` says whether there are any, and the window stops widening once it reaches
        back to the first of them (``margin_ms`` covers arrival times out of order). A window
        holding more than ``_TAIL_PAGE`` records is narrowed before it is read
        (:meth:`_last_since`): a shard quiet since a burst is not read whole for its last record.
        """
        window_ms = _TAIL_WINDOW_MS
        first: SeenRecord | None = None
        if start.kind is StartKind.AFTER_SEQUENCE_NUMBER:
            ahead = self._ahead(shard_id, start)
            if ahead is not None and ahead.resume is None:
                return ahead.last  # read to the tip: None when nothing follows the start
            if ahead is not None:
                first = ahead.first
        empty_since_ms = now_ms  # no record arrived from here on, as far as is known
        while True:
            since_ms = now_ms - window_ms
            if start.kind is StartKind.AT_TIMESTAMP and start.timestamp_ms is not None:
                since_ms = max(since_ms, start.timestamp_ms)  # nothing before the start counts
            # the first record after start arrived at first.arrival_ms: a start there finds one
            lowest_ms = since_ms if first is None else max(since_ms, first.arrival_ms - margin_ms)
            last = self._last_since(shard_id, since_ms, lowest_ms, empty_since_ms)
            if last is not None:
                return last if start.is_before(last.sequence_number) else None
            empty_since_ms = since_ms
            if first is None:
                found = self._first(shard_id, start)
                if found is None:
                    return None
                first = found.record
            if since_ms <= first.arrival_ms - margin_ms:
                # arrival times out of order beyond the margin: read everything after start
                return self._last_after(shard_id, start)
            window_ms *= _TAIL_WIDENING

    def _last_since(
        self, shard_id: str, since_ms: int, lowest_ms: int, empty_since_ms: int
    ) -> SeenRecord | None:
        """The shard's last record, read from ``since_ms`` (None: nothing arrived since).

        A window holding more than a page is halved first, keeping its later half while a
        record arrived in it (one GetRecords of one record a step), down to a second, which is
        read to the tip from the last record found. Whatever the order of arrival times, a
        read that starts at a record and goes on to the tip ends at the shard's last record;
        each step keeps a start where a record was found, and the iterator after it, which
        the last read goes on with. The halving starts between ``lowest_ms`` (a start known to
        find a record, at or after ``since_ms``) and ``empty_since_ms`` (where a narrower
        window found none): where the tail is, as far as is known. Those bounds only spare
        steps: the last read goes on to the tip whatever they say.
        """
        reading = self._reading(shard_id, ShardStart.at_timestamp(max(since_ms, 0)), _TAIL_PAGE)
        last, resume = reading.last, reading.resume
        if resume is None:
            return last  # read to the tip (or nothing arrived since)
        # a start at the last record read finds it (or one after it): the halving starts there
        low = max(lowest_ms, resume.record.arrival_ms)
        high = max(empty_since_ms, low)
        while high - low > _TAIL_NARROWEST_MS:
            middle = (low + high) // 2
            found = self._first(shard_id, ShardStart.at_timestamp(max(middle, 0)))
            if found is None:
                high = middle
            else:  # a start at the record found finds it: past a quiet stretch at once
                low = min(max(middle, found.record.arrival_ms), high)
                resume = found
        return self._last_resumed(shard_id, resume)

    def _reading(self, shard_id: str, start: ShardStart, at_most: int) -> _Reading:
        """Records read from ``start`` to the tip; or, once ``at_most`` records were read short
        of the tip, what was read so far and where to go on (a window of exactly ``at_most``
        records is then searched as a larger one would be: one call fewer for every larger
        one)."""
        first: SeenRecord | None = None
        last: SeenRecord | None = None
        read = 0

        def size() -> int:
            return at_most - read

        for page in self._pages(shard_id, start, check=False, limit=size):
            if page.records:
                first = first or _seen(page.records[0])
                last = _seen(page.records[-1])
                read += len(page.records)
            if page.caught_up:
                break  # a tail: whatever arrives next is for the next batch
            if not page.tip and read >= at_most:
                return _Reading(first, last, _Resume.after(page))
        return _Reading(first, last, None)

    def _ahead(self, shard_id: str, start: ShardStart) -> _Reading | None:
        """A page read on after the record ``start`` names; None when Kinesis refuses that
        record (past the trim horizon: the read of the batch says what was lost)."""
        try:
            return self._reading(shard_id, start, _TAIL_PAGE)
        except StreamUnavailableError as exc:
            if _code_of(exc.__cause__) != "InvalidArgumentException":
                raise
            return None

    def _last_resumed(self, shard_id: str, resume: _Resume) -> SeenRecord:
        """The last record from ``resume`` on to the tip (its record, when none came after)."""
        last = resume.record
        if resume.iterator is None:
            return last
        start = ShardStart.after(last.sequence_number, last.arrival_ms)
        for page in self._pages(shard_id, start, check=False, iterator=resume.iterator):
            if page.records:
                last = _seen(page.records[-1])
            if page.caught_up:
                break
        return last

    def _first(self, shard_id: str, start: ShardStart) -> _Resume | None:
        """The first record from ``start`` on, read one record a call, and where to go on."""
        for page in self._pages(shard_id, start, check=False, limit=lambda: 1):
            if page.records:
                return _Resume.after(page)  # one record a page: the first
        return None

    def _last_after(self, shard_id: str, start: ShardStart) -> SeenRecord | None:
        last: SeenRecord | None = None
        for page in self._pages(shard_id, start, check=False):
            if page.records:
                last = _seen(page.records[-1])
        return last

    def _pages(
        self,
        shard_id: str,
        start: ShardStart,
        *,
        on_lost: Callable[[ShardPositionLostError], None] = raise_lost,
        limit: Callable[[], int] | None = None,
        check: bool = True,
        iterator: str | None = None,
    ) -> Iterator[_Page]:
        """Pages from ``start`` on, until the tip or the end of a closed shard. After a
        sequence number, the first page is checked to start with that record (``check``).
        Given ``iterator`` (one at ``start``, a page's next), reads with it and checks nothing."""
        checking = check and start.kind is StartKind.AFTER_SEQUENCE_NUMBER
        if iterator is None:
            iterator, checking = self._open(shard_id, start, checking, on_lost)
        else:
            checking = False
        last_seen: str | None = None
        while iterator is not None:
            size = limit() if limit is not None else self._page_limit
            if self._pacer is not None:  # the size asked for: a page under it is not full
                size = self._pacer.page_limit(shard_id, size)
            page = self._read_retrying()(self._get_page, shard_id, iterator, size)
            if page is None:
                # iterators live 5 minutes: go on right after the last record seen
                resume = ShardStart.after(last_seen) if last_seen is not None else start
                iterator, checking = self._open(
                    shard_id, resume, checking and last_seen is None, on_lost
                )
                continue
            raw_records: list[dict[str, Any]] = page["Records"]
            iterator = page.get("NextShardIterator")
            ended = iterator is None
            tip = ended or (not raw_records and page.get("MillisBehindLatest", 0) == 0)
            records = raw_records
            if checking and (records or tip):
                records = self._checked(shard_id, start, records, on_lost)
                checking = False
            if raw_records:
                last_seen = str(raw_records[-1]["SequenceNumber"])
            caught_up = 0 < len(raw_records) < size and page.get("MillisBehindLatest") == 0
            yield _Page(records, tip=tip, ended=ended, caught_up=caught_up, next_iterator=iterator)
            if tip:
                return

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
            answer = self._call(
                "get_shard_iterator", StreamName=self.stream, ShardId=shard_id, **arguments
            )
        except StreamUnavailableError as exc:
            if not (checking and _code_of(exc.__cause__) == "InvalidArgumentException"):
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
        on_lost(self._lost(shard_id, start, _seen(records[0]) if records else None))
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

    def _iterator_at_timestamp(self, shard_id: str, start_ms: int) -> str | None:
        return self._call(  # type: ignore[no-any-return]
            "get_shard_iterator",
            StreamName=self.stream,
            ShardId=shard_id,
            ShardIteratorType="AT_TIMESTAMP",
            Timestamp=datetime.fromtimestamp(start_ms / 1000, tz=UTC),
        )["ShardIterator"]

    def _get_records(
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
        wanted = limit or self._page_limit
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
        return self._call(  # type: ignore[no-any-return]
            "get_shard_iterator", StreamName=self.stream, ShardId=shard_id, **kwargs
        )["ShardIterator"]

    def _read_retrying(self) -> Retrying:
        """Reads are idempotent: a throttled one is tried again, after a jittered backoff
        (0.4 s doubling to 5 s, half of it drawn), up to ``max_throttle_retries`` times. Other
        failures are raised at once: the SDK has retried them already."""

        def backoff_s(state: RetryCallState) -> float:
            return throttle_backoff_s(state.attempt_number, draw=self._jitter)

        return Retrying(
            retry=retry_if_exception_type(StreamThrottledError),
            wait=backoff_s,
            stop=stop_after_attempt(self._max_throttle_retries + 1),
            sleep=self._sleep,
            before_sleep=before_sleep_log(log, logging.INFO),
            reraise=True,
        )

    def _call(self, operation: str, **kwargs: Any) -> Any:
        return self._read_retrying()(self._call_once, operation, kwargs)

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


def utc_timestamp(value: Any) -> datetime:
    """A response's timestamp as the SDK parses it, but in UTC: Kinesis sends epoch seconds,
    and botocore's default parser converts each one to the local time zone through dateutil,
    which cost more than the rest of a 10,000-record page. Anything else goes to botocore's."""
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, tz=UTC)
    parsed: datetime = botocore.utils.parse_timestamp(value)
    return parsed


def _record_bytes(raw: dict[str, Any]) -> int:
    return len(raw.get("Data", b"")) + len(str(raw.get("PartitionKey", "")).encode())


def _seen(raw: dict[str, Any]) -> SeenRecord:
    return SeenRecord(
        str(raw["SequenceNumber"]), arrival_ms_of(raw.get("ApproximateArrivalTimestamp"))
    )


def _code_of(cause: BaseException | None) -> str | None:
    if isinstance(cause, botocore.exceptions.ClientError):
        return aws_error_code(cause)
    return None


def shard_of(raw: dict[str, Any]) -> Shard:
    """A shard as ListShards describes it."""
    hash_range = raw["HashKeyRange"]
    sequences = raw.get("SequenceNumberRange", {})
    return Shard(
        shard_id=raw["ShardId"],
        starting_hash_key=int(hash_range["StartingHashKey"]),
        ending_hash_key=int(hash_range["EndingHashKey"]),
        parent_shard_id=raw.get("ParentShardId"),
        adjacent_parent_shard_id=raw.get("AdjacentParentShardId"),
        starting_sequence_number=str(sequences.get("StartingSequenceNumber", "0")),
        ending_sequence_number=sequences.get("EndingSequenceNumber"),
    )
