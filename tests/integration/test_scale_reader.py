"""The scale harness's reader (devstack.scale_reader) at a small size under the quota mode: a
stream of 8 shards read in 3 micro-batches by 2 worker processes, with the default options and
with ``max_records_per_trigger``, measured once for the module; then exactness and the calls
counted per batch (counts, never times): what a batch asks must not grow with the batches.
"""

from __future__ import annotations

import pytest
import stacks

from devstack import emulators as local_stack
from devstack.scale_reader import ReaderShape, StepFigures, VariantFigures, measure
from spark_jobs.stream_planner import IDLE_POLL_MS

SHAPE = ReaderShape(shards=8, batches=3, workers=2, rows_per_shard=5, idle_s=1.0)
LIMITED = f"max_records_per_trigger={SHAPE.batch_rows}"


@pytest.fixture(scope="module")
def figures(emulators: local_stack.Endpoints) -> dict[str, VariantFigures]:
    """Both options, once, through quota proxies of their own (AWS's quotas)."""
    with stacks.quota_mode(emulators) as stack:
        measured = measure(stack, SHAPE)
    return {variant.variant: variant for variant in measured}


def _steps(variant: VariantFigures, prefix: str) -> list[StepFigures]:
    return [step for step in variant.steps if step.step.startswith(prefix)]


@pytest.mark.parametrize("options", ["default", LIMITED])
def test_every_row_written_is_read_exactly_once_across_the_batches(
    figures: dict[str, VariantFigures], options: str
) -> None:
    variant = figures[options]
    audit = variant.audit
    assert audit.rows == variant.rows_read == SHAPE.batches * SHAPE.batch_rows
    assert (audit.missing, audit.duplicated, audit.unexpected) == (0, 0, 0)
    # one batch's rows a batch: a round written before each trigger, or a backlog cut by the limit
    assert [b.rows for b in _steps(variant, "batch")] == [SHAPE.batch_rows] * SHAPE.batches


@pytest.mark.parametrize("options", ["default", LIMITED])
def test_each_batch_lists_the_shards_once_and_asks_each_shard_the_same_whatever_the_batch(
    figures: dict[str, VariantFigures], options: str
) -> None:
    variant = figures[options]
    (start,) = _steps(variant, "start")
    assert start.control_plane == {"ListShards": 1}  # trim_horizon: the shards, no tail
    batches = _steps(variant, "batch")
    assert len(batches) == SHAPE.batches
    for batch in batches:
        # no DescribeStreamSummary: the control plane a batch is one listing, batch after batch
        assert batch.control_plane == {"ListShards": 1}
        assert batch.partitions == SHAPE.shards
        assert batch.throttles == {}
        # the driver: each shard's tail (default) or its share counted (the limit), one
        # iterator and one page a shard
        for operation in ("GetShardIterator", "GetRecords"):
            assert batch.planning[operation].total == SHAPE.shards, operation
            assert batch.planning[operation].max == 1, operation
        # the executors: a task a shard, one iterator and one page each
        for operation in ("GetShardIterator", "GetRecords"):
            assert batch.reading[operation].total == SHAPE.shards, operation
            assert batch.reading[operation].max == 1, operation


@pytest.mark.parametrize("options", ["default", LIMITED])
def test_an_idle_query_asks_kinesis_once_a_second_not_at_every_trigger(
    figures: dict[str, VariantFigures], options: str
) -> None:
    (idle,) = _steps(figures[options], "idle")
    assert idle.triggers >= 1
    assert idle.rows == idle.partitions == 0
    # a caught-up query looks again once a second (spark_jobs.stream_planner.IDLE_POLL_MS),
    # however often Spark's triggers ask (spark.sql.streaming.pollingDelay apart): a look is
    # the listing, and an iterator and pages on every shard; a trigger sooner asks nothing
    looks = idle.control_plane["ListShards"]
    assert idle.control_plane == {"ListShards": looks}
    assert 1 <= looks <= SHAPE.idle_s / (IDLE_POLL_MS / 1000) + 2
    if options == "default":  # a look takes a trigger's time: the others within it ask nothing
        assert looks < idle.triggers
    assert idle.planning["GetShardIterator"].total == looks * SHAPE.shards
    # a tail search and a count under the limit alike stop at a page short of what they asked
    # for and 0 ms behind (the count's holds the record checked alone): one page a shard
    assert idle.planning["GetRecords"].total == looks * SHAPE.shards
    assert idle.reading["GetRecords"].total == 0
