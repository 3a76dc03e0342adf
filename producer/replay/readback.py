"""Replay mode's read-back: which of an attempt's rows the stream already holds.

A row is ``(key, data)``, counted: a record read back matches a row when its partition key is
the row's key and its data the row's data, and each record matches one row at most. Records are
kept by identity (the key and a 16-byte digest of the data, never the payload) with their
positions, oldest first.

::

    EarlierPuts(windows of the earlier attempts)        recovery (producer.replay.producer)
      ├─ match(rows) ── reads each shard the rows route to (lineage), once, over every window;
      │                 takes one found record per row, or None: left to send
      ├─ read_again() ─ once the earlier leases are over: the reads are final; what was taken
      │                 stays taken
      ├─ positions() ── every record read: an attempt's own read-back must not count them
      └─ possibly_others(excluding) ── the matches with an identical record left beside them

    read_rows(rows, window, excluding, since_ms)        an ambiguous put of the attempt itself:
                                                        each row matched only from its own
                                                        request's send time minus the skew

A row is routed to the shards its hash key's lineage went through (the stream listed, closed
shards included), or, for puts sent after a listing of the open shards (``listed_before``: a
Spark write's driver lists before its tasks start; a task retry and an attempt's own read-back
look only for its execution's puts), to the listed shard that covers it: a read that stops at
a record past the windows proves that shard open through them, and nothing is listed; one that
stops at the shard's end or at its tip proves nothing (an empty page at a closed shard's tip
can come before its end), and the rows are routed by the stream's listing from then on.

Only KCL-visible records count (an aggregate's user record outside its shard's hash range is
dropped by every consumer: it was not delivered), and only those that arrived inside a window.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from dedupe_store.clock import Clock
from dedupe_store.records import Position, row_tag
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import Shard, kcl_view, lineage
from producer import metrics
from producer.protocol import PreparedMessage
from producer.replay.plan import match_since, possibly_others
from producer.replay.shared_reads import RecordRead, shared_by

__all__ = [
    "EarlierPuts",
    "FoundRows",
    "RowId",
    "RowsRead",
    "read_rows",
    "records_in",
    "row_id",
    "row_tag_of",
]

log = logging.getLogger(__name__)

RowId = tuple[str, bytes]  # the key, and a digest of the data


def row_id(key: str, data: bytes) -> RowId:
    """A row's identity: its key, and its data's 16-byte BLAKE2b digest."""
    return key, hashlib.blake2b(data, digest_size=16).digest()


def _id_of(item: PreparedMessage) -> RowId:
    return row_id(item.key, item.message.data)


def row_tag_of(item: PreparedMessage) -> str:
    """The row's tag on a run's item (:func:`dedupe_store.records.row_tag`)."""
    return row_tag(*_id_of(item))


@dataclass(slots=True)
class FoundRows:
    """Records read back, by row identity, each with its position; taken once each."""

    by_row: dict[RowId, deque[Position]] = field(default_factory=lambda: defaultdict(deque))
    # each record's arrival (epoch ms), when the reader asked for them (None: not kept)
    arrival_ms: dict[Position, int] | None = None

    def add(self, row: RowId, position: Position, arrival_ms: int) -> None:
        self.by_row[row].append(position)
        if self.arrival_ms is not None:
            self.arrival_ms[position] = arrival_ms

    def take(self, row: RowId) -> Position | None:
        """The oldest record of ``row`` not taken yet, now taken; None when none is left."""
        found = self.by_row.get(row)
        return found.popleft() if found else None

    def drop(self, taken: set[Position]) -> None:
        """Forget the records at ``taken`` (taken before these were read again)."""
        for row, positions in self.by_row.items():
            self.by_row[row] = deque(p for p in positions if p not in taken)


def _shards_of(hash_keys: Iterable[int], shards: Sequence[Shard]) -> set[str]:
    """Every shard of ``shards``, open or closed, whose hash range covers one of
    ``hash_keys``."""
    return {shard.shard_id for hash_key in hash_keys for shard in lineage(shards, hash_key)}


def _hash_keys(items: Iterable[PreparedMessage]) -> set[int]:
    return {int(item.explicit_hash_key) for item in items}


def records_in(
    reader: KinesisReader,
    shard: Shard,
    windows: Sequence[tuple[int, int]],
    now_ms: int,
    *,
    keep_alive: Callable[[], object] = lambda: None,
    on_no_later_record: Callable[[], object] = lambda: None,
) -> Iterator[RecordRead]:
    """The shard's KCL-visible records that arrived in one of ``windows``, read up to
    ``now_ms`` (never waiting for the future: the caller knows whether more may land).
    ``keep_alive`` is called before each window and each record (it must be cheap: a clock
    reading and a comparison, but when a lease runs short): a read of a long window outlasts a
    lease, and pages come as fast as GetRecords answers. ``on_no_later_record``: called when a
    read met no record past its window (:meth:`KinesisReader.read_window`: the shard may have
    closed, and its children hold what arrived later)."""
    for start_ms, end_ms in windows:
        keep_alive()
        if start_ms > now_ms:
            continue
        end = min(end_ms, now_ms)

        def closed(end: int = end) -> int:
            return end + 1  # a read of what has arrived: the caller knows what may still land

        read = reader.read_window(
            shard.shard_id, start_ms, end, now_ms=closed, on_no_later_record=on_no_later_record
        )
        for record, delivered in kcl_view(read, shard):
            keep_alive()
            if not start_ms <= record.arrival_ms <= end:
                continue
            if not delivered:
                # a stray aggregate: written, never delivered to a KCL consumer
                metrics.READ_DROPPED.labels(reader.stream, metrics.DROPPED_OUTSIDE_SHARD).inc()
                continue
            position = Position(record.shard_id, record.sequence_number, record.sub_sequence_number)
            yield row_id(record.partition_key, record.data), position, record.arrival_ms


def _read_shard(
    reader: KinesisReader,
    shard: Shard,
    windows: Sequence[tuple[int, int]],
    now_ms: int,
    into: FoundRows,
    *,
    wanted: Callable[[RowId], bool] | None = None,
    on_no_later_record: Callable[[], object] = lambda: None,
) -> None:
    """The shard's records in ``windows`` (:func:`records_in`) of the ``wanted`` rows."""
    records = records_in(reader, shard, windows, now_ms, on_no_later_record=on_no_later_record)
    for row, position, arrival_ms in records:
        if wanted is None or wanted(row):
            into.add(row, position, arrival_ms)


class EarlierPuts:
    """What the earlier attempts of a run put on the shards this attempt's rows route to.

    Each shard is read once, when the first row routed to it is matched, over every earlier
    window (merged: :func:`producer.replay.plan.read_windows`). ``final`` says whether the
    reads can still miss a put: False while an earlier lease runs (found rows are sure, rows
    not found are not), True once every earlier lease is over for every clock.
    ``keep_alive``: called while a read goes on (the attempt keeps its lease with it).
    ``before_read``: called with the clock's reading before each shard is read (reads come
    later than the plan, and again after a wait: the attempt checks the windows are still in
    the stream's retention, and raises when they are not).

    The shards are routed by the stream's listing, closed shards included (a row's lineage),
    or by ``listed_before``: the open shards listed before every earlier put was sent (the
    driver's listing shipped with the write, when the earlier attempts are of this execution:
    a task retry). A put sent since is on the shard that listing routes its row to, unless
    that shard closed first. A read that meets a record past the windows proves its shard was
    open through them; one that ends at the shard's tip or end proves nothing, and the rows
    are routed by the stream's listing from then on (:class:`_Routing`)."""

    def __init__(
        self,
        reader: KinesisReader,
        clock: Clock,
        windows: Sequence[tuple[int, int]],
        *,
        final: bool,
        skew_ms: int = 0,
        keep_alive: Callable[[], object] = lambda: None,
        before_read: Callable[[int], object] = lambda _now_ms: None,
        listed_before: Sequence[Shard] | None = None,
    ) -> None:
        self._reader = reader
        self._shared = shared_by(reader)
        self._skew_ms = skew_ms
        self._keep_alive = keep_alive
        self._before_read = before_read
        self._clock = clock
        self._windows = list(windows)
        self.final = final
        until_ms = max((end_ms for _, end_ms in self._windows), default=0)
        self._routing = _Routing(
            listed_before,
            lambda: self._shared.shard_map(reader, clock, until_ms=until_ms, skew_ms=self._skew_ms),
        )
        self._read: set[str] = set()
        self._found = FoundRows()
        self._taken: set[Position] = set()
        self._taken_rows: Counter[RowId] = Counter()
        self.rows_found = 0

    @property
    def get_records_calls(self) -> int:
        return self._reader.get_records_calls

    def match(self, items: Sequence[PreparedMessage]) -> list[Position | None]:
        """Per item, in order: the position of a found record of its row (taken), or None."""
        self._read_routed(_hash_keys(items))
        matched: list[Position | None] = []
        for item in items:
            row = _id_of(item)
            position = self._found.take(row)
            if position is not None:
                self._taken.add(position)
                self._taken_rows[row] += 1
                self.rows_found += 1
            matched.append(position)
        return matched

    def possibly_others(self, excluding: set[Position]) -> int:
        """How many rows matched so far could be another writer's copy: those of a row of which
        an identical record read in the windows is left unmatched (not at a position in
        ``excluding``: this attempt's own records) —
        :func:`producer.replay.plan.possibly_others`. Final once the attempt matched all its
        rows: a later call may still take a record left now."""
        left = Counter(
            {
                row: sum(1 for p in self._found.by_row.get(row, ()) if p not in excluding)
                for row in self._taken_rows
            }
        )
        return possibly_others(self._taken_rows, left)

    def read_again(self) -> None:
        """Read every shard read so far again, now that no earlier put can still land: the
        reads become final. Records taken before stay taken."""
        self.final = True
        self._routing.listed_again()
        shards, self._read = self._read, set()
        self._found = FoundRows()
        self._read_shards(shards)
        self._reroute_if_unproven()
        self._found.drop(self._taken)

    def _read_routed(self, hash_keys: set[int]) -> None:
        """Read the shards ``hash_keys`` route to that were not read yet."""
        self._read_shards(self._routing.shards_of(hash_keys) - self._read)
        self._reroute_if_unproven()

    def _reroute_if_unproven(self) -> None:
        """When a shard routed by the listing made before the puts was not proven open: read
        every shard the rows so far route to by the stream's listing (its children among
        them) that was not read yet."""
        if self._routing.reroute():
            log.info(
                "replay read-back could not prove the write's listing enough (a shard read to "
                "its tip or end): routing by the stream's listing stream=%s",
                self._reader.stream,
            )
            self._read_shards(self._routing.shards_of_all() - self._read)

    def _read_shards(self, shard_ids: set[str]) -> None:
        by_id = {shard.shard_id: shard for shard in self._routing.shards()}
        for shard_id in sorted(shard_ids):
            now_ms = self._clock.now_ms()
            self._before_read(now_ms)
            for row, position, arrival_ms in self._records(by_id[shard_id], now_ms):
                self._found.add(row, position, arrival_ms)
            self._read.add(shard_id)

    def _records(self, shard: Shard, now_ms: int) -> list[RecordRead]:
        """The shard's records in the windows: read now, or, once the reads are final and
        every window ended before now (plus the skew), as this process read them before
        (:mod:`producer.replay.shared_reads`: a replayed batch's tasks in one worker read
        each shard once). A read routed by the listing made before the puts is always made:
        it is what proves the shard stayed open."""

        # a read that is not final finds what is sure (a row it misses is waited for and read
        # again, finally): only a final read must prove the listing made before the puts enough
        unproven = self._routing.unproven if self.final else lambda: None

        def read() -> list[RecordRead]:
            return list(
                records_in(
                    self._reader,
                    shard,
                    self._windows,
                    now_ms,
                    keep_alive=self._keep_alive,
                    on_no_later_record=unproven,
                )
            )

        ended = all(end_ms + self._skew_ms < now_ms for _, end_ms in self._windows)
        if not (self.final and ended) or self._routing.before_puts:
            return read()
        return self._shared.records(shard.shard_id, self._windows, read)

    def positions(self) -> set[Position]:
        """Every record read, taken or not: an attempt's own read-back must not count them."""
        return {p for rows in self._found.by_row.values() for p in rows} | self._taken


class _Routing:
    """Which shards a read-back's rows route to: by ``listed_before`` (the open shards listed
    before every put looked for was sent) while every shard read by it is proved open
    through the windows, else by ``listing()`` (the stream's shards, closed ones included:
    each row's lineage). Only a read that meets a record past the windows proves its shard
    open through them; one that ends at the shard's end or at its tip (:meth:`unproven`: a
    closed shard can answer an empty page at its tip before its end) leaves it unproven, and
    a hash key no listed shard covers proves the listing incomplete. The hash keys routed so
    far are kept: once routed by the listing, every row is routed again by it."""

    def __init__(
        self, listed_before: Sequence[Shard] | None, listing: Callable[[], list[Shard]]
    ) -> None:
        self._before = list(listed_before) if listed_before is not None else None
        self._listing = listing
        self._shards: list[Shard] | None = None
        self._hash_keys: set[int] = set()
        self._not_enough = False  # the listing made before the puts is not enough

    @property
    def before_puts(self) -> bool:
        """Whether the rows are routed by the listing made before the puts."""
        return self._before is not None

    def shards(self) -> list[Shard]:
        if self._before is not None:
            return self._before
        if self._shards is None:
            self._shards = self._listing()
        return self._shards

    def shards_of(self, hash_keys: set[int]) -> set[str]:
        """The shards ``hash_keys`` route to (kept: :meth:`shards_of_all`)."""
        self._hash_keys |= hash_keys
        shards = self.shards()
        routed: set[str] = set()
        for hash_key in hash_keys:
            covering = lineage(shards, hash_key)
            if not covering:
                self._not_enough = True
            routed.update(shard.shard_id for shard in covering)
        return routed

    def shards_of_all(self) -> set[str]:
        """The shards every hash key routed so far routes to."""
        return _shards_of(self._hash_keys, self.shards())

    def unproven(self) -> None:
        """A read met no record past the windows: its shard may have closed before a put
        looked for was sent."""
        self._not_enough = True

    def reroute(self) -> bool:
        """Whether the listing made before the puts turned out not to be enough (a shard it
        routed to not proven open, or a hash key it does not cover): the rows are routed by
        the stream's listing from now on (True once, as that switches)."""
        if self._before is None or not self._not_enough:
            return False
        self._before = None
        return True

    def listed_again(self) -> None:
        """The next routing by the stream's listing lists it again (a wait went by)."""
        self._shards = None


@dataclass(frozen=True, slots=True)
class RowsRead:
    """What :func:`read_rows` found: per item, in order, a position or None; and how many of
    those matches could be another writer's copy (:func:`producer.replay.plan.possibly_others`)."""

    positions: list[Position | None]
    possibly_others: int


def read_rows(
    reader: KinesisReader,
    clock: Clock,
    items: Sequence[PreparedMessage],
    window: tuple[int, int],
    *,
    excluding: set[Position],
    since_ms: Sequence[int] | None = None,
    listed_before: Sequence[Shard] | None = None,
) -> RowsRead:
    """Per item, in order: the position of a record of its row in ``window`` on the shards
    it routes to, none of them at a position in ``excluding`` (records known to be others'
    or already matched), each record matched once; None when not found. ``since_ms``: per
    item, the earliest arrival its put can have (its request's send time minus the skew):
    an identical record that arrived before it is another writer's, never matched to it.
    ``listed_before``: the open shards listed before the items' puts were sent (routed by
    it, without a listing, while each shard read proves open: :class:`EarlierPuts`)."""
    wanted = {_id_of(item) for item in items}
    found = FoundRows(arrival_ms={})
    routing = _Routing(listed_before, reader.shards)
    read: set[str] = set()

    def read_shards(shard_ids: set[str]) -> None:
        by_id = {shard.shard_id: shard for shard in routing.shards()}
        for shard_id in sorted(shard_ids - read):
            _read_shard(
                reader,
                by_id[shard_id],
                [window],
                clock.now_ms(),
                found,
                wanted=wanted.__contains__,
                on_no_later_record=routing.unproven,
            )
            read.add(shard_id)

    read_shards(routing.shards_of(_hash_keys(items)))
    if routing.reroute():
        read_shards(routing.shards_of_all())
    found.drop(excluding)
    arrival_ms = found.arrival_ms or {}
    starts = since_ms if since_ms is not None else [window[0]] * len(items)
    positions, others = match_since(
        [(_id_of(item), start) for item, start in zip(items, starts, strict=True)],
        {row: [(arrival_ms[p], p) for p in records] for row, records in found.by_row.items()},
    )
    return RowsRead(positions, others)
