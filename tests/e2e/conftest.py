"""What the Spark tests share: one local SparkSession for the whole run (a JVM start costs
seconds), and a fresh stream and ledger table per test (helpers in spark_support.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from spark_support import FAST_LEASES, SHARDS, streamcheck

from kinesis_store.provisioning import create_stream
from producer.clients import kinesis_client
from producer.wiring import Stack, build_stack, ledger_from
from spark_jobs.writer import producer_settings


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """``local[2]`` on the loopback interface, no UI, quiet; workers run this interpreter."""
    pytest.importorskip("pyspark.sql")
    saved = {
        name: os.environ.get(name)
        for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")
    }
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


@pytest.fixture(scope="session")
def spark_table(emulators: Any) -> str:
    """One ledger table for every Spark test: the ledger keys every item by its stream, and
    each test has a stream of its own (creating a table takes seconds, a stream does not)."""
    table = f"keo-spark-tests-{os.getpid()}"
    parsed = producer_settings(
        {
            "KEO_DYNAMODB_ENDPOINT_URL": emulators.dynamodb,
            "KEO_REGION": "us-east-1",
            "KEO_TABLE": table,
        }
    )
    ledger_from(parsed).create_table(wait=True)
    return table


@pytest.fixture
def settings(emulators: Any, names: Any, spark_table: str) -> dict[str, str]:
    """Plain KEO_* strings, as the executors receive them."""
    return {
        "KEO_KINESIS_ENDPOINT_URL": emulators.kinesis,
        "KEO_DYNAMODB_ENDPOINT_URL": emulators.dynamodb,
        "KEO_REGION": "us-east-1",
        "KEO_STREAM": names.stream,
        "KEO_TABLE": spark_table,
        **FAST_LEASES,
    }


@pytest.fixture
def stack(settings: dict[str, str]) -> Stack:
    """A fresh stream of two shards, ACTIVE, and the session's ledger table."""
    parsed = producer_settings(settings)
    create_stream(kinesis_client(parsed, for_put=False), parsed.stream, SHARDS, timeout_s=30)
    return build_stack(parsed)


@pytest.fixture
def kinesis(emulators: Any) -> Any:
    return streamcheck.kinesis_client(emulators.kinesis)


@pytest.fixture
def keo(spark: Any) -> Iterator[Any]:
    """The session with ``format("keo")`` registered; hooks a test installs are removed after."""
    import spark_jobs

    spark_jobs.register(spark)
    yield spark
    spark_jobs.register(spark)
