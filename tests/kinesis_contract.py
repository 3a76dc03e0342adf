"""The Kinesis contract: what the producer, the reconciler and the audit rely on from Kinesis,
through :class:`KinesisWriter` and :class:`KinesisReader`; every backend must pass these cases.

``tests/integration/test_kinesis_contract.py`` runs them against kinesalite,
``tests/unit/test_fake_kinesis_contract.py`` against the in-memory ``FakeKinesisClient``, so
the fake the protocol's unit tests run on cannot drift from a real Kinesis. Each supplies a
``kinesis`` fixture: a :class:`KinesisUnderTest` over a fresh stream of two shards. Imported
with ``from kinesis_contract import *`` so pytest collects them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES, MAX_RECORDS_PER_PUT, put_entry
from kinesis_store.errors import StreamNotFoundError
from kinesis_store.kpl import Aggregate, UserRecord
from kinesis_store.reader import KinesisReader
from kinesis_store.results import PutResultKind, RecordResult
from kinesis_store.shards import Shard, lineage, open_shards
from kinesis_store.writer import KinesisWriter

SHARDS = 2
RETENTION_HOURS = 24  # a new stream's
GAP_MS = 50  # time let pass between puts that must arrive apart


@dataclass(frozen=True)
class KinesisUnderTest:
    """One backend, with a fresh stream of :data:`SHARDS` shards named ``stream``."""

    stream: str
    writer_for: Callable[[str], KinesisWriter]
    reader_for: Callable[[str], KinesisReader]
    now_ms: Callable[[], int]  # the backend's clock, which stamps arrivals
    let_pass: Callable[[int], None]  # let that many ms pass on it
    split: Callable[[str, int], None]  # SplitShard(shard, new starting hash key), then ACTIVE

    @property
    def writer(self) -> KinesisWriter:
        return self.writer_for(self.stream)

    @property
    def reader(self) -> KinesisReader:
        return self.reader_for(self.stream)

    def read_stream(self) -> list[UserRecord]:
        """Every user record of the stream, shard by shard, each in sequence order."""
        return [r for shard in self.reader.shards() for r in self.reader.read_all(shard.shard_id)]


def covering(shards: list[Shard], hash_key: int) -> Shard:
    (shard,) = [shard for shard in open_shards(shards) if shard.covers(hash_key)]
    return shard


def written(results: list[RecordResult]) -> list[RecordResult]:
    assert [r.kind for r in results] == [PutResultKind.WRITTEN] * len(results), results
    return results


# --- puts ---------------------------------------------------------------------------------------


def test_a_put_answers_each_record_written_with_the_position_it_reads_back_at(
    kinesis: KinesisUnderTest,
) -> None:
    # GIVEN ten records with keys of their own
    entries = [put_entry(f"k-{i}", f"data-{i}".encode()) for i in range(10)]
    # WHEN they are put in one request
    results = kinesis.writer.put_entries(entries)
    # THEN each is WRITTEN, in request order, with a shard of the stream and a sequence number
    assert len(written(results)) == 10
    assert all(r.shard_id and r.sequence_number and not r.retriable for r in results)
    assert {r.shard_id for r in results} <= {s.shard_id for s in kinesis.reader.shards()}
    # AND each reads back, once, at that position, with its data
    read = {r.partition_key: r for r in kinesis.read_stream()}
    assert sorted(read) == sorted(f"k-{i}" for i in range(10))
    for i, result in enumerate(results):
        record = read[f"k-{i}"]
        assert (record.shard_id, record.sequence_number) == (
            result.shard_id,
            result.sequence_number,
        )
        assert (record.data, record.sub_sequence_number) == (f"data-{i}".encode(), None)


def test_a_record_routed_by_its_explicit_hash_key_lands_on_the_shard_covering_it(
    kinesis: KinesisUnderTest,
) -> None:
    # GIVEN the stream's open shards, and records of one partition key routed to each end of
    # each shard's range by an explicit hash key
    shards = kinesis.reader.shards()
    hash_keys = [k for s in shards for k in (s.starting_hash_key, s.ending_hash_key)]
    entries = [put_entry("one-key", b"x", str(hash_key)) for hash_key in hash_keys]
    # WHEN they are put
    results = written(kinesis.writer.put_entries(entries))
    # THEN each lands on the open shard whose range covers its hash key, not its key's MD5's
    assert [r.shard_id for r in results] == [covering(shards, k).shard_id for k in hash_keys]
    assert len({r.shard_id for r in results}) == SHARDS


def test_a_request_of_500_records_is_written_and_one_of_501_is_refused_whole(
    kinesis: KinesisUnderTest,
) -> None:
    # GIVEN requests of 500 and of 501 records
    most = [put_entry(f"ok-{i}", b"x") for i in range(MAX_RECORDS_PER_PUT)]
    too_many = [put_entry(f"no-{i}", b"x") for i in range(MAX_RECORDS_PER_PUT + 1)]
    # WHEN both are put
    accepted = kinesis.writer.put_entries(most)
    refused = kinesis.writer.put_entries(too_many)
    # THEN the first is written whole; the second is refused whole: not written, and not worth
    # sending again as it is
    assert len(written(accepted)) == MAX_RECORDS_PER_PUT
    assert len(refused) == MAX_RECORDS_PER_PUT + 1
    assert {(r.kind, r.error_code, r.retriable) for r in refused} == {
        (PutResultKind.NOT_WRITTEN, "ValidationException", False)
    }
    # AND none of its records is in the stream
    keys = [r.partition_key for r in kinesis.read_stream()]
    assert sorted(keys) == sorted(e["PartitionKey"] for e in most)


# --- the stream and its shards ------------------------------------------------------------------


def test_describe_reports_the_retention_the_record_limit_and_the_open_shards(
    kinesis: KinesisUnderTest,
) -> None:
    # GIVEN a new stream of two shards
    # WHEN it is described
    info = kinesis.reader.describe()
    # THEN it reports a new stream's retention, 1 MiB records (it says no other), two shards
    assert (info.name, info.retention_hours) == (kinesis.stream, RETENTION_HOURS)
    assert (info.max_record_bytes, info.open_shard_count) == (DEFAULT_MAX_RECORD_BYTES, SHARDS)


def test_the_shards_of_a_new_stream_are_open_and_split_the_hash_keys_between_them(
    kinesis: KinesisUnderTest,
) -> None:
    # GIVEN a new stream
    # WHEN its shards are listed
    shards = sorted(kinesis.reader.shards(), key=lambda s: s.starting_hash_key)
    # THEN they are open, without parents, and cover 0 .. 2^128 - 1 without gap or overlap
    assert len(shards) == SHARDS
    assert all(not s.closed and s.parent_shard_id is None for s in shards)
    assert shards[0].starting_hash_key == 0
    assert shards[-1].ending_hash_key == 2**128 - 1
    assert all(a.ending_hash_key + 1 == b.starting_hash_key for a, b in itertools.pairwise(shards))


def test_a_split_closes_the_parent_and_lists_both_children_with_their_lineage(
    kinesis: KinesisUnderTest,
) -> None:
    # GIVEN a record on the first shard
    parent = min(kinesis.reader.shards(), key=lambda s: s.starting_hash_key)
    low, middle = parent.starting_hash_key, (parent.starting_hash_key + parent.ending_hash_key) // 2
    written(kinesis.writer.put_entries([put_entry("before", b"x", str(low))]))
    # WHEN that shard is split at its middle
    kinesis.split(parent.shard_id, middle)
    # THEN the parent is listed closed, and two open children split its range between them
    shards = {s.shard_id: s for s in kinesis.reader.shards()}
    assert shards[parent.shard_id].closed
    children = sorted(
        (s for s in shards.values() if s.parent_shard_id == parent.shard_id),
        key=lambda s: s.starting_hash_key,
    )
    assert [(c.starting_hash_key, c.ending_hash_key) for c in children] == [
        (low, middle - 1),
        (middle, parent.ending_hash_key),
    ]
    assert not any(c.closed for c in children)
    assert kinesis.reader.describe().open_shard_count == SHARDS + 1
    # AND a hash key's lineage is its parent and the child now covering it, where new puts land
    assert {s.shard_id for s in lineage(list(shards.values()), low)} == {
        parent.shard_id,
        children[0].shard_id,
    }
    (after,) = written(kinesis.writer.put_entries([put_entry("after", b"y", str(low))]))
    assert after.shard_id == children[0].shard_id
    # AND the parent's record is still read from the closed parent, to its end
    assert [r.partition_key for r in kinesis.reader.read_all(parent.shard_id)] == ["before"]


# --- reading back -------------------------------------------------------------------------------


def test_a_window_read_returns_what_arrived_in_it_in_order_and_stops_at_the_first_later_record(
    kinesis: KinesisUnderTest,
) -> None:
    # GIVEN three records put one by one on one shard, then, after the window's end, a fourth
    shard = min(kinesis.reader.shards(), key=lambda s: s.starting_hash_key)
    start_ms = kinesis.now_ms() - GAP_MS
    for key in ("w-1", "w-2", "w-3"):
        written(kinesis.writer.put_entries([put_entry(key, b"x", str(shard.starting_hash_key))]))
    kinesis.let_pass(GAP_MS)
    end_ms = kinesis.now_ms()
    kinesis.let_pass(GAP_MS)
    written(kinesis.writer.put_entries([put_entry("w-late", b"x", str(shard.starting_hash_key))]))
    # WHEN the window is read
    read = list(kinesis.reader.read_window(shard.shard_id, start_ms, end_ms, now_ms=kinesis.now_ms))
    # THEN it holds the three, in the order they arrived, and not the later one
    assert [r.partition_key for r in read] == ["w-1", "w-2", "w-3"]
    assert [int(r.sequence_number) for r in read] == sorted(int(r.sequence_number) for r in read)
    assert all(start_ms <= r.arrival_ms <= end_ms for r in read)


def test_a_window_read_whose_end_has_passed_stops_at_the_tip(kinesis: KinesisUnderTest) -> None:
    # GIVEN two records on a shard, and a window that ends now
    shard = min(kinesis.reader.shards(), key=lambda s: s.starting_hash_key)
    start_ms = kinesis.now_ms() - GAP_MS
    entries = [put_entry(key, b"x", str(shard.starting_hash_key)) for key in ("t-1", "t-2")]
    written(kinesis.writer.put_entries(entries))
    end_ms = kinesis.now_ms()
    # WHEN it is read, with nothing after them
    read = kinesis.reader.read_window(shard.shard_id, start_ms, end_ms, now_ms=kinesis.now_ms)
    # THEN the read returns both and ends at the tip instead of waiting for more
    assert [r.partition_key for r in read] == ["t-1", "t-2"]
    # AND a window on an empty shard ends at once, empty
    other = max(kinesis.reader.shards(), key=lambda s: s.starting_hash_key)
    assert (
        list(kinesis.reader.read_window(other.shard_id, start_ms, end_ms, now_ms=kinesis.now_ms))
        == []
    )


def test_a_window_read_says_when_no_record_past_it_proves_its_shard_open(
    kinesis: KinesisUnderTest,
) -> None:
    # GIVEN a record on each shard, then the first shard split
    parent, other = sorted(kinesis.reader.shards(), key=lambda s: s.starting_hash_key)
    start_ms = kinesis.now_ms() - GAP_MS
    for shard in (parent, other):
        written(kinesis.writer.put_entries([put_entry("e", b"x", str(shard.starting_hash_key))]))
    middle = (parent.starting_hash_key + parent.ending_hash_key) // 2
    kinesis.split(parent.shard_id, middle)
    kinesis.let_pass(GAP_MS)
    split_ms = kinesis.now_ms()
    kinesis.let_pass(GAP_MS)
    end_ms = kinesis.now_ms()
    # WHEN each is read over windows that ended, noting the reads that met no later record
    unproven: list[str] = []

    def read(shard: Shard, window_start_ms: int) -> list[str]:
        records = kinesis.reader.read_window(
            shard.shard_id,
            window_start_ms,
            end_ms,
            now_ms=kinesis.now_ms,
            on_no_later_record=lambda: unproven.append(shard.shard_id),
        )
        return [r.partition_key for r in records]

    # THEN each holds its record, and both reads say so: the split parent's met its end, the
    # open shard's its tip (an empty page at the tip is no proof the shard is open: a closed
    # one can answer one before its end)
    assert read(parent, start_ms) == ["e"]
    assert read(other, start_ms) == ["e"]
    assert unproven == [parent.shard_id, other.shard_id]
    # AND a read of the parent from after it closed meets its end too, empty
    assert read(parent, split_ms) == []
    assert unproven[2:] == [parent.shard_id]
    # AND once a record arrived on the open shard after the window, its read stops there and
    # proves it open through the window
    kinesis.let_pass(GAP_MS)
    written(kinesis.writer.put_entries([put_entry("later", b"x", str(other.starting_hash_key))]))
    assert read(other, start_ms) == ["e"]
    assert unproven[3:] == []


def test_an_aggregated_record_reads_back_as_its_user_records_with_sub_sequence_numbers(
    kinesis: KinesisUnderTest,
) -> None:
    # GIVEN a KPL aggregate of three user records, one of them with an explicit hash key
    aggregate = Aggregate(DEFAULT_MAX_RECORD_BYTES)
    users = [("agg-1", b"one", None), ("agg-2", b"two", "7"), ("agg-3", b"three", None)]
    for key, data, explicit_hash_key in users:
        assert aggregate.add(key, data, explicit_hash_key)
    # WHEN it is put as one record
    (result,) = written(kinesis.writer.put_entries([aggregate.entry()]))
    # THEN its shard reads back the three user records, at its sequence number, numbered
    # 0, 1, 2, with their keys, data and explicit hash keys
    assert result.shard_id is not None
    read = list(kinesis.reader.read_all(result.shard_id))
    assert [(r.partition_key, r.data, r.explicit_hash_key) for r in read] == users
    assert [r.sub_sequence_number for r in read] == [0, 1, 2]
    assert {r.sequence_number for r in read} == {result.sequence_number}
    assert all(r.aggregated for r in read)


# --- a stream that does not exist ---------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda k, s: k.writer_for(s).put_entries([put_entry("k", b"x")]), id="put"),
        pytest.param(lambda k, s: k.reader_for(s).describe(), id="describe"),
        pytest.param(lambda k, s: k.reader_for(s).shards(), id="shards"),
    ],
)
def test_a_stream_that_does_not_exist_is_not_found(
    kinesis: KinesisUnderTest, call: Callable[[KinesisUnderTest, str], object]
) -> None:
    # GIVEN a stream name no stream has
    missing = f"{kinesis.stream}-missing"
    # WHEN it is put to, described or listed
    with pytest.raises(StreamNotFoundError) as excinfo:
        call(kinesis, missing)
    # THEN StreamNotFoundError names it (not a put result: the caller cannot go on)
    assert excinfo.value.stream == missing
    assert not excinfo.value.retriable
