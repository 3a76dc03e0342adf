"""AWS's Kinesis quotas as the quota mode counts them (devstack.quotas): pure, the time given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devstack.quotas import MIB, KinesisQuotas, KinesisQuotaState, TokenBucket


def test_a_bucket_holds_one_second_and_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate_per_s=5, capacity=5)
    assert all(bucket.take(1, now_s=10.0) for _ in range(5))
    assert not bucket.take(1, now_s=10.0)
    assert bucket.take(1, now_s=10.2)  # a fifth of a second: one more
    assert not bucket.take(1, now_s=10.2)
    # a long idle time fills it to its capacity, never beyond
    assert bucket.available(now_s=100.0) == 5


def test_a_debt_blocks_the_bucket_until_the_rate_pays_it_back() -> None:
    bucket = TokenBucket(rate_per_s=2 * MIB, capacity=2 * MIB)
    bucket.owe(10 * MIB, now_s=0.0)  # a 10 MiB GetRecords answer
    assert bucket.available(now_s=3.9) < 0
    assert bucket.available(now_s=4.0) == 0  # "within the next 5 seconds": 8 MiB owed, 4 s


@given(st.lists(st.floats(min_value=0, max_value=0.5), min_size=1, max_size=200))
def test_a_bucket_never_gives_more_than_its_capacity_plus_its_rate_over_the_time(
    gaps: list[float],
) -> None:
    bucket = TokenBucket(rate_per_s=1000, capacity=1000)
    now_s, taken = 0.0, 0
    for gap in gaps:
        now_s += gap
        while bucket.take(1, now_s):
            taken += 1
    assert taken <= 1000 + now_s * 1000 + 1e-6


def test_records_are_admitted_in_order_per_shard_and_the_excess_refused() -> None:
    state = KinesisQuotaState(KinesisQuotas(shard_write_records_per_s=3))
    decided = state.admit_records(
        "PutRecords", "s", [("a", 1), ("a", 1), ("b", 1), ("a", 1), ("a", 1)], now_s=0.0
    )
    assert [d.admitted for d in decided] == [True, True, True, True, False]
    assert decided[4].code == "ProvisionedThroughputExceededException"
    assert dict(state.written) == {("s", "a"): 3, ("s", "b"): 1}
    assert dict(state.refused) == {("s", "a"): 1}
    assert state.throttles["PutRecords"] == 1


def test_a_record_too_big_for_what_is_left_is_refused_and_a_smaller_one_after_it_written() -> None:
    state = KinesisQuotaState(KinesisQuotas(shard_write_bytes_per_s=100))
    decided = state.admit_records("PutRecords", "s", [("a", 60), ("a", 60), ("a", 40)], 0.0)
    assert [d.admitted for d in decided] == [True, False, True]


def test_read_calls_are_counted_by_shard_refused_ones_too() -> None:
    state = KinesisQuotaState(KinesisQuotas(shard_read_calls_per_s=2))
    # GIVEN three GetRecords on shard a (the third over its 2 a second) and one on b
    for shard in ("a", "a", "a", "b"):
        state.admit_read("s", shard, now_s=0.0)
    state.admit_iterator("s", "a", now_s=0.0)
    # THEN each shard's calls are counted, whatever the quota answered
    assert state.snapshot()["calls_by_shard"] == {
        "GetRecords": {"s/a": 3, "s/b": 1},
        "GetShardIterator": {"s/a": 1},
    }
    assert state.throttles == {"GetRecords": 1}


def test_control_plane_quotas_count_per_account_or_per_stream() -> None:
    state = KinesisQuotaState()
    # DescribeStreamSummary: 20 a second for the account, whichever stream
    assert all(
        state.admit_control("DescribeStreamSummary", f"s{i % 3}", 0.0).admitted for i in range(20)
    )
    refused = state.admit_control("DescribeStreamSummary", "other", 0.0)
    assert (refused.admitted, refused.code) == (False, "LimitExceededException")
    # ListShards: 1,000 a second per stream
    assert all(state.admit_control("ListShards", "s1", 0.0).admitted for _ in range(1000))
    assert not state.admit_control("ListShards", "s1", 0.0).admitted
    assert state.admit_control("ListShards", "s2", 0.0).admitted
    # an operation without a quota here passes
    assert state.admit_control("AddTagsToStream", "s1", 0.0).admitted


def test_every_quota_is_a_positive_rate() -> None:
    with pytest.raises(ValueError, match="positive"):
        KinesisQuotas(shard_read_calls_per_s=0)
