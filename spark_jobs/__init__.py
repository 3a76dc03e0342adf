"""Spark: the ``foreachBatch`` sink (:mod:`spark_jobs.sink`) and the runnable jobs
(:mod:`spark_jobs.produce_stream`). The only package that imports pyspark, and only lazily."""
