"""One local SparkSession for every Spark test of the run (a JVM start costs seconds)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """``local[2]`` on the loopback interface, no UI, quiet; workers run this interpreter."""
    pytest.importorskip("pyspark.sql")
    saved = {name: os.environ.get(name) for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    from spark_jobs.session import local_session

    session = local_session("keo-tests")
    try:
        yield session
    finally:
        session.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
