"""Which Spark runs which part of keo (the README's "Spark versions" table)::

    Spark 3.5 (EMR 7, EMR Serverless, Glue 5,    foreachBatch(ExactlyOnceSink(...)), both dedupe
    Databricks LTS) and 4.0 to 4.3               modes; read_records; the audit on Spark
    Spark 4.0 to 4.3 only                        format("keo"): df.write and df.writeStream,
                                                 spark.read and spark.readStream (Python data
                                                 sources, new in Spark 4.0)

The version is the session's (``spark.version``: on Spark Connect, the server's), not the
installed pyspark's. Nothing here imports pyspark.
"""

from __future__ import annotations

import re
from typing import Any, Final

from spark_jobs.errors import SparkVersionError

__all__ = ["PYTHON_DATA_SOURCES", "require_python_data_sources", "version_of"]

# pyspark.sql.datasource (batch and streaming) appeared in Spark 4.0
PYTHON_DATA_SOURCES: Final = (4, 0)
ON_SPARK_35: Final = (
    "On Spark 3.5, write with df.writeStream.foreachBatch(spark_jobs.ExactlyOnceSink(...)) "
    '(dedupe="key" or "replay"), read a stream into a DataFrame with '
    "spark_jobs.read_records(spark, stream=...), and audit with python -m spark_jobs.audit; "
    'a streaming read (spark.readStream.format("keo")) needs Spark 4.'
)


def version_of(spark: Any) -> tuple[int, int]:
    """``(major, minor)`` of the session's Spark (``"3.5.6-amzn-2"`` -> ``(3, 5)``)."""
    text = str(spark.version)
    found = re.match(r"(\d+)\.(\d+)", text)
    if found is None:
        raise ValueError(f"not a Spark version: {text!r}")
    return int(found.group(1)), int(found.group(2))


def require_python_data_sources(spark: Any, feature: str) -> None:
    """:class:`SparkVersionError` unless the session's Spark runs Python data sources."""
    if version_of(spark) < PYTHON_DATA_SOURCES:
        raise SparkVersionError(
            feature,
            running=str(spark.version),
            needs=".".join(map(str, PYTHON_DATA_SOURCES)),
            instead=ON_SPARK_35,
        )
