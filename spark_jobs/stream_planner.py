"""The driver's side of ``spark.readStream.format("keo")``: where a new query starts, where
each batch ends, and the ranges a batch reads, over an injected
:class:`kinesis_store.reader.KinesisReader` and clock (no pyspark; Spark's glue is
:mod:`spark_jobs.stream_reader`).

A batch's end is fixed here, before the batch runs, as a sequence number per shard (or "to
its end" for a closed shard), and Spark logs it in the checkpoint; the executors read up to
it and no further, so a replayed batch reads the same records:

- without a limit, the end of an open shard is its tail: the last record it holds, found by
  reading its last seconds (:meth:`KinesisReader.tail`); a closed shard is read to its end;
- with a limit (``max_records_per_trigger``, ``max_records_per_shard_per_trigger``), the
  driver counts user records forward from the start to find the record where the limit falls
  (:meth:`KinesisReader.count_forward`). That reads those records twice, once here and once on
  an executor: the price of a bounded batch. Records are counted as user records (a KPL
  aggregate counts what it holds) and batches are cut at whole Kinesis records, so a batch
  holds at most the limit, except that an aggregate holding more than the limit is read
  whole, alone. The budget is shared among the shards in rounds starting at the offset's turn
  (:func:`spark_jobs.stream_offsets.allot`), so every shard with a backlog moves within as
  many batches as there are shards, whatever the limit and the aggregates' sizes;
- under ``Trigger.AvailableNow`` (:meth:`StreamPlanner.freeze`), each shard's tail when the
  query started is its last end: records written later wait for the next run.

Shards are read at once (up to ``READS_AT_ONCE``): tails are looked for on every shard
together, and a bounded batch's counts, taken one after another as the budget needs, begin
with a first page read ahead with those of the next shards (:class:`_Counts`). Each read is a
few GetRecords calls paced to its own shard's 5 calls a second, so one shard after another
would make a batch's planning as slow as the sum of its shards (a bounded query with nothing
new: 68 s a trigger at 256 shards, a shard's count a fifth of a second).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Final

from dedupe_store.clock import Clock
from kinesis_store.errors import ShardPositionLostError
from kinesis_store.positions import SeenRecord, ShardStart
from kinesis_store.reader import Ahead, KinesisReader
from kinesis_store.shards import Shard
from spark_jobs.stream_offsets import (
    ShardProgress,
    ShardRange,
    StartingPosition,
    StartingPositionKind,
    StreamOffset,
    Taken,
    allot,
    missing_from,
    plan,
    readable,
    with_listing,
)

__all__ = [
    "IDLE_POLL_MS",
    "READS_AT_ONCE",
    "Budget",
    "StreamPlanner",
    "lost_records_policy",
]

log = logging.getLogger(__name__)

# Shards a planning reads at once (tail searches, counts' first pages): a read client holds
# 16 connections
READS_AT_ONCE: Final = 16
# A query that found nothing new looks again after this long, not at every trigger: Spark's
# default trigger asks again at once, and each look lists the shards and reads every shard's
# tail (64 shards idle: about 3.7 GetRecords and 3.7 GetShardIterator a second on every shard,
# four fifths of the 5 calls a second a shard serves all its consumers). A second, as the
# KCL's polling consumer waits between reads of an idle shard (idleTimeBetweenReadsInMillis).
IDLE_POLL_MS: Final = 1000

LOST_HINT = (
    "format('keo'): fail_on_data_loss=false goes on from the oldest record the shard still "
    "holds (what was lost is not read); the default stops the query"
)


def _on_lost(fail: bool, error: ShardPositionLostError) -> None:
    if fail:
        error.add_note(LOST_HINT)
        raise error
    log.warning(
        "records lost stream=%s shard=%s after=%s first_kept=%s: going on "
        "(fail_on_data_loss=false)",
        error.stream,
        error.shard_id,
        error.sequence_number,
        error.first_sequence_number,
    )


def lost_records_policy(fail: bool) -> Callable[[ShardPositionLostError], None]:
    """What a read does when its position is past the trim horizon: raise (``fail``), or
    log it and go on. Picklable: the executors get it with their partition's reader."""
    return partial(_on_lost, fail)


@dataclass(frozen=True, slots=True)
class Budget:
    """How many user records one batch may read: in all, and per shard (None: no bound)."""

    total: int | None
    per_shard: int | None


@dataclass(frozen=True, slots=True)
class _Cap:
    """A shard's last end under ``Trigger.AvailableNow``: its tail when the query started
    (None: it held nothing), or its end when it was closed already."""

    tail: SeenRecord | None
    closed: bool


class StreamPlanner:
    """Offsets and plans for one streaming query; one per driver-side reader."""

    def __init__(
        self,
        reader: KinesisReader,
        clock: Clock,
        *,
        starting_position: StartingPosition,
        fail_on_data_loss: bool,
        margin_ms: int,
        idle_poll_ms: int = IDLE_POLL_MS,
    ) -> None:
        self._reader = reader
        self._idle_poll_ms = idle_poll_ms
        # the start a look found nothing new after, and when: asked again sooner, it stays put
        self._idle: tuple[StreamOffset, int] | None = None
        self._clock = clock
        self._starting_position = starting_position
        self._on_lost = lost_records_policy(fail_on_data_loss)
        self._margin_ms = margin_ms
        self._listed: dict[str, Shard] = {}
        self._caps: dict[str, _Cap] | None = None
        self.lags_ms: dict[str, int] = {}

    @property
    def stream(self) -> str:
        return self._reader.stream

    def parse(self, raw: dict[str, object]) -> StreamOffset:
        return StreamOffset.parse(raw, stream=self.stream)

    # --- offsets ---------------------------------------------------------------------------

    def initial(self) -> StreamOffset:
        """Where a new query starts: every shard listed, at the starting position. ``latest``
        is fixed now as each open shard's tail (closed shards are finished: nothing will be
        written to them), so the first batch does not depend on when its tasks run."""
        listed = self._list()
        offset, _ = with_listing(StreamOffset(self.stream, {}), listed)
        position = self._starting_position
        if position.kind is StartingPositionKind.AT_TIMESTAMP:
            at = ShardProgress(at_ms=position.timestamp_ms)
            return offset.with_progress(dict.fromkeys(offset.shards, at))
        if position.kind is StartingPositionKind.LATEST:
            opened = [shard for shard in listed if not shard.closed]
            tails = self._tails({s.shard_id: ShardStart.trim_horizon() for s in opened})
            return offset.with_progress(
                {
                    shard.shard_id: ShardProgress(finished=True)
                    if shard.closed
                    else ShardProgress().advanced_to(tails[shard.shard_id])
                    for shard in listed
                }
            )
        return offset

    def freeze(self) -> None:
        """``Trigger.AvailableNow``: every shard's end as it is now is the last one this run
        reads (shards that appear later wait for the next run)."""
        listed = self._list()
        tails = self._tails(
            {shard.shard_id: ShardStart.trim_horizon() for shard in listed if not shard.closed}
        )
        self._caps = {
            shard.shard_id: _Cap(None, closed=True)
            if shard.closed
            else _Cap(tails[shard.shard_id], closed=False)
            for shard in listed
        }

    def latest(self, start: StreamOffset, budget: Budget | None) -> StreamOffset:
        """The end of the next batch: ``start`` moved on by every shard that may be read now
        (its parents finished), as far as the budget allows; equal to ``start`` when there
        is nothing new. ``lags_ms`` then holds how far behind its tail each open shard's start
        was (:meth:`ShardProgress.millis_behind`), for the shards whose tail this planning
        knew (no budget, or an AvailableNow run's) and whose start has a time.

        A query that found nothing new after ``start`` less than ``idle_poll_ms`` ago stays
        put without asking Kinesis (not an AvailableNow run: its ends are fixed)."""
        now_ms = self._clock.now_ms()
        idle = self._idle
        if idle is not None and idle[0] == start and now_ms - idle[1] < self._idle_poll_ms:
            return start
        end = self._latest(start, budget)
        self._idle = (start, now_ms) if end == start and self._caps is None else None
        return end

    def _latest(self, start: StreamOffset, budget: Budget | None) -> StreamOffset:
        self.lags_ms = {}
        listed = self._list()
        offset, gone = with_listing(start, listed)
        for shard_id in gone:
            self._on_lost(self._gone(shard_id, start.progress(shard_id)))
        shards = [
            s for s in readable(offset, listed) if self._caps is None or s.shard_id in self._caps
        ]
        if budget is None:
            return offset.with_progress(self._ends(shards, offset))
        ends, turn = self._counted(shards, offset, budget)
        return offset.with_progress(ends, turn=turn)

    def ranges(self, start: StreamOffset, end: StreamOffset) -> list[ShardRange]:
        """What a batch reads: a pure function of its two offsets, given the shards' hash
        ranges (listed again only when a shard is not known yet, as after a restart)."""
        if any(shard_id not in self._listed for shard_id in end.shards):
            self._list()
        for shard_id in missing_from(start, end, self._listed):
            self._on_lost(self._gone(shard_id, start.progress(shard_id)))
        return plan(start, end, self._listed)

    # --- inside ----------------------------------------------------------------------------

    def _list(self) -> list[Shard]:
        shards = self._reader.shards()
        self._listed = {shard.shard_id: shard for shard in shards}
        return shards

    def _tails(self, starts: Mapping[str, ShardStart]) -> dict[str, SeenRecord | None]:
        """Each shard's tail after its start (:meth:`KinesisReader.tail`), all looked for at
        once, as of one moment."""
        now_ms = self._clock.now_ms()

        def tail(shard_id: str) -> SeenRecord | None:
            return self._reader.tail(
                shard_id, starts[shard_id], now_ms=now_ms, margin_ms=self._margin_ms
            )

        if len(starts) <= 1:
            return {shard_id: tail(shard_id) for shard_id in starts}
        with ThreadPoolExecutor(
            min(len(starts), READS_AT_ONCE), thread_name_prefix="keo-tail"
        ) as pool:
            return dict(zip(starts, pool.map(tail, starts), strict=True))

    def _ends(self, shards: Sequence[Shard], offset: StreamOffset) -> dict[str, ShardProgress]:
        """Each shard's end with no budget: a closed shard's end, the cap of an AvailableNow
        run, or else its tail now."""
        ends: dict[str, ShardProgress] = {}
        searched: dict[str, ShardStart] = {}
        for shard in shards:
            progress = offset.progress(shard.shard_id)
            cap = self._caps.get(shard.shard_id) if self._caps is not None else None
            if shard.closed and (cap is None or cap.closed):
                ends[shard.shard_id] = progress.advanced_to(None, finished=True)  # to its end
            elif cap is not None:
                ends[shard.shard_id] = progress.advanced_to(cap.tail)
                self._lag(shard.shard_id, progress, cap.tail)
            else:
                searched[shard.shard_id] = progress.start
        for shard_id, tail in self._tails(searched).items():
            ends[shard_id] = offset.progress(shard_id).advanced_to(tail)
            self._lag(shard_id, offset.progress(shard_id), tail)
        return {shard.shard_id: ends[shard.shard_id] for shard in shards}

    def _lag(self, shard_id: str, progress: ShardProgress, tail: SeenRecord | None) -> None:
        behind_ms = progress.millis_behind(tail)
        if behind_ms is not None:
            self.lags_ms[shard_id] = behind_ms

    def _counted(
        self, shards: Sequence[Shard], offset: StreamOffset, budget: Budget
    ) -> tuple[dict[str, ShardProgress], str | None]:
        """Each shard's end within the budget (:func:`allot`, from the offset's turn), and the
        next batch's turn."""
        pool = ThreadPoolExecutor(
            max(1, min(len(shards), READS_AT_ONCE)), thread_name_prefix="keo-count"
        )
        try:
            counts = _Counts(
                self._reader, shards, offset, caps=self._caps, on_lost=self._on_lost, pool=pool
            )
            turn = allot(
                [shard.shard_id for shard in shards],
                budget.total,
                budget.per_shard,
                counts.take,
                turn=offset.turn,
                on_round=counts.offered,
            )
        finally:  # reads ahead for takes the budget did not reach: dropped, or let finish
            pool.shutdown(wait=True, cancel_futures=True)
        return counts.progress, turn

    def _gone(self, shard_id: str, progress: ShardProgress) -> ShardPositionLostError:
        return ShardPositionLostError(
            stream=self.stream,
            shard_id=shard_id,
            sequence_number=None,
            since_ms=progress.after_ms,
            first_sequence_number=None,
            first_arrival_ms=None,
        )


class _Counts:
    """A bounded batch's counts, taken as :func:`allot` offers them: each shard's end counted
    forward from its start (:meth:`KinesisReader.count_forward`).

    The takes go one after another, as the budget needs; their reads need not. A take begins
    reading ahead its shard's first page and those of the next ``READS_AT_ONCE - 1`` shards of
    the round (:meth:`KinesisReader.read_ahead`, each sized to the most the round may offer
    its shard, each paced to its shard), and its count begins with its own: a shard with
    nothing new costs one GetRecords, and S of them the time of S / 16. A page read ahead for
    a take the budget does not reach is not used (at most ``READS_AT_ONCE - 1`` a batch)."""

    def __init__(
        self,
        reader: KinesisReader,
        shards: Sequence[Shard],
        offset: StreamOffset,
        *,
        caps: Mapping[str, _Cap] | None,
        on_lost: Callable[[ShardPositionLostError], None],
        pool: ThreadPoolExecutor,
    ) -> None:
        self._reader = reader
        self._shards = {shard.shard_id: shard for shard in shards}
        self._caps = caps
        self._on_lost = on_lost
        self._pool = pool
        self.progress = {shard_id: offset.progress(shard_id) for shard_id in self._shards}
        self._round: list[tuple[str, int]] = []  # the round's offers that may read, in order
        self._places: dict[str, int] = {}  # a shard's place in the round
        self._ahead: dict[str, Future[Ahead]] = {}

    def offered(self, offers: Mapping[str, int]) -> None:
        """A round begins: it may offer each shard this many user records at most, in order."""
        self._round = [
            (shard_id, most) for shard_id, most in offers.items() if self._may_move(shard_id)
        ]
        self._places = {shard_id: place for place, (shard_id, _) in enumerate(self._round)}

    def take(self, shard_id: str, share: int, whole_up_to: int | None) -> Taken:
        """:func:`allot`'s ``take``: the shard's next ``share`` counted, its progress moved."""
        current = self.progress[shard_id]
        if not self._may_move(shard_id):
            return Taken(0, more=False)
        self._read_ahead_from(shard_id)
        ahead = self._ahead.pop(shard_id, None)
        counted = self._reader.count_forward(
            shard_id,
            current.start,
            max_user_records=share,
            through=self._through(shard_id),
            oversized_up_to=whole_up_to,
            on_lost=self._on_lost,
            closed=self._shards[shard_id].closed,
            ahead=None if ahead is None else ahead.result(),
        )
        self.progress[shard_id] = current.advanced_to(counted.last, finished=counted.ended)
        return Taken(counted.user_records, more=counted.full)

    def _cap(self, shard_id: str) -> _Cap | None:
        return self._caps.get(shard_id) if self._caps is not None else None

    def _may_move(self, shard_id: str) -> bool:
        """Whether an AvailableNow run's cap leaves the shard anything to read."""
        cap = self._cap(shard_id)
        if cap is None or cap.closed:
            return True
        tail = cap.tail
        return tail is not None and self.progress[shard_id].start.is_before(tail.sequence_number)

    def _through(self, shard_id: str) -> str | None:
        """The last record an AvailableNow run reads of the shard (None: no cap, or to its end)."""
        cap = self._cap(shard_id)
        if cap is None or cap.closed or cap.tail is None:
            return None
        return cap.tail.sequence_number

    def _read_ahead_from(self, shard_id: str) -> None:
        """Begins reading the first pages of ``shard_id``'s count and of the shards after it
        in the round, ``READS_AT_ONCE`` in all (those begun already go on)."""
        place = self._places.get(shard_id)
        if place is None:
            return
        for next_id, most in self._round[place : place + READS_AT_ONCE]:
            if next_id not in self._ahead:
                self._ahead[next_id] = self._pool.submit(
                    self._reader.read_ahead,
                    next_id,
                    self.progress[next_id].start,
                    max_user_records=most,
                    on_lost=self._on_lost,
                )
