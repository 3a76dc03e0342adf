"""GetRecords paced within a shard's 5 calls/s and 2 MB/s, room left for another consumer of
the shard (4 calls and 1.8 MiB a second are ours), pages sized to one call's share, and the
jittered backoff of a throttled read: a manual clock that only the injected sleep moves. No
sockets, no wall clock."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

import botocore.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinesis_store.errors import StreamUnavailableError
from kinesis_store.positions import ShardStart
from kinesis_store.read_pacing import SHARED_BYTES_PER_S, ReadPacer, throttle_backoff_s
from kinesis_store.reader import KinesisReader

SHARD = "shardId-000000000000"
OTHER = "shardId-000000000001"


class Time:
    """A clock that moves only when slept on; the sleeps are kept."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_s += seconds

    def pacer(self) -> ReadPacer:
        return ReadPacer(clock=self.clock, sleep=self.sleep)


def calls_in_any_second(times: list[float]) -> int:
    return max(sum(1 for t in times if start <= t < start + 1.0) for start in times)


def test_calls_on_one_shard_leave_at_most_four_a_second_one_left_for_another_consumer() -> None:
    # GIVEN a pacer, and a reader calling GetRecords on one shard as fast as it can, each
    # answer empty
    time = Time()
    pacer = time.pacer()
    # WHEN it calls 12 times
    left = []
    for _ in range(12):
        at = pacer.before_call(SHARD)
        pacer.after_call(SHARD, at, page_bytes=0)
        left.append(time.now_s)
    # THEN the calls left 0.25 s apart: never more than 4 in a second
    assert calls_in_any_second(left) == 4
    assert time.sleeps == pytest.approx([0.25] * 11)


def test_a_call_that_wakes_late_moves_the_next_one_a_whole_interval_after_it() -> None:
    # GIVEN a pacer whose caller oversleeps: each sleep lasts 0.4 s longer than asked (a
    # process starved of CPU)
    time = Time()

    def oversleep(seconds: float) -> None:
        time.sleep(seconds + 0.4)

    pacer = ReadPacer(clock=time.clock, sleep=oversleep)
    # WHEN it calls 12 times on one shard, each answer empty
    left = []
    for _ in range(12):
        at = pacer.before_call(SHARD)
        pacer.after_call(SHARD, at, page_bytes=0)
        left.append(time.now_s)
    # THEN each call left a whole interval (and the oversleep) after the one before: the late
    # calls never caught up on their schedule, two calls in one slot
    assert [b - a for a, b in itertools.pairwise(left)] == pytest.approx([0.65] * 11)
    assert calls_in_any_second(left) <= 4


def test_a_large_page_holds_the_next_call_until_its_bytes_fit_in_our_share() -> None:
    # GIVEN a call that brought back 5 MiB
    time = Time()
    pacer = time.pacer()
    at = pacer.before_call(SHARD)
    pacer.after_call(SHARD, at, page_bytes=5 * 1024 * 1024)
    # WHEN the next call is made
    pacer.before_call(SHARD)
    # THEN it left 2.8 s after the first: 5 MiB at 1.8 MiB a second
    assert time.now_s - at == pytest.approx(5 * 1024 * 1024 / SHARED_BYTES_PER_S)


def test_time_spent_elsewhere_counts_and_shards_are_paced_apart() -> None:
    time = Time()
    pacer = time.pacer()
    # GIVEN a call on one shard
    pacer.after_call(SHARD, pacer.before_call(SHARD), page_bytes=0)
    # WHEN another shard is called at once, and the first one after the caller spent 0.5 s
    pacer.after_call(OTHER, pacer.before_call(OTHER), page_bytes=0)
    time.now_s += 0.5
    pacer.before_call(SHARD)
    # THEN nobody waited
    assert time.sleeps == []


def test_a_page_asks_for_no_more_than_one_calls_share_of_the_bytes() -> None:
    # GIVEN our share of a shard: 1.8 MiB a second in 4 calls, 471,859 bytes a call (calls
    # answered at once)
    pacer = Time().pacer()
    share = int(SHARED_BYTES_PER_S / 4)
    # THEN before any page, records are taken to be of 1 KiB
    assert pacer.page_limit(SHARD, 10_000) == share // 1024
    # AND after a page of 100-byte records, pages hold as many of them as a share takes
    pacer.after_call(SHARD, pacer.before_call(SHARD), page_bytes=100 * 50, records=50)
    assert pacer.page_limit(SHARD, 10_000) == share // 100
    # AND never more than asked, never none
    assert pacer.page_limit(SHARD, 7) == 7
    pacer.after_call(SHARD, 0.0, page_bytes=5 * 1024 * 1024, records=1)
    assert pacer.page_limit(SHARD, 10_000) == 1


@settings(max_examples=200, deadline=None)
@given(
    delays=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=2.0),  # on the way: leaving to arriving
            st.floats(min_value=0.0, max_value=1.0),  # arriving to answered
        ),
        min_size=2,
        max_size=30,
    )
)
def test_calls_held_up_on_their_way_never_arrive_more_than_four_in_a_second(
    delays: list[tuple[float, float]],
) -> None:
    # GIVEN a pacer whose calls are held up on their way to the shard and in it, each for its
    # own time (a slow network, a starved process, a starved proxy)
    time = Time()
    pacer = time.pacer()
    arrived = []
    # WHEN it calls once for each, one after another
    for on_the_way_s, served_s in delays:
        at = pacer.before_call(SHARD)
        time.now_s += on_the_way_s
        arrived.append(time.now_s)
        time.now_s += served_s
        pacer.after_call(SHARD, at, page_bytes=0)
    # THEN the shard saw them at least an interval apart: never more than 4 in a second,
    # whatever the delays, one call a second left to its other consumer
    assert all(b - a >= 0.25 - 1e-9 for a, b in itertools.pairwise(arrived))
    assert calls_in_any_second(arrived) <= 4


def test_pages_are_sized_to_the_call_and_the_time_it_took() -> None:
    # GIVEN a shard whose last call took 0.1 s from leaving to its answer
    time = Time()
    pacer = time.pacer()
    at = pacer.before_call(SHARD)
    time.now_s += 0.1
    pacer.after_call(SHARD, at, page_bytes=1024 * 100, records=100)
    # THEN the next page takes the bytes of the interval and that time: 0.35 s of our share
    assert pacer.page_limit(SHARD, 10_000) == int(SHARED_BYTES_PER_S * 0.35 / 1024)
    # AND a call that took a second makes it no larger than twice a call's share
    at = pacer.before_call(SHARD)
    time.now_s += 1.0
    pacer.after_call(SHARD, at, page_bytes=1024 * 100, records=100)
    assert pacer.page_limit(SHARD, 10_000) == int(SHARED_BYTES_PER_S * 0.5 / 1024)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        ReadPacer(calls_per_s=0)


@pytest.mark.parametrize(
    ("retry", "draw", "wait_s"),
    [
        (1, 1.0, 0.4),
        (1, 0.0, 0.2),
        (2, 1.0, 0.8),
        (3, 0.5, 1.2),
        (5, 1.0, 5.0),  # 6.4 capped
        (9, 0.0, 2.5),
    ],
)
def test_a_throttled_retry_waits_half_its_ceiling_plus_a_drawn_part(
    retry: int, draw: float, wait_s: float
) -> None:
    assert throttle_backoff_s(retry, draw=lambda: draw) == pytest.approx(wait_s)


# --- the reader, paced -------------------------------------------------------------------


def record(sequence_number: int, data: bytes = b"payload") -> dict[str, Any]:
    return {
        "SequenceNumber": str(sequence_number),
        "ApproximateArrivalTimestamp": 1_700_000_000.0 + sequence_number,
        "Data": data,
        "PartitionKey": "key",
    }


def throttled() -> botocore.exceptions.ClientError:
    code = "ProvisionedThroughputExceededException"
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": "Rate exceeded for shard"}}, "GetRecords"
    )


class Pages:
    """A client whose GetRecords answers from a script; every call's time is kept."""

    def __init__(self, time: Time, answers: list[Any]) -> None:
        self._time = time
        self._answers = deque(answers)
        self.called_at: list[float] = []

    def get_shard_iterator(self, **_: Any) -> dict[str, Any]:
        return {"ShardIterator": "it"}

    def get_records(self, **_: Any) -> Any:
        self.called_at.append(self._time.now_s)
        answer = self._answers.popleft()
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_paced_reader_spaces_its_calls_and_counts_what_they_brought_back() -> None:
    # GIVEN a shard answered in four pages, the third throttled once, then behind the tip
    time = Time()
    client = Pages(
        time,
        [
            {"Records": [record(1), record(2)], "NextShardIterator": "a", "MillisBehindLatest": 9},
            {"Records": [record(3)], "NextShardIterator": "b", "MillisBehindLatest": 5},
            throttled(),
            {"Records": [record(4, b"x" * 93)], "NextShardIterator": "c", "MillisBehindLatest": 0},
        ],
    )
    reader = KinesisReader(
        client, "orders", sleep=time.sleep, pacer=time.pacer(), jitter=lambda: 1.0
    )
    # WHEN the shard is read after record 0 through record 4
    read = list(reader.read_range(SHARD, ShardStart.trim_horizon(), "4"))
    # THEN every record came once, the calls left 0.25 s apart at least, the throttled one
    # was tried again after its backoff (0.4 s), and nothing waited twice for one call
    assert [r.sequence_number for r in read] == ["1", "2", "3", "4"]
    gaps = [b - a for a, b in zip(client.called_at, client.called_at[1:], strict=False)]
    assert gaps == pytest.approx([0.25, 0.25, 0.4])
    # AND the reads of the shard are counted: records, bytes (data and key), the last lag
    reads = reader.shard_reads(SHARD)
    assert (reads.calls, reads.records, reads.millis_behind_latest) == (3, 4, 0)
    assert reads.bytes == 3 * (7 + 3) + (93 + 3)


def test_a_page_cut_to_the_pacers_share_is_full_not_the_tip() -> None:
    # GIVEN a paced reader, whose first page is cut to one call's share of the bytes (records
    # taken to be of 1 KiB: 460), and a shard answering that many, 0 ms behind the tip (records
    # that arrived in the same millisecond), then the last one
    time = Time()
    cut = time.pacer().page_limit(SHARD, 10_000)
    assert cut == 460
    client = Pages(
        time,
        [
            {
                "Records": [record(i) for i in range(1, cut + 1)],
                "NextShardIterator": "a",
                "MillisBehindLatest": 0,
            },
            {"Records": [record(cut + 1)], "NextShardIterator": "b", "MillisBehindLatest": 0},
        ],
    )
    reader = KinesisReader(client, "orders", sleep=time.sleep, pacer=time.pacer())
    # WHEN the shard's tail after record 0 is looked for
    last = reader.tail(SHARD, ShardStart.after("0"), now_ms=1_700_000_000_000, margin_ms=0)
    # THEN the full page was not taken for the tip: the tail is the record after it
    assert last is not None
    assert last.sequence_number == str(cut + 1)


def test_a_read_whose_signature_arrived_stale_is_signed_anew_and_tried_again() -> None:
    # GIVEN a shard whose first GetRecords is refused for its signature's age (the process
    # stalled between signing and sending), then answered
    time = Time()
    stale = botocore.exceptions.ClientError(
        {
            "Error": {
                "Code": "InvalidSignatureException",
                "Message": "Signature expired: 20261129T090332Z is now earlier than ...",
            }
        },
        "GetRecords",
    )
    client = Pages(
        time,
        [stale, {"Records": [record(1)], "NextShardIterator": "a", "MillisBehindLatest": 0}],
    )
    reader = KinesisReader(client, "orders", sleep=time.sleep, jitter=lambda: 1.0)
    # WHEN the shard is read
    read = list(reader.read_range(SHARD, ShardStart.trim_horizon(), "1"))
    # THEN the refused call was tried again, and the record came once
    assert [r.sequence_number for r in read] == ["1"]
    assert len(client.called_at) == 2


@pytest.mark.parametrize(
    "message",
    [
        "The request signature we calculated does not match the signature you provided.",
        # the signer's clock runs ahead: one signed anew by it is refused the same way
        "Signature not yet current: 20261129T100332Z is still later than 20261129T095832Z",
    ],
)
def test_a_read_refused_for_a_wrong_signature_is_not_tried_again(message: str) -> None:
    # GIVEN a shard whose GetRecords is refused for a signature that is wrong, not expired
    time = Time()
    wrong = botocore.exceptions.ClientError(
        {"Error": {"Code": "InvalidSignatureException", "Message": message}},
        "GetRecords",
    )
    client = Pages(time, [wrong])
    reader = KinesisReader(client, "orders", sleep=time.sleep, jitter=lambda: 1.0)
    # WHEN the shard is read THEN it fails at once: another try would fail the same way
    with pytest.raises(StreamUnavailableError, match="InvalidSignatureException"):
        list(reader.read_range(SHARD, ShardStart.trim_horizon(), "1"))
    assert len(client.called_at) == 1
