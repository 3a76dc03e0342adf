"""The scale harness (devstack.scale_bench) at a small size under the quota mode: 8 tasks in 2
worker processes on 4 shards, its three scenarios measured once for the module, then exactness
and the calls it counted, per query and per shard (counts, never times).

The counts asserted are what the code does today. Where issue 39 sets a target the code does
not meet yet, the test that states the target is marked ``xfail(strict=True)``: it starts to
pass, and so fails, when the target is met, and the loose bound beside it is to be tightened.
"""

from __future__ import annotations

import pytest
import stacks

from devstack import emulators as local_stack
from devstack.scale_bench import QueryFigures, ScenarioFigures, Shape, measure

SHAPE = Shape(tasks=8, workers=2, shards=4)
# the tests' short leases (a replay waits for the killed attempts' leases), as options
TIMING = {name: str(value) for name, value in stacks.FAST.items()}


@pytest.fixture(scope="module")
def figures(emulators: local_stack.Endpoints) -> dict[str, ScenarioFigures]:
    """The three scenarios, once, through quota proxies of their own (AWS's quotas)."""
    with stacks.quota_mode(emulators) as stack:
        measured = measure(stack, SHAPE, timing=TIMING)
    return {scenario.scenario: scenario for scenario in measured}


def _query(figures: dict[str, ScenarioFigures], scenario: str, query: str) -> QueryFigures:
    return next(q for q in figures[scenario].queries if q.query == query)


def test_every_scenario_leaves_every_row_in_the_stream_exactly_once(
    figures: dict[str, ScenarioFigures],
) -> None:
    for scenario in ("clean", "killed", "retry-wave"):
        audit = figures[scenario].audit
        assert audit.rows == SHAPE.tasks * SHAPE.task_rows
        assert (audit.missing, audit.duplicated, audit.unexpected) == (0, 0, 0), scenario


def test_a_clean_write_describes_the_stream_and_the_table_once_and_reads_nothing_back(
    figures: dict[str, ScenarioFigures],
) -> None:
    clean = _query(figures, "clean", "clean")
    assert clean.committed
    assert (clean.attempts, clean.failed_attempts) == (SHAPE.tasks, {})
    # the driver's check and its listing of the shards (the put pacers'), shipped to the
    # tasks: the workers ask nothing
    assert clean.control_plane == {
        "DescribeStreamSummary": 1,
        "DescribeTable": 1,
        "ListShards": 1,
    }
    assert "GetRecords" not in clean.calls
    assert "GetShardIterator" not in clean.calls
    assert clean.rows == {"sent": SHAPE.tasks * SHAPE.task_rows}


def test_a_killed_execution_commits_nothing_and_its_replay_finds_what_it_put(
    figures: dict[str, ScenarioFigures],
) -> None:
    killed = _query(figures, "killed", "killed")
    replay = _query(figures, "killed", "replay")
    assert not killed.committed
    assert 0 < killed.attempts < SHAPE.tasks + SHAPE.workers
    assert replay.committed
    assert replay.failed_attempts == {}
    # the replay found the killed execution's rows, and sent the rest
    assert replay.rows["duplicates"] > 0
    assert replay.rows["duplicates"] + replay.rows.get("sent", 0) == SHAPE.tasks * SHAPE.task_rows
    # a restarted driver checks the stream and the table again, once
    assert replay.control_plane["DescribeStreamSummary"] == 1
    assert replay.control_plane["DescribeTable"] == 1


def test_a_replay_reads_each_shard_once_per_recovering_task_today(
    figures: dict[str, ScenarioFigures],
) -> None:
    replay = _query(figures, "killed", "replay")
    iterators = replay.reads_per_shard["GetShardIterator"]
    records = replay.reads_per_shard["GetRecords"]
    # every shard is read: each task's 50 rows route to all 4 shards
    assert iterators.mean >= 1
    assert records.mean >= 1
    # NOT YET issue 39's target: each recovering task reads every shard its rows route to
    # (twice when it waited for a killed attempt's lease), so the reads per shard grow with T
    # (8 tasks: about 10 GetShardIterator and 20 GetRecords a shard); and each lists the
    # shards (ListShards) when it starts reading, beside the driver's listings
    assert iterators.max <= 2 * SHAPE.tasks
    assert records.max <= 4 * SHAPE.tasks
    assert replay.control_plane["ListShards"] <= 2 + 2 * SHAPE.tasks


def test_a_replay_its_driver_planned_reads_each_shard_once_whatever_the_tasks(
    figures: dict[str, ScenarioFigures],
) -> None:
    # (issue 39's target: a replay started once the killed leases ended, whose driver read
    # the recovery once and shipped it to the tasks)
    replay = _query(figures, "killed-later", "replay")
    assert replay.committed
    assert replay.rows["duplicates"] > 0
    # each shard's window holds one page of data (400 small rows on 4 shards): pages + 2
    assert replay.reads_per_shard["GetShardIterator"].max == 1
    assert replay.reads_per_shard["GetRecords"].max <= 1 + 2
    # the driver's listings: its plan's, and the put pacers' (shipped: no worker lists)
    assert replay.control_plane["ListShards"] <= 2


def test_a_retry_wave_retries_every_fourth_task_once_and_its_retries_find_their_rows(
    figures: dict[str, ScenarioFigures],
) -> None:
    wave = _query(figures, "retry-wave", "retry wave")
    failing = SHAPE.tasks // 4
    assert wave.committed
    assert wave.failed_attempts == {"FailpointError": failing}
    assert wave.attempts == SHAPE.tasks + failing
    # each failed attempt had put all its rows (one request): its retry sent none again
    assert wave.rows == {
        "sent": (SHAPE.tasks - failing) * SHAPE.task_rows,
        "duplicates": failing * SHAPE.task_rows,
    }
    assert wave.control_plane["DescribeStreamSummary"] == 1
    assert wave.control_plane["DescribeTable"] == 1
    # each retry reads the shards its rows route to: a shard is read once per retried task
    # (one GetShardIterator a window; twice if it waited for the failed attempt's lease),
    # routed by the driver's listing (made before any task put): the retries list nothing
    assert failing <= wave.reads_per_shard["GetShardIterator"].max <= 2 * failing
    assert wave.control_plane["ListShards"] == 1


def test_the_busiest_ledger_item_of_a_batch_of_up_to_256_tasks_is_the_run_item(
    figures: dict[str, ScenarioFigures],
) -> None:
    for scenario in ("clean", "retry-wave"):
        busiest = figures[scenario].busiest_ledger_item
        assert "/run/" in busiest["key"]
        # a batch's first 256 tasks register and finish on the run item (stripe 0): 2 writes
        # a task and more, here within a second or two; the tasks past those count on stripe
        # items of 256 tasks each (issue 39: no hot ledger item; bench/results at T = 2,000)
        assert busiest["writes"] >= 2 * SHAPE.tasks
        assert busiest["peak_writes_per_s"] >= 1
        assert figures[scenario].most_written_ledger_items[0]["key"] == busiest["key"]
