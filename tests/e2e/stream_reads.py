"""What the tests of ``spark.readStream.format("keo")`` share, in the test process and in a
``local-cluster`` driver (cluster_job.py) alike: no fixture and no test-only package, so a
driver program run as a script imports it from its own folder.

- :class:`Batches`, a ``foreachBatch`` function that keeps each batch's rows, and
  :func:`run_query`, one ``Trigger.AvailableNow`` run of a read into it from a checkpoint;
- records put with chosen hash keys, plain (:func:`put`) or KPL-aggregated as well
  (:func:`put_resharded_wave`);
- a split of a shard and a merge of two, each waited on until the stream is ACTIVE again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES, put_entry
from kinesis_store.kpl import Aggregate
from kinesis_store.provisioning import wait_active
from spark_jobs.options import setting_options

QUARTER = 2**126  # shard 0 of 2 covers [0, 2**127): its split point
RESHARD_TIMEOUT_S = 30
Place = tuple[str, str, int]  # shard, sequence number, sub-sequence number (-1: not aggregated)
Row = tuple[Any, ...]  # shard, sequence number, sub-sequence number, key, data


class Batches:
    """A ``foreachBatch`` function keeping each batch's rows, and a replayed batch's apart."""

    def __init__(self) -> None:
        self.rows: dict[int, list[Row]] = {}
        self.replayed: dict[int, list[Row]] = {}

    def __call__(self, frame: Any, batch_id: int) -> None:
        self.keep(batch_id, frame.collect())

    def keep(self, batch_id: int, collected: list[Any]) -> None:
        rows = [
            (row.shard_id, row.sequence_number, row.sub_sequence_number, row.key, row.data)
            for row in collected
        ]
        (self.replayed if batch_id in self.rows else self.rows)[batch_id] = rows

    def places(self, batch_ids: Any = None) -> list[Place]:
        chosen = sorted(self.rows) if batch_ids is None else batch_ids
        return [place(row) for batch_id in chosen for row in self.rows[batch_id]]

    def batch_of(self) -> dict[Place, int]:
        return {place(row): batch_id for batch_id, rows in self.rows.items() for row in rows}


def place(row: Row) -> Place:
    sub = row[2] if row[2] is not None else -1
    return (row[0], row[1], sub)


def run_query(
    keo: Any,
    settings: dict[str, str],
    checkpoint: Path,
    sink: Batches,
    through: Callable[[Any], Any] = lambda frame: frame,
    **options: str,
) -> None:
    """One availableNow run of the streaming read, from the checkpoint, until it stops;
    ``through`` maps the read's frame before the sink gets it."""
    query = (
        through(keo.readStream.format("keo").options(**setting_options(settings), **options).load())
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "the availableNow query did not stop"
    assert query.exception() is None


def put(kinesis: Any, stream: str, keys: list[str], hash_key: int | None = None) -> None:
    entries = [
        put_entry(key, f"data of {key}".encode(), None if hash_key is None else str(hash_key))
        for key in keys
    ]
    kinesis.put_records(StreamName=stream, Records=entries)


# --- a wave of records across a reshard ------------------------------------------------------

# Partition keys with explicit hash keys, by the range that holds them whatever the reshards:
# the low and high quarters of shard 0 (its children after the split), and shard 1.
RANGES: dict[str, dict[str, int]] = {
    "low": {"low-a": 5, "low-b": QUARTER - 5},
    "high": {"high-a": QUARTER + 5, "high-b": 2**127 - 5},
    "other": {"other-a": 2**127 + 5, "other-b": 2**128 - 5},
}
WAVE_RECORDS = 5  # per key: one plain record, three in an aggregate, one plain again
WAVES = ("before", "split", "merged")  # before shard 0's split, after it, after the merge


def wave_data(wave: str) -> list[str]:
    """A key's data in one wave, in the order written."""
    return [f"{wave}-{i}" for i in range(WAVE_RECORDS)]


def put_resharded_wave(kinesis: Any, stream: str, wave: str) -> None:
    """``wave_data(wave)`` for every key of ``RANGES``, in three PutRecords calls one after
    another (Kinesis orders a key's records by call, not within one): a plain record per key,
    then one KPL aggregate per range holding its keys' next three records interleaved, then a
    plain record per key."""
    keys = {key: hash_key for ranged in RANGES.values() for key, hash_key in ranged.items()}
    first, *aggregated, last = wave_data(wave)

    def plain(data: str) -> list[dict[str, Any]]:
        return [put_entry(key, data.encode(), str(hash_key)) for key, hash_key in keys.items()]

    aggregates = []
    for ranged in RANGES.values():
        aggregate = Aggregate(DEFAULT_MAX_RECORD_BYTES)
        for data in aggregated:
            for key, hash_key in ranged.items():
                assert aggregate.add(key, data.encode(), str(hash_key))
        aggregates.append(aggregate.entry())
    for entries in (plain(first), aggregates, plain(last)):
        response = kinesis.put_records(StreamName=stream, Records=entries)
        assert response["FailedRecordCount"] == 0, response


# --- resharding ------------------------------------------------------------------------------


def split(kinesis: Any, stream: str, parent: str, at: int = QUARTER) -> list[str]:
    """Splits ``parent`` at hash key ``at``; its two children, lower range first, once the
    stream is ACTIVE again."""
    kinesis.split_shard(StreamName=stream, ShardToSplit=parent, NewStartingHashKey=str(at))
    wait_active(kinesis, stream, timeout_s=RESHARD_TIMEOUT_S)
    children = [
        shard
        for shard in kinesis.list_shards(StreamName=stream)["Shards"]
        if shard.get("ParentShardId") == parent
    ]
    children.sort(key=lambda shard: int(shard["HashKeyRange"]["StartingHashKey"]))
    return [str(shard["ShardId"]) for shard in children]


def merge(kinesis: Any, stream: str, shards: Sequence[str]) -> str:
    """Merges two adjacent shards; the merged shard, once the stream is ACTIVE again."""
    low, high = shards
    kinesis.merge_shards(StreamName=stream, ShardToMerge=low, AdjacentShardToMerge=high)
    wait_active(kinesis, stream, timeout_s=RESHARD_TIMEOUT_S)
    return str(
        next(
            s["ShardId"]
            for s in kinesis.list_shards(StreamName=stream)["Shards"]
            if s.get("ParentShardId") == low and s.get("AdjacentParentShardId") == high
        )
    )
