"""Helpers of the Spark tests (the fixtures are in conftest.py).

``streamcheck`` (tests/integration/streamcheck.py) reads a stream back with plain boto3 calls,
never with the product's reader, so a reader bug cannot hide a duplicate; it is loaded here so
e2e test modules can ``from spark_support import streamcheck``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import planting
import pytest
from prometheus_client.parser import text_string_to_metric_families
from stream_reads import Place

from dedupe_store.records import ClaimRequest
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from producer.audit.stream import audit_stream
from producer.protocol import Message, prepare
from producer.retries import poll_until
from producer.wiring import Stack

SHARDS = 2


def _installed_spark() -> tuple[int, int]:
    try:
        major, minor, *_ = importlib.metadata.version("pyspark").split(".")
    except importlib.metadata.PackageNotFoundError:
        return (0, 0)
    return int(major), int(minor)


# The tests' sessions are classic local ones: the installed pyspark's version is theirs.
SPARK_VERSION = _installed_spark()
# format("keo") is a Python data source: Spark 4's (spark_jobs.versions)
needs_data_sources = pytest.mark.skipif(
    SPARK_VERSION < (4, 0), reason="format('keo') needs Spark 4's Python data sources"
)
# a module of Spark 3.5's sink on local-cluster (its two drivers cost CI a minute or more):
# ``make test-spark35`` runs it, on pyspark 3.5; Spark 4's ``make test`` skips it
SINK_ON_A_CLUSTER = [
    pytest.mark.skipif(
        SPARK_VERSION >= (4, 0), reason="Spark 3.5's sink on a cluster: make test-spark35 runs it"
    ),
    pytest.mark.spark,
    pytest.mark.spark35,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
]
OUTSIDE = "agg-outside"  # an aggregated user record outside its shard's range: KCL drops it
# short leases so a lost race or a replay settles in seconds
FAST_LEASES = {
    "KEO_PUT_CONNECT_TIMEOUT_S": "1",
    "KEO_PUT_READ_TIMEOUT_S": "1",
    "KEO_CLOCK_SKEW_S": "0.5",
    "KEO_LEASE_S": "4",
    # the fence on, as by default, with a 1 s window: the lease is its minimum, 1 + 2 + 2 x 0.5
    "KEO_SIGNATURE_WINDOW_S": "1",
    "KEO_INFLIGHT_BUCKETS": "4",
}


def _load_streamcheck() -> Any:
    if "streamcheck" in sys.modules:
        return sys.modules["streamcheck"]
    path = Path(__file__).resolve().parents[1] / "integration" / "streamcheck.py"
    spec = importlib.util.spec_from_file_location("streamcheck", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["streamcheck"] = module
    spec.loader.exec_module(module)
    return module


streamcheck = _load_streamcheck()


def batch_complete(stack: Stack, query: str, batch_id: int) -> bool:
    completed = stack.ledger.completed_batch(
        stack.settings.stream, query, batch_id, now_ms=stack.clock.now_ms()
    )
    return completed is not None


def events(count: int, prefix: str = "k") -> list[tuple[str, str]]:
    return [(f"{prefix}{i:04d}", f"payload of {prefix}{i:04d}") for i in range(count)]


def frame(spark: Any, rows: list[tuple[Any, ...]], schema: str = "key string, data string") -> Any:
    return spark.createDataFrame(rows, schema).repartition(2)


def payloads(rows: list[tuple[str, str]]) -> dict[str, bytes]:
    return {key: data.encode("utf-8") for key, data in rows}


def write_event_files(source: Path, files: int, per_file: int) -> list[str]:
    source.mkdir(parents=True)
    keys: list[str] = []
    for f in range(files):
        lines = []
        for i in range(per_file):
            key = f"evt-{f}-{i:03d}"
            keys.append(key)
            routing = None if i % 2 else f"route-{i % 5}"
            lines.append(json.dumps({"key": key, "data": f"body {key}", "routing_key": routing}))
        (source / f"events-{f}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return keys


def visible_places(kinesis: Any, stream: str) -> list[Place]:
    """Every user record a KCL consumer gets, read by the oracle (a stray aggregate, such as
    one holding ``OUTSIDE``, dropped whole)."""
    contents = streamcheck.read_stream(kinesis, stream)
    return [
        (r.shard_id, r.sequence_number, r.sub_sequence_number if r.aggregated else -1)
        for r in contents.records
    ]


def plant_unverifiable(stack: Stack, key: str, data: str) -> str:
    """An earlier claim of ``key`` that the ledger could not verify within the stream's
    retention: no batch can settle the key; returns the key."""
    (stuck,), _ = prepare([Message(key, data.encode())], DEFAULT_MAX_RECORD_BYTES)
    request = ClaimRequest(
        stack.settings.stream, stuck.key, stuck.payload_digest, stuck.explicit_hash_key
    )
    _, claims = planting.plant_requests(
        stack.ledger, [request], owner="lost-host", now_ms=stack.clock.now_ms(), lease_ms=3000
    )
    assert stack.ledger.mark_unverifiable(claims[stuck.key]).applied
    return stuck.key


def assert_exactly_these(kinesis: Any, stack: Stack, keys: list[str]) -> Any:
    """The stream holds each of ``keys`` once, where the ledger says, and nothing else, and
    the product's audit agrees; returns the stream's contents."""
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(contents, keys, stack.ledger)
    streamcheck.assert_only(contents, keys)
    report = audit_stream(stack.reader, stack.ledger, expected=keys)
    assert report.clean, report.as_json()
    assert report.user_records == len(keys)
    return contents


def assert_binary_rows_arrived(kinesis: Any, stack: Stack, rows: list[tuple[Any, ...]]) -> None:
    """``(key, bytes, routing key)`` rows: the bytes arrived unchanged, all on one shard."""
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(
        contents, [r[0] for r in rows], stack.ledger, payloads={r[0]: r[1] for r in rows}
    )
    assert len(contents.per_shard()) == 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape_until(port: int, done: Any, timeout_s: float = 60) -> Samples:
    """``/metrics`` on 127.0.0.1:``port``, asked until ``done(samples)`` holds (the driver
    starts its exporter with the first commit); the last samples."""
    found: Samples = {}

    def scraped() -> bool:
        nonlocal found
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        except httpx.TransportError:
            return False  # not listening yet
        found = {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
        }
        return bool(done(found))

    assert poll_until(scraped, timeout_s=timeout_s, interval_s=0.2), found
    return found


def sample(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def start_event_query(spark: Any, source: Path, checkpoint: Path, options: dict[str, str]) -> Any:
    """A streaming write of the JSON event files in ``source`` with ``format("keo")``, one
    file per micro-batch, until every file is written (``availableNow``)."""
    from spark_jobs.produce_stream import EVENT_SCHEMA

    return (
        spark.readStream.schema(EVENT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("keo")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
