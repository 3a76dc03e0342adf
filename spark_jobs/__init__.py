"""Spark: the ``foreachBatch`` sink (:mod:`spark_jobs.sink`) and the runnable jobs
(:mod:`spark_jobs.produce_stream`). The only package that imports pyspark, and only lazily:
executors and the CLI import this package, so nothing here imports pyspark at import time.
``spark_jobs.produce_stream`` is run with ``python -m`` and is not imported here.
"""

from __future__ import annotations

from spark_jobs.session import local_session
from spark_jobs.sink import (
    BatchReport,
    DeadLetter,
    ExactlyOnceSink,
    producer_settings,
    settings_from_env,
)

__all__ = [
    "BatchReport",
    "DeadLetter",
    "ExactlyOnceSink",
    "local_session",
    "producer_settings",
    "settings_from_env",
]
