"""``keo demo``: at-least-once, ``dedupe=key`` and ``dedupe=replay`` side by side, under the same
faults, on the local stack: what each stream holds, and what DynamoDB bills for each. With
``--relay``: a Kinesis stream relayed into another by Spark under faults, audited against it."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final, TypeAlias
from urllib.parse import quote

import typer

from cli.exit_codes import ExitCode
from cli.options import exit_on_errors, exit_without_spark, load_settings, use_local_stack
from producer.settings import Dedupe

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
            help="events in the sample data set (10,000 take about 1.5 min on 2 cores, "
            "as long with --relay)",
        ),
    ] = 10_000,
    spark: Annotated[
        bool,
        typer.Option(
            "--spark/--no-spark",
            help="run through three Spark streaming queries (default): a plain foreachBatch "
            "sink and format('keo') with dedupe=key and with dedupe=replay; or, with "
            "--no-spark, through three producers in this process (faster, no JVM)",
        ),
    ] = True,
    relay: Annotated[
        bool,
        typer.Option(
            "--relay",
            help="the relay instead: the events put into a Kinesis stream A, relayed by Spark "
            "into a stream B (readStream.format('keo') to writeStream.format('keo'), "
            "dedupe=replay) under throttled and expired reads, lost and throttled writes and a "
            "driver killed after a batch's puts; then B audited against A (on Spark: not with "
            "--no-spark)",
        ),
    ] = False,
    seed: Annotated[int, typer.Option(help="seed of the fault schedule (Spark demo)")] = 7,
    lose_every: Annotated[
        int,
        typer.Option(
            min=2, help="--no-spark: lose the response of every N-th PutRecords, the first on"
        ),
    ] = 2,
    state_dir: Annotated[
        Path,
        typer.Option(help="where the local stack keeps its state and the demo its files"),
    ] = Path(".keo"),
    quotas: Annotated[
        str,
        typer.Option(
            "--quotas",
            envvar="KEO_QUOTAS",
            help="the local stack the demo starts: aws (default): Kinesis and DynamoDB behind "
            "AWS's quotas, as on AWS; none: the emulators as they are",
        ),
    ] = "aws",
    dynamodb_emulator: Annotated[
        str,
        typer.Option(
            "--dynamodb-emulator",
            envvar="KEO_DYNAMODB_EMULATOR",
            help="the local stack's DynamoDB: dynamodb-local (default: Amazon's, the code path "
            "AWS runs, claims 25 to a request) or dynalite (lighter; a claim a request)",
        ),
    ] = "dynamodb-local",
) -> None:
    """Send the same events three ways, under the same injected faults: through a plain
    at-least-once Kinesis sink, exactly once per key (dedupe=key) and exactly once per
    run (dedupe=replay); then audit each stream, and show what DynamoDB billed for each.

    The Spark demo writes a sample data set of JSON event files and streams it
    (local[2], one file per micro-batch) three times: into a plain put_records
    sink in foreachBatch (at least once), and with writeStream.format("keo") in
    key mode and in replay mode. All three meet, through a seeded fault proxy on
    127.0.0.1, PutRecords responses lost after the write and throttled records;
    the driver killed after one batch's puts, before its commit, and restarted
    from its checkpoint (Spark replays the batch); and one shard split between
    two batches.

    With --no-spark, three producers in this process meet lost responses, a
    replayed micro-batch (in replay mode, a run whose first attempt died before
    its commit), and a writer stalled past its lease right before its put while
    another one sends the same messages; Kinesis is reached through a proxy that
    enforces a 10 s signature window, as AWS enforces 5 minutes, and the
    signature fence refuses the stalled put.

    Every DynamoDB call goes through a proxy that bills it by AWS's rules: the
    table shows each column's requests, writes and billed write units, in all
    and per message. The key-mode stream is audited per key (each key once), the
    replay-mode stream against the rows sent (each row as often as it was sent).

    With --relay, Spark reads instead of files a Kinesis stream A, filled with the
    events, and relays it into a stream B (the query of python -m
    spark_jobs.relay: readStream.format('keo'), writeStream.format('keo') with
    dedupe=replay, a few micro-batches) with every Kinesis call through the
    seeded fault proxy: GetRecords throttled or answered with an expired
    iterator, PutRecords responses lost after the write and records throttled;
    the driver is killed after one batch's puts, before its commit, and the
    relay restarted from its checkpoint, so Spark replays the batch. Then B is
    audited against A: every record of A in B once, as a multiset of key and
    data, and nothing else. Exit 0 when it is.

    The local stack (kinesalite, DynamoDB Local) is started under --state-dir
    behind AWS's quotas (--quotas aws: a shard's 1,000 records a second, a
    partition key's 1,000 write units...), unless KEO_KINESIS_ENDPOINT_URL and
    KEO_DYNAMODB_ENDPOINT_URL are set: then those endpoints are used. The table
    shows each column's records a second a shard, against the shard's 1,000, and
    the records the shards' quota refused (resent by the writers).

    Exit 0 when both exactly-once streams (dedupe=key, dedupe=replay) audit
    exactly once, else 1.
    """
    from rich.console import Console

    if relay and not spark:
        raise typer.BadParameter("the relay runs on Spark: drop --no-spark", param_hint="'--relay'")
    from devstack import emulators

    for value, choices, hint in (
        (quotas, emulators.QUOTA_MODES, "'--quotas' / KEO_QUOTAS"),
        (dynamodb_emulator, emulators.DYNAMODB_EMULATORS, "'--dynamodb-emulator'"),
    ):
        if value not in choices:
            raise typer.BadParameter(f"{value!r}: one of {', '.join(choices)}", param_hint=hint)
    console = Console()
    started_stack = _use_local_stack(console, state_dir, quotas, dynamodb_emulator)
    settings = load_settings(table=DEMO_TABLE, **DEMO_LEASES)
    started = time.monotonic()
    workdir = (state_dir / "demo" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    with exit_on_errors():
        if spark:
            results = _run_spark(console, settings, messages, seed, workdir, relay=relay)
        else:
            from devstack.demo import run_demo

            results = run_demo(
                settings, count=messages, lose_every=lose_every, say=console.print, workdir=workdir
            )
    console.print(demo_table(results, relay=relay, refused=_refused_by_quota(settings)))
    console.print(f"demo finished in {time.monotonic() - started:.0f} s")
    _next_steps(console, results, settings, state_dir if started_stack else None, workdir)
    if not demo_passed(results):
        raise typer.Exit(ExitCode.FAILED)


def _use_local_stack(console: Console, state_dir: Path, quotas: str, dynamodb: str) -> bool:
    """Endpoints into the environment; True when the local stack under ``state_dir`` is used."""
    if use_local_stack(state_dir, "demo", dynamodb=dynamodb, quotas=quotas):
        behind = ", behind AWS's quotas" if quotas == "aws" else ""
        console.print(
            f"[bold]started the local stack[/bold] (kinesalite, {dynamodb} on 127.0.0.1{behind})"
        )
        return True
    console.print(
        "[bold]using the endpoints from the environment[/bold] "
        f"(Kinesis {os.environ['KEO_KINESIS_ENDPOINT_URL']}, "
        f"DynamoDB {os.environ['KEO_DYNAMODB_ENDPOINT_URL']})"
    )
    return False


def _run_spark(
    console: Console,
    settings: ProducerSettings,
    messages: int,
    seed: int,
    workdir: Path,
    *,
    relay: bool,
) -> list[DemoResult]:
    # The CLI is an entry point: it may wire the Spark job. Only here does producer reach into
    # spark_jobs, lazily, so `producer` itself never imports it (nor pyspark).
    try:
        from devstack.relay_demo import run_relay_demo
        from devstack.spark_demo import DemoFaults, demo_session, run_spark_demo
    except ImportError as exc:
        exit_without_spark("demo", exc)

    if not logging.getLogger().isEnabledFor(logging.INFO):
        # the driver's deaths are staged: py4j's tracebacks of them are noise, not news
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
    console.print("[bold]starting Spark[/bold] (local[2], one session for the whole demo)")
    session = demo_session(workdir)
    faults = DemoFaults(seed=seed)
    try:
        if relay:
            return [
                run_relay_demo(
                    session,
                    settings,
                    messages=messages,
                    workdir=workdir,
                    say=console.print,
                    faults=faults,
                )
            ]
        return run_spark_demo(
            session, settings, messages=messages, workdir=workdir, say=console.print, faults=faults
        )
    finally:
        session.stop()


def _refused_by_quota(settings: ProducerSettings) -> Mapping[str, int] | None:
    """The records each stream's shards refused, when Kinesis is the quota mode's proxy (its
    ``GET /__keo/report``); None otherwise."""
    import httpx

    from devstack.fault_proxy import REPORT_PATH

    endpoint = settings.kinesis_endpoint_url
    if endpoint is None:
        return None
    try:
        report = httpx.get(endpoint.rstrip("/") + REPORT_PATH, timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None
    refused: dict[str, int] = {}
    for where, count in report.get("quotas", {}).get("records_refused", {}).items():
        stream = where.rsplit("/", 1)[0]
        refused[stream] = refused.get(stream, 0) + int(count)
    return refused if "quotas" in report else None


def _per_shard_second(result: DemoResult) -> str:
    """Records a second a shard read: against the shard's write quota of 1,000."""
    shards = result.report.shards
    if not shards or result.seconds <= 0:
        return "-"
    return f"{result.audit.records / result.seconds / shards:.0f}"


def _reconciled(result: DemoResult) -> object:
    """What the reconciler found after the run (the Spark demo runs it): in key mode the
    stale claims it settled, in replay mode the runs OPEN past their leases (it has no rows to
    resend: a replay of the run ends it)."""
    report = result.reconciled
    if report is None:
        return "-"
    return len(report.open_runs) if result.column.dedupe is Dedupe.REPLAY else report.scanned


def _per_message(count: float, result: DemoResult) -> str:
    return f"{count / max(result.messages_in, 1):.4f}" if count else "0"


Row: TypeAlias = "tuple[str, Callable[[DemoResult], object]]"

# the table's sections: the audit, what DynamoDB billed for the writing, the time it took
_SECTIONS: Final[Sequence[Sequence[Row]]] = (
    (
        ("audited as", lambda r: "rows as sent" if r.audit.unit == "rows" else "each key once"),
        ("messages in", lambda r: r.messages_in),
        ("records in the stream", lambda r: r.audit.records),
        ("duplicated keys / rows", lambda r: r.audit.duplicated),
        ("extra records", lambda r: r.audit.extra),
        ("missing keys / rows", lambda r: r.audit.missing),
        ("batches replayed", lambda r: r.batches_replayed),
        (
            "claims still in flight",
            lambda r: r.audit.in_flight if r.column.dedupe is Dedupe.KEY else "-",
        ),
        ("left to the reconciler", _reconciled),
    ),
    (
        ("DynamoDB requests", lambda r: r.bill.requests),
        ("  per message", lambda r: _per_message(r.bill.requests, r)),
        ("DynamoDB writes", lambda r: r.bill.write_requests),
        ("billed write units", lambda r: r.bill.total_write_units),
        ("  per message", lambda r: _per_message(r.bill.total_write_units, r)),
    ),
    (
        ("seconds", lambda r: f"{r.seconds:.1f}"),
        ("records/s/shard (of 1,000)", _per_shard_second),
    ),
)


# the relay's table names its streams: the rows of A went in, stream B is audited; it has no
# claims (replay mode), so no row for them
_RELAY_ROWS: Final[Mapping[str, Row | None]] = {
    "audited as": ("audited as", lambda _: "each row of A once"),
    "messages in": ("records in A", lambda r: r.messages_in),
    "records in the stream": ("records in B", lambda r: r.audit.records),
    "claims still in flight": None,
}


def demo_table(
    results: Sequence[DemoResult],
    *,
    relay: bool = False,
    refused: Mapping[str, int] | None = None,
) -> Table:
    """The results side by side: one column per writer; the audit, the bill, the time, then
    the faults injected and the verdict. ``relay``: the relay demo's one column, B audited
    against A. ``refused``: the records each stream's shard quota refused (the quota mode)."""
    from rich.table import Table

    title = "stream A relayed into B, under faults" if relay else "the same events, the same faults"
    table = Table(title=title)
    table.add_column("")
    for result in results:
        table.add_column(result.name, justify="right")
    for section in _SECTIONS:
        for row in section:
            shown = _RELAY_ROWS.get(row[0], row) if relay else row
            if shown is None:
                continue
            label, value = shown
            table.add_row(label, *(str(value(r)) for r in results))
        table.add_section()
    if refused is not None:
        table.add_row("shard quota refused", *(str(refused.get(r.stream, 0)) for r in results))
        table.add_section()
    labels = list(dict.fromkeys(label for r in results for label in r.faults))
    for label in labels:
        table.add_row(f"injected: {label}", *(str(r.faults.get(label, 0)) for r in results))
    table.add_section()
    table.add_row(
        "verdict",
        *(
            "[green]exactly once[/green]" if r.exactly_once else "[red]not exactly once[/red]"
            for r in results
        ),
    )
    return table


def demo_passed(results: Sequence[DemoResult]) -> bool:
    """Every exactly-once column (dedupe=key, dedupe=replay) audits exactly once."""
    guaranteed = [r for r in results if r.column.dedupe is not None]
    return bool(guaranteed) and all(r.exactly_once for r in guaranteed)


def _next_steps(
    console: Console,
    results: Sequence[DemoResult],
    settings: ProducerSettings,
    state_dir: Path | None,
    workdir: Path,
) -> None:
    """How to check it: ``state_dir`` is the local stack's, None when the environment's
    endpoints were used (they are already set where the user runs the commands)."""
    from devstack.demo import EXPECTED_ROWS

    expected = workdir / EXPECTED_ROWS
    token = secrets.token_urlsafe(18)
    env = f"source {state_dir}/endpoints.env && " if state_dir is not None else ""
    lines = ["", "[bold]see for yourself[/bold]"]
    for result in results:
        how = (
            "--dedupe replay --strict"
            if result.column.dedupe is Dedupe.REPLAY
            else f"--table {settings.table}"
        )
        lines.append(
            f"audit {result.name}:  {env}.venv/bin/keo audit --stream {result.stream} {how} "
            f"--expected {expected}"
        )
    if any(result.column.dedupe is None for result in results):
        lines.append(
            "  (the at-least-once stream was written without the ledger: its records are "
            "'unknown to ledger')"
        )
    lines += [
        f"serve the API:  {env}KEO_API_TOKEN={token} .venv/bin/keo serve "
        f"--table {settings.table} --port 8080",
    ]
    api = f"curl -H 'Authorization: Bearer {token}' http://127.0.0.1:8080/v1/streams"
    for result in results:
        if result.column.dedupe is Dedupe.KEY:
            lines.append(f"query a key:    {api}/{result.stream}/messages/order-000001")
        if result.replayed_run is not None:
            run = quote(result.replayed_run, safe="")
            lines.append(f"query a run:    {api}/{result.stream}/runs/{run}")
    if state_dir is not None:
        lines.append(f"stop the stack: .venv/bin/keo emulators down --state-dir {state_dir}")
    console.print("\n".join(lines), highlight=False, soft_wrap=True)
