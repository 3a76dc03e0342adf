"""The offsets of ``spark.readStream.format("keo")`` and the plans made from them (pure: no
pyspark, no I/O).

An offset is what Spark writes to its checkpoint for the stream, as JSON::

    {"version": 1, "stream": "orders",
     "shards": {"shardId-000000000000": {"after": "4968...", "after_ms": 1767225600000},
                "shardId-000000000001": {"at_ms": 1767225000000},
                "shardId-000000000002": {},
                "shardId-000000000003": {"finished": true}},
     "turn": "shardId-000000000002"}

Per shard: the last Kinesis record read (``after``, its arrival ``after_ms``), else where the
shard's first read starts (``at_ms``: the query's starting timestamp; nothing: the trim
horizon), and whether it is ``finished``: closed and read to its end. A batch is the pair
(start offset, end offset), and the end is fixed on the driver before the batch runs, so the
partitions of a batch are a function of its two offsets (:func:`plan`): a replayed batch
reads the same records. ``turn`` (absent in checkpoints written before it) is the shard whose
turn it is to be offered a bounded batch's budget first: kept in the offset so that a
restarted query goes on sharing the budget where it left off (:func:`allot`).

Lineage, as the KCL follows it: a shard is read only once every parent it names
(``ParentShardId``, ``AdjacentParentShardId``) is finished, or gone from the stream. A finished
shard stays in the offsets while the stream still lists it (else it would look new and be read
again), and leaves them once the stream no longer does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Final

from dedupe_store.errors import KeoError
from kinesis_store.positions import SeenRecord, ShardStart
from kinesis_store.shards import Shard

__all__ = [
    "OFFSET_VERSION",
    "CheckpointMismatchError",
    "ShardProgress",
    "ShardRange",
    "StartingPosition",
    "StartingPositionKind",
    "StreamOffset",
    "Taken",
    "allot",
    "missing_from",
    "plan",
    "readable",
    "with_listing",
]

OFFSET_VERSION: Final = 1


class CheckpointMismatchError(KeoError):
    """The checkpoint's offsets cannot be read by this query: they are another stream's, or
    of a format this version does not know. ``found`` is what the offset says."""

    def __init__(self, message: str, *, stream: str, found: str | None) -> None:
        super().__init__(message)
        self.stream = stream
        self.found = found


class StartingPositionKind(StrEnum):
    TRIM_HORIZON = "trim_horizon"
    LATEST = "latest"
    AT_TIMESTAMP = "at_timestamp"


@dataclass(frozen=True, slots=True)
class StartingPosition:
    """Where a new query starts (a query restarted from its checkpoint goes on from there)."""

    kind: StartingPositionKind
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ShardProgress:
    """How far one shard has been read (see the module's docstring)."""

    after: str | None = None
    after_ms: int | None = None
    at_ms: int | None = None
    finished: bool = False

    @property
    def start(self) -> ShardStart:
        """Where the next read of the shard starts."""
        if self.after is not None:
            return ShardStart.after(self.after, self.after_ms)
        if self.at_ms is not None:
            return ShardStart.at_timestamp(self.at_ms)
        return ShardStart.trim_horizon()

    def advanced_to(self, last: SeenRecord | None, *, finished: bool = False) -> ShardProgress:
        """Read up to ``last`` (None: nothing more), and finished or not."""
        if last is None or not self.start.is_before(last.sequence_number):
            return replace(self, finished=self.finished or finished)
        return ShardProgress(last.sequence_number, last.arrival_ms, finished=finished)

    def millis_behind(self, tail: SeenRecord | None) -> int | None:
        """How far this start is behind the shard's ``tail`` (its last record; None: it holds
        nothing after the start), in arrival time: the tail's arrival less that of the last
        record read (or the starting timestamp). None when the start has no time (the trim
        horizon, or a checkpoint written before offsets kept arrival times)."""
        start_ms = self.after_ms if self.after is not None else self.at_ms
        if start_ms is None:
            return None
        if tail is None or not self.start.is_before(tail.sequence_number):
            return 0
        return max(0, tail.arrival_ms - start_ms)  # arrival times are not monotonic

    def as_json(self) -> dict[str, Any]:
        if self.finished:
            return {"finished": True}  # never read again: where it stopped no longer matters
        out: dict[str, Any] = {}
        if self.after is not None:
            out["after"] = self.after
            if self.after_ms is not None:
                out["after_ms"] = self.after_ms
        elif self.at_ms is not None:
            out["at_ms"] = self.at_ms
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ShardProgress:
        after = raw.get("after")
        return cls(
            after=str(after) if after is not None else None,
            after_ms=_int_or_none(raw.get("after_ms")),
            at_ms=_int_or_none(raw.get("at_ms")),
            finished=bool(raw.get("finished", False)),
        )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class StreamOffset:
    """The read positions of every shard the query knows, by shard id, and ``turn``: the shard
    a bounded batch offers its budget to first (None: the lowest id; see :func:`allot`)."""

    stream: str
    shards: Mapping[str, ShardProgress]
    turn: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The checkpoint's form: shards in id order, so equal offsets give equal JSON (Spark
        compares them as text to decide whether there is anything new)."""
        out: dict[str, Any] = {
            "version": OFFSET_VERSION,
            "stream": self.stream,
            "shards": {
                shard_id: self.shards[shard_id].as_json() for shard_id in sorted(self.shards)
            },
        }
        if self.turn is not None:
            out["turn"] = self.turn
        return out

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, stream: str) -> StreamOffset:
        """An offset from the checkpoint, refused when it is not this stream's."""
        version, found = raw.get("version"), raw.get("stream")
        if version != OFFSET_VERSION or not isinstance(raw.get("shards"), dict):
            problem, found = (
                f"the checkpoint's offset for stream {stream!r} is not one this version reads "
                f"(version {version!r}, expected {OFFSET_VERSION}): start the query with a new "
                "checkpointLocation",
                version,
            )
        elif found != stream:
            problem = (
                f"the checkpoint holds the offsets of stream {found!r}, and this query reads "
                f"stream {stream!r}: give this query a checkpointLocation of its own (a "
                "checkpoint belongs to one query and its source)"
            )
        else:
            problem = None
        if problem is not None:
            raise CheckpointMismatchError(
                f"format('keo'): {problem}",
                stream=stream,
                found=None if found is None else str(found),
            )
        shards = {
            str(shard_id): ShardProgress.from_json(progress)
            for shard_id, progress in raw["shards"].items()
        }
        turn = raw.get("turn")
        return cls(stream, shards, None if turn is None else str(turn))

    def progress(self, shard_id: str) -> ShardProgress:
        """A shard the offset does not name has read nothing yet (from the trim horizon)."""
        return self.shards.get(shard_id, ShardProgress())

    def with_progress(
        self, updates: Mapping[str, ShardProgress], *, turn: str | None = None
    ) -> StreamOffset:
        """Moved on by ``updates``, and with the bounded batches' ``turn`` when one is given."""
        return StreamOffset(
            self.stream, {**self.shards, **updates}, self.turn if turn is None else turn
        )


def with_listing(offset: StreamOffset, listed: Iterable[Shard]) -> tuple[StreamOffset, list[str]]:
    """The offset brought up to date with the stream's shards: new ones added (read from
    the trim horizon when their turn comes), finished ones the stream no longer lists
    dropped. Also returns the shards the offset had not finished that the stream no longer
    lists: their remaining records are past the retention (lost)."""
    listed_ids = {shard.shard_id for shard in listed}
    shards = {
        shard_id: progress
        for shard_id, progress in offset.shards.items()
        if shard_id in listed_ids or not progress.finished
    }
    gone = sorted(shard_id for shard_id in shards if shard_id not in listed_ids)
    for shard_id in gone:
        del shards[shard_id]
    for shard_id in listed_ids - shards.keys():
        shards[shard_id] = ShardProgress()
    return StreamOffset(offset.stream, shards, offset.turn), gone


def readable(offset: StreamOffset, listed: Iterable[Shard]) -> list[Shard]:
    """The listed shards a batch may read now, in shard-id order: not finished, and every
    parent finished or gone (the KCL's order: a parent's records before its children's)."""
    shards = list(listed)
    known = {shard.shard_id for shard in shards} | set(offset.shards)

    def parent_done(parent: str | None) -> bool:
        return parent is None or parent not in known or offset.progress(parent).finished

    return sorted(
        (
            shard
            for shard in shards
            if not offset.progress(shard.shard_id).finished
            and parent_done(shard.parent_shard_id)
            and parent_done(shard.adjacent_parent_shard_id)
        ),
        key=lambda shard: shard.shard_id,
    )


@dataclass(frozen=True, slots=True)
class ShardRange:
    """What one input partition reads: the records of ``shard`` after ``start``, through the
    record numbered ``through`` (inclusive), or to the shard's end when ``through`` is None."""

    shard: Shard
    start: ShardStart
    through: str | None


def plan(start: StreamOffset, end: StreamOffset, listed: Mapping[str, Shard]) -> list[ShardRange]:
    """The ranges between two offsets, one per shard that moved, in shard-id order. Pure: the
    same two offsets always plan the same ranges (``listed`` gives each shard's hash range,
    which never changes). A shard missing from ``listed`` is the caller's to report."""
    ranges: list[ShardRange] = []
    for shard_id in sorted(end.shards):
        before, after = start.progress(shard_id), end.shards[shard_id]
        if before.finished or after == before or shard_id not in listed:
            continue
        if after.finished:
            ranges.append(ShardRange(listed[shard_id], before.start, None))
        elif after.after is not None and before.start.is_before(after.after):
            ranges.append(ShardRange(listed[shard_id], before.start, after.after))
    return ranges


def missing_from(start: StreamOffset, end: StreamOffset, listed: Mapping[str, Shard]) -> list[str]:
    """The shards a batch would read that the stream no longer lists."""
    return sorted(
        shard_id
        for shard_id, after in end.shards.items()
        if shard_id not in listed
        and not start.progress(shard_id).finished
        and after != start.progress(shard_id)
    )


@dataclass(frozen=True, slots=True)
class Taken:
    """What one shard gave to a batch's budget: its user records, and whether it has more
    (it stopped because the share was used up)."""

    user_records: int
    more: bool


def allot(
    shard_ids: Sequence[str],
    total: int | None,
    per_shard: int | None,
    take: Callable[[str, int, int | None], Taken],
    *,
    turn: str | None = None,
    on_round: Callable[[Mapping[str, int]], None] | None = None,
) -> str | None:
    """Shares a batch's budget of user records among shards, fairly, in rounds; returns the
    shard whose turn it is to be offered the next batch's budget first.

    The order: shard-id order, starting at ``turn`` (the first shard from it on, else the
    lowest), the same in every round. Each round offers every shard that may have more an
    equal share of what is left (at least one record, while anything is left), capped by what
    ``per_shard`` leaves it; ``take(shard_id, share, whole_up_to)`` reads that many more at
    most, in whole Kinesis records, and says what it took. A shard whose next record holds
    more than its share takes that record alone when it holds at most ``whole_up_to`` (None:
    however many):

    - the batch's first take has no bound (``None``), so that the query moves on whatever the
      record sizes: an aggregate holding more than ``total`` is then the whole batch;
    - a shard that has taken nothing yet in this batch may take one record that fits in what
      the batch (and ``per_shard``) still leaves, though it is bigger than its share;
    - any other take keeps to its share.

    So a batch holds at most ``total`` unless it is one record alone, and a shard takes at
    most ``per_shard`` unless with one record, the batch's first take. A shard that reached its
    tip, or ``per_shard``, is done; what it left goes to the others in the next round. Rounds
    end when the budget is spent or a round moves nothing.

    The next turn is the first shard after this batch's first that took nothing and may have
    more (it was offered too little, or nothing): the batch's first shard with a backlog always
    moves, and each batch the turn moves towards a shard left waiting, so every shard with a
    backlog moves within as many batches as there are shards (within about ``len(shard_ids) /
    total`` when ``total`` is below the shard count and records are single). When no shard was
    left waiting, or nothing was taken, the turn stays: a batch that reads nothing changes no
    offset.

    Before each round, ``on_round`` is told what the round may offer each shard at most, in
    the order it offers them: the takes go one after another, as the budget needs, but their
    reads may begin together (the planner reads their first pages at once).
    """
    if total is None and per_shard is None:
        raise ValueError("allot needs a budget")
    ordered = sorted(shard_ids)
    begin = next((i for i, shard_id in enumerate(ordered) if turn is None or shard_id >= turn), 0)
    ordered = ordered[begin:] + ordered[:begin]
    left = total
    used = dict.fromkeys(ordered, 0)
    drained: set[str] = set()  # said it has nothing more
    active = list(ordered)
    while active and (left is None or left > 0):
        round_share = None if left is None else max(1, left // len(active))
        if on_round is not None:  # a take's room only shrinks as the round goes on
            on_round({s: _share(round_share, _room(left, per_shard, used[s])) for s in active})
        moved = False
        still: list[str] = []
        for shard_id in active:
            if left is not None and left <= 0:
                break
            room = _room(left, per_shard, used[shard_id])
            share = _share(round_share, room)
            taken = take(
                shard_id, share, _whole_up_to(any(used.values()), used[shard_id], share, room)
            )
            if taken.user_records:
                moved = True
                used[shard_id] += taken.user_records
                if left is not None:
                    left -= taken.user_records
            if not taken.more:
                drained.add(shard_id)
            elif per_shard is None or used[shard_id] < per_shard:
                still.append(shard_id)
        if not moved:
            break
        active = still
    waiting = (s for s in ordered[1:] if used[s] == 0 and s not in drained)
    return next(waiting, turn) if any(used.values()) else turn


def _room(left: int | None, per_shard: int | None, used: int) -> int:
    """What the batch's budget and the shard's own bound still let one shard take."""
    bounds = [n for n in (left, None if per_shard is None else per_shard - used) if n is not None]
    return min(bounds)


def _share(round_share: int | None, room: int) -> int:
    """What a round offers one shard: its equal share (None: no total), within its room."""
    return room if round_share is None else min(round_share, room)


def _whole_up_to(batch_took: bool, shard_took: int, share: int, room: int) -> int | None:
    """The most user records one record bigger than the share may hold to be taken alone:
    any number for the batch's first take (None), what is left for a shard that has taken
    nothing yet, else no more than the share."""
    if not batch_took:
        return None
    return room if shard_took == 0 else share
