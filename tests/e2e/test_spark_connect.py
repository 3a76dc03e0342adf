"""``format("keo")`` on Spark Connect (``SparkSession.builder.remote("local[2]")``), where a
DataFrame has no ``rdd``: the write path, the read path and the Spark audit work all the same.

PySpark refuses a Spark Connect session in a process that holds a classic one (the other
Spark tests share one), so connect_write.py runs in a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from spark_support import events, streamcheck

from producer.wiring import Stack
from spark_jobs.options import setting_options
from spark_jobs.session import worker_python_path

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("connect_write.py")
JOB_TIMEOUT_S = 240


def test_batch_writes_on_spark_connect_deliver_each_key_once_and_a_replay_run_once(
    settings: dict[str, str], stack: Stack, kinesis: Any
) -> None:
    pytest.importorskip("pyspark.sql.connect.session")
    pytest.importorskip("grpc")
    # GIVEN rows, and the options of format("keo") for a fresh stream
    rows = events(40, prefix="connect")
    replay_rows = events(20, prefix="replayed")
    job = {
        "options": setting_options(settings),
        "settings": settings,
        "rows": rows,
        "replay_rows": replay_rows,
    }

    # WHEN a process writes them on a Spark Connect session, reads the stream back and
    # audits it
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

    # THEN the session was a Connect one, without rdd, every key is in the stream once, and
    # the audit on Spark Connect says so
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    found = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert found == {
        "session": "pyspark.sql.connect.session",
        "has_rdd": False,
        "read": 60,
        "audit": {"clean": True, "user_records": 40},
    }
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    keys = [key for key, _ in rows]
    streamcheck.assert_exactly_once(contents, keys, stack.ledger)
    streamcheck.assert_only(contents, keys + [key for key, _ in replay_rows])
    # AND the replay-mode rows, written twice under one run id, are in the stream once each
    assert {key: contents.counts[key] for key, _ in replay_rows} == dict.fromkeys(
        (key for key, _ in replay_rows), 1
    )
