"""What ``KeoStreamReader`` tells Spark about batch sizes, and what it makes of Spark's limits
(pyspark imported, no Spark started)."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("pyspark.sql.streaming.datasource")

from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from spark_jobs.options import StreamReadOptions
from spark_jobs.stream_planner import Budget
from spark_jobs.stream_reader import KeoStreamReader


def reader(**options: str) -> KeoStreamReader:
    return KeoStreamReader(
        StreamReadOptions.parse({"stream": "orders", "region": "us-east-1", **options})
    )


def test_max_records_per_trigger_is_the_default_read_limit() -> None:
    assert reader().getDefaultReadLimit() == ReadAllAvailable()
    assert reader(max_records_per_trigger="500").getDefaultReadLimit() == ReadMaxRows(500)


def test_a_per_shard_bound_alone_still_bounds_batches() -> None:
    # GIVEN only a per-shard bound
    only_per_shard = reader(max_records_per_shard_per_trigger="100")
    # WHEN Spark hands back the default limit
    limit = only_per_shard.getDefaultReadLimit()
    # THEN each batch is bounded per shard, not in all
    assert only_per_shard._budget(limit) == Budget(None, 100)


def test_spark_asking_for_everything_overrides_the_options() -> None:
    bounded = reader(max_records_per_trigger="500", max_records_per_shard_per_trigger="50")
    assert bounded._budget(ReadMaxRows(500)) == Budget(500, 50)
    assert bounded._budget(ReadAllAvailable()) is None
    assert bounded._budget(ReadMinRows(10)) is None


def test_the_reader_travels_to_the_executors_without_clients_and_skips_spark_placeholders() -> None:
    # GIVEN a reader that has built its planner (clients) on the driver
    driver_side = reader()
    assert driver_side.planner is not None
    # WHEN Spark pickles it for the executors
    executor_side = pickle.loads(pickle.dumps(driver_side))  # noqa: S301 - our own object
    # THEN it carries its options only, and reads nothing for a placeholder partition
    assert executor_side._planner is None
    assert executor_side.options == driver_side.options
    assert list(executor_side.read(InputPartition(None))) == []
