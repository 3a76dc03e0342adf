"""``readStream.format("keo")`` and the relay (#24), timed on the local stack against what a
user would write without them; ``devstack.spark_bench`` runs it (so ``keo bench`` and
``make bench`` do), its figures under ``"streaming"``. By itself::

    python -m devstack.stream_bench [--records 50000] [--repeats 3] [--out F]

Stream A, of ``PARTITIONS`` shards, is filled first with ``records`` records of
``PAYLOAD_BYTES`` bytes (plain ``put_records``), and only read after. Then, in ``repeats``
rounds, each measure next to its reference (the ratio is taken within a round, where the
machine's drift is shared, and its median reported):

- **read**: ``spark.readStream.format("keo")`` over A, ``Trigger.AvailableNow`` (one batch,
  every shard to its tail when the query starts) into Spark's ``noop`` sink, a new checkpoint
  each round, timed from ``start()`` to its end (the query's planning included: finding each
  shard's tail), against a plain boto3 ``GetRecords`` loop over the same shards, a thread per
  shard as Spark runs a task per shard, from TRIM_HORIZON to the tip, 10,000 records a call,
  and against the same loop paced to AWS's read limits (``boto3_get_records_paced``: 5 calls
  and 2 MB a second per shard, :class:`kinesis_store.read_pacing.ReadPacer`), as the read
  is and as a loop on AWS must be (kinesalite enforces neither). The same query's batches
  alone are timed too (``keo_read_stream_batches``: the sum of Spark's ``triggerExecution``
  over its batches): the read once the query runs, without its start (the driver's Python
  source process, listing the shards, finding each shard's tail), which a long-running
  query pays once;
- **running**: a query that runs on (``processingTime`` 0, into ``noop``) over a stream fed
  ``FEED_PER_S`` records a second, for ``RUNNING_S`` seconds once it has caught up: per
  batch, its planning (Spark's ``latestOffset``: each shard's new end) and the batch
  (``triggerExecution``), medians and 90th percentiles. Not timed against a reference: what a
  running query pays per batch to fix its end before it runs;
- **relay**: A into a stream B, exactly once (:func:`spark_jobs.relay.start_relay`, replay
  mode, a new query name and checkpoint each round), against at least once: the same read
  into ``foreachBatch`` of the demo's plain ``put_records`` sink
  (:class:`devstack.spark_demo.AtLeastOnceSink`), into a stream of its own.

Both Spark paths are warmed up first, untimed, on a small stream (a query's first batch
starts Python workers), unless ``warm_up`` is off (a smoke run's figures mean nothing).
The load average at the start and the end is in the figures. Nothing is asserted. A
measure's ``median_ratio`` is against its first reference; ``ratios`` has one per reference.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

from devstack.bench import load_average
from devstack.bench_stack import as_env, fresh_streams, local_endpoints, write
from devstack.spark_demo import AtLeastOnceSink
from kinesis_store.entries import put_entry
from kinesis_store.read_pacing import ReadPacer
from producer.clients import kinesis_client
from producer.retries import poll_until
from producer.settings import Dedupe
from spark_jobs.options import setting_options
from spark_jobs.relay import start_relay
from spark_jobs.writer import producer_settings

__all__ = ["DEFAULT_RECORDS", "measure", "run"]

log = logging.getLogger(__name__)

DEFAULT_RECORDS: Final = 50_000
WARM_RECORDS: Final = 500
PAYLOAD_BYTES: Final = 200
PUTS_IN_FLIGHT: Final = 4
READ: Final = "keo_read_stream"
READ_BATCHES: Final = "keo_read_stream_batches"
GET_RECORDS: Final = "boto3_get_records"
GET_RECORDS_PACED: Final = "boto3_get_records_paced"
EXACTLY_ONCE: Final = "relay_exactly_once"
AT_LEAST_ONCE: Final = "relay_at_least_once"
STREAMS: Final = ("source", "warm", "exactly_once", "at_least_once", "running")
FEED_PER_S: Final = 1_000
FEED_EVERY_S: Final = 0.1
RUNNING_S: Final = 20.0
CAUGHT_UP_WAIT_S: Final = 60.0

Say = Callable[[str], None]


def fill(settings: Mapping[str, str], records: int) -> None:
    """``records`` records into the settings' stream, 500 a call, what failed put again."""
    parsed = producer_settings(settings)
    client = kinesis_client(parsed, for_put=False)

    def put(start: int) -> None:
        entries = [
            put_entry(f"fill-{i}", f"{i:0{PAYLOAD_BYTES}d}".encode())
            for i in range(start, min(records, start + 500))
        ]
        while entries:
            answer = client.put_records(StreamName=parsed.stream, Records=entries)
            entries = [
                entry
                for entry, result in zip(entries, answer["Records"], strict=True)
                if result.get("ErrorCode")
            ]

    with ThreadPoolExecutor(PUTS_IN_FLIGHT) as pool:
        list(pool.map(put, range(0, records, 500)))


def get_records_loop(settings: Mapping[str, str], *, pacer: ReadPacer | None = None) -> int:
    """Every record of the stream read with plain boto3, a thread per shard: the count. With
    ``pacer``, each shard's calls keep to its read limits (5 calls, 2 MB a second)."""
    parsed = producer_settings(settings)
    client = kinesis_client(parsed, for_put=False)
    shards = client.list_shards(StreamName=parsed.stream)["Shards"]

    def read(shard_id: str) -> int:
        iterator = client.get_shard_iterator(
            StreamName=parsed.stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        count = 0
        while iterator is not None:
            left_at_s = pacer.before_call(shard_id) if pacer is not None else 0.0
            page = client.get_records(ShardIterator=iterator, Limit=10_000)
            if pacer is not None:
                page_bytes = sum(
                    len(raw["Data"]) + len(raw["PartitionKey"].encode()) for raw in page["Records"]
                )
                pacer.after_call(shard_id, left_at_s, page_bytes)
            count += len(page["Records"])
            iterator = page.get("NextShardIterator")
            if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                break  # the tip
        return count

    with ThreadPoolExecutor(len(shards)) as pool:
        return sum(pool.map(read, [shard["ShardId"] for shard in shards]))


def _timed(run: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    count = run()
    return time.perf_counter() - started, count


def _ended(query: Any) -> int:
    """Waits for an availableNow query to end; the rows it read."""
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the bench's query failed: {query.exception()}")
    return sum(progress.numInputRows for progress in query.recentProgress)


def _batches_s(query: Any) -> float:
    """The time an ended query spent in its batches, as Spark measured it."""
    return float(sum(p.durationMs.get("triggerExecution", 0) for p in query.recentProgress)) / 1000


class _Feed:
    """``FEED_PER_S`` records a second into a stream, from a thread, until stopped."""

    def __init__(self, settings: Mapping[str, str]) -> None:
        self._parsed = producer_settings(settings)
        self._client = kinesis_client(self._parsed, for_put=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keo-bench-feed", daemon=True)
        self._failure: BaseException | None = None
        self.sent = 0

    def __enter__(self) -> _Feed:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._failure is not None:
            raise RuntimeError("the bench's feed stopped: its figures mean nothing") from (
                self._failure
            )

    def _run(self) -> None:
        per_call = round(FEED_PER_S * FEED_EVERY_S)
        try:
            while not self._stop.wait(FEED_EVERY_S):
                entries = [
                    put_entry(f"feed-{self.sent + i}", b"x" * PAYLOAD_BYTES)
                    for i in range(per_call)
                ]
                self._client.put_records(StreamName=self._parsed.stream, Records=entries)
                self.sent += per_call
        except Exception as exc:  # raised again by __exit__, in the bench's thread
            self._failure = exc


def _spread(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 1),
        "p90": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 1),
    }


class _Queries:
    """The streaming queries the measures start, each with a checkpoint of its own."""

    def __init__(self, spark: Any, folder: Path) -> None:
        self.spark = spark
        self.folder = folder
        self.started = 0
        self.read_batches_s: list[float] = []  # per read, its batches' time

    def _checkpoint(self, label: str) -> str:
        self.started += 1
        return str(self.folder / f"{label}-{self.started}")

    def _read(self, source: Mapping[str, str]) -> Any:
        options = setting_options(source)
        return self.spark.readStream.format("keo").options(**options).load()

    def read(self, source: Mapping[str, str]) -> int:
        query = (
            self._read(source)
            .writeStream.format("noop")
            .option("checkpointLocation", self._checkpoint("read"))
            .trigger(availableNow=True)
            .start()
        )
        rows = _ended(query)
        self.read_batches_s.append(_batches_s(query))
        return rows

    def running(self, stream: Mapping[str, str], *, seconds: float) -> dict[str, Any]:
        """The **running** measure (see the module's docstring) on ``stream``, a new one."""
        with _Feed(stream):
            query = (
                self._read(stream)
                .writeStream.format("noop")
                .option("checkpointLocation", self._checkpoint("running"))
                .trigger(processingTime="0 seconds")
                .start()
            )
            try:
                if not poll_until(
                    lambda: any(p.numInputRows > 0 for p in query.recentProgress),
                    timeout_s=CAUGHT_UP_WAIT_S,
                    interval_s=0.2,
                ):
                    raise RuntimeError(f"the running query read nothing in {CAUGHT_UP_WAIT_S} s")
                before = max(p.batchId for p in query.recentProgress)
                time.sleep(seconds)  # the measure's span: the batches Spark runs in it
                # Spark keeps the last 100 progress reports: the figures are of those
                kept = [p for p in query.recentProgress if p.batchId > before]
            finally:
                query.stop()
        batches = [p for p in kept if p.numInputRows > 0]
        if not batches:
            raise RuntimeError("the running query read nothing while it was fed")
        return {
            "fed_records_per_s": FEED_PER_S,
            "seconds": seconds,
            "batches": max(p.batchId for p in kept) - before,
            "planning_ms": _spread([p.durationMs.get("latestOffset", 0) for p in batches]),
            "batch_ms": _spread([p.durationMs.get("triggerExecution", 0) for p in batches]),
            "records_per_batch": _spread([p.numInputRows for p in batches]),
        }

    def exactly_once(self, source: Mapping[str, str], target: Mapping[str, str]) -> int:
        checkpoint = self._checkpoint("relay")
        query = start_relay(
            self.spark,
            settings=target,
            source=producer_settings(source).stream,
            target=producer_settings(target).stream,
            checkpoint=checkpoint,
            query_name=f"bench-{Path(checkpoint).name}-{time.time_ns()}",
            dedupe=Dedupe.REPLAY,
        )
        return _ended(query)

    def at_least_once(self, source: Mapping[str, str], target: Mapping[str, str]) -> int:
        query = (
            self._read(source)
            .select("key", "data")
            .writeStream.foreachBatch(AtLeastOnceSink(target))
            .option("checkpointLocation", self._checkpoint("plain"))
            .trigger(availableNow=True)
            .start()
        )
        return _ended(query)


def _figures(records: int, seconds: list[float]) -> dict[str, Any]:
    return {
        "seconds": [round(s, 3) for s in seconds],
        "records_per_s": round(records / statistics.median(seconds), 1),
    }


def _ratios(measured: Sequence[float], reference: Sequence[float]) -> dict[str, Any]:
    per_round = [round(r / m, 3) for m, r in zip(measured, reference, strict=True)]
    return {"ratio_per_round": per_round, "median_ratio": round(statistics.median(per_round), 3)}


def _side_by_side(
    records: int,
    repeats: int,
    measure: tuple[str, Callable[[], int]],
    references: Sequence[tuple[str, Callable[[], int]]],
    say: Say,
) -> dict[str, Any]:
    """``repeats`` rounds of each reference then ``measure``; each must see every record."""
    runs = [*references, measure]
    seconds: dict[str, list[float]] = {name: [] for name, _ in runs}
    for number in range(1, repeats + 1):
        for name, run in runs:
            say(f"spark: {name}, {records} records ({number}/{repeats})")
            took, count = _timed(run)
            if count != records:
                raise RuntimeError(f"{name} saw {count} records of {records}")
            seconds[name].append(took)
    ratios = {name: _ratios(seconds[measure[0]], seconds[name]) for name, _ in references}
    return {
        **{name: _figures(records, seconds[name]) for name, _ in runs},
        **ratios[references[0][0]],
        "ratios": ratios,
        "seconds": seconds,
    }


def run(
    spark: Any,
    streams: Mapping[str, Mapping[str, str]],
    folder: Path,
    *,
    records: int = DEFAULT_RECORDS,
    repeats: int = 3,
    warm_up: bool = True,
    running_s: float = RUNNING_S,
    say: Say = log.info,
) -> dict[str, Any]:
    """Every measure (``running_s``: the running query's span). ``streams`` holds the ``KEO_*`` settings of four new streams (and
    ledger tables), by label: ``source`` (A), ``warm``, ``exactly_once`` and
    ``at_least_once`` (the relay's targets) and ``running``; ``folder`` takes the checkpoints."""
    source, warm = streams["source"], streams["warm"]
    say(f"spark: streaming, {records} records into stream A ({PUTS_IN_FLIGHT} puts in flight)")
    fill(source, records)
    queries = _Queries(spark, folder)
    if warm_up:
        say("spark: warming up readStream.format('keo') and both relays")
        fill(warm, WARM_RECORDS)
        queries.read(warm)
        queries.exactly_once(warm, streams["exactly_once"])
        queries.at_least_once(warm, streams["at_least_once"])
    queries.read_batches_s.clear()
    read = _side_by_side(
        records,
        repeats,
        (READ, lambda: queries.read(source)),
        [
            (GET_RECORDS, lambda: get_records_loop(source)),
            (GET_RECORDS_PACED, lambda: get_records_loop(source, pacer=ReadPacer())),
        ],
        say,
    )
    seconds = read.pop("seconds")
    read[READ_BATCHES] = {
        **_figures(records, queries.read_batches_s),
        "ratios": {
            name: _ratios(queries.read_batches_s, seconds[name])
            for name in (GET_RECORDS, GET_RECORDS_PACED)
        },
        "before_first_batch_s": [
            round(whole - batches, 3)
            for whole, batches in zip(seconds[READ], queries.read_batches_s, strict=True)
        ],
    }
    relay = _side_by_side(
        records,
        repeats,
        (EXACTLY_ONCE, lambda: queries.exactly_once(source, streams["exactly_once"])),
        [(AT_LEAST_ONCE, lambda: queries.at_least_once(source, streams["at_least_once"]))],
        say,
    )
    relay.pop("seconds")
    say(f"spark: a running query over a stream fed {FEED_PER_S} records a second")
    running_figures = queries.running(streams["running"], seconds=running_s)
    return {
        "records": records,
        "payload_bytes": PAYLOAD_BYTES,
        "rounds": repeats,
        "read": read,
        "relay": relay,
        "running": running_figures,
    }


def measure(
    spark: Any,
    endpoints: Mapping[str, str],
    *,
    records: int = DEFAULT_RECORDS,
    repeats: int = 3,
    say: Say = log.info,
) -> dict[str, Any]:
    """:func:`run` on new streams and tables (``endpoints`` are ``format("keo")`` options:
    endpoints, region), the checkpoints in a temporary folder; the machine beside."""
    load_at_start = load_average()
    created = fresh_streams(endpoints, [f"stream-{label}" for label in STREAMS])
    streams = {label: as_env(created[f"stream-{label}"]) for label in STREAMS}
    with tempfile.TemporaryDirectory(prefix="keo-stream-bench-") as folder:
        figures = run(spark, streams, Path(folder), records=records, repeats=repeats, say=say)
    return {
        **figures,
        "machine": {
            "cpus": os.cpu_count(),
            "master": spark.sparkContext.master,
            "load_average": {"start": load_at_start, "end": load_average()},
        },
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.stream_bench",
        description="Time readStream.format('keo') against a boto3 GetRecords loop, and the "
        "relay exactly once against at least once.",
    )
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS, help="records in A")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of each measure")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results") / f"streaming-{time.strftime('%Y-%m-%d')}.json",
        help="where figures go",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from spark_jobs import register
    from spark_jobs.session import local_session

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    with ExitStack() as cleanup:
        endpoints = local_endpoints(cleanup)
        spark = local_session("keo-stream-bench")
        cleanup.callback(spark.stop)
        register(spark)
        figures = measure(spark, endpoints, records=args.records, repeats=args.repeats)
    command = f"python -m devstack.stream_bench --records {args.records} --repeats {args.repeats}"
    write(
        {
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": command,
            "streaming": figures,
        },
        args.out,
    )
    log.info("figures written to %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
