"""``KinesisReader``: reads a stream back: its description, its shard map with lineage, a
shard's records in a time window, whole, or between two positions, deaggregated as a KCL
consumer sees them; a shard's tail; its records counted forward from a position.

Its calls are :class:`kinesis_store.shard_pages.ShardPages`': throttled reads tried again
after a jittered backoff, expired iterators renewed, botocore's errors translated once into
:mod:`kinesis_store.errors`, GetRecords paced when given a
:class:`kinesis_store.read_pacing.ReadPacer`; :meth:`KinesisReader.shard_reads` says what the
reads of a shard brought back (records, bytes, and how far behind the tip the last page was).
A count's first page may be read ahead of it (:meth:`KinesisReader.read_ahead`), on another
thread: a planner reads many shards' at once.
A shard's tail is :class:`kinesis_store.tail.TailSearch`'s to find. One reader may read
several shards on several threads at once (a planner looks for their tails together), never
one shard on two threads.

A read that goes on after a record already read (``AFTER_SEQUENCE_NUMBER``) first asks for
that record itself (``AT_SEQUENCE_NUMBER``): when the shard no longer holds it, it is past the
trim horizon and what came after it may be lost. The caller's ``on_lost`` decides: raise
(the default) or go on from the oldest record the shard still holds.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
import botocore.utils

from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from kinesis_store.errors import ShardPositionLostError, StreamUnavailableError
from kinesis_store.kpl import (
    MalformedAggregate,
    UserRecord,
    arrival_ms_of,
    deaggregate,
    user_record_count,
)
from kinesis_store.positions import Counted, SeenRecord, ShardStart, sequence_key
from kinesis_store.read_pacing import ReadPacer
from kinesis_store.shard_pages import Ahead, ShardPages, ShardReads, raise_lost
from kinesis_store.shards import Shard, StreamInfo
from kinesis_store.tail import TailSearch

__all__ = ["Ahead", "KinesisReader", "ShardReads", "shard_of", "stop_on_malformed", "utc_timestamp"]

log = logging.getLogger(__name__)


def stop_on_malformed(fault: MalformedAggregate) -> None:
    """An ``on_malformed`` that stops the read at a malformed aggregate, before any of its user
    records is given out, instead of going on as the KCL does."""
    raise fault.error()


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
        self._shard_pages = ShardPages(
            client,
            stream,
            sleep=sleep,
            max_throttle_retries=max_throttle_retries,
            page_limit=page_limit,
            pacer=pacer,
            jitter=jitter,
        )
        self._tail_search = TailSearch(self._shard_pages)

    @property
    def client(self) -> Any:
        """The botocore client, for event hooks (metrics, injected faults)."""
        return self._client

    @property
    def get_records_calls(self) -> int:
        """How many GetRecords calls this reader made."""
        return self._shard_pages.get_records_calls

    def shard_reads(self, shard_id: str) -> ShardReads:
        """What this reader's GetRecords calls on ``shard_id`` brought back so far."""
        return self._shard_pages.shard_reads(shard_id)

    def describe(self) -> StreamInfo:
        summary = self._shard_pages.call("describe_stream_summary", StreamName=self.stream)[
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
            page = self._shard_pages.call("list_shards", **kwargs)
            found.extend(shard_of(raw) for raw in page.get("Shards", []))
            token = page.get("NextToken")
            if not token:
                return found
            kwargs = {"NextToken": token}

    def read_window(
        self,
        shard_id: str,
        start_ms: int,
        end_ms: int,
        *,
        now_ms: Callable[[], int],
        on_no_later_record: Callable[[], object] = lambda: None,
    ) -> Iterator[UserRecord]:
        """User records that arrived in ``[start_ms, end_ms]``, read once from ``start_ms``.

        Stops at the first record that arrived after ``end_ms`` (the shard was still open
        then), at the tip once ``end_ms`` has passed, or at a closed shard's end. At the tip or
        the end ``on_no_later_record`` is called: nothing read proves the shard open after the
        window (a closed shard may answer an empty page at its tip before the page without a
        next iterator: kinesalite does, and Kinesis does not promise otherwise), and a closed
        shard's children hold what arrived after it closed. Arrival times are not monotonic,
        hence callers pad the window with the skew margin.
        """
        iterator = self._shard_pages.iterator_at_timestamp(shard_id, start_ms)
        last_sequence: str | None = None
        while iterator is not None:
            page, iterator = self._shard_pages.get_records(
                shard_id, iterator, last_sequence, start_ms
            )
            for raw in page["Records"]:
                last_sequence = str(raw["SequenceNumber"])
                arrival = arrival_ms_of(raw.get("ApproximateArrivalTimestamp"))
                if arrival > end_ms:
                    return
                yield from self._user_records(shard_id, raw)
            at_tip = not page["Records"] and page.get("MillisBehindLatest", 0) == 0
            if iterator is not None and at_tip:
                if now_ms() > end_ms:
                    break
                self._sleep(0.2)  # the window is still open: wait for late arrivals
        on_no_later_record()

    def read_all(self, shard_id: str) -> Iterator[UserRecord]:
        """Every user record of a shard from TRIM_HORIZON to its end (closed) or the tip."""
        iterator: str | None = self._shard_pages.call(
            "get_shard_iterator",
            StreamName=self.stream,
            ShardId=shard_id,
            ShardIteratorType="TRIM_HORIZON",
        )["ShardIterator"]
        last_sequence: str | None = None
        while iterator is not None:
            page, iterator = self._shard_pages.get_records(shard_id, iterator, last_sequence, None)
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
        for page in self._shard_pages.pages(shard_id, start, on_lost=on_lost):
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
        closed: bool = False,
        ahead: Ahead | None = None,
    ) -> Counted:
        """Reads forward from ``start`` (to ``through`` at most, inclusive) and takes whole
        Kinesis records while their user records fit in ``max_user_records``; a first record
        that holds more is taken alone when it holds at most ``oversized_up_to`` (None: however
        many; by default it is not taken). GetRecords is asked for no more records than are
        still wanted; ``ahead`` is the count's first page, read before (:meth:`read_ahead`).

        The count stops at a page that caught up with the shard's tip (:attr:`Page.caught_up`:
        short of what was asked, 0 ms behind): what arrives after it is the next count's, and a
        shard with nothing new costs one GetRecords. A ``closed`` shard is read on to the page
        that says it ended (on kinesalite, and maybe on Kinesis, the page after its last
        record): only that finishes it, and its children wait for it."""
        taken = 0
        last: SeenRecord | None = None

        def wanted() -> int:
            return self._page_size(max_user_records - taken)

        pages = self._shard_pages.pages(shard_id, start, on_lost=on_lost, limit=wanted, ahead=ahead)
        for page in pages:
            at_tip = page.tip or (page.caught_up and not closed)
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
                if taken >= max_user_records and not (at_page_end and at_tip):
                    return Counted(last, taken, ended=False, full=True)
            if at_tip:
                return Counted(last, taken, ended=page.ended, full=False)
        return Counted(last, taken, ended=False, full=False)

    def read_ahead(
        self,
        shard_id: str,
        start: ShardStart,
        *,
        max_user_records: int,
        on_lost: Callable[[ShardPositionLostError], None] = raise_lost,
    ) -> Ahead:
        """The first page :meth:`count_forward` from ``start`` reads for ``max_user_records``
        (or fewer), read now, maybe on another thread, for the count to begin with: a planner
        reads many shards' first pages at once, each paced to its own shard."""
        return self._shard_pages.read_ahead(
            shard_id, start, limit=self._page_size(max_user_records), on_lost=on_lost
        )

    def _page_size(self, user_records: int) -> int:
        """The records a count asks one page for while it still wants ``user_records``: at
        least one, a page at most (a record holds at least one user record)."""
        return max(1, min(self._shard_pages.page_limit, user_records))

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
            self._shard_pages.count_malformed(shard_id)
            if self._on_malformed is not None:
                self._on_malformed(fault)
        return read.records

    def tail(
        self, shard_id: str, start: ShardStart, *, now_ms: int, margin_ms: int
    ) -> SeenRecord | None:
        """The last record the shard holds after ``start``; None when it holds nothing after it.

        Found without reading the shard whole (:class:`kinesis_store.tail.TailSearch`): a start
        after a record is read on from first, then windows back from now, each wider than the
        last, are read (``margin_ms`` covers arrival times out of order).
        """
        return self._tail_search.tail(shard_id, start, now_ms=now_ms, margin_ms=margin_ms)


def utc_timestamp(value: Any) -> datetime:
    """A response's timestamp as the SDK parses it, but in UTC: Kinesis sends epoch seconds,
    and botocore's default parser converts each one to the local time zone through dateutil,
    which cost more than the rest of a 10,000-record page. Anything else goes to botocore's."""
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, tz=UTC)
    parsed: datetime = botocore.utils.parse_timestamp(value)
    return parsed


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
