"""``readStream.format("keo")`` under a driver killed with SIGKILL in the middle of a micro-batch,
then restarted from its checkpoints: the output holds every record of the input stream once.

One scenario, one test (a driver start costs a JVM's start): a ``local[3]`` driver in a process
of its own (stream_kill_job.py) runs two queries over stream A at once, 40 records a batch, so
its kill interrupts both in their batch 1, with batch 0 committed:

- A into parquet files (Spark's file sink): the kill lands while a task of batch 1 is
  converting its first row;
- A into stream B, the relay (``writeStream.format("keo")``, replay mode): the kill lands
  when one task of batch 1 has put its rows and the other has not.

Each point is reached by the task freezing itself (SIGSTOP), which the test waits for; then
it kills the driver's process, its JVM and the frozen Python workers, and starts a new driver
on the same checkpoints. Local mode rather than ``local-cluster``: killing the driver kills
its executors too, which loses nothing the checkpoints need, and one JVM per driver keeps the
scenario near 30 seconds. The oracle of A and B is ``streamcheck``'s plain boto3
reading; the files are read back by the restarted driver, through the file sink's log.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import cluster_driver
import pytest
from cluster_driver import DRIVER_TIMEOUT_S, EXIT_TIMEOUT_S
from spark_support import streamcheck

from dedupe_store.states import RunState
from kinesis_store.entries import put_entry
from kinesis_store.provisioning import create_stream
from producer.clients import kinesis_client
from producer.wiring import Stack

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
    pytest.mark.timeout(600),  # beyond the deadlines below, which say what they waited for
]

SCRIPT = Path(__file__).with_name("stream_kill_job.py")
QUERY = "kill-relay"
RECORDS, PER_BATCH, FROZEN_TASKS = 120, 40, 3


def contents(kinesis: Any, stream: str) -> Counter[tuple[str, bytes]]:
    return Counter(
        (r.partition_key, r.data) for r in streamcheck.read_stream(kinesis, stream).records
    )


def places(kinesis: Any, stream: str) -> Counter[tuple[str, str, int]]:
    return Counter(
        (r.shard_id, r.sequence_number, r.sub_sequence_number if r.aggregated else -1)
        for r in streamcheck.read_stream(kinesis, stream).records
    )


def test_a_driver_killed_mid_batch_then_restarted_leaves_every_record_once_in_files_and_b(
    settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    # GIVEN stream A with 120 records (two of them identical) and an empty stream B
    source = stack.settings.stream
    target = f"{source}-b"
    create_stream(kinesis_client(stack.settings, for_put=False), target, 2, timeout_s=30)
    rows = [(f"order-{i:03d}", f"payload {i}".encode()) for i in range(RECORDS - 2)]
    rows += rows[:2]  # the same record twice in A: twice in B
    for start in range(0, len(rows), 40):
        kinesis.put_records(
            StreamName=source, Records=[put_entry(k, d) for k, d in rows[start : start + 40]]
        )
    job = {
        "work_dir": str(tmp_path),
        "settings": settings,
        "source": source,
        "target": target,
        "query": QUERY,
        "max_records_per_trigger": PER_BATCH,
        "stop": True,
    }

    # WHEN the first driver's three tasks of batch 1 have frozen themselves mid-batch
    with cluster_driver.running(job, tmp_path / "first", script=SCRIPT) as first:
        frozen = cluster_driver.wait_frozen(first, tmp_path / "first", count=FROZEN_TASKS)
        in_b_at_kill = sum(contents(kinesis, target).values())
        sink_log = tmp_path / "files" / "_spark_metadata"
        logged_at_kill = sorted(p.name for p in sink_log.iterdir() if not p.name.startswith("."))
        # AND it is killed with SIGKILL: its process, its JVM, the frozen Python workers
        cluster_driver.kill_driver(first, frozen)
    left = cluster_driver.wait_gone(cluster_driver.under(tmp_path), EXIT_TIMEOUT_S)
    assert left == set(), [cluster_driver.cmdline(pid) for pid in left]
    # (the kill came in batch 1 of both: the file sink had committed batch 0 only, and B
    # held batch 0 and part of batch 1)
    assert logged_at_kill == ["0"]
    assert PER_BATCH < in_b_at_kill < 2 * PER_BATCH

    # AND a new driver runs both queries again from their checkpoints, to the end
    with cluster_driver.running(
        {**job, "stop": False}, tmp_path / "second", script=SCRIPT
    ) as second:
        second.wait(DRIVER_TIMEOUT_S)
    assert second.returncode == 0, cluster_driver.tail(tmp_path / "second.err")
    files = cluster_driver.steps(tmp_path / "second.out")["files"]

    # THEN the files' rows, read through the sink's log, are A's records, each once
    in_files = Counter(
        (shard, sequence, -1 if sub is None else sub) for shard, sequence, sub in files["rows"]
    )
    assert in_files == places(kinesis, source)
    assert sum(in_files.values()) == RECORDS
    # AND B holds exactly A's records, the identical ones twice, read with plain boto3
    assert contents(kinesis, target) == Counter(rows)
    # AND batch 1's replay found what the killed attempt had put, and sent only the rest
    replayed = stack.ledger.get_run(target, f"{QUERY}/1")
    assert replayed is not None
    assert replayed.state is RunState.COMPLETE
    assert replayed.counts["duplicates"] > 0, replayed.counts
    assert replayed.counts["sent"] > 0, replayed.counts
