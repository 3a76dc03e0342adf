"""Which Spark runs which part (spark_jobs.versions), without a Spark: the version read from a
session, the data source refused before Spark 4 with what to use instead, and the modules a
Spark 3.5 user imports importing nothing of Spark 4's."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import spark_jobs
from spark_jobs.errors import SparkVersionError
from spark_jobs.versions import require_python_data_sources, version_of

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.spark35


@dataclass(frozen=True)
class Session:
    """What the checks read of a SparkSession (classic or Connect): its ``version``."""

    version: str


@pytest.mark.parametrize(
    ("version", "expected"),
    [("3.5.6-amzn-2", (3, 5)), ("3.5.9", (3, 5)), ("4.0.0", (4, 0)), ("4.3.0-SNAPSHOT", (4, 3))],
)
def test_the_version_is_the_sessions_major_and_minor(
    version: str, expected: tuple[int, int]
) -> None:
    assert version_of(Session(version)) == expected


def test_a_version_spark_never_reports_is_refused() -> None:
    with pytest.raises(ValueError, match="not a Spark version"):
        version_of(Session("unknown"))


@pytest.mark.parametrize("version", ["3.5.6-amzn-2", "3.4.1"])
def test_before_spark_4_format_keo_is_refused_naming_the_version_and_what_to_use(
    version: str,
) -> None:
    # GIVEN a session of EMR 7's Spark (or older)
    # WHEN the data source is registered
    with pytest.raises(SparkVersionError) as refused:
        spark_jobs.register(Session(version))
    # THEN the error names the feature, the running Spark, the Spark it needs, and what does
    # the work on this Spark instead: the sink, the batch read, the audit
    error = refused.value
    assert (error.running, error.needs) == (version, "4.0")
    message = str(error)
    assert 'format("keo") (the keo data source) needs Spark 4.0 or later' in message
    assert f"this session runs Spark {version}" in message
    for instead in ("foreachBatch(spark_jobs.ExactlyOnceSink", "spark_jobs.read_records", "audit"):
        assert instead in message
    assert 'a streaming read (spark.readStream.format("keo")) needs Spark 4' in message


def test_spark_4_runs_python_data_sources() -> None:
    require_python_data_sources(Session("4.0.1"), "format('keo')")  # no error


def test_what_a_spark_35_user_imports_needs_nothing_of_spark_4() -> None:
    # GIVEN a fresh interpreter where Spark 4's modules cannot be imported, as on Spark 3.5
    code = "\n".join(
        [
            "import importlib.abc, sys",
            "class Spark35(importlib.abc.MetaPathFinder):",
            "    def find_spec(self, name, path=None, target=None):",
            "        if name.endswith('.datasource') and name.startswith('pyspark.sql'):",
            "            raise ModuleNotFoundError(name)",
            "sys.meta_path.insert(0, Spark35())",
            "import spark_jobs, spark_jobs.sink, spark_jobs.batch_read, spark_jobs.audit",
            "import spark_jobs.produce_stream, spark_jobs.relay, spark_jobs.session",
            "from spark_jobs import ExactlyOnceSink, read_records, SparkVersionError",
            "import pyspark.sql",
        ]
    )
    # WHEN it imports the sink, the batch read, the audit, the jobs and pyspark itself
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, check=False
    )
    # THEN every import succeeds
    assert result.returncode == 0, result.stderr.decode()


def test_a_job_this_spark_cannot_run_exits_3_saying_what_it_needs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the relay job's start on a Spark 3.5 session (no Spark is started here)
    from spark_jobs import job_runner, relay

    stopped: list[bool] = []

    class Context:
        def setLogLevel(self, level: str) -> None:  # noqa: N802 - Spark's name
            assert level

    class Spark35:
        version = "3.5.6-amzn-2"
        sparkContext = Context()  # noqa: N815 - Spark's name

        def stop(self) -> None:
            stopped.append(True)

    def job_session(master: str | None, app_name: str) -> Spark35:
        assert (master, app_name) == (None, "keo-relay")
        return Spark35()

    monkeypatch.setattr(job_runner, "job_session", job_session)
    # WHEN `python -m spark_jobs.relay` runs
    code = relay.main(
        ["--source", "a", "--target", "b", "--checkpoint", "ckpt", "--query-name", "q"]
    )
    # THEN it exits 3 (configuration), says on stderr what it needs and what to use, and
    # stops its session
    assert code == job_runner.ExitCode.CONFIG
    err = capsys.readouterr().err
    assert err.startswith('keo-relay: format("keo") (the keo data source) needs Spark 4.0')
    assert "this session runs Spark 3.5.6-amzn-2" in err
    assert stopped == [True]
