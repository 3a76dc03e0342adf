"""The demo end to end on the session's local stack: at-least-once, dedupe=key, dedupe=replay.

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
from dedupe_store.states import RunState
from devstack.demo import EXPECTED_ROWS
from producer.audit.rows import RowAuditReport
from producer.audit.stream import AuditReport
from producer.settings import ProducerSettings
from producer.wiring import ledger_from


def _cells(text: str, label: str) -> list[str]:
    """The cells of the table row whose first cell starts with ``label``."""
    line = next(line for line in text.splitlines() if line.strip("│ ").startswith(label))
    return [cell.strip() for cell in line.split("│") if cell.strip()]


@pytest.mark.spark
def test_the_spark_demo_duplicates_at_least_once_and_delivers_exactly_once_in_both_modes(
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

    # WHEN 600 events go through the three queries under the same faults, in four micro-batches
    # (the fewest that meet every fault: a batch replayed, a split before the last)
    results = run_spark_demo(
        spark, settings, messages=600, workdir=tmp_path, say=console.print, files=4
    )
    console.print(demo_table(results))
    text = console.export_text()

    # THEN the plain foreachBatch sink duplicated keys; neither mode of format("keo") did
    assert 'dedupe=replay (writeStream.format("keo"), dedupe=replay)' in text, text
    assert demo_passed(results), text
    assert _cells(text, "duplicated keys / rows")[1] != "0", text
    assert _cells(text, "duplicated keys / rows")[2:] == ["0", "0"], text
    assert _cells(text, "missing keys / rows")[1:] == ["0", "0", "0"], text
    at_least_once, key, replay = results
    assert at_least_once.audit.records > 600
    assert isinstance(key.report, AuditReport)
    assert key.report.clean, key.report.as_json()
    assert isinstance(replay.report, RowAuditReport)
    assert replay.report.strict
    assert replay.report.clean, replay.report.as_json()
    assert key.audit.records == replay.audit.records == 600

    # AND each met every fault: a replayed batch, a split shard, faults at the proxy
    for result in results:
        assert result.batches_replayed >= 1, text
        assert result.report.shards == 4, text  # two shards, one closed by its split in two
        assert result.faults_injected > 2, text

    # AND DynamoDB billed key mode a write unit a message or more, replay mode a few per batch
    assert _cells(text, "DynamoDB requests")[1] == "0", text
    assert key.bill.total_write_units >= 600, text
    assert 0 < replay.bill.total_write_units < 100, text
    assert replay.bill.requests < key.bill.requests / 10, text
    assert (tmp_path / EXPECTED_ROWS).read_text(encoding="utf-8").count("\n") == 600


@pytest.mark.spark
def test_the_relay_demo_delivers_every_record_of_a_to_b_once_under_faults_and_a_driver_kill(
    spark: Any, emulators: Any, spark_table: str, tmp_path: Path
) -> None:
    from devstack.relay_demo import run_relay_demo
    from devstack.spark_demo import DemoFaults

    # GIVEN the demo's settings on the session's local stack
    settings = ProducerSettings(
        table=spark_table,
        region="us-east-1",
        kinesis_endpoint_url=emulators.kinesis,
        dynamodb_endpoint_url=emulators.dynamodb,
        **DEMO_LEASES,
    )
    console = Console(record=True, width=160, force_terminal=False)

    # WHEN 300 events in stream A are relayed into stream B in one micro-batch (the fewest
    # that meet every fault), through the fault proxy, the driver dying after its puts
    result = run_relay_demo(
        spark,
        settings,
        messages=300,
        workdir=tmp_path,
        say=console.print,
        faults=DemoFaults(crash_batch=0, read_faults_limit=1),
        batches=1,
    )
    console.print(demo_table([result], relay=True))
    text = console.export_text()

    # THEN B holds every record of A once (strictly: nothing else), and the table says so
    assert isinstance(result.report, RowAuditReport)
    assert result.report.strict
    assert result.report.clean, result.report.as_json()
    assert demo_passed([result]), text
    assert _cells(text, "records in A") == ["records in A", "300"], text
    assert _cells(text, "records in B") == ["records in B", "300"], text
    assert _cells(text, "duplicated keys / rows")[1:] == ["0"], text
    assert _cells(text, "missing keys / rows")[1:] == ["0"], text
    assert _cells(text, "verdict")[1:] == ["exactly once"], text
    # AND every fault fired: the reads' and the writes' at the proxy, and the driver's death,
    # after which the query was restarted from its checkpoint
    assert result.batches_replayed >= 1, text
    for label in (
        "lost responses",
        "throttled puts",
        "throttled reads",
        "expired iterators",
        "driver kills",
    ):
        assert result.faults[label] >= 1, (label, text)
        assert int(_cells(text, f"injected: {label}")[1]) >= 1, text
    # AND the replayed batch found in B all that its killed run had put, and sent none again
    assert result.replayed_run is not None
    replayed = ledger_from(settings).get_run(result.stream, result.replayed_run)
    assert replayed is not None
    assert replayed.state is RunState.COMPLETE
    assert replayed.counts["sent"] == 0, replayed.counts
    assert replayed.counts["duplicates"] == 300, replayed.counts
    # AND DynamoDB billed a few writes per batch and task, none per record
    assert 0 < result.bill.total_write_units < 60, text
    assert (tmp_path / EXPECTED_ROWS).read_text(encoding="utf-8").count("\n") == 300


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

    # THEN it used those endpoints (started nothing), both modes audited clean, and it says
    # what DynamoDB billed for each and how to look
    assert result.exit_code == ExitCode.OK, result.output
    assert "using the endpoints from the environment" in result.output
    assert not (tmp_path / "state" / "emulators.json").exists()
    assert int(_cells(result.output, "duplicated keys / rows")[1]) > 0
    assert _cells(result.output, "duplicated keys / rows")[2:] == ["0", "0"]
    assert _cells(result.output, "verdict")[2:] == ["exactly once", "exactly once"]
    assert all(int(n) > 0 for n in _cells(result.output, "injected: lost responses")[1:])
    requests = [int(cell) for cell in _cells(result.output, "DynamoDB requests")[1:]]
    assert requests[0] == 0
    assert 0 < requests[2] < requests[1] / 10
    assert "keo audit --stream demo-key-" in result.output
    assert "--dedupe replay --strict --expected " in result.output
    assert "Authorization: Bearer " in result.output
