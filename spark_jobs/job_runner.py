"""What the runnable Structured Streaming jobs (``python -m spark_jobs.produce_stream``,
``python -m spark_jobs.relay``) share: their trigger, master and log-level flags, and how one
runs: logging set up, a bad trigger refused before Spark starts, the job's session, the query
awaited, the session stopped."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from spark_jobs.errors import SparkVersionError
from spark_jobs.session import job_session

__all__ = ["ExitCode", "add_job_arguments", "run_query_job", "trigger_options"]

log = logging.getLogger(__name__)


class ExitCode(IntEnum):
    """``keo``'s exit codes (``cli/exit_codes.py``): scripts rely on them."""

    OK = 0
    FAILED = 1
    USAGE = 2
    CONFIG = 3
    UNAVAILABLE = 4


def add_job_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--trigger``, ``--master`` and ``--log-level``; ``what`` the trigger processes."""
    parser.add_argument(
        "--trigger",
        default="available-now",
        help=f"'available-now' ({what} what is there, then stop) or 'processing-time=10s'",
    )
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--log-level", default="INFO", help="Python log level of the job")


def trigger_options(trigger: str) -> dict[str, Any]:
    if trigger == "available-now":
        return {"availableNow": True}
    name, _, interval = trigger.partition("=")
    if name == "processing-time" and interval:
        return {"processingTime": interval}
    raise ValueError(
        f"--trigger must be 'available-now' or 'processing-time=<interval>': {trigger}"
    )


def run_query_job(args: argparse.Namespace, app_name: str, start: Callable[[Any], Any]) -> int:
    """Run ``start(spark)``'s streaming query until it ends: 0 when it ended by itself, 3 when
    the session's Spark cannot run it (:class:`SparkVersionError`, said on stderr)."""
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    trigger_options(args.trigger)  # reject a bad trigger before starting Spark
    spark = job_session(args.master, app_name)
    spark.sparkContext.setLogLevel("WARN")
    try:
        query = start(spark)
        log.info("query started app=%s id=%s", app_name, query.id)
        query.awaitTermination()
    except SparkVersionError as exc:
        # a job this Spark cannot run: say what it needs and what to use, no traceback
        sys.stderr.write(f"{app_name}: {exc}\n")
        return ExitCode.CONFIG
    finally:
        spark.stop()
    return ExitCode.OK
