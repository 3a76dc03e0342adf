"""``format("keo")`` on ``local-cluster[2,1,1024]`` under the quota mode: two executor JVMs
with Python workers of their own, the driver in a process of its own (cluster_job.py), killed
with SIGKILL while it commits a micro-batch of a relay, then restarted from the same
checkpoint. Every Kinesis and DynamoDB call of the drivers and executors goes through the
quota mode's proxies (AWS's quotas: a shard's 5 GetRecords a second, its 1,000 records a
second, a key's write units), the test's own reads straight to the emulators.

One scenario for the module, since every driver start launches a cluster (seconds each):

1. the driver relays a source stream of 120 records (``readStream.format("keo")``, 60 records
   a micro-batch, two partitions) into the stream under test (``writeStream.format("keo")``,
   key mode); the executors put the first batch's rows;
   ``KEO_FAILPOINTS=batch_before_complete=stop`` freezes the driver's commit before it records
   the batch; the test kills the driver (its Python process, its JVM, which holds the
   standalone master and workers, and the frozen commit worker) with SIGKILL;
2. a new driver restarts the relay from the checkpoint (Spark replays batch 0 from the offsets
   it logged, then runs batch 1), writes a batch of other rows, and reads the stream back with
   ``format("keo")``; then, on a stream of its own, it puts waves of plain and
   KPL-aggregated records and reads them with ``readStream.format("keo")`` from one
   checkpoint: a wave and a run, shard 0 split, a wave and a run, its children merged, a wave
   and a run.

The tests then check what each part left: every key once in the stream, the writes spread
over both executors, the read, the streaming read across the reshards, the quotas kept, and no
process left behind by the killed driver.
"""

from __future__ import annotations

import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cluster_driver
import pytest
from cluster_driver import DRIVER_TIMEOUT_S, EXIT_TIMEOUT_S
from spark_support import (
    FAST_LEASES,
    assert_exactly_these,
    events,
    streamcheck,
    visible_places,
)
from stream_reads import RANGES, WAVES, place, wave_data

from dedupe_store.records import BatchRecord
from devstack.dynamodb_quota_proxy import DynamoDbQuotaProxy
from devstack.quota_proxy import KinesisQuotaProxy
from kinesis_store.entries import put_entry
from producer.wiring import Stack, build_stack
from spark_jobs.writer import producer_settings

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
    # the module's scenario runs in its first test's setup: two drivers, two clusters
    pytest.mark.timeout(1200),  # beyond the deadlines below, which say what they waited for
]

QUERY = "cluster-orders"
BATCHES, PER_BATCH, BATCH_ROWS = 2, 60, 80


# --- the scenario ----------------------------------------------------------------------------


@dataclass
class ClusterRun:
    stream_keys: list[str]
    batch_keys: list[str]
    work_dir: Path
    stack: Stack
    kinesis: Any
    read_stream: str  # the streaming read's, resharded
    kinesis_quotas: dict[str, Any] = field(default_factory=dict)  # the proxies' counters
    dynamodb_quotas: dict[str, Any] = field(default_factory=dict)
    first_steps: dict[str, Any] = field(default_factory=dict)
    second_steps: dict[str, Any] = field(default_factory=dict)
    records_at_kill: int = -1
    recorded_at_kill: BatchRecord | None = None
    frozen: list[str] = field(default_factory=list)
    killed_tree: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    left_by_restart: list[str] = field(default_factory=list)

    def executors(self, step: str) -> set[str]:
        """The executor ids that put records in ``step`` (files named by cluster_job.py)."""
        names = (path.name for path in (self.work_dir / "where" / step).iterdir())
        return {name.split("-")[1] for name in names}


def _kill_the_driver_when_frozen(driver: subprocess.Popen[bytes], run: ClusterRun) -> None:
    """Waits for the failpoint to freeze the commit, then SIGKILLs the driver's Python
    process, its JVM and the frozen worker: the executors are left to notice on their own."""
    frozen = cluster_driver.wait_frozen(driver, run.work_dir / "first")
    run.frozen = frozen.commands(frozen.frozen)
    run.killed_tree = frozen.commands()
    # the point of the kill: the executors have put batch 0, the batch is not recorded
    run.records_at_kill = len(
        streamcheck.read_stream(run.kinesis, run.stack.settings.stream).records
    )
    run.recorded_at_kill = _completed(run.stack, 0)
    cluster_driver.kill_driver(driver, frozen)


def _completed(stack: Stack, batch_id: int) -> BatchRecord | None:
    return stack.ledger.completed_batch(
        stack.settings.stream, QUERY, batch_id, now_ms=stack.clock.now_ms()
    )


def _relayed_rows(kinesis: Any, source: str) -> list[str]:
    """The relay's source: ``BATCHES * PER_BATCH`` records put on stream ``source``; their keys."""
    rows = events(BATCHES * PER_BATCH, prefix="cluster-relay")
    for start in range(0, len(rows), 100):
        answer = kinesis.put_records(
            StreamName=source,
            Records=[put_entry(k, d.encode()) for k, d in rows[start : start + 100]],
        )
        assert answer["FailedRecordCount"] == 0
    return [key for key, _ in rows]


@pytest.fixture(scope="module")
def cluster_run(
    emulators: Any, spark_table: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterRun]:
    pytest.importorskip("pyspark.sql")
    work_dir = tmp_path_factory.mktemp("keo-cluster")
    settings = cluster_driver.new_stream(emulators, spark_table, "cluster", FAST_LEASES)
    source = cluster_driver.new_stream(emulators, spark_table, "cluster-source", FAST_LEASES)
    resharded = cluster_driver.new_stream(emulators, spark_table, "cluster-reshard", FAST_LEASES)
    kinesis = streamcheck.kinesis_client(emulators.kinesis)
    run = ClusterRun(
        stream_keys=_relayed_rows(kinesis, source["KEO_STREAM"]),
        batch_keys=[key for key, _ in events(BATCH_ROWS, prefix="cluster-batch")],
        work_dir=work_dir,
        stack=build_stack(producer_settings(settings)),
        kinesis=kinesis,
        read_stream=resharded["KEO_STREAM"],
    )
    drivers: list[subprocess.Popen[bytes]] = []
    with (
        KinesisQuotaProxy(emulators.kinesis) as kinesis_proxy,
        DynamoDbQuotaProxy(emulators.dynamodb) as dynamodb_proxy,
    ):
        proxied = {
            "KEO_KINESIS_ENDPOINT_URL": kinesis_proxy.endpoint,
            "KEO_DYNAMODB_ENDPOINT_URL": dynamodb_proxy.endpoint,
        }
        job = cluster_driver.stream_job(work_dir, {**settings, **proxied}, QUERY)
        job["stream"].update(relay_from=source["KEO_STREAM"], per_trigger=PER_BATCH)
        try:
            drivers.append(
                cluster_driver.start_driver(
                    job, work_dir / "first", KEO_FAILPOINTS="batch_before_complete=stop"
                )
            )
            _kill_the_driver_when_frozen(drivers[0], run)
            run.first_steps = cluster_driver.steps(work_dir / "first.out")
            left = cluster_driver.wait_gone(cluster_driver.under(work_dir), EXIT_TIMEOUT_S)
            run.orphans = [f"{pid} {cluster_driver.cmdline(pid)}" for pid in left]

            batch_rows = [list(row) for row in events(BATCH_ROWS, prefix="cluster-batch")]
            stream_read = {
                "settings": {**resharded, **proxied},
                "checkpoint": str(work_dir / "read-checkpoint"),
            }
            job.update(run="second", batch_rows=batch_rows, read="format", stream_read=stream_read)
            drivers.append(cluster_driver.start_driver(job, work_dir / "second"))
            second = drivers[1].wait(DRIVER_TIMEOUT_S)
            assert second == 0, cluster_driver.tail(work_dir / "second.err")
            run.second_steps = cluster_driver.steps(work_dir / "second.out")
            left = cluster_driver.wait_gone(cluster_driver.under(work_dir), EXIT_TIMEOUT_S)
            run.left_by_restart = [f"{pid} {cluster_driver.cmdline(pid)}" for pid in left]
            run.kinesis_quotas = kinesis_proxy.state.snapshot()
            run.dynamodb_quotas = dynamodb_proxy.state.snapshot()
            yield run
        finally:
            # whatever a failed run left
            cluster_driver.kill(cluster_driver.under(work_dir))
            for driver in drivers:
                driver.wait()


# --- what it left ----------------------------------------------------------------------------


def test_a_driver_killed_in_its_commit_restarts_from_the_checkpoint_and_adds_nothing(
    cluster_run: ClusterRun,
) -> None:
    run = cluster_run
    # GIVEN a driver frozen by the failpoint in the commit of batch 0, killed with SIGKILL
    assert run.first_steps["session"]["executors"] == 2
    assert "stream" not in run.first_steps  # it never finished
    (frozen,) = run.frozen
    assert "python_streaming_sink_runner" in frozen  # the driver's worker for sink commits
    # at that point the executors had put batch 0, and the batch was not recorded
    assert run.records_at_kill == PER_BATCH
    assert run.recorded_at_kill is None

    # WHEN a new driver restarted the query from the checkpoint
    assert run.second_steps["stream"]["batches"] == [0, 1]

    # THEN batch 0 was replayed, every row found delivered, and batch 1 sent its rows
    replayed, second = _completed(run.stack, 0), _completed(run.stack, 1)
    assert replayed is not None
    assert (replayed.counts["sent"], replayed.counts["duplicates"]) == (0, PER_BATCH)
    assert second is not None
    assert (second.counts["sent"], second.counts["duplicates"]) == (PER_BATCH, 0)
    # AND, with the batch write after it, the stream holds every key once; the audit is clean
    assert run.second_steps["batch"]["rows"] == BATCH_ROWS
    assert_exactly_these(run.kinesis, run.stack, run.stream_keys + run.batch_keys)


def test_the_writes_ran_on_both_executors(cluster_run: ClusterRun) -> None:
    # GIVEN two partitions per write on a cluster of two one-core executors
    # WHEN the streaming write (before the kill) and the batch write put their rows
    # THEN each executor put some of them, from its own Python workers
    assert cluster_run.executors("first-stream") == {"0", "1"}
    assert cluster_run.executors("second-batch") == {"0", "1"}


def test_the_reader_on_the_cluster_reads_each_key_once(cluster_run: ClusterRun) -> None:
    # GIVEN the stream after both writes
    # WHEN the restarted driver read it with spark.read.format("keo")
    read = Counter(cluster_run.second_steps["read"]["keys"])
    # THEN it found every key, each once, and nothing else
    assert read == Counter(cluster_run.stream_keys + cluster_run.batch_keys)


def test_a_streaming_read_across_a_split_and_a_merge_gives_every_record_once_in_order_per_key(
    cluster_run: ClusterRun,
) -> None:
    # GIVEN six partition keys, two in each quarter of shard 0 and two in shard 1, and a wave of
    # five records per key (plain, three in a KPL aggregate, plain) before shard 0's split,
    # between the split and the merge of its children, and after the merge
    # WHEN the restarted driver read the stream with readStream.format("keo") after each wave,
    # three availableNow runs from one checkpoint
    read = cluster_run.second_steps["stream_read"]
    batches: dict[int, list[list[Any]]] = dict(read["batches"])
    rows = [row for batch_id in sorted(batches) for row in batches[batch_id]]

    # THEN every user record came once (the oracle reads the stream with plain boto3)
    keys = [key for ranged in RANGES.values() for key in ranged]
    assert len(rows) == len(keys) * len(WAVES) * len(wave_data(""))
    assert sorted(map(place, rows)) == sorted(
        visible_places(cluster_run.kinesis, cluster_run.read_stream)
    )
    # AND each key's records came in the order written, wave after wave
    data_of: dict[str, list[str]] = defaultdict(list)
    for _, _, _, key, data in rows:
        data_of[key].append(data)
    assert data_of == {key: [data for wave in WAVES for data in wave_data(wave)] for key in keys}
    # AND each run read its own wave, and only it: a restart goes on where the last run ended
    for wave, run_batches in zip(WAVES, read["runs"], strict=True):
        in_run = [row[4] for batch_id in run_batches for row in batches[batch_id]]
        assert sorted(in_run) == sorted(wave_data(wave) * len(keys))
    assert read["replayed"] == 0
    # AND shard 0 was read to its end before its children, and they before the merged shard
    batches_of: dict[str, set[int]] = defaultdict(set)
    for batch_id, batch_rows in batches.items():
        for row in batch_rows:
            batches_of[row[0]].add(batch_id)
    shards = read["shards"]
    children = set().union(*(batches_of[child] for child in shards["children"]))
    assert max(batches_of[shards["parent"]]) < min(children)
    assert max(children) < min(batches_of[shards["merged"]])


def test_the_streaming_read_ran_on_both_executors(cluster_run: ClusterRun) -> None:
    # GIVEN streaming batches of one partition per shard that moved (two, in most of them)
    # WHEN the restarted driver ran them on a cluster of two one-core executors
    # THEN each executor read some of the rows
    assert cluster_run.second_steps["stream_read"]["executors"] == ["0", "1"]


def test_every_call_of_the_cluster_went_through_the_quota_mode(cluster_run: ClusterRun) -> None:
    # GIVEN the drivers and executors of the scenario pointed at the quota mode's proxies
    kinesis, dynamodb = cluster_run.kinesis_quotas, cluster_run.dynamodb_quotas
    # WHEN they relayed, wrote, read and streamed
    # THEN each kind of call they make was admitted (or throttled) by a quota, and the
    # throttles are said (how many depends on the machine's speed)
    assert {"PutRecords", "GetRecords", "GetShardIterator"} <= set(kinesis["calls"])
    assert set(dynamodb["calls"]) & {"UpdateItem", "BatchExecuteStatement"}
    written = sum(kinesis["records_written"].values())
    assert written >= 2 * PER_BATCH + BATCH_ROWS
    print(f"quota throttles: kinesis {kinesis['throttles']}, dynamodb {dynamodb['throttles']}")


def test_no_process_outlives_its_driver(cluster_run: ClusterRun) -> None:
    # GIVEN a driver killed with SIGKILL while it had two executor JVMs with Python workers
    executors = [cmd for cmd in cluster_run.killed_tree if "CoarseGrainedExecutorBackend" in cmd]
    workers = [cmd for cmd in cluster_run.killed_tree if "pyspark.daemon pyspark.worker" in cmd]
    assert len(executors) == 2
    assert len(workers) >= 2
    # AND a driver that stopped its session
    # THEN their executors and every Python worker ended on their own
    assert cluster_run.orphans == []
    assert cluster_run.left_by_restart == []
