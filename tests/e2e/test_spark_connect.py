"""``format("keo")`` on Spark Connect (``SparkSession.builder.remote("local[2]")``), where a
DataFrame has no ``rdd``: the write path, the read paths (``format("keo")`` and
``read_records``), the streaming read and the Spark audit work all the same.

PySpark refuses a Spark Connect session in a process that holds a classic one (the other
Spark tests share one), so connect_write.py runs in a process of its own, once for the
module (a Connect server costs seconds to start): the tests read what it did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cluster_driver import new_stream
from spark_support import FAST_LEASES, events, streamcheck

from producer.wiring import Stack, build_stack
from spark_jobs.options import setting_options
from spark_jobs.session import worker_python_path
from spark_jobs.writer import producer_settings

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("connect_write.py")
JOB_TIMEOUT_S = 300


@dataclass(frozen=True)
class ConnectRun:
    """What connect_write.py did on a fresh stream, and what it printed."""

    stack: Stack
    rows: list[tuple[str, str]]
    replay_rows: list[tuple[str, str]]
    found: dict[str, Any]


@pytest.fixture(scope="module")
def connect_run(
    emulators: Any, spark_table: str, tmp_path_factory: pytest.TempPathFactory
) -> ConnectRun:
    pytest.importorskip("pyspark.sql.connect.session")
    pytest.importorskip("grpc")
    # GIVEN rows, and the options of format("keo") for a fresh stream
    settings = new_stream(emulators, spark_table, "connect", FAST_LEASES)
    parsed = producer_settings(settings)
    rows = events(40, prefix="connect")
    replay_rows = events(20, prefix="replayed")
    job = {
        "options": setting_options(settings),
        "settings": settings,
        "rows": rows,
        "replay_rows": replay_rows,
        "checkpoint": str(tmp_path_factory.mktemp("connect") / "checkpoint"),
    }

    # WHEN a process writes them on a Spark Connect session, reads the stream back (a batch
    # read and a streaming read) and audits it
    env = {
        **os.environ,
        "PYTHONPATH": worker_python_path(),
        "SPARK_TESTING": "1",  # the Connect server on an ephemeral port, not 15002
    }
    result = subprocess.run(
        [sys.executable, str(JOB), json.dumps(job)],
        env=env,
        capture_output=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    found = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return ConnectRun(build_stack(parsed), rows, replay_rows, found)


def test_batch_writes_on_spark_connect_deliver_each_key_once_and_a_replay_run_once(
    connect_run: ConnectRun, kinesis: Any
) -> None:
    # THEN the session was a Connect one, without rdd, every key is in the stream once, and
    # the audit on Spark Connect says so
    found = {name: value for name, value in connect_run.found.items() if name != "streamed"}
    assert found == {
        "session": "pyspark.sql.connect.session",
        "has_rdd": False,
        "read": 60,
        "read_records": 60,
        "audit": {"clean": True, "user_records": 40},
    }
    stack = connect_run.stack
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    keys = [key for key, _ in connect_run.rows]
    streamcheck.assert_exactly_once(contents, keys, stack.ledger)
    streamcheck.assert_only(contents, keys + [key for key, _ in connect_run.replay_rows])
    # AND the replay-mode rows, written twice under one run id, are in the stream once each
    assert {key: contents.counts[key] for key, _ in connect_run.replay_rows} == dict.fromkeys(
        (key for key, _ in connect_run.replay_rows), 1
    )


def test_a_streaming_read_on_spark_connect_gives_every_record_once(
    connect_run: ConnectRun, kinesis: Any
) -> None:
    # THEN the streaming read on the Connect session, in bounded batches into a memory sink,
    # gave each record of the stream once, as the oracle reads it
    contents = streamcheck.read_stream(kinesis, connect_run.stack.settings.stream)
    expected = sorted(
        (r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key)
        for r in contents.records
    )
    streamed = sorted(tuple(row) for row in connect_run.found["streamed"])
    assert streamed == expected
    assert len(streamed) == 60
