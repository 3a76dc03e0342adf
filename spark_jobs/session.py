"""The local SparkSessions the demo and the tests share: ``local[2]`` on the loopback
interface, no UI, quiet logs, Python workers running this interpreter (reused across
batches, so each keeps its clients) and importing the same code as the driver; and
``local-cluster``, where each executor is a JVM of its own with its own Python workers."""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

# The folder this package was imported from: a checkout, a worktree or site-packages.
CODE_ROOT = str(Path(__file__).resolve().parents[1])
# For a session that lives seconds (a test's driver process): the C1 compiler only and the
# serial collector start its JVMs about a third sooner on two cores, and its batches are too
# small for C2 to pay off. Not for a session that runs long or is timed (a bench).
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def worker_python_path(environ: dict[str, str] | None = None) -> str:
    """``PYTHONPATH`` for the Python workers: the driver's code first, then what was set.

    Workers do not inherit the driver's ``sys.path``: without this, a worker of a driver run
    from a checkout imports whatever copy of the packages the interpreter has installed (an
    editable install of another tree, an older wheel), not the code the driver runs.
    """
    current = (os.environ if environ is None else environ).get("PYTHONPATH", "")
    rest = [entry for entry in current.split(os.pathsep) if entry and entry != CODE_ROOT]
    return os.pathsep.join([CODE_ROOT, *rest])


def _local_options(python_path: str, parallelism: int = 2) -> dict[str, str]:
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(parallelism),
        "spark.default.parallelism": str(parallelism),
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.python.worker.reuse": "true",
        "spark.executorEnv.PYTHONPATH": python_path,
        "spark.sql.streaming.stopTimeout": "10s",
    }


def _prepare_workers() -> str:
    """Workers run this interpreter and import the driver's code: the JVM starts with this
    process's environment (its driver-side Python workers, which plan data source reads and
    writes and run their commits, read it); executors get it through spark.executorEnv."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    python_path = worker_python_path()
    os.environ["PYTHONPATH"] = python_path
    return python_path


def local_session(app_name: str, *, threads: int = 2, java_options: str | None = None) -> Any:
    """``local[threads]``: that many tasks at once (a test that freezes some tasks mid-batch
    needs a thread for each, and one more for the rest)."""
    python_path = _prepare_workers()
    options = _local_options(python_path, parallelism=threads)
    return _classic_session(f"local[{threads}]", app_name, options, java_options)


def cluster_session(
    app_name: str,
    work_dir: Path,
    *,
    executors: int = 2,
    cores: int = 1,
    memory_mb: int = 1024,
    java_options: str | None = None,
) -> Any:
    """A ``local-cluster[executors,cores,memory_mb]`` session: a standalone master and its
    workers inside this driver's JVM, each executor a JVM of its own (its own Python workers,
    tasks and results crossing the network), on the loopback interface.

    The workers put each executor's folder (its logs, its Python workers' working directory)
    under ``$SPARK_HOME/work``; so that is not the installed pyspark's own folder,
    ``SPARK_HOME`` becomes ``work_dir/spark-home``, which links to its ``bin`` and ``jars``.
    The session starts once every executor has registered, and tasks do not wait for
    locality, so the tasks of a stage spread over the executors. ``java_options`` go to every
    JVM of the cluster: the driver's (which holds the master and the workers) and the
    executors'.
    """
    python_path = _prepare_workers()
    os.environ["SPARK_HOME"] = str(_spark_home_in(work_dir))
    # the master, the workers and the executors bind where this says, not to the host's name
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    options = {
        **_local_options(python_path, parallelism=executors * cores),
        "spark.executor.memory": f"{memory_mb}m",
        # the session waits for every core it expects (spark.cores.max, else none)
        "spark.cores.max": str(executors * cores),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        # a task goes to the first free executor: on one machine, waiting for the one that
        # holds its input buys nothing, and it could put every task of a stage on one executor
        "spark.locality.wait": "0s",
    }
    if java_options:
        options["spark.executor.extraJavaOptions"] = java_options
    master = f"local-cluster[{executors},{cores},{memory_mb}]"
    return _classic_session(master, app_name, options, java_options)


def _spark_home_in(work_dir: Path) -> Path:
    import pyspark

    installed = Path(pyspark.__file__).resolve().parent
    home = work_dir / "spark-home"
    home.mkdir(parents=True, exist_ok=True)
    for part in ("bin", "jars"):
        link = home / part
        if not link.exists():
            link.symlink_to(installed / part, target_is_directory=True)
    return home


def _classic_session(
    master: str, app_name: str, options: dict[str, str], java_options: str | None
) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for name, value in options.items():
        builder = builder.config(name, value)
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def local_connect_session(app_name: str, *, java_options: str | None = None) -> Any:
    """A Spark Connect session on a ``local[2]`` server this process starts (loopback only).

    A process holds either this or :func:`local_session`, never both: PySpark refuses a
    remote session while a classic one runs. Needs the ``connect`` extra.
    """
    python_path = _prepare_workers()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for name, value in _local_options(python_path).items():
        builder = builder.config(name, value)
    builder = builder.config("spark.connect.grpc.binding.address", "127.0.0.1")
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    with warnings.catch_warnings():
        # The options configure the server it starts; the client then sets them again on its
        # session, where the static ones cannot change and each warns that it was not set.
        warnings.filterwarnings("ignore", message="Failed to set", category=UserWarning)
        return builder.remote("local[2]").getOrCreate()


def job_session(master: str | None, app_name: str) -> Any:
    """A session for a runnable job (``python -m`` or spark-submit): ``master``, else
    spark-submit's, else ``local[*]``; local workers run this interpreter and import the
    driver's code; nothing is downloaded."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = worker_python_path()
    if master is not None and master.startswith("local-cluster"):
        _local_cluster_environment(os.environ)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not _master_submitted():
        builder = builder.master("local[*]")
    return builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()


def _local_cluster_environment(environ: MutableMapping[str, str]) -> None:
    """A ``local-cluster`` master's workers write each executor's folder under
    ``$SPARK_HOME/work``: without a ``SPARK_HOME`` of the user's, that would be the installed
    pyspark's own folder, so a scratch one (linking to its ``bin`` and ``jars``) stands in,
    and the executors' logs stay there after the job. The master, workers and executors bind
    to the loopback interface unless ``SPARK_LOCAL_IP`` says otherwise."""
    if "SPARK_HOME" not in environ:
        environ["SPARK_HOME"] = str(_spark_home_in(Path(tempfile.mkdtemp(prefix="keo-spark-"))))
    environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def _master_submitted() -> bool:
    """True when spark-submit (or spark-defaults.conf) chose a master for this driver."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return bool(SparkConf().contains("spark.master"))
