"""The Spark demo: the same events, the same faults, three streaming queries, three audits.

::

    events/part-*.json ──readStream (one file per micro-batch)──┬─ foreachBatch(AtLeastOnceSink)
                                                                 ├─ format("keo"), dedupe=key
                                                                 └─ format("keo"), dedupe=replay
         FaultProxy on 127.0.0.1 (one per query, the same seeded schedule) <── all write through
           PutRecords: response dropped after the write; some records throttled
         ── kinesalite
         MeteringProxy on 127.0.0.1 (one per query) <── every DynamoDB call, executors' and
         ── dynalite                                     commits' alike, billed

    DriverFaults, a producer.hooks.Hooks, at the driver's batch steps; format("keo")'s commit
    calls them (the data source is registered with them), FaultyDriver calls them after the
    plain sink's puts:
      batch_after_puts of batch ``crash_batch``         the driver dies after the batch's puts,
                                                        before it is committed; the query is
                                                        restarted from its checkpoint (without
                                                        that fault), so Spark replays the batch
                                                        with the same id and rows
      batch_before_complete of ``split_batch`` - 1      a shard is split: the stream reshards
                                                        between two batches

The plain sink is what users have today: ``put_records`` from the executors, the whole request
resent when its response is lost (as the SDK's retries do), records with a per-record error
resent. In key mode the replayed batch's keys are found claimed; in replay mode (runs
``<query_name>/<batch id>``) its rows are found in the stream by the replay's recovery. Then the
exactly-once streams are reconciled, and each stream is audited as its guarantee is defined
(:func:`devstack.demo.audited`). One SparkSession serves the whole demo; the caller owns it, and
gets it back with ``format("keo")`` registered without hooks.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from dedupe_store.settings import ENV_PREFIX
from devstack.cost_meter import MeterReading
from devstack.demo import (
    AT_LEAST_ONCE,
    COLUMNS,
    DRIVER_KILLS,
    EXPIRED_ITERATORS,
    LOST_RESPONSES,
    SHARD_SPLITS,
    THROTTLED_PUTS,
    THROTTLED_READS,
    Column,
    DemoResult,
    audited,
    local_endpoints,
    put_at_least_once,
    write_expected,
)
from devstack.fault_proxy import FaultProxy, FaultRule, FaultSchedule
from devstack.metering_proxy import MeteringProxy
from kinesis_store.entries import MAX_RECORDS_PER_PUT, put_entry
from kinesis_store.provisioning import create_stream, wait_active
from producer.clients import kinesis_client
from producer.hooks import Step
from producer.key.producer import default_owner
from producer.protocol import Message
from producer.settings import ProducerSettings
from producer.wiring import build_stack, ledger_from
from spark_jobs import register
from spark_jobs.produce_stream import EVENT_SCHEMA
from spark_jobs.session import local_session
from spark_jobs.writer import per_worker, producer_settings

log = logging.getLogger(__name__)

DEFAULT_SHARDS: Final = 2
DEFAULT_EVENT_FILES: Final = 5
QUERY_TIMEOUT_S: Final = 600
ACTIVE_TIMEOUT_S: Final = 60

Say = Callable[[str], None]


class DriverKilledError(RuntimeError):
    """The demo's stand-in for a driver killed after a batch's puts, before its commit."""

    MESSAGE = "driver killed after the puts of batch"

    def __init__(self, batch_id: int) -> None:
        super().__init__(f"{self.MESSAGE} {batch_id}")
        self.batch_id = batch_id


@dataclass(frozen=True)
class DemoFaults:
    """The faults both queries meet. The proxy's draws are seeded: a run can be replayed."""

    seed: int = 7
    lost_response_probability: float = 0.15  # per PutRecords: written, response dropped
    throttle_probability: float = 0.25  # per PutRecords: some records refused, not written
    throttled_fraction: float = 0.1  # ... this share of its records
    crash_batch: int = 1  # the driver dies after this batch's puts
    split_batch: int = 3  # a shard is split before this batch (once the one before settled)
    # the relay's reads (keo demo --relay): each drawn fault costs the reader a backoff, so few
    read_throttle_probability: float = 0.1  # per GetRecords: throttled, not answered
    expired_iterator_probability: float = 0.1  # per GetRecords: its iterator had expired
    read_faults_limit: int = 4  # at most this many of each, drawn

    def __post_init__(self) -> None:
        if self.split_batch < 1:
            # the split happens on the driver as the batch before it settles
            raise ValueError(f"split_batch must be at least 1, got {self.split_batch}")

    def schedule(self) -> FaultSchedule:
        """The writes' faults: what the three queries of the Spark demo meet."""
        return FaultSchedule(self._write_rules(), seed=self.seed)

    def relay_schedule(self) -> FaultSchedule:
        """The relay's: the writes' faults and the reads', each met by the first calls of its
        operation (so a relay of a few hundred records meets all four), then drawn."""
        drawn = [
            *self._write_rules(),
            FaultRule(
                "GetRecords",
                "throttle",
                self.read_throttle_probability,
                limit=self.read_faults_limit,
            ),
            FaultRule(
                "GetRecords",
                "expire_iterator",
                self.expired_iterator_probability,
                limit=self.read_faults_limit,
            ),
        ]
        first = [FaultRule(r.operation, r.fault, limit=1, fraction=r.fraction) for r in drawn]
        return FaultSchedule(first + drawn, seed=self.seed)

    def _write_rules(self) -> list[FaultRule]:
        return [
            FaultRule("PutRecords", "drop_response", self.lost_response_probability),
            FaultRule(
                "PutRecords", "partial", self.throttle_probability, fraction=self.throttled_fraction
            ),
        ]

    def on_the_driver(self, admin: Mapping[str, str], *, split: bool = True) -> DriverFaults:
        """The driver's share; ``admin`` holds the ``KEO_*`` values of a client that reaches
        the stream directly, not through the fault proxy. Without ``split``, the driver only
        dies."""
        return DriverFaults(
            dict(admin),
            crash_batch=self.crash_batch,
            split_batch=self.split_batch if split else None,
        )


# the table's names of the proxy's faults, by the schedule's (rule's operation and fault)
_FAULT_LABELS: Final = {
    ("PutRecords", "drop_response"): LOST_RESPONSES,
    ("PutRecords", "partial"): THROTTLED_PUTS,
    ("GetRecords", "throttle"): THROTTLED_READS,
    ("GetRecords", "expire_iterator"): EXPIRED_ITERATORS,
}


def injected_faults(schedule: FaultSchedule) -> dict[str, int]:
    """What the proxy injected, by the table's labels: every fault the schedule holds, 0 for
    one that was never drawn."""
    return {
        _FAULT_LABELS[rule.operation, rule.fault]: schedule.injected.get(
            f"{rule.operation}:{rule.fault}", 0
        )
        for rule in schedule.rules
    }


# --- the sample data ---------------------------------------------------------------------------


def sample_events(count: int) -> list[Message]:
    """``count`` order events, ``data`` a JSON object in UTF-8."""
    return [
        Message(
            f"order-{i:06d}",
            json.dumps(
                {"order": i, "amount_cents": (i * 7919) % 100_000, "currency": "EUR"}
            ).encode("utf-8"),
        )
        for i in range(count)
    ]


def write_events(directory: Path, count: int, files: int = DEFAULT_EVENT_FILES) -> list[Message]:
    """``count`` order events as JSON lines in ``files`` files (one micro-batch each); the
    events as the sinks send them (``data`` as UTF-8)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = max(1, min(files, count))
    events = sample_events(count)
    per_file = -(-count // files)
    for number in range(files):
        lines = [
            json.dumps({"key": m.key, "data": m.data.decode("utf-8"), "routing_key": None})
            for m in events[number * per_file : (number + 1) * per_file]
        ]
        path = directory / f"events-{number:03d}.json"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        # the file source orders files by modification time: keep the numbering's order
        stamp = time.time() - (files - number)
        os.utime(path, (stamp, stamp))
    return events


# --- the plain at-least-once sink --------------------------------------------------------------


def _put_client(settings: ProducerSettings) -> Any:
    """One client per Python worker process and settings (rebuilt after a fork)."""
    # SDK retries off, short timeouts: this sink's loop below does the SDK's resending
    return per_worker("plain-put-client", settings, lambda: kinesis_client(settings, for_put=True))


@dataclass(frozen=True)
class AtLeastOncePartitionWriter:
    """Executor side of the plain sink: ``(key, data)`` rows (data a string, or binary as
    ``readStream.format("keo")`` reads it), 500 records per request."""

    settings: ProducerSettings
    stream: str

    def __call__(self, rows: Iterable[Any]) -> Iterator[int]:
        client = _put_client(self.settings)
        entries: list[dict[str, Any]] = []
        written = 0
        for key, data in rows:
            payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
            entries.append(put_entry(key, payload))
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
        self.settings = producer_settings(settings)
        self.stream = self.settings.stream

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


@dataclass(frozen=True)
class DriverFaults:
    """Hooks: the driver's bad day, at the batch steps of :mod:`producer.hooks`.

    ``format("keo")`` pickles its hooks to the Python workers that run its commits, so this
    holds plain values and builds its Kinesis client where it acts. The split happens once
    per stream whichever process asks (a stream with a closed shard has been split); the
    death happens in every run that is armed with it, so a restarted driver gets
    :meth:`restarted`.
    """

    admin: dict[str, str]
    crash_batch: int | None
    split_batch: int | None

    def at(self, step: Step, *, batch_id: int | None = None) -> None:
        if batch_id is None:
            return  # a producer's step, on an executor
        if step is Step.BATCH_AFTER_PUTS and batch_id == self.crash_batch:
            log.info("demo: the driver dies after the puts of batch %d", batch_id)
            raise DriverKilledError(batch_id)
        if (
            step is Step.BATCH_BEFORE_COMPLETE
            and self.split_batch is not None
            and batch_id == self.split_batch - 1
        ):
            settings = producer_settings(self.admin)
            admin = kinesis_client(settings, for_put=False)
            if not closed_shards(admin, settings.stream):
                split_a_shard(admin, settings.stream)

    def restarted(self) -> DriverFaults:
        """What the driver meets once restarted: the same, but it does not die again."""
        return replace(self, crash_batch=None)


class FaultyDriver:
    """Wraps the plain ``foreachBatch`` sink on the driver: after the batch's puts, the driver
    meets :class:`DriverFaults` at the steps where ``format("keo")``'s commit meets them."""

    def __init__(
        self, sink: Callable[[Any, int], object], faults: DriverFaults, *, partitions: int = 2
    ) -> None:
        self._sink = sink
        self._faults = faults
        self._partitions = partitions

    def __call__(self, df: Any, batch_id: int) -> None:
        self._sink(df.repartition(self._partitions), batch_id)
        self._faults.at(Step.BATCH_AFTER_PUTS, batch_id=batch_id)
        self._faults.at(Step.BATCH_BEFORE_COMPLETE, batch_id=batch_id)


def closed_shards(admin: Any, stream: str) -> int:
    """Shards of ``stream`` closed by a split or a merge."""
    shards = admin.list_shards(StreamName=stream)["Shards"]
    return sum(1 for s in shards if "EndingSequenceNumber" in s["SequenceNumberRange"])


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
    wait_active(admin, stream, timeout_s=ACTIVE_TIMEOUT_S)
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


def keo_options(settings: ProducerSettings, **overrides: str) -> dict[str, str]:
    """Settings as ``format("keo")``'s options: ``KEO_LEASE_S`` is ``lease_s``."""
    return {
        name.removeprefix(ENV_PREFIX).lower(): value
        for name, value in sink_values(settings, **overrides).items()
    }


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
    """The three queries over the same events and faults; ``settings`` names the table and
    endpoints. ``workdir`` receives the events, the checkpoints, and ``expected-rows.jsonl``.
    """
    faults = faults or DemoFaults()
    suffix = time.strftime("%Y%m%d-%H%M%S")
    source = workdir / "events"
    events = write_events(source, messages, files)
    write_expected(workdir, events)
    say(
        f"{messages} events in {len(list(source.glob('*.json')))} files under {source} "
        "(one micro-batch each)"
    )
    ledger_from(settings).create_table(wait=True)
    results = []
    try:
        for column in COLUMNS:
            update: dict[str, Any] = {"stream": column.stream(suffix)}
            if column.dedupe is not None:
                update["dedupe"] = column.dedupe
            results.append(
                _run_side(
                    spark,
                    column,
                    settings.model_copy(update=update),
                    events=events,
                    source=source,
                    checkpoint=workdir / f"checkpoint-{column.slug}",
                    faults=faults,
                    shards=shards,
                    say=say,
                )
            )
    finally:
        register(spark)  # the session's format("keo") without the demo's faults
    return results


# Starts a side's query, its driver meeting these faults.
Start = Callable[[DriverFaults], Any]
# A side's query, given the settings (``kinesis_endpoint_url``, ``dynamodb_endpoint_url``) that
# reach the emulators through the side's proxies: how it writes (for the log), how it starts.
Query = Callable[[dict[str, str]], tuple[str, Start]]


def _run_side(
    spark: Any,
    column: Column,
    settings: ProducerSettings,
    *,
    events: list[Message],
    source: Path,
    checkpoint: Path,
    faults: DemoFaults,
    shards: int,
    say: Say,
) -> DemoResult:
    admin = kinesis_client(settings, for_put=False)
    create_stream(admin, settings.stream, shards, timeout_s=ACTIVE_TIMEOUT_S)

    def query(through: dict[str, str]) -> tuple[str, Start]:
        if column is AT_LEAST_ONCE:
            values = sink_values(settings, **through)
            return "foreachBatch, put_records with the usual retries", _plain_query(
                spark, source, checkpoint, values
            )
        options = keo_options(settings, **through, query_name=settings.stream)
        return f'writeStream.format("keo"), {column.name}', _keo_query(
            spark, source, checkpoint, options
        )

    run = run_under_faults(
        column,
        settings,
        schedule=faults.schedule(),
        on_the_driver=faults.on_the_driver(sink_values(settings)),
        query=query,
        say=say,
    )
    return audited_side(
        column,
        settings,
        events,
        run,
        faults={**run.faults, SHARD_SPLITS: closed_shards(admin, settings.stream)},
        replayed_run=f"{settings.stream}/{faults.crash_batch}",
    )


@dataclass(frozen=True)
class SideRun:
    """A side's query, run to the end of its input under the faults."""

    seconds: float
    restarts: int  # of the query from its checkpoint, after its driver died
    faults: dict[str, int]  # injected by the fault proxy, and the driver's staged deaths
    bill: MeterReading  # DynamoDB's, for every call the query made


def run_under_faults(
    column: Column,
    settings: ProducerSettings,
    *,
    schedule: FaultSchedule,
    on_the_driver: DriverFaults,
    query: Query,
    say: Say,
) -> SideRun:
    """Run ``query`` with Kinesis behind a fault proxy drawing from ``schedule`` and DynamoDB
    behind a metering proxy, its driver meeting ``on_the_driver``, restarted from its
    checkpoint until it reaches the end of its input."""
    kinesis_url, dynamodb_url = local_endpoints(settings)
    started = time.monotonic()
    # the proxy stands for Kinesis: it enforces the signature window the fence relies on
    window_s = settings.signature_window_s if settings.fenced else None
    with (
        FaultProxy(kinesis_url, schedule, signature_window_s=window_s) as proxy,
        MeteringProxy(dynamodb_url, settings.table) as metered,
    ):
        how, start = query(
            {"kinesis_endpoint_url": proxy.endpoint, "dynamodb_endpoint_url": metered.endpoint}
        )
        say(
            f"[bold]{column.name}[/bold] ({how}): streaming into {settings.stream} through the "
            f"fault proxy at {proxy.endpoint}"
        )
        restarts, kills = run_until_done(start, on_the_driver, say=say)
    return SideRun(
        seconds=time.monotonic() - started,
        restarts=restarts,
        faults={**injected_faults(schedule), DRIVER_KILLS: kills},
        bill=metered.meter.snapshot(),
    )


def audited_side(
    column: Column,
    settings: ProducerSettings,
    sent: Sequence[Message],
    run: SideRun,
    *,
    faults: dict[str, int],
    replayed_run: str,
) -> DemoResult:
    """The side's stream audited against ``sent`` (:func:`devstack.demo.audited`), once the
    reconciler has looked at what an exactly-once side left behind."""
    reconciled = None
    if column.dedupe is not None:
        stack = build_stack(settings)
        reconciled = stack.reconciler(owner=f"demo-reconciler:{default_owner()}").run_once()
    return audited(
        column,
        settings,
        sent,
        seconds=run.seconds,
        batches_replayed=run.restarts,
        bill=run.bill,
        faults=faults,
        reconciled=reconciled,
        replayed_run=replayed_run,
    )


def _events(spark: Any, source: Path) -> Any:
    """The event files as a stream, one file per micro-batch."""
    return spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))


def _plain_query(spark: Any, source: Path, checkpoint: Path, values: dict[str, str]) -> Start:
    sink = AtLeastOnceSink(values)

    def start(faults: DriverFaults) -> Any:
        return (
            _events(spark, source)
            .writeStream.foreachBatch(FaultyDriver(sink, faults))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    return start


def _keo_query(spark: Any, source: Path, checkpoint: Path, options: dict[str, str]) -> Start:
    def start(faults: DriverFaults) -> Any:
        # the data source carries its hooks to its commits: registered anew for each run
        register(spark, hooks=faults)
        return (
            _events(spark, source)
            .repartition(2)
            .writeStream.format("keo")
            .options(**options)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    return start


def run_until_done(
    start: Start, faults: DriverFaults, *, say: Say, max_restarts: int = 5
) -> tuple[int, int]:
    """Run the query to the end of its input, restarting it from its checkpoint each time it
    dies (as an orchestrator restarts a killed driver); returns the number of restarts, and
    how many of them followed the staged death of the driver (not staged again)."""
    from pyspark.errors import StreamingQueryException

    restarts = kills = 0
    while True:
        query = start(faults)
        try:
            if not query.awaitTermination(QUERY_TIMEOUT_S):
                query.stop()
                raise TimeoutError(f"the demo query ran longer than {QUERY_TIMEOUT_S} s")
        except StreamingQueryException as exc:
            if restarts >= max_restarts:
                raise
            restarts += 1
            if DriverKilledError.MESSAGE in str(exc):
                kills += 1
                faults = faults.restarted()
                why = "killed after a batch's puts, before its commit"
            else:
                text = str(exc).strip()
                why = text.splitlines()[0][:160] if text else type(exc).__name__
            say(f"  the driver died ({why}); restarting the query from its checkpoint")
            continue
        return restarts, kills
