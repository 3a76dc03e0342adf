"""Spark: the ``keo`` data source (:mod:`spark_jobs.datasource`, registered by :func:`register`;
its streaming read is :mod:`spark_jobs.stream_reader`) and its driver metrics
(:mod:`spark_jobs.driver_metrics`), the ``foreachBatch`` sink (:mod:`spark_jobs.sink`), the
writer both run (:mod:`spark_jobs.writer`) and the dead letters both keep
(:mod:`spark_jobs.dead_letters`), the batch read of a stream on any Spark
(:func:`read_records`, :mod:`spark_jobs.batch_read`) and the runnable jobs
(:mod:`spark_jobs.produce_stream`). Which of them runs on which Spark: :mod:`spark_jobs.versions`
(the data source needs Spark 4; the sink, the batch read and the audit run on 3.5 too).

The only package that imports pyspark, and only lazily: executors and the CLI import this
package, so nothing here imports pyspark at import time. ``spark_jobs.produce_stream`` is run
with ``python -m`` and is not imported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dedupe_store.exports import lazy_exports
from producer.hooks import NO_HOOKS, Hooks

if TYPE_CHECKING:
    from spark_jobs.batch_read import read_records as read_records
    from spark_jobs.dead_letters import DeadLetter as DeadLetter
    from spark_jobs.errors import (
        OptionsError as OptionsError,
    )
    from spark_jobs.errors import (
        SparkVersionError as SparkVersionError,
    )
    from spark_jobs.session import local_session as local_session
    from spark_jobs.sink import ExactlyOnceSink as ExactlyOnceSink
    from spark_jobs.writer import (
        BatchReport as BatchReport,
    )
    from spark_jobs.writer import (
        producer_settings as producer_settings,
    )
    from spark_jobs.writer import (
        settings_from_env as settings_from_env,
    )

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "spark_jobs.batch_read": ("read_records",),
        "spark_jobs.dead_letters": ("DeadLetter",),
        "spark_jobs.errors": ("OptionsError", "SparkVersionError"),
        "spark_jobs.session": ("local_session",),
        "spark_jobs.sink": ("ExactlyOnceSink",),
        "spark_jobs.writer": (
            "BatchReport",
            "producer_settings",
            "settings_from_env",
        ),
    },
    own=["register"],
)


def register(spark: Any, *, hooks: Hooks = NO_HOOKS) -> None:
    """Register the ``keo`` data source with ``spark`` (a classic or a Spark Connect session).

    ``hooks`` is the test seam (:mod:`producer.hooks`): it travels with the registered class
    to the executors and to the driver's commits. Registering again replaces the format.
    Python data sources are Spark 4's: on Spark 3.5 this raises
    :class:`~spark_jobs.errors.SparkVersionError`, saying what to use there instead.
    """
    from spark_jobs.versions import require_python_data_sources

    require_python_data_sources(spark, 'format("keo") (the keo data source)')
    from spark_jobs.datasource import register_source

    register_source(spark, hooks=hooks)
