"""A job run with ``--master local-cluster[...]`` keeps its executors' folders out of the
installed pyspark and binds to the loopback interface (no Spark started here)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyspark
import pytest

from spark_jobs.session import _local_cluster_environment


def test_local_cluster_gets_a_scratch_spark_home_linking_to_pyspark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an environment without SPARK_HOME or SPARK_LOCAL_IP
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    environ: dict[str, str] = {}
    # WHEN a local-cluster job prepares it
    _local_cluster_environment(environ)
    # THEN SPARK_HOME is a folder of its own whose bin and jars are pyspark's
    home = Path(environ["SPARK_HOME"])
    installed = Path(pyspark.__file__).resolve().parent
    assert home.parent.parent == tmp_path
    assert (home / "bin").resolve() == installed / "bin"
    assert (home / "jars").resolve() == installed / "jars"
    # AND the master, workers and executors bind to the loopback interface
    assert environ["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_a_users_spark_home_and_address_are_kept() -> None:
    # GIVEN a Spark installation and an address of the user's
    environ = {"SPARK_HOME": "/opt/spark", "SPARK_LOCAL_IP": "10.0.0.5"}
    # WHEN a local-cluster job prepares the environment
    _local_cluster_environment(environ)
    # THEN both are left as they were
    assert environ == {"SPARK_HOME": "/opt/spark", "SPARK_LOCAL_IP": "10.0.0.5"}
