"""Issue 39 on a real cluster: ``foreachBatch(ExactlyOnceSink)`` in replay mode on
``local-cluster[2,1,1024]``, one micro-batch of 16 tasks over a stream of 8 shards, its driver
killed after half the tasks put, and the batch replayed from the checkpoint: every row once,
and the replay reads each shard about once, not once per task.

The driver plans a replayed batch's recovery (``Guarantee.plan_recovery``:
``producer.replay.recovery.plan_reads_once_over`` supersedes the killed execution, waits until
its lease is over for every clock, and reads every shard's earlier windows once) and ships it
with the batch's tasks, whose workers are seeded with it (``producer.replay.shared_reads``) and
read nothing. Before it, each of the 16 tasks read every shard its rows route to: 16
``GetShardIterator`` and 21 ``GetRecords`` a shard (the issue's measure). This is the cluster's
cross-check of the scale harness's ``killed`` scenario (integration/test_scale_harness.py),
with the same arithmetic on the same counters.

Every Kinesis call of the drivers and executors goes through the quota mode's proxy (AWS's
quotas; it counts calls by operation and reads by shard), every ledger call through
DynamoDB's. Spark 3.5's sink, so ``make test-spark35`` runs it (marker spark35) and Spark 4's
``make test`` skips it, as it does test_spark_cluster_sink.py.

1. driver A runs batch 0; the first attempts of tasks 8 and 9 stop at their first request
   (``before_put``): each executor has one core, and Spark hands out a stage's tasks in order,
   so tasks 0 to 7 have put their rows and 10 to 15 never start. The test kills the driver, its
   JVM and the two stopped tasks, and waits until every process of the cluster has ended;
2. driver B, whose cluster started while A worked and has waited since for a file (its
   session's start overlaps A's work: nothing of it calls Kinesis or the ledger before), is
   let go at once, within the killed execution's lease: it restarts the query from the
   checkpoint, its sink waits on the driver for that lease and plans, and Spark replays batch
   0, 16 tasks again. The proxies' counters are taken right before the go and once B ended.

The stream is read back with plain boto3 as a KCL consumer reads it (streamcheck). Nothing
waits on the wall clock: each step waits for a state under a deadline.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cluster_driver
import pytest
from cluster_driver import DRIVER_TIMEOUT_S, EXIT_TIMEOUT_S
from spark_support import FAST_LEASES, SINK_ON_A_CLUSTER, streamcheck, write_event_files

from dedupe_store.records import ReplayRun
from dedupe_store.states import RunState
from devstack.dynamodb_quota_proxy import DynamoDbQuotaProxy
from devstack.quota_proxy import KinesisQuotaProxy
from devstack.scale_bench import (
    Counted,
    ShardSpread,
    calls_between,
    reads_per_shard,
    throttles_between,
)
from producer.wiring import Stack, build_stack
from spark_jobs.writer import producer_settings

pytest.importorskip("pyspark")
pytestmark = [
    *SINK_ON_A_CLUSTER,
    # the scenario runs in the first test's setup: two drivers, two clusters
    pytest.mark.timeout(900),  # beyond the deadlines below, which say what they waited for
]

QUERY = "cluster-scale"
SHARDS, TASKS, PER_TASK = 8, 16, 40
EXECUTORS = 2  # local-cluster[2,1,1024]: one core, and so one Python worker, each
ROWS = TASKS * PER_TASK  # one event file: one micro-batch, repartitioned into 16 tasks
STOPPED = (8, 9)  # one a core: once both stop, tasks 0 to 7 have put, 10 to 15 wait
PAGE_ROWS = 10_000  # a GetRecords page's records at most (the reader's limit)
# a lease long enough that driver B, let go once A's cluster has ended, plans while the killed
# execution's still runs (its sink waits for it: what each task would wait)
TIMING = {**FAST_LEASES, "KEO_DEDUPE": "replay", "KEO_LEASE_S": "20"}


@dataclass
class ScaleRun:
    work_dir: Path
    stack: Stack  # on the emulators, not the proxies: the test's own reads
    kinesis: Any
    rows: Counter[tuple[str, bytes]]  # the batch's rows, as a multiset
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    in_stream_at_kill: int = -1
    lease_left_at_go_ms: int = -1  # of the killed execution, when driver B was let go
    calls: dict[str, int] = field(default_factory=dict)  # driver B's, by operation
    throttles: dict[str, int] = field(default_factory=dict)  # driver B's, by operation
    reads: dict[str, ShardSpread] = field(default_factory=dict)  # driver B's, a shard
    by_shard: dict[str, dict[str, int]] = field(default_factory=dict)  # operation -> shard
    orphans: dict[str, list[str]] = field(default_factory=dict)  # by driver

    def run(self) -> ReplayRun:
        found = self.stack.ledger.get_run(self.stack.settings.stream, f"{QUERY}/0")
        assert found is not None, "no run item for batch 0"
        return found

    def in_stream(self) -> Counter[tuple[str, bytes]]:
        return cluster_driver.in_stream(self.kinesis, self.stack.settings.stream)

    def log_lines(self) -> list[str]:
        """The product's INFO lines of every Python process that logged (cluster_job.py)."""
        return [
            line
            for path in sorted((self.work_dir / "logs").glob("*.log"))
            for line in path.read_text(encoding="utf-8").splitlines()
        ]


def _counted(kinesis: KinesisQuotaProxy, ledger: DynamoDbQuotaProxy) -> Counted:
    return Counted(kinesis.report()["quotas"], ledger.report()["quotas"])


def _ended(run: ScaleRun, driver: str, pids: set[int]) -> None:
    """Waits until ``pids`` (a driver's cluster) have ended; notes those that did not."""
    left = cluster_driver.wait_gone(pids, EXIT_TIMEOUT_S)
    run.orphans[driver] = [f"{pid} {cluster_driver.cmdline(pid)}" for pid in left]


def _kill_after_half_the_puts(run: ScaleRun, driver: subprocess.Popen[bytes]) -> None:
    """Driver A, once tasks 8 and 9 of batch 0 stopped at their first request (tasks 0 to 7
    put): the driver, its JVM and the stopped tasks killed, and its cluster waited for."""
    logs = run.work_dir / "first"
    frozen = cluster_driver.wait_frozen(driver, logs, count=len(STOPPED))
    run.stopped = sorted(p.name for p in (run.work_dir / "marks").glob("stop-b0-*"))
    run.in_stream_at_kill = sum((run.in_stream() & run.rows).values())
    cluster_driver.kill_driver(driver, frozen)
    run.steps["first"] = cluster_driver.steps(logs.with_suffix(".out"))
    _ended(run, "first", set(frozen.processes))


def _grown_by_shard(before: Counted, after: Counted, stream: str) -> dict[str, dict[str, int]]:
    """``stream``'s read calls in between, by operation, then by shard (those it called)."""
    grown: dict[str, dict[str, int]] = {}
    for operation, now in after.kinesis["calls_by_shard"].items():
        was = before.kinesis["calls_by_shard"].get(operation, {})
        grown[operation] = {
            where.removeprefix(f"{stream}/"): n - was.get(where, 0)
            for where, n in sorted(now.items())
            if where.startswith(f"{stream}/") and n > was.get(where, 0)
        }
    return grown


def _replay(
    run: ScaleRun,
    driver: subprocess.Popen[bytes],
    go: Path,
    proxies: tuple[KinesisQuotaProxy, DynamoDbQuotaProxy],
) -> None:
    """Driver B, its cluster up and waiting: let go, the query restarted from the checkpoint
    and batch 0 replayed; the proxies' counters taken right before and once it ended."""
    logs = run.work_dir / "second"
    before = _counted(*proxies)
    killed = run.run().executions[0]
    run.lease_left_at_go_ms = killed.lease_expires_at_ms - run.stack.clock.now_ms()
    go.touch()
    assert driver.wait(DRIVER_TIMEOUT_S) == 0, cluster_driver.tail(logs.with_suffix(".err"))
    after = _counted(*proxies)
    run.steps["second"] = cluster_driver.steps(logs.with_suffix(".out"))
    stream = run.stack.settings.stream
    run.calls = calls_between(before, after)
    run.throttles = throttles_between(before, after)
    run.reads = reads_per_shard(before, after, stream, SHARDS)
    run.by_shard = _grown_by_shard(before, after, stream)
    _ended(run, "second", cluster_driver.under(run.work_dir))


@pytest.fixture(scope="module")
def scale_run(
    emulators: Any, spark_table: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ScaleRun]:
    work_dir = tmp_path_factory.mktemp("keo-cluster-scale")
    write_event_files(work_dir / "in", files=1, per_file=ROWS)
    direct = cluster_driver.new_stream(emulators, spark_table, "scale", TIMING, shards=SHARDS)
    with (
        KinesisQuotaProxy(emulators.kinesis) as kinesis,
        DynamoDbQuotaProxy(emulators.dynamodb) as ledger,
    ):
        run = ScaleRun(
            work_dir=work_dir,
            stack=build_stack(producer_settings(direct)),
            kinesis=streamcheck.kinesis_client(emulators.kinesis),
            rows=cluster_driver.rows_of(work_dir / "in" / "events-0.json"),
        )
        through_proxies = {
            **direct,
            "KEO_KINESIS_ENDPOINT_URL": kinesis.endpoint,
            "KEO_DYNAMODB_ENDPOINT_URL": ledger.endpoint,
        }
        job = cluster_driver.stream_job(
            work_dir, through_proxies, QUERY, sink="foreach_batch", partitions=TASKS
        )
        stops = [
            {"batch": 0, "partition": p, "attempt": 0, "step": "before_put", "action": "stop"}
            for p in STOPPED
        ]
        go = work_dir / "go"
        second = {**job, "run": "second", "start_when": str(go)}
        try:
            first = {**job, "task_failpoints": stops}
            with cluster_driver.running(first, work_dir / "first") as driver_a:
                cluster_driver.wait_step(driver_a, work_dir / "first", "session")
                # driver B's cluster starts while A works and waits, idle, for its go: only
                # its session's start overlaps A (nothing of B calls Kinesis or the ledger
                # before the go), seconds saved
                with cluster_driver.running(second, work_dir / "second") as driver_b:
                    _kill_after_half_the_puts(run, driver_a)
                    _replay(run, driver_b, go, (kinesis, ledger))
            yield run
        finally:
            cluster_driver.kill(cluster_driver.under(work_dir))


# --- what it left -----------------------------------------------------------------------------


def test_a_driver_killed_after_half_the_puts_replays_only_what_was_missing(
    scale_run: ScaleRun,
) -> None:
    run = scale_run
    # GIVEN driver A killed while tasks 8 and 9 were stopped at their first request: tasks 0
    # to 7 had put their rows, 10 to 15 had not started
    assert [name.rsplit("-pid", 1)[0] for name in run.stopped] == [
        f"stop-b0-p{p}-a0" for p in STOPPED
    ]
    assert run.steps["first"]["session"]["executors"] == EXECUTORS
    assert "stream" not in run.steps["first"]  # it never finished
    assert run.in_stream_at_kill == STOPPED[0] * PER_TASK

    # WHEN driver B restarted the query from the checkpoint and Spark replayed batch 0
    assert run.steps["second"]["stream"]["batches"] == [0]
    replayed = run.run()

    # THEN the run is COMPLETE: the rows found were not sent again, only the rest were
    assert replayed.state is RunState.COMPLETE
    assert replayed.counts["duplicates"] == run.in_stream_at_kill
    assert replayed.counts["sent"] == ROWS - run.in_stream_at_kill
    assert len(replayed.executions) == 2


def test_every_row_is_in_the_stream_once_as_a_kcl_consumer_reads_it(scale_run: ScaleRun) -> None:
    run = scale_run
    # WHEN the stream is read back with plain boto3, as KCL delivers it
    contents = streamcheck.read_stream(run.kinesis, run.stack.settings.stream)
    found = Counter((r.partition_key, r.data) for r in contents.records)
    # THEN it holds every row of the batch, each once, and nothing else
    cluster_driver.assert_each_row_once(found, run.rows)
    # AND the rows are spread over every shard
    assert len(contents.per_shard()) == SHARDS


def test_the_replay_reads_each_shard_about_once_not_once_per_task(scale_run: ScaleRun) -> None:
    run = scale_run
    # GIVEN the killed execution's windows, on every shard: the pages of data a shard holds
    # (its rows in the stream at the kill, each shard's a page at most)
    pages = -(-run.in_stream_at_kill // PAGE_ROWS)
    assert pages == 1
    # ... and driver B, let go while the killed execution's lease still ran, superseded it,
    # waited for that lease on the driver, then read the windows once there, before its 16
    # tasks, each of which recovered from what it was sent
    assert run.lease_left_at_go_ms > 0
    logged = [line for line in run.log_lines() if f" run={QUERY}/0 " in line]
    assert any("waits on the driver for earlier leases" in line for line in logged), logged
    assert any("replay recovery planned on the driver" in line for line in logged), logged
    assert run.run().executions[0].superseded
    replay = f" execution={run.run().executions[1].execution_id} "
    attempts = [line for line in logged if "replay attempt stream=" in line and replay in line]
    assert len(attempts) == TASKS, attempts
    assert all(" step=RECOVER " in line for line in attempts), attempts

    # WHEN the replay's calls are counted, each shard's
    iterators, records = run.reads["GetShardIterator"], run.reads["GetRecords"]

    # THEN each shard was read about once (an iterator, its pages and the tip), not once per
    # task (16 tasks read each shard 16 times before the driver planned)
    assert iterators.max <= 2, run.by_shard
    assert records.max <= pages + 2, run.by_shard
    # (every shard read: each holds rows of the batch)
    assert len(run.by_shard["GetShardIterator"]) == SHARDS, run.by_shard
    # AND the control plane once for the query, as in the scale harness: the driver's check of
    # the stream and the table, a listing for its plan and one for the tasks' put pacers
    # (shipped with the write: a Python worker lists none)
    assert run.calls["DescribeStreamSummary"] == run.calls["DescribeTable"] == 1, run.calls
    assert run.calls["ListShards"] <= 2, run.calls
    # AND nothing was throttled: the quotas had room for the stream's other consumers
    assert run.throttles == {}, run.throttles


def test_no_process_outlives_its_driver(scale_run: ScaleRun) -> None:
    # GIVEN driver A and its JVM killed with SIGKILL, two tasks stopped and killed, and driver
    # B ended
    # THEN every executor and Python worker of both clusters ended on its own
    assert scale_run.orphans == {"first": [], "second": []}
