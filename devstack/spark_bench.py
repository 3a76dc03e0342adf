"""The ``keo`` data source's overhead: its Arrow and row writers, in key mode and in replay mode,
against the same producer driven by ``keo send`` and against a plain ``foreachBatch`` sink, on
the same rows.

::

    python -m devstack.spark_bench [--rows 20000] [--interface-rows 400000] [--repeats 3]
                                   [--stream-records 50000] [--out F]

``keo bench`` runs it too (``--spark``, the default), so ``make bench`` writes both files.
Two measures, on one local SparkSession and the embedded stack (started in a temporary
folder unless both ``KEO_*_ENDPOINT_URL`` are set), every row ``PAYLOAD_BYTES`` long:

- **interface**: what each writer interface costs by itself. The same writers, planned and
  checked as for a real write, hand their ``(key, data, routing_key)`` rows to a counter
  instead of the producer (``_Writes.deliver``), so the time is Spark's transfer to Python
  plus the conversion to tuples. The median of ``--repeats`` runs, at ``--rows`` and, as
  20,000 rows take about as long as starting a Spark job, at ``--interface-rows`` too.
- **end to end**, ``--rows`` rows, each sink into a stream and ledger table of its own (no
  measure writes into a table that an earlier one filled):

  - ``df.write.format("keo")``, Arrow writer and row writer: every row new, then the same
    rows again (every row a DUPLICATE);
  - ``keo send``: the same producer, driven as the command line drives it. ``keo send
    --input`` runs as a subprocess on a JSON-lines file of the same rows, new then again
    (DUPLICATE), so its figure is what a user of the command sees, its start included (the
    imports, the clients, the stream's description). That start is timed on its own too
    (``startup_s``, ``keo send`` on an empty file): about a second, against tens of seconds
    for the rows, so the subprocess, not an in-process producer, is the fair stand-in. It is
    one process; ``format("keo")`` runs a producer in each of its ``PARTITIONS`` tasks;
  - a plain at-least-once ``foreachBatch`` sink, ``put_records`` from the executors and no
    ledger (``devstack.spark_demo.AtLeastOnceSink``, the demo's). It is called on the same
    batch DataFrame, as ``foreachBatch`` would call it, so none of the Spark measures pays
    for a streaming query's bookkeeping. Putting again is not a DUPLICATE path (it would
    only write every row twice);
  - ``df.write.format("keo")`` in replay mode (``dedupe=replay``, Arrow writer, a ``run_id``
    per write), in ``--repeats`` rounds with the plain sink (the plain sink, then a new
    replay-mode run: ``replay_vs_plain`` has each round's ratio and their median), then the
    last run again (COMPLETE: every row DUPLICATE, nothing sent). Its DynamoDB calls, the
    tasks' and the driver's, go through a metering proxy (:mod:`devstack.metering_proxy`):
    the bill per row, ``--rows / PARTITIONS`` rows per task.

  ``ratios`` divides each sink's rate by ``keo send``'s (new and DUPLICATE) and by the
  plain sink's (new; the median of its rounds).
- **streaming** (:mod:`devstack.stream_bench`), ``--stream-records`` records:
  ``readStream.format("keo")`` against a plain boto3 ``GetRecords`` loop, and the relay
  exactly once (replay mode) against at least once, in ``--repeats`` rounds each.

On the emulators the ledger bounds the exactly-once rates (dynalite is a single Node process
sharing 2 cores with Spark), so the figures show what Spark adds to the protocol, not what
AWS would do. The load average at the start and at the end of the run goes in the file: on a
shared machine it says how noisy the figures are. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

from devstack import stream_bench
from devstack.bench import (
    load_average,
    metered_dynamodb,
    per_message,
    timed_keo_send,
    write_lines,
)
from devstack.bench_stack import PARTITIONS, as_env, fresh_streams, local_endpoints, write
from devstack.spark_demo import AtLeastOnceSink
from spark_jobs import register
from spark_jobs.datasource import (
    KeoArrowWriter,
    KeoCommitMessage,
    KeoDataSource,
    KeoRowWriter,
)
from spark_jobs.session import local_session, worker_python_path
from spark_jobs.writer import PartitionReport, producer_settings

log = logging.getLogger(__name__)

INTERFACES: Final = {"arrow": "true", "rows": "false"}
CLI_SEND: Final = "keo_send"
REPLAY: Final = "replay"  # format("keo"), Arrow writer, dedupe=replay
PLAIN_SINK: Final = "plain_foreach_batch"
PAYLOAD_BYTES: Final = 200
DEFAULT_ROWS: Final = 20_000
DEFAULT_INTERFACE_ROWS: Final = (400_000,)
DEFAULT_REPEATS: Final = 3
INTERFACE_FORMAT: Final = "keo_interface_bench"

Say = Callable[[str], None]


class _Counting:
    """Counts the rows instead of sending them; nothing to commit."""

    def deliver(self, rows: Iterator[tuple[Any, Any, Any]]) -> KeoCommitMessage:
        count = sum(1 for _ in rows)
        return KeoCommitMessage(PartitionReport(0, {"sent": count}))

    def commit(self, *_: Any) -> None:
        return None


class CountingArrowWriter(_Counting, KeoArrowWriter):
    pass


class CountingRowWriter(_Counting, KeoRowWriter):
    pass


class InterfaceBenchSource(KeoDataSource):
    """``format("keo_interface_bench")``: the keo writers, counting instead of sending."""

    arrow_writer = CountingArrowWriter
    row_writer = CountingRowWriter

    @classmethod
    def name(cls) -> str:
        return INTERFACE_FORMAT


def _frame(spark: Any, rows: int, prefix: str) -> Any:
    return spark.range(rows, numPartitions=PARTITIONS).selectExpr(
        f"concat('{prefix}-', cast(id as string)) as key",
        f"repeat('x', {PAYLOAD_BYTES}) as data",
    )


def _timed_write(frame: Any, data_format: str, options: dict[str, str]) -> float:
    started = time.perf_counter()
    frame.write.format(data_format).mode("append").options(**options).save()
    return time.perf_counter() - started


def _timed_sink(frame: Any, sink: Callable[[Any, int], object]) -> float:
    started = time.perf_counter()
    sink(frame, 0)
    return time.perf_counter() - started


def _figures(rows: int, seconds: list[float]) -> dict[str, Any]:
    median = statistics.median(seconds)
    return {"seconds": [round(s, 3) for s in seconds], "rows_per_s": round(rows / median, 1)}


def _ratios(end_to_end: Mapping[str, Any]) -> dict[str, Any]:
    """Each sink's rate over ``keo send``'s (new, DUPLICATE) and the plain sink's (new)."""
    send, plain = end_to_end[CLI_SEND], end_to_end[PLAIN_SINK]

    def ratio(figures: Mapping[str, Any] | None, reference: Mapping[str, Any]) -> float | None:
        if figures is None:
            return None  # the plain sink has no DUPLICATE path
        return round(float(figures["rows_per_s"]) / float(reference["rows_per_s"]), 3)

    return {
        name: {
            "new_vs_keo_send": ratio(figures["new"], send["new"]),
            "duplicate_vs_keo_send": ratio(figures.get("duplicate"), send["duplicate"]),
            "new_vs_plain_foreach_batch": ratio(figures["new"], plain["new"]),
        }
        for name, figures in end_to_end.items()
    }


def run(
    spark: Any,
    settings: Mapping[str, str],
    *,
    rows: int = DEFAULT_ROWS,
    interface_rows: Sequence[int] = DEFAULT_INTERFACE_ROWS,
    repeats: int = DEFAULT_REPEATS,
    stream_records: int = stream_bench.DEFAULT_RECORDS,
    stream_warm_up: bool = True,
    stream_running_s: float = stream_bench.RUNNING_S,
    say: Say = log.info,
) -> dict[str, Any]:
    """Every measure; ``settings`` are options of ``format("keo")`` (endpoints, region), and
    each measure adds a stream and a table of its own. The caller owns ``spark``."""
    load_at_start = load_average()
    register(spark)
    spark.dataSource.register(InterfaceBenchSource)
    say("spark: a stream and a ledger table for each measure")
    streaming_labels = {label: f"stream-{label}" for label in stream_bench.STREAMS}
    streams = fresh_streams(
        settings,
        ["interface", CLI_SEND, *INTERFACES, REPLAY, PLAIN_SINK, *streaming_labels.values()],
    )
    interface = _interface(
        spark,
        streams["interface"],
        rows=rows,
        interface_rows=interface_rows,
        repeats=repeats,
        say=say,
    )
    end_to_end: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="keo-spark-bench-") as folder:
        end_to_end[CLI_SEND] = _keo_send(streams[CLI_SEND], Path(folder), rows, say)
    for name, arrow in INTERFACES.items():
        options = {**streams[name], "arrow": arrow}
        frame = _frame(spark, rows, name)
        end_to_end[name] = {}
        for run_name in ("new", "duplicate"):
            say(f"spark: format('keo'), {name} writer, {rows} rows ({run_name})")
            end_to_end[name][run_name] = _figures(rows, [_timed_write(frame, "keo", options)])
    rounds = _replay_and_plain(spark, streams, rows=rows, repeats=repeats, say=say)
    end_to_end[REPLAY] = rounds.pop(REPLAY)
    end_to_end[PLAIN_SINK] = rounds.pop(PLAIN_SINK)
    with tempfile.TemporaryDirectory(prefix="keo-stream-bench-") as folder:
        streaming = stream_bench.run(
            spark,
            {label: as_env(streams[name]) for label, name in streaming_labels.items()},
            Path(folder),
            records=stream_records,
            repeats=repeats,
            warm_up=stream_warm_up,
            running_s=stream_running_s,
            say=say,
        )
    return {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
        "machine": _machine(spark, load_at_start),
        "interface": interface,
        "end_to_end": end_to_end,
        "ratios": _ratios(end_to_end),
        "replay_vs_plain": rounds,
        "streaming": streaming,
    }


def _interface(
    spark: Any,
    options: dict[str, str],
    *,
    rows: int,
    interface_rows: Sequence[int],
    repeats: int,
    say: Say,
) -> dict[str, Any]:
    interface: dict[str, Any] = {}
    warm = _frame(spark, 1000, "warm")
    for name, arrow in INTERFACES.items():
        # a first run starts the Python workers; it is not counted
        say(f"spark: warming up the {name} writer")
        with_arrow = {**options, "arrow": arrow}
        _timed_write(warm, INTERFACE_FORMAT, with_arrow)
        interface[name] = {}
        for count in dict.fromkeys([rows, *interface_rows]):
            say(f"spark: the {name} writer's interface, {count} rows x {repeats}")
            frame = _frame(spark, count, "interface")
            seconds = [_timed_write(frame, INTERFACE_FORMAT, with_arrow) for _ in range(repeats)]
            interface[name][str(count)] = _figures(count, seconds)
    return interface


def _keo_send(options: dict[str, str], folder: Path, rows: int, say: Say) -> dict[str, Any]:
    """``keo send`` on the rows, new then DUPLICATE, and its start on an empty file."""
    env = {
        **os.environ,
        **as_env(options),
        # the code this process runs, not whatever copy the interpreter has installed
        "PYTHONPATH": worker_python_path(),
    }
    say("spark: keo send's start (an empty input)")
    empty = write_lines(folder / "empty.jsonl", 0, PAYLOAD_BYTES, CLI_SEND)
    startup_s = timed_keo_send(env, empty, "none")
    lines = write_lines(folder / "rows.jsonl", rows, PAYLOAD_BYTES, CLI_SEND)
    figures: dict[str, Any] = {"startup_s": round(startup_s, 3)}
    for run_name, expected in (("new", "SENT"), ("duplicate", "DUPLICATE")):
        say(f"spark: keo send, {rows} rows ({run_name})")
        seconds = timed_keo_send(env, lines, f"{expected} {rows}")
        figures[run_name] = _figures(rows, [seconds])
    return figures


def _replay_and_plain(
    spark: Any, streams: Mapping[str, dict[str, str]], *, rows: int, repeats: int, say: Say
) -> dict[str, Any]:
    """The plain ``foreachBatch`` sink and ``format("keo")`` in replay mode, in ``repeats``
    rounds, each the plain sink then a new replay-mode write (Arrow writer, ``dedupe=replay``,
    a ``run_id`` of its own); then the last write again (its run COMPLETE: every row
    DUPLICATE, nothing sent). The ratio of the two is taken within each round, where the
    machine's drift is shared, then its median.

    Both are warmed up first, untimed, as a streaming query's batches after its first one:
    the Python workers keep their clients (``format("keo")`` one client set per worker and
    settings, so every replay-mode write goes through the same metering proxy: a proxy of
    its own per write would be new settings, new clients, each write). Every replay-mode
    write's DynamoDB calls, the tasks' and the driver's, are priced by that proxy's meter:
    the bill per row, with ``rows / PARTITIONS`` rows per task."""
    sink = AtLeastOnceSink(as_env(streams[PLAIN_SINK]))
    plain_frame, replay_frame = _frame(spark, rows, PLAIN_SINK), _frame(spark, rows, REPLAY)
    plain_s: list[float] = []
    replay_s: list[float] = []
    bills: list[dict[str, Any]] = []
    with metered_dynamodb(producer_settings(as_env(streams[REPLAY]))) as (endpoint, meter):
        options = {**streams[REPLAY], "dynamodb_endpoint_url": endpoint, "dedupe": "replay"}

        def replay_write(run_id: str) -> float:
            before = meter.snapshot()
            seconds = _timed_write(replay_frame, "keo", {**options, "run_id": run_id})
            bills.append(per_message(meter.snapshot(), rows, since=before))
            return seconds

        say("spark: warming up the plain sink and format('keo') in replay mode")
        _timed_sink(_frame(spark, 1000, "warm"), sink)
        _timed_write(_frame(spark, 1000, "warm"), "keo", {**options, "run_id": "warm-up"})
        for number in range(1, repeats + 1):
            say(f"spark: plain foreachBatch put_records sink, {rows} rows ({number}/{repeats})")
            plain_s.append(_timed_sink(plain_frame, sink))
            say(f"spark: format('keo'), dedupe=replay, {rows} rows ({number}/{repeats})")
            replay_s.append(replay_write(f"bench-{number}"))
        say(f"spark: format('keo'), dedupe=replay, {rows} rows again (DUPLICATE)")
        again_s = replay_write(f"bench-{repeats}")
    per_round = [round(p / r, 3) for p, r in zip(plain_s, replay_s, strict=True)]
    return {
        PLAIN_SINK: {"new": _figures(rows, plain_s)},
        REPLAY: {
            "rows_per_partition": -(-rows // PARTITIONS),
            "new": {**_figures(rows, replay_s), **bills[0]},
            "duplicate": {**_figures(rows, [again_s]), **bills[-1]},
        },
        "rounds": repeats,
        "ratio_per_round": per_round,
        "median_ratio": round(statistics.median(per_round), 3),
    }


def _machine(spark: Any, load_at_start: list[float]) -> dict[str, Any]:
    import platform

    import pyarrow
    import pyspark

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "pyarrow": pyarrow.__version__,
        "master": spark.sparkContext.master,
        "partitions": PARTITIONS,
        "payload_bytes": PAYLOAD_BYTES,
        "load_average": {"start": load_at_start, "end": load_average()},
    }


def bench(
    endpoints: Mapping[str, str],
    *,
    rows: int = DEFAULT_ROWS,
    interface_rows: Sequence[int] = DEFAULT_INTERFACE_ROWS,
    repeats: int = DEFAULT_REPEATS,
    stream_records: int = stream_bench.DEFAULT_RECORDS,
    say: Say = log.info,
) -> dict[str, Any]:
    """:func:`run` in a local SparkSession of its own, stopped at the end; ``endpoints`` are
    ``format("keo")`` options (``kinesis_endpoint_url``, ``dynamodb_endpoint_url``, ``region``)."""
    say("spark: starting a local[2] session")
    spark = local_session("keo-spark-bench")
    try:
        figures = run(
            spark,
            endpoints,
            rows=rows,
            interface_rows=interface_rows,
            repeats=repeats,
            stream_records=stream_records,
            say=say,
        )
    finally:
        spark.stop()
    more = "".join(f" --interface-rows {n}" for n in interface_rows)
    command = (
        f"python -m devstack.spark_bench --rows {rows}{more} --repeats {repeats} "
        f"--stream-records {stream_records}"
    )
    return {**figures, "command": command}


def default_output() -> Path:
    return Path("bench/results") / f"spark-writers-{time.strftime('%Y-%m-%d')}.json"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.spark_bench",
        description="Time format('keo')'s Arrow and row writers against keo send and a plain "
        "foreachBatch sink.",
    )
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="rows per write")
    parser.add_argument(
        "--interface-rows",
        type=int,
        action="append",
        help="more rows for the interface measure (repeatable; default "
        f"{', '.join(map(str, DEFAULT_INTERFACE_ROWS))})",
    )
    parser.add_argument(
        "--repeats", type=int, default=DEFAULT_REPEATS, help="runs of the interface measure"
    )
    parser.add_argument(
        "--stream-records",
        type=int,
        default=stream_bench.DEFAULT_RECORDS,
        help="records of the stream readStream.format('keo') and the relay read",
    )
    parser.add_argument("--out", type=Path, default=default_output(), help="where figures go")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    with ExitStack() as cleanup:
        results = bench(
            local_endpoints(cleanup),
            rows=args.rows,
            interface_rows=args.interface_rows or DEFAULT_INTERFACE_ROWS,
            repeats=args.repeats,
            stream_records=args.stream_records,
        )
    write(results, args.out)
    log.info("figures written to %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
