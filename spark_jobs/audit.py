"""The audit on Spark: ``keo audit``'s verdict, report and exit codes, the stream read by Spark.

Example::

    python -m spark_jobs.audit --stream orders --table orders-ledger --expected keys.txt --json

Spark reads the stream (``format("keo")``, one task per shard, every shard at once) and groups
its user records by key; the driver gets one row per key with its positions, scans the ledger,
and hands both to :func:`producer.audit.judge`, the comparison ``keo audit`` uses. The driver
holds one entry per key, as ``keo audit`` does; the reading, the long part, is parallel.

``--expected`` is read by Spark too: keys one per line, or JSON lines (the input of
``keo send``) whose ``key`` is a string of 1 to 256 characters and whose ``data`` is present
(``keo audit`` also skips rows whose data ``keo send`` could not encode). Other settings come
from ``KEO_*`` variables (endpoints, region). Exit codes are ``keo``'s: 0 clean, 1 anomalies,
2 usage, 3 configuration, 4 a backend could not be reached.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from enum import IntEnum
from typing import Any

from dedupe_store.errors import LedgerError
from dedupe_store.records import MAX_KEY_CHARS, Position
from producer.audit import AuditReport, StreamTally, judge
from producer.errors import KeoError, StreamNotFoundError
from producer.kinesis import KinesisReader
from producer.wiring import kinesis_client, ledger_from
from spark_jobs.options import SETTING_OPTIONS
from spark_jobs.writer import producer_settings, settings_from_env

log = logging.getLogger(__name__)


class ExitCode(IntEnum):
    """``keo``'s exit codes (``cli/exit_codes.py``): scripts rely on them."""

    OK = 0
    FAILED = 1
    CONFIG = 3
    UNAVAILABLE = 4


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.audit",
        description="Audit a stream on Spark: each key exactly once, the ledger agreeing.",
    )
    parser.add_argument("--stream", help="Kinesis stream (default: KEO_STREAM)")
    parser.add_argument("--table", help="DynamoDB ledger table (default: KEO_TABLE)")
    parser.add_argument(
        "--expected",
        help="keys that must each be in the stream once: one per line, or keo send's JSON lines",
    )
    parser.add_argument(
        "--json", action="store_true", help="the full report as JSON on stdout (summary: stderr)"
    )
    parser.add_argument("--show-keys", type=int, default=10, help="keys listed per anomaly")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--log-level", default="WARNING", help="Python log level of the job")
    return parser.parse_args(argv)


def read_options(values: dict[str, str]) -> dict[str, str]:
    """The ``format("keo")`` options of a set of ``KEO_*`` values (settings only)."""
    options = {name[len("KEO_") :].lower(): value for name, value in values.items()}
    return {name: value for name, value in options.items() if name in SETTING_OPTIONS}


def spark_tally(spark: Any, values: dict[str, str], shards: int) -> StreamTally:
    """Every visible user record's position by key, read and grouped on Spark."""
    from pyspark.sql import functions as f

    stream = (
        spark.read.format("keo")
        .options(**read_options(values))
        .option("kcl_filter", "false")
        .load()
    )
    position = f.struct("shard_id", "sequence_number", "sub_sequence_number")
    by_key = stream.groupBy("key").agg(
        f.collect_list(f.when(f.col("visible_to_kcl"), position)).alias("positions"),
        f.sum(f.when(f.col("visible_to_kcl"), 0).otherwise(1)).alias("dropped"),
    )
    tally = StreamTally(producer_settings(values).stream, shards=shards)
    for row in by_key.toLocalIterator():
        tally.dropped_by_kcl += row["dropped"]
        if row["positions"]:
            tally.user_records += len(row["positions"])
            tally.seen[row["key"]] = [Position(*p) for p in row["positions"]]
    return tally


def expected_keys(spark: Any, path: str) -> Iterator[str]:
    """The keys of ``--expected``, read on Spark (see the module's docstring)."""
    from pyspark.sql import functions as f

    lines = spark.read.text(path).where(f.length(f.trim("value")) > 0)
    first = lines.first()
    if first is None:
        return iter(())
    if not first["value"].lstrip().startswith("{"):
        keys = lines.select(f.col("value").alias("key"))
    else:
        rows = lines.select(
            f.get_json_object("value", "$.key").alias("key"),
            f.get_json_object("value", "$.data").alias("data"),
        )
        keys = rows.where(
            f.col("data").isNotNull() & f.char_length("key").between(1, MAX_KEY_CHARS)
        ).select("key")
        skipped = lines.count() - keys.count()
        if skipped:
            sys.stderr.write(
                f"spark_jobs.audit: --expected {path}: {skipped} rows keo send would refuse "
                "were skipped\n"
            )
    return (row["key"] for row in keys.toLocalIterator())


def audit(spark: Any, values: dict[str, str], *, expected: str | None) -> AuditReport:
    settings = producer_settings(values)
    reader = KinesisReader(kinesis_client(settings, for_put=False), settings.stream)
    shards = len(reader.shards())  # also: the stream exists, before Spark starts reading
    ledger = ledger_from(settings)
    ledger.ensure_ready()
    from spark_jobs import register

    register(spark)
    tally = spark_tally(spark, values, shards)
    wanted = list(expected_keys(spark, expected)) if expected is not None else None
    return judge(tally, ledger.scan(settings.stream), expected=wanted)


def main(argv: Sequence[str] | None = None, *, session: Any = None) -> int:
    """Run the audit; ``session`` is a SparkSession the caller owns (else the job makes one)."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    values = settings_from_env(stream=args.stream, table=args.table)
    try:
        producer_settings(values)
    except ValueError as exc:
        sys.stderr.write(f"spark_jobs.audit: {exc}\n")
        return ExitCode.CONFIG
    from spark_jobs.session import job_session

    spark = session if session is not None else job_session(args.master, "keo-audit")
    try:
        report = audit(spark, values, expected=args.expected)
    except StreamNotFoundError as exc:
        sys.stderr.write(f"spark_jobs.audit: {exc}\n")
        return ExitCode.CONFIG
    except (KeoError, LedgerError) as exc:
        sys.stderr.write(f"spark_jobs.audit: {exc}\n")
        return ExitCode.UNAVAILABLE
    finally:
        if session is None:
            spark.stop()
    if args.json:
        sys.stdout.write(json.dumps(report.as_json(), ensure_ascii=False) + "\n")
    (sys.stderr if args.json else sys.stdout).write(report.summary(args.show_keys) + "\n")
    return ExitCode.OK if report.clean else ExitCode.FAILED


if __name__ == "__main__":
    sys.exit(main())
