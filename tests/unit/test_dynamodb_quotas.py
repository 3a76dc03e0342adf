"""AWS's DynamoDB throughput quotas as the quota mode counts them (devstack.dynamodb_quotas):
pure, the time given."""

from __future__ import annotations

import pytest

from devstack.dynamodb_quotas import (
    KEY_THROTTLED,
    TABLE_THROTTLED,
    DynamoDbQuotas,
    DynamoDbQuotaState,
)


def test_a_partition_key_takes_1000_write_units_a_second() -> None:
    state = DynamoDbQuotaState()
    assert all(state.admit_write("PutItem", "t", "k", 10, now_s=5.0).admitted for _ in range(100))
    refused = state.admit_write("PutItem", "t", "k", 10, now_s=5.0)
    # AWS's answer for a hot key: the exception and its throttling reason
    assert (refused.admitted, refused.code, refused.message) == (
        False,
        KEY_THROTTLED,
        "TableWriteKeyRangeThroughputExceeded",
    )
    # another key of the table has its own partition's units
    assert state.admit_write("PutItem", "t", "other", 10, now_s=5.0).admitted
    # a tenth of a second refills a tenth
    assert state.admit_write("PutItem", "t", "k", 100, now_s=5.1).admitted
    assert state.throttles == {"PutItem": 1}
    assert state.throttled_keys == {("t", "k"): 1}


def test_a_refused_write_takes_nothing_from_either_bucket() -> None:
    state = DynamoDbQuotaState(DynamoDbQuotas(table_write_units_per_s=5))
    assert state.admit_write("PutItem", "t", "a", 4, now_s=0.0).admitted
    refused = state.admit_write("PutItem", "t", "b", 2, now_s=0.0)
    assert (refused.code, refused.message) == (TABLE_THROTTLED, "TableWriteAccountLimitExceeded")
    assert state.admit_write("PutItem", "t", "b", 1, now_s=0.0).admitted
    assert state.units == {("t", "Write"): 5}


def test_a_read_is_admitted_while_its_buckets_are_not_in_debt_and_owes_what_it_read() -> None:
    state = DynamoDbQuotaState()
    for _ in range(300):  # strongly consistent reads of 40 KB: 10 units each
        assert state.admit_read("GetItem", "t", "k", now_s=0.0).admitted
        state.charge_read("t", "k", 10.0, now_s=0.0)
    refused = state.admit_read("GetItem", "t", "k", now_s=0.0)
    assert (refused.code, refused.message) == (KEY_THROTTLED, "TableReadKeyRangeThroughputExceeded")
    # a Query counts at the table only: the key's debt is not the table's
    assert state.admit_read("Query", "t", None, now_s=0.0).admitted


def test_a_table_is_its_own_read_quota_across_keys() -> None:
    state = DynamoDbQuotaState(DynamoDbQuotas(table_read_units_per_s=2))
    state.charge_read("t", "a", 2.0, now_s=0.0)
    refused = state.admit_read("GetItem", "t", "b", now_s=0.0)
    assert (refused.code, refused.message) == (TABLE_THROTTLED, "TableReadAccountLimitExceeded")
    assert state.admit_read("GetItem", "other-table", "b", now_s=0.0).admitted


def test_a_quota_must_be_a_positive_rate() -> None:
    with pytest.raises(ValueError, match="positive"):
        DynamoDbQuotas(key_write_units_per_s=0)


def test_each_key_counts_its_writes_and_the_most_it_took_in_one_second() -> None:
    state = DynamoDbQuotaState()
    # GIVEN key "run" written 3 times within a second, then twice a second later; "task" once
    for now_s in (0.0, 0.3, 0.9, 1.5, 1.6):
        assert state.admit_write("UpdateItem", "t", "run", 2, now_s=now_s).admitted
    state.admit_write("UpdateItem", "t", "task", 1, now_s=0.0)
    # AND a refused write, which is not counted
    state.admit_write("UpdateItem", "t", "run", 5000, now_s=1.6)
    # THEN each key has its total and its busiest second (0.9 to 1.6 holds 3 writes too)
    run = state.key_writes[("t", "run")]
    assert (run.writes, run.units, run.peak_writes_per_s, run.peak_units_per_s) == (5, 10, 3, 6)
    assert state.key_writes[("t", "task")].peak_writes_per_s == 1
    # AND the report names each table's busiest key
    assert state.snapshot()["busiest_write_keys"] == {
        "t": {"key": "run", "writes": 5, "units": 10, "peak_writes_per_s": 3, "peak_units_per_s": 6}
    }
    # AND the keys that took the most writes in all, the most first
    assert [k["key"] for k in state.snapshot()["most_written_keys"]["t"]] == ["run", "task"]
