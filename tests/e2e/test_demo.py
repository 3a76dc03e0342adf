"""The demo end to end on the session's local stack.

The Spark demo runs in this process on the session's SparkSession (tests/e2e/conftest.py):
``keo demo`` would start a second JVM. The CLI itself is run with ``--no-spark``, against the
session's emulators given through the environment, as a user with a running stack would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from cli.demo import DEMO_LEASES, demo, demo_passed, demo_table
from cli.exit_codes import ExitCode
from producer.settings import ProducerSettings


def _cells(text: str, label: str) -> list[str]:
    """The cells of the table row whose first cell starts with ``label``."""
    line = next(line for line in text.splitlines() if line.strip("│ ").startswith(label))
    return [cell.strip() for cell in line.split("│") if cell.strip()]


@pytest.mark.spark
def test_the_spark_demo_duplicates_at_least_once_and_delivers_exactly_once(
    spark: Any, emulators: Any, names: Any, tmp_path: Path
) -> None:
    from devstack.spark_demo import run_spark_demo

    # GIVEN the demo's settings on the session's local stack
    settings = ProducerSettings(
        table=names.table,
        region="us-east-1",
        kinesis_endpoint_url=emulators.kinesis,
        dynamodb_endpoint_url=emulators.dynamodb,
        **DEMO_LEASES,
    )
    console = Console(record=True, width=160, force_terminal=False)

    # WHEN 600 events go through both queries under the same faults
    results = run_spark_demo(spark, settings, messages=600, workdir=tmp_path, say=console.print)
    console.print(demo_table(results))
    text = console.export_text()

    # THEN the plain foreachBatch sink duplicated keys and format("keo") did not, none missing
    assert 'exactly-once (writeStream.format("keo"))' in text, text
    assert demo_passed(results), text
    assert _cells(text, "duplicated keys")[1] != "0", text
    assert _cells(text, "duplicated keys")[2] == "0", text
    assert _cells(text, "missing keys")[1:] == ["0", "0"], text
    at_least_once, exactly_once = results
    assert at_least_once.report.user_records > 600
    assert exactly_once.report.clean, exactly_once.report.as_json()
    assert exactly_once.report.user_records == 600

    # AND both met every fault: a replayed batch, a split shard, faults at the proxy
    for result in results:
        assert result.batches_replayed >= 1, text
        assert result.report.shards == 4, text  # two shards, one closed by its split in two
        assert result.faults_injected > 2, text
    assert (tmp_path / "expected-keys.txt").read_text(encoding="utf-8").count("\n") == 600


def test_keo_demo_without_spark_uses_the_endpoints_it_is_given(
    emulators: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a running local stack named by the environment
    for name, value in emulators.as_env().items():
        monkeypatch.setenv(name, value)
    app = typer.Typer()
    app.command()(demo)

    # WHEN the fast demo runs
    result = CliRunner().invoke(
        app, ["--no-spark", "--messages", "300", "--state-dir", str(tmp_path / "state")]
    )

    # THEN it used those endpoints (started nothing), audited clean, and says how to look
    assert result.exit_code == ExitCode.OK, result.output
    assert "using the endpoints from the environment" in result.output
    assert not (tmp_path / "state" / "emulators.json").exists()
    assert int(_cells(result.output, "duplicated keys")[1]) > 0
    assert _cells(result.output, "duplicated keys")[2] == "0"
    assert "keo audit --stream demo-exactly-once-" in result.output
    assert "Authorization: Bearer " in result.output
