"""``keo reconcile``: resolve stale in-flight claims by reading the stream back, and report
replay-mode runs left open."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from cli import logs
from cli.exit_codes import ExitCode
from cli.metrics_export import (
    MetricsFileOpt,
    MetricsHostOpt,
    MetricsPortOpt,
    exporting,
    write_file,
)
from cli.options import (
    DynamoEndpointOpt,
    KinesisEndpointOpt,
    StreamOpt,
    TableOpt,
    exit_on_errors,
    load_settings,
)
from cli.progress import Progress
from cli.stdout import write_json_line
from dedupe_store.inflight import bucket_share

if TYPE_CHECKING:
    from producer.reconcile.reconciler import ReconcileReport
    from producer.wiring import Stack


def parse_bucket_share(value: str | None, buckets: int) -> list[int] | None:
    """``i/N``: this reconciler takes the index buckets b with b % N == i."""
    if value is None:
        return None
    try:
        index_text, count_text = value.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise typer.BadParameter("use i/N, e.g. 0/2 and 1/2 for two reconcilers") from None
    if count < 1 or not 0 <= index < count:
        raise typer.BadParameter(f"need 0 <= i < N, got {value}")
    return bucket_share(index, count, buckets)


def reconcile(
    stream: StreamOpt = None,
    table: TableOpt = None,
    once: Annotated[bool, typer.Option("--once", help="one pass, then exit (for cron)")] = False,
    loop: Annotated[bool, typer.Option("--loop", help="run until interrupted")] = False,
    interval_s: Annotated[
        float, typer.Option("--interval", min=0.1, help="seconds between passes with --loop")
    ] = 30.0,
    bucket: Annotated[
        str | None,
        typer.Option(
            "--bucket",
            help="i/N: take a share of the in-flight index, so N reconcilers split the work",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="the summary as JSON on stdout (the text one on stderr)"),
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress", help="progress on stderr (default: on a terminal)"
        ),
    ] = None,
    kinesis_endpoint_url: KinesisEndpointOpt = None,
    dynamodb_endpoint_url: DynamoEndpointOpt = None,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1",
    metrics_file: MetricsFileOpt = None,
) -> None:
    """Resolve claims whose lease expired: found in the stream -> DELIVERED; not found ->
    resent (when the claim stored its payload) or RELEASED for the next producer; older
    than the stream's retention -> UNVERIFIABLE (never resent).

    A claim is stale once its lease and the clock skew have passed: with the signature fence
    (KEO_PUT_FENCE=signature, the default) the lease outlives the 300 s signature window
    (KEO_LEASE_S, 360 s), so a crashed producer's keys wait that long; that is what keeps a
    stalled producer from writing a duplicate. KEO_PUT_FENCE=off allows a 60 s lease (and
    says once on stderr what it cannot bound: docs/guarantees.md).

    Safe to run several at once: every write is conditional on the attempt seen.

    Replay-mode runs (dedupe=replay) left OPEN past every execution's lease are reported, never
    acted on: a warning per run, their names in the JSON report ("open_runs"), the
    keo_replay_runs_open gauge. Their driver did not commit them and the ledger holds none of
    their rows, so there is nothing to resend: a replay of the run (Spark restarting the query,
    or the same --run-id again) recovers and commits it; else the dedupe TTL removes it. They
    do not make the exit code 1.

    A bucket of the in-flight index that cannot be read (after retries) does not stop the
    pass: the others are settled, the report names the failed buckets ("failed_buckets"),
    and the run is recorded all the same.

    Exit codes with --once: 0 nothing left unresolved, 1 something is (conflicts, pending
    claims, errors), 3 configuration, 4 a backend is unreachable (also: a bucket could not be
    read, or the run could not be recorded; what could be settled was).

    Metrics: --metrics-port serves them while it runs (with --loop); --metrics-file writes
    them when it ends (with --loop, after every pass too).

    Example (cron, every minute): keo reconcile --stream orders --table orders-ledger --once
    """
    if once == loop:
        typer.echo("keo reconcile: give exactly one of --once or --loop", err=True)
        raise typer.Exit(ExitCode.USAGE)
    settings = load_settings(
        stream=stream,
        table=table,
        kinesis_endpoint_url=kinesis_endpoint_url,
        dynamodb_endpoint_url=dynamodb_endpoint_url,
    )
    buckets = parse_bucket_share(bucket, settings.inflight_buckets)
    from devstack import failpoints
    from producer.key.producer import default_owner
    from producer.wiring import build_stack, warn_if_unfenced

    warn_if_unfenced(settings)
    show = progress if progress is not None else sys.stderr.isatty()
    with (
        exporting("reconcile", port=metrics_port, host=metrics_host, file=metrics_file),
        exit_on_errors(),
    ):
        stack = build_stack(settings, hooks=failpoints.from_env())
        reconciler = stack.reconciler(owner=f"reconciler:{default_owner()}", buckets=buckets)
        while True:
            with Progress(show, "reconciling", unit="groups") as bar:
                if show:
                    bar.set_total(_count_stale(stack, buckets))
                report = reconciler.run_once(bar.advance)
            _report_pass(report, table=settings.table, as_json=as_json)
            if once:
                break
            if metrics_file is not None:
                write_file(metrics_file, "reconcile")
            time.sleep(interval_s)
    if not report.complete:
        raise typer.Exit(ExitCode.UNAVAILABLE)
    if report.unresolved:
        raise typer.Exit(ExitCode.FAILED)


def _report_pass(report: ReconcileReport, *, table: str, as_json: bool) -> None:
    """A pass's report: its summary on stdout (a log line instead, after the JSON report, with
    ``as_json``), then on stderr the buckets not read and a run not recorded."""
    if as_json:
        write_json_line(report.as_json())
        sys.stdout.flush()
    summary = (
        f"keo reconcile: stream {report.stream}: {report.scanned} stale claims: "
        f"{report.delivered} delivered, {report.resent} resent, "
        f"{report.released} released, {report.unverifiable} unverifiable, "
        f"{len(report.conflicts)} conflicts, {report.pending} pending, "
        f"{report.lost_races} taken by others, {report.errors} errors "
        f"({report.get_records_calls} GetRecords calls); "
        f"{len(report.open_runs)} replay runs left open"
    )
    if as_json:  # the JSON report is the result: the summary is a log line
        logs.report(
            summary,
            event="reconcile_pass",
            stream=report.stream,
            table=table,
            counts={**report.counts(), "open_runs": len(report.open_runs)},
        )
    else:
        typer.echo(summary)
    for failed, why in report.failed_buckets.items():
        typer.echo(f"keo reconcile: bucket {failed} not read: {why}", err=True)
    if not report.run_recorded:
        typer.echo("keo reconcile: the run could not be recorded in the ledger", err=True)


def _count_stale(stack: Stack, buckets: list[int] | None) -> int:
    """About how many claim groups the pass will look at (the progress total): one keys-only
    read of the in-flight index, with the pass's own cut-off (lease + skew passed)."""
    cutoff_ms = stack.clock.now_ms() - stack.settings.lease_policy().skew_ms
    stale = stack.ledger.stale_groups(stack.settings.stream, now_ms=cutoff_ms, buckets=buckets)
    return sum(1 for _ in stale)
