"""``keo demo``: at-least-once vs exactly-once, under the same faults, on the local stack."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from producer.cli.exit_codes import ExitCode
from producer.cli.options import exit_on_errors, load_settings

if TYPE_CHECKING:
    from producer.demo import DemoResult


def demo(
    messages: Annotated[int, typer.Option(min=10, max=100_000, help="messages to send")] = 2000,
    lose_every: Annotated[
        int, typer.Option(min=2, help="lose the response of every N-th PutRecords")
    ] = 2,
    state_dir: Annotated[Path, typer.Option(help="where the local stack keeps its state")] = Path(
        ".keo"
    ),
) -> None:
    """Start the local stack, then send the same messages through a plain at-least-once
    producer and through the exactly-once producer, injecting the same faults into both
    (PutRecords responses lost after the write; a batch replayed after a crash), and audit
    both streams with 'keo audit'. Exit 0 when the exactly-once stream audits clean.
    """
    from rich.console import Console
    from rich.table import Table

    from producer import emulators
    from producer.demo import run_demo

    console = Console()
    console.print("[bold]starting the local stack[/bold] (kinesalite, dynalite on 127.0.0.1)")
    try:
        endpoints = emulators.up(state_dir)
    except emulators.EmulatorError as exc:
        typer.echo(f"keo demo: {exc}", err=True)
        raise typer.Exit(ExitCode.UNAVAILABLE) from None
    os.environ.update(endpoints.as_env())
    settings = load_settings(
        table="keo-demo-ledger",
        lease_s=6.0,
        put_read_timeout_s=2.0,
        put_connect_timeout_s=1.0,
        clock_skew_s=1.0,
    )
    with exit_on_errors():
        results = run_demo(settings, count=messages, lose_every=lose_every, say=console.print)

    table = Table(title="the same messages, the same faults")
    table.add_column("")
    for result in results:
        table.add_column(result.name, justify="right")
    rows: list[tuple[str, Callable[[DemoResult], object]]] = [
        ("messages in", lambda r: r.messages_in),
        ("records in the stream", lambda r: r.report.user_records),
        ("distinct keys", lambda r: r.report.distinct_keys),
        ("duplicated keys", lambda r: len(r.report.duplicates)),
        ("missing keys", lambda r: len(r.report.expected_missing)),
        ("responses lost (injected)", lambda r: r.faults_injected),
        ("batches replayed", lambda r: r.batches_replayed),
        ("seconds", lambda r: f"{r.seconds:.1f}"),
    ]
    for label, value in rows:
        table.add_row(label, *(str(value(r)) for r in results))
    console.print(table)
    exactly_once = results[-1]
    stream = exactly_once.report.stream
    console.print(
        f"audit it yourself:  source {state_dir}/endpoints.env && "
        f".venv/bin/keo audit --stream {stream} --table keo-demo-ledger\n"
        "query a key:        KEO_API_TOKEN=demo-token-0123456789 .venv/bin/keo serve --table keo-demo-ledger "
        "--port 8080 &\n"
        "                    curl -H 'Authorization: Bearer demo-token-0123456789' "
        f"http://127.0.0.1:8080/v1/streams/{stream}/messages/order-000001\n"
        f"stop the stack:     .venv/bin/keo emulators down --state-dir {state_dir}"
    )
    clean = len(exactly_once.report.duplicates) == 0 and not exactly_once.report.expected_missing
    if not clean:
        raise typer.Exit(ExitCode.FAILED)
