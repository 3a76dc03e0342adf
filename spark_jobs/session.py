"""The local SparkSession the demo and the tests share: ``local[2]`` on the loopback
interface, no UI, quiet logs, Python workers running this interpreter (reused across
batches, so each keeps its clients)."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(app_name: str, *, java_options: str | None = None) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.stopTimeout", "10s")
    )
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
