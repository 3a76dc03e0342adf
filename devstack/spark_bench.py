"""The ``keo`` data source's two writer interfaces, Arrow record batches and Spark rows, timed.

::

    python -m devstack.spark_bench [--rows 20000] [--interface-rows N] [--repeats 3] [--out F]

Two measures, on one local SparkSession and the embedded stack (started in a temporary
folder unless both ``KEO_*_ENDPOINT_URL`` are set):

- **interface**: what each interface costs by itself. The same writers, planned and checked as
  for a real write, hand their ``(key, data, routing_key)`` rows to a counter instead of the
  producer (``_Writes.deliver``), so the time is Spark's transfer to Python plus the
  conversion to tuples. The median of ``--repeats`` runs, at ``--rows`` and, as 20,000 rows
  take about as long as starting a Spark job, at ``--interface-rows`` too.
- **end to end**: ``df.write.format("keo")`` into a fresh stream (every row new), then the same
  rows again (every row a DUPLICATE). On the emulators the ledger bounds this rate (dynalite
  is a single Node process sharing 2 cores with Spark), so it shows how much the interface
  matters next to the protocol, not what AWS would do.

Figures go to a JSON file; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

from devstack import emulators
from producer.kinesis import create_stream
from producer.wiring import kinesis_client, ledger_from
from spark_jobs import register
from spark_jobs.datasource import (
    KeoArrowWriter,
    KeoCommitMessage,
    KeoDataSource,
    KeoRowWriter,
)
from spark_jobs.session import local_session
from spark_jobs.writer import PartitionReport, producer_settings

log = logging.getLogger(__name__)

INTERFACES: Final = {"arrow": "true", "rows": "false"}
PARTITIONS: Final = 2
PAYLOAD_BYTES: Final = 200
INTERFACE_FORMAT: Final = "keo_interface_bench"


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


def _figures(rows: int, seconds: list[float]) -> dict[str, Any]:
    median = statistics.median(seconds)
    return {"seconds": [round(s, 3) for s in seconds], "rows_per_s": round(rows / median, 1)}


def run(
    spark: Any,
    settings: dict[str, str],
    *,
    rows: int,
    interface_rows: Sequence[int],
    repeats: int,
) -> dict[str, Any]:
    """Both measures for both interfaces; ``settings`` are options of ``format("keo")``."""
    register(spark)
    spark.dataSource.register(InterfaceBenchSource)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    admin_settings = producer_settings({f"KEO_{k.upper()}": v for k, v in settings.items()})
    admin = kinesis_client(admin_settings, for_put=False)
    ledger_from(admin_settings).create_table(wait=True)
    create_stream(admin, admin_settings.stream, PARTITIONS, timeout_s=60)

    interface: dict[str, Any] = {}
    warm = _frame(spark, 1000, "warm")
    for name, arrow in INTERFACES.items():
        # a first run starts the Python workers; it is not counted
        options = {**settings, "arrow": arrow}
        _timed_write(warm, INTERFACE_FORMAT, options)
        interface[name] = {}
        for count in dict.fromkeys([rows, *interface_rows]):
            frame = _frame(spark, count, "interface")
            seconds = [_timed_write(frame, INTERFACE_FORMAT, options) for _ in range(repeats)]
            interface[name][str(count)] = _figures(count, seconds)
            log.info("interface %s rows=%d: %s", name, count, interface[name][str(count)])

    end_to_end: dict[str, Any] = {}
    for name, arrow in INTERFACES.items():
        stream = f"bench-spark-{name}-{stamp}"
        create_stream(admin, stream, PARTITIONS, timeout_s=60)
        options = {**settings, "stream": stream, "arrow": arrow}
        frame = _frame(spark, rows, name)
        figures = {}
        for run_name in ("new", "duplicate"):
            figures[run_name] = _figures(rows, [_timed_write(frame, "keo", options)])
            log.info("end to end %s %s: %s", name, run_name, figures[run_name])
        end_to_end[name] = figures
    return {"interface": interface, "end_to_end": end_to_end}


def _machine() -> dict[str, Any]:
    import pyarrow
    import pyspark

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "pyarrow": pyarrow.__version__,
        "master": f"local[{PARTITIONS}]",
        "partitions": PARTITIONS,
        "payload_bytes": PAYLOAD_BYTES,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.spark_bench",
        description="Time the keo data source's Arrow and row writers.",
    )
    parser.add_argument("--rows", type=int, default=20_000, help="rows per write")
    parser.add_argument(
        "--interface-rows",
        type=int,
        action="append",
        default=[],
        help="more rows for the interface measure (repeatable)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of the interface measure")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results") / f"spark-writers-{time.strftime('%Y-%m-%d')}.json",
        help="where the figures go",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    with ExitStack() as cleanup:
        endpoints = {
            "kinesis_endpoint_url": os.environ.get("KEO_KINESIS_ENDPOINT_URL", ""),
            "dynamodb_endpoint_url": os.environ.get("KEO_DYNAMODB_ENDPOINT_URL", ""),
        }
        if not all(endpoints.values()):
            state = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="keo-bench-")))
            started = emulators.up(state)
            cleanup.callback(emulators.down, state)
            endpoints = {
                "kinesis_endpoint_url": started.kinesis,
                "dynamodb_endpoint_url": started.dynamodb,
            }
        stamp = time.strftime("%Y%m%d-%H%M%S")
        settings = {
            **endpoints,
            "region": os.environ.get("KEO_REGION", "us-east-1"),
            "stream": f"bench-spark-{stamp}",
            "table": f"bench-spark-{stamp}",
        }
        spark = local_session("keo-spark-bench")
        cleanup.callback(spark.stop)
        figures = run(
            spark,
            settings,
            rows=args.rows,
            interface_rows=args.interface_rows,
            repeats=args.repeats,
        )
    more = "".join(f" --interface-rows {n}" for n in args.interface_rows)
    result = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": args.rows,
        "command": (
            f"python -m devstack.spark_bench --rows {args.rows}{more} --repeats {args.repeats}"
        ),
        "machine": _machine(),
        **figures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    log.info("figures written to %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
