"""``foreachBatch(ExactlyOnceSink(...))`` on ``local-cluster[2,1,1024]``, in key mode and in
replay mode, under faults: a driver killed with SIGKILL in its commit and restarted from its
checkpoint, a Python worker killed after its task's put, lost responses and 500s after the
write, throttled records and ledger writes. The sink is what Spark 3.5 (EMR 7, Glue 5) writes
with, so ``make test-spark35`` runs this module, on pyspark 3.5. On Spark 4 ``make test`` skips
it (its two clusters cost CI two minutes): there the cluster's driver kill is the one of
``format("keo")`` (test_spark_cluster.py, test_spark_cluster_replay.py), and the sink's own
steps run in local mode (test_spark_sink.py, test_spark_replay.py, on both Sparks).

One scenario per mode (a driver start launches a cluster: seconds each), two drivers
(cluster_job.py with ``"sink": "foreach_batch"``) on one streaming query over two event files,
one micro-batch each, two partitions:

1. driver A puts batch 0; ``batch_before_complete=stop`` freezes the sink's commit, which
   runs in the driver's own Python process (foreachBatch calls back into it); the test kills
   it (its Python process and its JVM);
2. driver B restarts the query from the checkpoint: Spark replays batch 0 (every row found:
   nothing sent again), then runs batch 1, where the first attempt of task 0 kills its Python
   worker right after its put (Spark retries the task, whose rows are already in the stream);
   then it reads the stream back on the cluster with ``spark_jobs.read_records``.

Every Kinesis call of the drivers and executors goes through a fault proxy, every ledger call
through another. The stream is read back with plain boto3 as a KCL consumer reads it
(streamcheck). Nothing waits on the wall clock: each step waits for a state under a deadline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cluster_driver
import pytest
from cluster_driver import DRIVER_TIMEOUT_S, EXIT_TIMEOUT_S
from spark_support import (
    FAST_LEASES,
    SINK_ON_A_CLUSTER,
    assert_exactly_these,
    streamcheck,
    write_event_files,
)

from dedupe_store.clock import SkewedClock, SystemClock
from dedupe_store.states import RunState
from devstack.fault_proxy import FaultProxy, FaultRule, FaultSchedule
from producer.audit.stream import Anomaly, audit_stream
from producer.wiring import Stack, build_stack
from spark_jobs.writer import producer_settings

pytest.importorskip("pyspark")
pytestmark = [
    *SINK_ON_A_CLUSTER,
    # a mode's scenario runs in its first test's setup: two drivers, two clusters
    pytest.mark.timeout(900),  # beyond the deadlines below, which say what they waited for
]

QUERY = "cluster-sink"
FILES, PER_FILE = 2, 120  # one micro-batch each, two partitions of about 60 rows
LEASES_OVER_MS = 60_000  # a clock this far ahead sees every lease of the scenario expired
KILLED_WORKER = {"batch": 1, "partition": 0, "attempt": 0, "step": "after_put", "action": "kill"}


def kinesis_faults() -> FaultSchedule:
    """The first PutRecords loses its response, the second gets a 500 after the write, the
    third has records throttled; then one in ten meets one of them."""
    faults = ("drop_response", "error_after", "partial")
    once = [FaultRule("PutRecords", fault, probability=1.0, limit=1) for fault in faults]
    then = [FaultRule("PutRecords", fault, probability=0.1, fraction=0.3) for fault in faults]
    return FaultSchedule([*once, *then], seed=36)


@dataclass
class SinkRun:
    mode: str
    work_dir: Path
    stack: Stack  # on the emulators, not the proxies: the test's own reads
    kinesis: Any
    kinesis_proxy: FaultProxy
    ledger_proxy: FaultProxy
    rows: list[Counter[tuple[str, bytes]]]  # each batch's rows, as a multiset
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    frozen: list[str] = field(default_factory=list)
    driver_pid: int = 0
    in_stream_at_kill: int = -1
    settled_at_kill: bool = True
    orphans: list[str] = field(default_factory=list)

    def in_stream(self) -> Counter[tuple[str, bytes]]:
        return cluster_driver.in_stream(self.kinesis, self.stack.settings.stream)

    def counts(self, batch: int) -> dict[str, int] | None:
        """What the sink recorded of ``batch`` once it settled: the batch ledger's record in
        key mode, the COMPLETE run in replay mode; None before."""
        stream, now_ms = self.stack.settings.stream, self.stack.clock.now_ms()
        if self.mode == "key":
            done = self.stack.ledger.completed_batch(stream, QUERY, batch, now_ms=now_ms)
            return dict(done.counts) if done is not None else None
        run = self.stack.ledger.get_run(stream, f"{QUERY}/{batch}")
        return dict(run.counts) if run is not None and run.state is RunState.COMPLETE else None


def _kill_in_the_commit(run: SinkRun, job: dict[str, Any]) -> None:
    """Driver A: batch 0 put, the sink's commit frozen, the driver killed."""
    logs = run.work_dir / "first"
    with cluster_driver.running(job, logs, KEO_FAILPOINTS="batch_before_complete=stop") as driver:
        frozen = cluster_driver.wait_frozen(driver, logs)
        run.driver_pid = driver.pid
        run.frozen = [str(pid) for pid in frozen.frozen]
        run.in_stream_at_kill = sum((run.in_stream() & run.rows[0]).values())
        run.settled_at_kill = run.counts(0) is not None
        cluster_driver.kill_driver(driver, frozen)
    run.steps["first"] = cluster_driver.steps(logs.with_suffix(".out"))


def _restart_with_a_worker_killed(run: SinkRun, job: dict[str, Any]) -> None:
    """Driver B: batch 0 replayed, batch 1 with a Python worker killed after its put, the
    stream read back with read_records."""
    logs = run.work_dir / "second"
    second = {**job, "run": "second", "read": "read_records", "task_failpoints": [KILLED_WORKER]}
    with cluster_driver.running(second, logs) as driver:
        assert driver.wait(DRIVER_TIMEOUT_S) == 0, cluster_driver.tail(logs.with_suffix(".err"))
    run.steps["second"] = cluster_driver.steps(logs.with_suffix(".out"))


@pytest.fixture(scope="module", params=["key", "replay"])
def sink_run(
    request: pytest.FixtureRequest,
    emulators: Any,
    spark_table: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SinkRun]:
    mode = request.param
    work_dir = tmp_path_factory.mktemp(f"keo-cluster-sink-{mode}")
    write_event_files(work_dir / "in", files=FILES, per_file=PER_FILE)
    rows = [cluster_driver.rows_of(work_dir / "in" / f"events-{f}.json") for f in range(FILES)]
    timing = {**FAST_LEASES, "KEO_DEDUPE": mode, "KEO_LEDGER_MAX_RETRY_ATTEMPTS": "8"}
    direct = cluster_driver.new_stream(emulators, spark_table, f"sink-{mode}", timing)
    with (
        FaultProxy(emulators.kinesis, kinesis_faults()) as kinesis,
        FaultProxy(emulators.dynamodb, cluster_driver.throttled_ledger_writes(seed=36)) as ledger,
    ):
        run = SinkRun(
            mode=mode,
            work_dir=work_dir,
            stack=build_stack(producer_settings(direct)),
            kinesis=streamcheck.kinesis_client(emulators.kinesis),
            kinesis_proxy=kinesis,
            ledger_proxy=ledger,
            rows=rows,
        )
        through_proxies = {
            **direct,
            "KEO_KINESIS_ENDPOINT_URL": kinesis.endpoint,
            "KEO_DYNAMODB_ENDPOINT_URL": ledger.endpoint,
        }
        job = cluster_driver.stream_job(work_dir, through_proxies, QUERY, sink="foreach_batch")
        try:
            _kill_in_the_commit(run, job)
            _restart_with_a_worker_killed(run, job)
            left = cluster_driver.wait_gone(cluster_driver.under(work_dir), EXIT_TIMEOUT_S)
            run.orphans = [f"{pid} {cluster_driver.cmdline(pid)}" for pid in left]
            yield run
        finally:
            cluster_driver.kill(cluster_driver.under(work_dir))


# --- what it left -----------------------------------------------------------------------------


def test_a_driver_killed_in_its_commit_restarts_from_the_checkpoint_and_adds_nothing(
    sink_run: SinkRun,
) -> None:
    run = sink_run
    # GIVEN driver A frozen in the sink's commit of batch 0 (its own Python process: the
    # foreachBatch function runs there), after its tasks put every row, and killed
    assert run.steps["first"]["session"]["executors"] == 2
    assert "stream" not in run.steps["first"]  # it never finished
    assert run.frozen == [str(run.driver_pid)]
    assert run.in_stream_at_kill == PER_FILE
    assert not run.settled_at_kill

    # WHEN driver B restarted the query from the checkpoint
    assert run.steps["second"]["stream"]["batches"] == [0, 1]

    # THEN batch 0 was replayed: every row found in the stream, none sent again
    replayed = run.counts(0)
    assert replayed is not None
    assert (replayed["sent"], replayed["duplicates"]) == (0, PER_FILE)


def test_a_python_worker_killed_after_its_put_is_retried_and_sends_nothing_twice(
    sink_run: SinkRun,
) -> None:
    run = sink_run
    # GIVEN the first attempt of task 0 of batch 1, whose Python worker killed itself right
    # after the task's put
    marks = sorted(path.name for path in (run.work_dir / "marks").glob("kill-b1-p0-a0-pid*"))
    assert len(marks) == 1, marks
    # WHEN Spark retried the task and the batch settled
    settled = run.counts(1)
    assert settled is not None
    # THEN the retry found the killed attempt's rows in the stream and sent the rest
    assert settled["duplicates"] > 0
    assert settled["sent"] + settled["duplicates"] == PER_FILE
    assert settled["unresolved"] == 0


def test_every_row_is_in_the_stream_once_as_a_kcl_consumer_reads_it(sink_run: SinkRun) -> None:
    run = sink_run
    # GIVEN both batches, through lost responses, 500s, throttled records and ledger writes
    injected = run.kinesis_proxy.schedule.injected
    for fault in ("drop_response", "error_after", "partial"):
        assert injected[f"PutRecords:{fault}"] > 0, injected
    assert run.ledger_proxy.schedule.injected["UpdateItem:throttle"] > 0
    # WHEN the stream is read back with plain boto3, as KCL delivers it
    found = run.in_stream()
    # THEN it holds every row of both batches, each once, and nothing else
    expected = sum(run.rows, Counter())
    cluster_driver.assert_each_row_once(found, expected)
    if run.mode == "key":
        # AND the killed worker's keys, which its retry found in the stream under the killed
        # task's claim group, read as in flight until the reconciler settles that group: never
        # missing, never twice
        keys = [key for key, _ in expected]
        before = audit_stream(run.stack.reader, run.stack.ledger, expected=keys)
        assert before.counts[Anomaly.IN_FLIGHT] > 0, before.as_json()
        assert before.anomalies == before.counts[Anomaly.IN_FLIGHT], before.as_json()
        # WHEN the reconciler runs once the killed task's lease has expired for everyone
        later = build_stack(run.stack.settings, clock=SkewedClock(SystemClock(), LEASES_OVER_MS))
        reconciled = later.reconciler(owner="reconciler").run_once()
        assert (reconciled.delivered, reconciled.pending) == (before.counts[Anomaly.IN_FLIGHT], 0)
        # THEN each key is where the ledger says, and keo's audit is clean
        assert_exactly_these(run.kinesis, run.stack, keys)


def test_read_records_on_the_cluster_reads_each_key_once(sink_run: SinkRun) -> None:
    run = sink_run
    # WHEN driver B read the stream back with spark_jobs.read_records (one task per shard)
    keys = Counter(run.steps["second"]["read"]["keys"])
    # THEN it read every key of both batches once
    expected = {key for batch in run.rows for key, _ in batch}
    assert set(keys) == expected
    assert set(keys.values()) == {1}


def test_no_process_outlives_its_driver(sink_run: SinkRun) -> None:
    # GIVEN a driver and its JVM killed with SIGKILL, and a Python worker killed
    # THEN every executor and Python worker ended on its own
    assert sink_run.orphans == []
