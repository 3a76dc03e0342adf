"""The Spark demo: the same events, the same faults, two ``foreachBatch`` sinks, two audits.

::

    events/part-*.json ──readStream (one file per micro-batch)──┬─ AtLeastOnceSink ──┐
                                                                 └─ ExactlyOnceSink ──┤
         FaultProxy on 127.0.0.1 (one per sink, the same seeded schedule) <───────────┘
           PutRecords: response dropped after the write; some records throttled
         ── kinesalite

    per query, on the driver (FaultyDriver):
      before batch ``split_batch``   split one shard (the stream reshards mid-run)
      in batch ``crash_batch``       die after the batch's puts, before it is committed;
                                     the query is restarted from its checkpoint, so Spark
                                     replays that batch with the same id and rows

The plain sink is what users have today: ``put_records`` from the executors, the whole request
resent when its response is lost (as the SDK's retries do), records with a per-record error
resent. Then the exactly-once stream is reconciled, and both streams are audited as a consumer
would read them. One SparkSession serves the whole demo; the caller owns it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from devstack.demo import (
    DRIVER_KILLS,
    LOST_RESPONSES,
    SHARD_SPLITS,
    THROTTLED_PUTS,
    DemoResult,
    put_at_least_once,
)
from devstack.failpoints import FailpointError, Failpoints
from devstack.fault_proxy import FaultProxy, FaultRule, FaultSchedule
from producer.audit import audit_stream
from producer.hooks import NO_HOOKS, Step
from producer.kinesis import create_stream, wait_active
from producer.producer import default_owner
from producer.protocol import MAX_RECORDS_PER_PUT, put_entry
from producer.settings import ProducerSettings
from producer.wiring import build_stack, kinesis_client, ledger_from
from spark_jobs.produce_stream import EVENT_SCHEMA
from spark_jobs.session import local_session
from spark_jobs.sink import ExactlyOnceSink
from spark_jobs.writer import producer_settings

log = logging.getLogger(__name__)

AT_LEAST_ONCE: Final = "at-least-once"
EXACTLY_ONCE: Final = "exactly-once"
DEFAULT_SHARDS: Final = 2
DEFAULT_EVENT_FILES: Final = 5
QUERY_TIMEOUT_S: Final = 600
_ACTIVE_TIMEOUT_S: Final = 60

Say = Callable[[str], None]


class DriverKilledError(RuntimeError):
    """The demo's stand-in for a driver killed after a batch's puts, before its commit."""

    def __init__(self, batch_id: int) -> None:
        super().__init__(f"driver killed after the puts of batch {batch_id}")
        self.batch_id = batch_id


@dataclass(frozen=True)
class DemoFaults:
    """The faults both sinks meet. The proxy's draws are seeded: a run can be replayed."""

    seed: int = 7
    lost_response_probability: float = 0.15  # per PutRecords: written, response dropped
    throttle_probability: float = 0.25  # per PutRecords: some records refused, not written
    throttled_fraction: float = 0.1  # ... this share of its records
    crash_batch: int = 1  # the driver dies after this batch's puts
    split_batch: int = 3  # a shard is split before this batch

    def schedule(self) -> FaultSchedule:
        return FaultSchedule(
            [
                FaultRule("PutRecords", "drop_response", self.lost_response_probability),
                FaultRule(
                    "PutRecords",
                    "partial",
                    self.throttle_probability,
                    fraction=self.throttled_fraction,
                ),
            ],
            seed=self.seed,
        )


# --- the sample data ---------------------------------------------------------------------------


def write_events(directory: Path, count: int, files: int = DEFAULT_EVENT_FILES) -> list[str]:
    """``count`` order events as JSON lines in ``files`` files (one micro-batch each)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = max(1, min(files, count))
    keys: list[str] = []
    per_file = -(-count // files)
    for number in range(files):
        lines = []
        for i in range(number * per_file, min(count, (number + 1) * per_file)):
            key = f"order-{i:06d}"
            keys.append(key)
            data = json.dumps({"order": i, "amount_cents": (i * 7919) % 100_000, "currency": "EUR"})
            lines.append(json.dumps({"key": key, "data": data, "routing_key": None}))
        path = directory / f"events-{number:03d}.json"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        # the file source orders files by modification time: keep the numbering's order
        stamp = time.time() - (files - number)
        os.utime(path, (stamp, stamp))
    return keys


# --- the plain at-least-once sink --------------------------------------------------------------

_CLIENTS: dict[tuple[int, tuple[tuple[str, str], ...]], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _put_client(values: Mapping[str, str]) -> Any:
    """One client per Python worker process and settings (rebuilt after a fork)."""
    cache_key = (os.getpid(), tuple(sorted(values.items())))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(cache_key)
        if client is None:
            # SDK retries off, short timeouts: this sink's loop below does the SDK's resending
            client = kinesis_client(producer_settings(values), for_put=True)
            _CLIENTS[cache_key] = client
        return client


@dataclass(frozen=True)
class AtLeastOncePartitionWriter:
    """Executor side of the plain sink: ``(key, data)`` rows, 500 records per request."""

    settings: dict[str, str]
    stream: str

    def __call__(self, rows: Iterable[Any]) -> Iterator[int]:
        client = _put_client(self.settings)
        entries: list[dict[str, Any]] = []
        written = 0
        for key, data in rows:
            entries.append(put_entry(key, data.encode("utf-8")))
            if len(entries) == MAX_RECORDS_PER_PUT:
                put_at_least_once(client, self.stream, entries)
                written += len(entries)
                entries = []
        if entries:
            put_at_least_once(client, self.stream, entries)
            written += len(entries)
        yield written


class AtLeastOnceSink:
    """``foreachBatch`` sink that puts every row, with the usual retry loop and no ledger."""

    def __init__(self, settings: Mapping[str, str]) -> None:
        self.settings = dict(settings)
        self.stream = producer_settings(self.settings).stream

    def __call__(self, df: Any, batch_id: int) -> None:
        written = sum(
            df.select("key", "data")
            .rdd.mapPartitions(AtLeastOncePartitionWriter(self.settings, self.stream))
            .collect()
        )
        log.info(
            "plain batch written stream=%s batch=%d records=%d", self.stream, batch_id, written
        )


# --- the driver's bad day ----------------------------------------------------------------------


class FaultyDriver:
    """Wraps a sink on the driver: splits a shard before one batch, dies in another.

    The death comes after the batch's puts and before the batch is committed: the exactly-once
    sink is stopped at its ``batch_after_puts`` step (before it marks the batch COMPLETE), the
    plain sink right after it returns. Either way Spark has not committed the batch, so the
    restarted query replays it. Each happens once per wrapper.
    """

    def __init__(
        self,
        sink: Callable[[Any, int], object],
        *,
        admin: Any,
        stream: str,
        faults: DemoFaults,
        partitions: int = 2,
    ) -> None:
        self._sink = sink
        self._admin = admin
        self._stream = stream
        self._faults = faults
        self._partitions = partitions
        self.crashes = 0
        self.splits = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        if batch_id >= self._faults.split_batch and not self.splits:
            split_a_shard(self._admin, self._stream)
            self.splits += 1
        frame = df.repartition(self._partitions)
        if batch_id != self._faults.crash_batch or self.crashes:
            self._sink(frame, batch_id)
            return
        self.crashes += 1
        # the driver dies after the batch's puts, before the batch is recorded or committed
        sink = self._sink
        if isinstance(sink, ExactlyOnceSink):
            sink.hooks = Failpoints(f"{Step.BATCH_AFTER_PUTS}=raise")
        try:
            sink(frame, batch_id)
        except FailpointError:
            raise DriverKilledError(batch_id) from None
        finally:
            if isinstance(sink, ExactlyOnceSink):
                sink.hooks = NO_HOOKS
        raise DriverKilledError(batch_id)


def split_a_shard(admin: Any, stream: str) -> None:
    """Split the widest open shard at the middle of its hash range; wait until ACTIVE."""
    shards = admin.list_shards(StreamName=stream)["Shards"]
    open_shards = [s for s in shards if "EndingSequenceNumber" not in s["SequenceNumberRange"]]
    widest = max(
        open_shards,
        key=lambda s: (
            int(s["HashKeyRange"]["EndingHashKey"]) - int(s["HashKeyRange"]["StartingHashKey"])
        ),
    )
    start = int(widest["HashKeyRange"]["StartingHashKey"])
    end = int(widest["HashKeyRange"]["EndingHashKey"])
    admin.split_shard(
        StreamName=stream,
        ShardToSplit=widest["ShardId"],
        NewStartingHashKey=str((start + end) // 2),
    )
    wait_active(admin, stream, timeout_s=_ACTIVE_TIMEOUT_S)
    log.info("shard split stream=%s shard=%s", stream, widest["ShardId"])


# --- running it --------------------------------------------------------------------------------


def demo_session(log_dir: Path) -> Any:
    """The demo's one SparkSession, with Spark's own logs quieter still."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log4j = log_dir / "log4j2.properties"
    # a query that dies is part of the show: Spark's own stack traces are not
    log4j.write_text(
        "rootLogger.level = error\n"
        "rootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
        "logger.streaming.name = org.apache.spark.sql.execution.streaming\n"
        "logger.streaming.level = off\n"
        "logger.python.name = org.apache.spark.api.python\n"
        "logger.python.level = off\n",
        encoding="utf-8",
    )
    return local_session("keo-demo", java_options=f"-Dlog4j2.configurationFile={log4j.as_uri()}")


def sink_values(settings: ProducerSettings, **overrides: str) -> dict[str, str]:
    """Settings as the ``KEO_*`` strings the executors receive."""
    values = {
        f"KEO_{name.upper()}": str(value)
        for name, value in settings.model_dump(mode="json").items()
        if value is not None
    }
    values.update({f"KEO_{name.upper()}": value for name, value in overrides.items()})
    return values


def run_spark_demo(
    spark: Any,
    settings: ProducerSettings,
    *,
    messages: int,
    workdir: Path,
    say: Say,
    faults: DemoFaults | None = None,
    shards: int = DEFAULT_SHARDS,
    files: int = DEFAULT_EVENT_FILES,
) -> list[DemoResult]:
    """Both sinks over the same events and faults; ``settings`` names the table and endpoints.

    ``workdir`` receives the events, the checkpoints, and ``expected-keys.txt``.
    """
    faults = faults or DemoFaults()
    suffix = time.strftime("%Y%m%d-%H%M%S")
    events = workdir / "events"
    keys = write_events(events, messages, files)
    (workdir / "expected-keys.txt").write_text("\n".join(keys) + "\n", encoding="utf-8")
    say(
        f"{messages} events in {len(list(events.glob('*.json')))} files under {events} "
        "(one micro-batch each)"
    )
    ledger_from(settings).create_table(wait=True)
    results = []
    for name in (AT_LEAST_ONCE, EXACTLY_ONCE):
        stream_settings = settings.model_copy(update={"stream": f"demo-{name}-{suffix}"})
        results.append(
            _run_side(
                spark,
                name,
                stream_settings,
                keys=keys,
                source=events,
                checkpoint=workdir / f"checkpoint-{name}",
                faults=faults,
                shards=shards,
                say=say,
            )
        )
    return results


def _run_side(
    spark: Any,
    name: str,
    settings: ProducerSettings,
    *,
    keys: list[str],
    source: Path,
    checkpoint: Path,
    faults: DemoFaults,
    shards: int,
    say: Say,
) -> DemoResult:
    admin = kinesis_client(settings, for_put=False)
    create_stream(admin, settings.stream, shards, timeout_s=_ACTIVE_TIMEOUT_S)
    upstream = settings.kinesis_endpoint_url
    if upstream is None:
        raise ValueError("the demo needs a local Kinesis endpoint (KEO_KINESIS_ENDPOINT_URL)")
    started = time.monotonic()
    # the proxy stands for Kinesis: it enforces the signature window the fence relies on
    window_s = settings.signature_window_s if settings.fenced else None
    with FaultProxy(upstream, faults.schedule(), signature_window_s=window_s) as proxy:
        values = sink_values(settings, kinesis_endpoint_url=proxy.endpoint)
        sink: Callable[[Any, int], object] = (
            AtLeastOnceSink(values) if name == AT_LEAST_ONCE else ExactlyOnceSink(values)
        )
        driver = FaultyDriver(sink, admin=admin, stream=settings.stream, faults=faults)
        say(
            f"[bold]{name}[/bold]: streaming into {settings.stream} through the fault proxy "
            f"at {proxy.endpoint}"
        )
        restarts = _run_until_done(spark, source, checkpoint, driver, say=say)
        injected = dict(proxy.schedule.injected)
    seconds = time.monotonic() - started

    stack = build_stack(settings)
    reconciled = None
    ledger = None
    if name == EXACTLY_ONCE:
        ledger = stack.ledger
        reconciled = stack.reconciler(owner=f"demo-reconciler:{default_owner()}").run_once()
    report = audit_stream(stack.reader, ledger, expected=keys)
    return DemoResult(
        name,
        len(keys),
        report,
        seconds,
        batches_replayed=restarts,
        faults={
            LOST_RESPONSES: injected.get("PutRecords:drop_response", 0),
            THROTTLED_PUTS: injected.get("PutRecords:partial", 0),
            DRIVER_KILLS: driver.crashes,
            SHARD_SPLITS: driver.splits,
        },
        table=settings.table if ledger is not None else None,
        reconciled=reconciled,
    )


def _run_until_done(
    spark: Any,
    source: Path,
    checkpoint: Path,
    sink: FaultyDriver,
    *,
    say: Say,
    max_restarts: int = 5,
) -> int:
    """Run the query to the end of its input, restarting it from its checkpoint each time it
    dies (as an orchestrator restarts a killed driver); returns the number of restarts."""
    from pyspark.errors import StreamingQueryException

    restarts = 0
    while True:
        query = (
            spark.readStream.schema(EVENT_SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        try:
            if not query.awaitTermination(QUERY_TIMEOUT_S):
                query.stop()
                raise TimeoutError(f"the demo query ran longer than {QUERY_TIMEOUT_S} s")
        except StreamingQueryException as exc:
            if restarts >= max_restarts:
                raise
            restarts += 1
            say(f"  the driver died ({_why(exc)}); restarting the query from its checkpoint")
            continue
        return restarts


def _why(exc: Exception) -> str:
    text = str(exc)
    for known in ("driver killed after the puts of batch", "sink failpoint after_puts"):
        if known in text:
            return "killed after a batch's puts, before its commit"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:160]
