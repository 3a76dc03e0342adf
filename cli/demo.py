"""``keo demo``: at-least-once vs exactly-once, under the same faults, on the local stack."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

from cli.exit_codes import ExitCode
from cli.options import exit_on_errors, exit_without_spark, load_settings, use_local_stack

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from devstack.demo import DemoResult
    from producer.settings import ProducerSettings

DEMO_TABLE: Final = "keo-demo-ledger"
# Leases that survive a busy 2-core machine: a put gives up after 1 + 2 s, and a claim outlives
# it by a wide margin, so a starved worker's slow put still lands inside its lease. The
# signature fence is on, with a 10 s window that the demo's fault proxy enforces in front of
# kinesalite as AWS enforces its 5 minutes: the lease is its minimum, 10 + 1 + 2 + 2 x 1 s.
DEMO_LEASES: Final = {
    "put_connect_timeout_s": 1.0,
    "put_read_timeout_s": 2.0,
    "clock_skew_s": 1.0,
    "signature_window_s": 10.0,
    "lease_s": 15.0,
}


def demo(
    messages: Annotated[
        int,
        typer.Option(
            min=10,
            max=200_000,
            help="events in the sample data set (10,000 take about 3 min on 2 cores)",
        ),
    ] = 10_000,
    spark: Annotated[
        bool,
        typer.Option(
            "--spark/--no-spark",
            help="run through two Spark streaming queries (default): a plain foreachBatch "
            "sink and format('keo'); or, with --no-spark, through two producers in this "
            "process (faster, no JVM)",
        ),
    ] = True,
    seed: Annotated[int, typer.Option(help="seed of the fault schedule (Spark demo)")] = 7,
    lose_every: Annotated[
        int, typer.Option(min=2, help="--no-spark: lose the response of every N-th PutRecords")
    ] = 2,
    state_dir: Annotated[
        Path,
        typer.Option(help="where the local stack keeps its state and the demo its files"),
    ] = Path(".keo"),
) -> None:
    """Send the same events through a plain at-least-once Kinesis sink and the
    exactly-once sink, under the same injected faults, then audit both streams.

    The Spark demo writes a sample data set of JSON event files and streams it
    (local[2], one file per micro-batch) twice: into a plain put_records sink in
    foreachBatch (at least once), and with writeStream.format("keo") (exactly
    once). Both meet, through a seeded fault proxy on 127.0.0.1, PutRecords
    responses lost after the write and throttled records; the driver killed
    after one batch's puts, before its commit, and restarted from its checkpoint
    (Spark replays the batch); and one shard split between two batches. The
    exactly-once stream is then reconciled, both streams are audited, and the
    results are printed side by side.

    With --no-spark, two producers in this process meet lost responses, a replayed
    batch, and a producer stalled past its lease right before its put while another
    one sends its keys; Kinesis is reached through a proxy that enforces a 10 s
    signature window, as AWS enforces 5 minutes, and the signature fence refuses
    the stalled put.

    The local stack (kinesalite, dynalite) is started under --state-dir, unless
    KEO_KINESIS_ENDPOINT_URL and KEO_DYNAMODB_ENDPOINT_URL are set: then those
    endpoints are used.

    Exit 0 when the exactly-once stream holds every event exactly once, else 1.
    """
    from rich.console import Console

    console = Console()
    started_stack = _use_local_stack(console, state_dir)
    settings = load_settings(table=DEMO_TABLE, **DEMO_LEASES)
    started = time.monotonic()
    with exit_on_errors():
        if spark:
            results, workdir = _run_spark(console, settings, messages, seed, state_dir)
        else:
            from devstack.demo import run_demo

            workdir = None
            results = run_demo(settings, count=messages, lose_every=lose_every, say=console.print)
    console.print(demo_table(results))
    console.print(f"demo finished in {time.monotonic() - started:.0f} s")
    _next_steps(console, results, settings, state_dir if started_stack else None, workdir)
    if not demo_passed(results):
        raise typer.Exit(ExitCode.FAILED)


def _use_local_stack(console: Console, state_dir: Path) -> bool:
    """Endpoints into the environment; True when the local stack under ``state_dir`` is used."""
    if use_local_stack(state_dir, "demo"):
        console.print("[bold]started the local stack[/bold] (kinesalite, dynalite on 127.0.0.1)")
        return True
    console.print(
        "[bold]using the endpoints from the environment[/bold] "
        f"(Kinesis {os.environ['KEO_KINESIS_ENDPOINT_URL']}, "
        f"DynamoDB {os.environ['KEO_DYNAMODB_ENDPOINT_URL']})"
    )
    return False


def _run_spark(
    console: Console, settings: ProducerSettings, messages: int, seed: int, state_dir: Path
) -> tuple[list[DemoResult], Path]:
    # The CLI is an entry point: it may wire the Spark job. Only here does producer reach into
    # spark_jobs, lazily, so `producer` itself never imports it (nor pyspark).
    try:
        from devstack.spark_demo import DemoFaults, demo_session, run_spark_demo
    except ImportError as exc:
        exit_without_spark("demo", exc)

    workdir = (state_dir / "demo" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    if not logging.getLogger().isEnabledFor(logging.INFO):
        # the driver's deaths are staged: py4j's tracebacks of them are noise, not news
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
    console.print("[bold]starting Spark[/bold] (local[2], one session for the whole demo)")
    session = demo_session(workdir)
    try:
        results = run_spark_demo(
            session,
            settings,
            messages=messages,
            workdir=workdir,
            say=console.print,
            faults=DemoFaults(seed=seed),
        )
    finally:
        session.stop()
    return results, workdir


_ROWS: Final[Sequence[tuple[str, Callable[[DemoResult], object]]]] = (
    ("messages in", lambda r: r.messages_in),
    ("records in the stream", lambda r: r.report.user_records),
    ("distinct keys in the stream", lambda r: r.report.distinct_keys),
    ("duplicated keys", lambda r: r.duplicated),
    ("extra records (duplicates)", lambda r: r.report.user_records - r.report.distinct_keys),
    ("missing keys", lambda r: r.missing),
    ("batches replayed", lambda r: r.batches_replayed),
    ("stale claims reconciled", lambda r: r.reconciled.scanned if r.reconciled else "-"),
    ("claims still in flight", lambda r: r.in_flight if r.table else "-"),
    ("seconds", lambda r: f"{r.seconds:.1f}"),
)


def demo_table(results: Sequence[DemoResult]) -> Table:
    """The results side by side: one column per sink, faults injected listed after the audit."""
    from rich.table import Table

    table = Table(title="the same events, the same faults")
    table.add_column("")
    for result in results:
        table.add_column(result.name, justify="right")
    for label, value in _ROWS:
        table.add_row(label, *(str(value(r)) for r in results))
    labels = list(dict.fromkeys(label for r in results for label in r.faults))
    for label in labels:
        table.add_row(f"injected: {label}", *(str(r.faults.get(label, 0)) for r in results))
    table.add_row(
        "verdict",
        *(
            "[green]exactly once[/green]" if r.exactly_once else "[red]not exactly once[/red]"
            for r in results
        ),
    )
    return table


def demo_passed(results: Sequence[DemoResult]) -> bool:
    """The exactly-once side (the last) audits with no duplicate and no missing key."""
    return bool(results) and results[-1].exactly_once


def _next_steps(
    console: Console,
    results: Sequence[DemoResult],
    settings: ProducerSettings,
    state_dir: Path | None,
    workdir: Path | None,
) -> None:
    """How to check it: ``state_dir`` is the local stack's, None when the environment's
    endpoints were used (they are already set where the user runs the commands)."""
    exactly_once = results[-1]
    stream = exactly_once.report.stream
    expected = f" --expected {workdir / 'expected-keys.txt'}" if workdir is not None else ""
    token = secrets.token_urlsafe(18)
    key = "order-000001"
    env = f"source {state_dir}/endpoints.env && " if state_dir is not None else ""
    lines = ["", "[bold]see for yourself[/bold]"]
    for result in results:
        lines.append(
            f"audit {result.name}:  {env}.venv/bin/keo audit --stream {result.report.stream} "
            f"--table {settings.table}{expected}"
        )
    lines.append(
        "  (the at-least-once stream was written without the ledger: its records are "
        "'unknown to ledger')"
    )
    lines += [
        f"serve the API:  {env}KEO_API_TOKEN={token} .venv/bin/keo serve "
        f"--table {settings.table} --port 8080",
        f"query a key:    curl -H 'Authorization: Bearer {token}' "
        f"http://127.0.0.1:8080/v1/streams/{stream}/messages/{key}",
    ]
    if state_dir is not None:
        lines.append(f"stop the stack: .venv/bin/keo emulators down --state-dir {state_dir}")
    console.print("\n".join(lines), highlight=False, soft_wrap=True)
