"""The relay demo (``keo demo --relay``): Kinesis stream A into stream B through Spark, exactly
once, under faults on both sides and a driver killed mid-batch; then B audited against A.

::

    sample events ──put_records, direct──> stream A ──readStream.format("keo")──┐
                                                                                │ Spark, local[2]
    stream B <──writeStream.format("keo"), dedupe=replay────────────────────────┘
         (spark_jobs.relay.start_relay: a few micro-batches, max_records_per_trigger)

         FaultProxy on 127.0.0.1 (a seeded schedule) <── every Kinesis call of the relay
           GetRecords: throttled; answered with an expired iterator      (A's reads, and B's
           PutRecords: response dropped after the write; records throttled   read-backs)
         MeteringProxy on 127.0.0.1 <── every DynamoDB call, billed (the run items: no write
                                        per record)
         DriverFaults (devstack.spark_demo): the driver dies after the puts of batch
           ``crash_batch``, before its commit; the relay is restarted from its checkpoint, so
           Spark replays the batch: it reads the same records of A (its end was fixed before it
           ran) and its recovery finds in B what the dead run put, sending only the rest.

Then B is audited against what A holds, read back directly (not through the proxy), as a
multiset of ``(key, data)``, strictly: every record of A in B once, nothing else in B. The
rows are also written to ``expected-rows.jsonl`` for ``keo audit --dedupe replay``. The
result is a :class:`devstack.demo.DemoResult`, like each column of the other demos.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from devstack.demo import Column, DemoResult, put_at_least_once, write_expected
from devstack.spark_demo import (
    ACTIVE_TIMEOUT_S,
    DEFAULT_EVENT_FILES,
    DEFAULT_SHARDS,
    DemoFaults,
    DriverFaults,
    Say,
    Start,
    audited_side,
    run_under_faults,
    sample_events,
    sink_values,
)
from kinesis_store.entries import MAX_RECORDS_PER_PUT, put_entry
from kinesis_store.provisioning import create_stream
from kinesis_store.reader import KinesisReader
from producer.audit.stream import StreamTally, visible_records
from producer.clients import kinesis_client
from producer.protocol import Message
from producer.settings import Dedupe, ProducerSettings
from producer.wiring import ledger_from
from spark_jobs import register
from spark_jobs.relay import start_relay

# the column of stream B; stream A is demo-relay-a-<suffix>
RELAY: Final = Column("relay A -> B", "relay-b", Dedupe.REPLAY)


def run_relay_demo(
    spark: Any,
    settings: ProducerSettings,
    *,
    messages: int,
    workdir: Path,
    say: Say,
    faults: DemoFaults | None = None,
    shards: int = DEFAULT_SHARDS,
    batches: int = DEFAULT_EVENT_FILES,
) -> DemoResult:
    """Fill a new stream A with ``messages`` sample events, relay it into a new stream B in
    about ``batches`` micro-batches under ``faults``, and audit B against A. ``settings`` names
    the table and the endpoints; ``workdir`` receives the checkpoint and
    ``expected-rows.jsonl`` (A's rows). The session gets ``format("keo")`` back without the
    demo's hooks."""
    faults = faults or DemoFaults()
    suffix = time.strftime("%Y%m%d-%H%M%S")
    source, target = f"demo-relay-a-{suffix}", RELAY.stream(suffix)
    admin = kinesis_client(settings, for_put=False)
    for stream in (source, target):
        create_stream(admin, stream, shards, timeout_s=ACTIVE_TIMEOUT_S)
    ledger_from(settings).create_table(wait=True)
    fill(admin, source, sample_events(messages))
    in_a = stream_rows(admin, source)
    write_expected(workdir, in_a)
    per_batch = -(-len(in_a) // max(1, batches))
    say(
        f"{len(in_a)} events put into stream {source} ({shards} shards); the relay reads them "
        f"in micro-batches of {per_batch} at most"
    )
    into_b = settings.model_copy(update={"stream": target, "dedupe": Dedupe.REPLAY})
    # the relay's query is B's run name: a replayed batch is run '<B>/<batch id>'
    query_name = target

    def query(through: dict[str, str]) -> tuple[str, Start]:
        values = sink_values(into_b, **through)

        def start(driver: DriverFaults) -> Any:
            # the data source carries its hooks to its commits: registered anew for each run
            register(spark, hooks=driver)
            return start_relay(
                spark,
                settings=values,
                source=source,
                target=target,
                checkpoint=str(workdir / "checkpoint-relay"),
                query_name=query_name,
                max_records_per_trigger=per_batch,
            )

        how = f'readStream.format("keo") from {source}, writeStream.format("keo"), {RELAY.dedupe}'
        return how, start

    try:
        run = run_under_faults(
            RELAY,
            into_b,
            schedule=faults.relay_schedule(),
            # the driver dies after a batch's puts; B's shards stay as they are
            on_the_driver=faults.on_the_driver(sink_values(into_b), split=False),
            query=query,
            say=say,
        )
    finally:
        register(spark)  # the session's format("keo") without the demo's faults
    return audited_side(
        RELAY,
        into_b,
        in_a,
        run,
        faults=run.faults,
        replayed_run=f"{query_name}/{faults.crash_batch}",
    )


def fill(client: Any, stream: str, events: Sequence[Message]) -> None:
    """Put ``events`` into ``stream``, 500 a request, each once (nothing injected here)."""
    for start in range(0, len(events), MAX_RECORDS_PER_PUT):
        chunk = events[start : start + MAX_RECORDS_PER_PUT]
        put_at_least_once(client, stream, [put_entry(m.key, m.data) for m in chunk])


def stream_rows(client: Any, stream: str) -> list[Message]:
    """Every record of ``stream`` as KCL delivers it, as ``(key, data)`` rows."""
    reader = KinesisReader(client, stream)
    return [
        Message(record.partition_key, record.data)
        for record in visible_records(reader, StreamTally(stream))
    ]
