"""What the replay attempts of one process share of their recovery reads: the shard map, and
each shard's records in windows that can no longer change.

A Spark Python worker runs a batch's tasks one after another with one client set: a replayed
batch of T tasks in W workers read each shard's earlier windows once per task (T times), and
listed the shards once per task, against a shard's 5 ``GetRecords`` calls a second shared
with every consumer and ListShards' 100 calls a second per stream. Kept per reader (one per
worker process and settings), they are read about once per worker::

    shard_map(until_ms)      a map listed once the clock was past ``until_ms`` (plus the skew)
                             holds every shard a record that arrived by then can be on (a
                             shard created after the listing holds only later records); else
                             listed again
    records(shard, windows)  a shard's records in windows that ended before the read, read
                             when every earlier lease was over (final): nothing can land in
                             them any more, so a later attempt's read would find the same

Bounded: the reads of the last ``MAX_SHARED_RECORDS`` records are kept (a replay's windows
are the same for all its tasks; a later run's replace them).

Where the driver knows the run a write replays before its tasks start (``foreachBatch``: the
batch's run; ``format("keo")``: a batch write's ``run_id``), it reads it once
(:func:`producer.replay.recovery.plan_reads_once_over`: an earlier execution that may still
put is superseded and its lease waited for first, as each task would wait) and ships what it
read with the write: each worker's reads are seeded with it (:meth:`SharedReads.seed`), and
its tasks read nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final
from weakref import WeakKeyDictionary

from dedupe_store.clock import Clock
from dedupe_store.records import Position
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import Shard

__all__ = [
    "MAX_PLANNED_RECORDS",
    "MAX_SHARED_RECORDS",
    "PlannedReads",
    "RecordRead",
    "SharedReads",
    "shared_by",
]

# a shard's records read in windows: (the row's key, its data's digest), where, when it arrived
RecordRead = tuple[tuple[str, bytes], Position, int]
WindowsKey = tuple[str, tuple[tuple[int, int], ...]]

# the records kept for later attempts of the process, at most (about 100 bytes each)
MAX_SHARED_RECORDS: Final = 1_000_000
# the records a driver reads for its tasks and ships with the write, at most: more, and each
# worker reads for itself (what a task is sent travels with it)
MAX_PLANNED_RECORDS: Final = 100_000


@dataclass(frozen=True, slots=True)
class PlannedReads:
    """What a driver read for a replay's tasks, before they started: the shard map it listed
    at ``listed_at_ms``, and every shard's records in the earlier executions' ``windows`` of
    ``run`` (all ended, every earlier lease over: final). Picklable: it travels with the
    write."""

    run: str
    listed_at_ms: int
    shards: tuple[Shard, ...]
    windows: tuple[tuple[int, int], ...]
    reads: Mapping[str, tuple[RecordRead, ...]]

    @property
    def records(self) -> int:
        return sum(len(read) for read in self.reads.values())


def _within(windows: Sequence[tuple[int, int]], cached: Sequence[tuple[int, int]]) -> bool:
    """Whether every window of ``windows`` lies inside one of ``cached``."""
    return all(any(a <= start and end <= b for a, b in cached) for start, end in windows)


class SharedReads:
    """One reader's shard map and final window reads, for every attempt of the process;
    thread-safe (a read itself runs outside the lock: two attempts may both read a shard the
    first time, never wrongly)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._map: tuple[int, list[Shard]] | None = None  # listed at (clock ms), the shards
        self._reads: OrderedDict[WindowsKey, list[RecordRead]] = OrderedDict()
        self._records = 0
        self.listings = 0  # ListShards pages asked by this process's recoveries, for the tests
        self.reads = 0  # shard windows read (not taken from a read before)

    def shard_map(
        self, reader: KinesisReader, clock: Clock, *, until_ms: int, skew_ms: int
    ) -> list[Shard]:
        """Every shard a record that arrived by ``until_ms`` can be on: the map listed last,
        when it was listed after ``until_ms`` plus the skew; else a new listing."""
        with self._lock:
            if self._map is not None and self._map[0] - skew_ms > until_ms:
                return self._map[1]
        listed_at_ms = clock.now_ms()
        shards = reader.shards()
        with self._lock:
            self.listings += 1
            if self._map is None or self._map[0] < listed_at_ms:
                self._map = (listed_at_ms, shards)
        return shards

    def seed(self, planned: PlannedReads) -> None:
        """Take what a driver read for this run's tasks (:func:`plan_reads`): its shard map,
        when newer than this one, and its reads."""
        with self._lock:
            if self._map is None or self._map[0] < planned.listed_at_ms:
                self._map = (planned.listed_at_ms, list(planned.shards))
            for shard_id, read in planned.reads.items():
                key = (shard_id, planned.windows)
                if key not in self._reads:
                    self._reads[key] = list(read)
                    self._records += len(read)

    def records(
        self,
        shard_id: str,
        windows: Sequence[tuple[int, int]],
        read: Callable[[], list[RecordRead]],
    ) -> list[RecordRead]:
        """The shard's records in ``windows``, from a read before (of the same windows, or of
        windows that hold them: its records in these) or ``read()`` now: the caller asks only
        for windows that can no longer change."""
        key = (shard_id, tuple(windows))
        with self._lock:
            found = self._reads.get(key)
            if found is None:
                found = self._covered(shard_id, windows)
            if found is not None:
                if key in self._reads:
                    self._reads.move_to_end(key)
                return found
        found = read()
        with self._lock:
            self.reads += 1
            if key not in self._reads:
                self._reads[key] = found
                self._records += len(found)
            while self._records > MAX_SHARED_RECORDS and len(self._reads) > 1:
                _, dropped = self._reads.popitem(last=False)
                self._records -= len(dropped)
        return found

    def _covered(
        self, shard_id: str, windows: Sequence[tuple[int, int]]
    ) -> list[RecordRead] | None:
        """The shard's records in ``windows`` from a read of windows that hold them; under the
        lock."""
        for (read_shard, read_windows), found in self._reads.items():
            if read_shard == shard_id and _within(windows, read_windows):
                return [r for r in found if any(a <= r[2] <= b for a, b in windows)]
        return None


_BY_READER: WeakKeyDictionary[KinesisReader, SharedReads] = WeakKeyDictionary()
_BY_READER_LOCK = threading.Lock()


def shared_by(reader: KinesisReader) -> SharedReads:
    """What the attempts that read through ``reader`` share (one per reader: a Spark worker
    keeps one per settings)."""
    with _BY_READER_LOCK:
        shared = _BY_READER.get(reader)
        if shared is None:
            shared = _BY_READER[reader] = SharedReads()
        return shared
