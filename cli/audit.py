"""``keo audit``: read the whole stream and prove each key is in it exactly once."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.exit_codes import ExitCode
from cli.input_lines import BadLine, DataEncoding, decode_line, numbered_lines, parse_line
from cli.options import (
    DynamoEndpointOpt,
    KinesisEndpointOpt,
    StreamOpt,
    TableOpt,
    exit_on_errors,
    load_settings,
)
from cli.progress import Progress
from producer.protocol import MAX_KEY_CHARS, Message

if TYPE_CHECKING:
    from producer.audit import AuditReport


def read_expected(path: Path) -> list[str]:
    """Keys, one per line; or, when the file is JSON lines (the input of 'keo send'), the
    "key" of every row that 'keo send' would accept (rows it rejects are not expected).

    A line that is not UTF-8, or a row 'keo send' would reject, is skipped with a warning on
    stderr naming its line: it cannot have been delivered.
    """
    keys: list[str] = []
    json_lines: bool | None = None  # decided by the first readable line
    with path.open("rb") as source:
        for number, raw in numbered_lines(source):
            line = raw if isinstance(raw, BadLine) else decode_line(raw)
            if json_lines is None and isinstance(line, str):
                json_lines = line.lstrip().startswith("{")
            if isinstance(line, str) and not json_lines:
                keys.append(line.rstrip("\r\n"))
                continue
            parsed = line if isinstance(line, BadLine) else parse_line(line, DataEncoding.TEXT)
            if isinstance(parsed, Message) and not 1 <= len(parsed.key) <= MAX_KEY_CHARS:
                parsed = BadLine(f"key has {len(parsed.key)} characters")
            if isinstance(parsed, BadLine):
                typer.echo(
                    f"keo audit: --expected {path} line {number} skipped: {parsed.reason}",
                    err=True,
                )
                continue
            keys.append(parsed.key)
    return keys


def audit(
    stream: StreamOpt = None,
    table: TableOpt = None,
    expected: Annotated[
        Path | None,
        typer.Option(
            "--expected",
            exists=True,
            dir_okay=False,
            help="keys that must each be in the stream exactly once: one per line, or the "
            "JSON lines given to 'keo send'",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="the full report as JSON on stdout")
    ] = False,
    show_keys: Annotated[int, typer.Option(help="keys listed per anomaly in the summary")] = 10,
    kinesis_endpoint_url: KinesisEndpointOpt = None,
    dynamodb_endpoint_url: DynamoEndpointOpt = None,
) -> None:
    """Read every shard (open and closed) from TRIM_HORIZON to its end, as a consumer would,
    and report: keys present more than once (with positions), records the ledger does not
    know, DELIVERED keys missing from the stream, ledger positions that disagree with the
    stream, and claims still IN_FLIGHT. With --expected, every listed key must be present.

    Exit 0 when clean, 1 on any anomaly.

    Example: keo audit --stream orders --table orders-ledger --expected events.jsonl --json
    """
    settings = load_settings(
        stream=stream,
        table=table,
        kinesis_endpoint_url=kinesis_endpoint_url,
        dynamodb_endpoint_url=dynamodb_endpoint_url,
    )
    from producer.audit import audit_stream
    from producer.kinesis import KinesisReader
    from producer.wiring import kinesis_client, ledger_from

    wanted = read_expected(expected) if expected is not None else None
    with exit_on_errors():
        reader = KinesisReader(kinesis_client(settings, for_put=False), settings.stream)
        ledger = ledger_from(settings)
        ledger.ensure_ready()
        with Progress(sys.stderr.isatty(), "auditing shards") as advance:
            report = audit_stream(reader, ledger, expected=wanted, progress=advance)
    if as_json:
        sys.stdout.write(json.dumps(report.as_json(), ensure_ascii=False) + "\n")
    _summary(report, show_keys)
    if not report.clean:
        raise typer.Exit(ExitCode.FAILED)


def _summary(report: AuditReport, show: int) -> None:
    lines = [
        f"keo audit: stream {report.stream}: {report.shards} shards, "
        f"{report.user_records} records, {report.distinct_keys} keys",
        f"  duplicates:           {len(report.duplicates)}",
        f"  missing (expected):   {len(report.expected_missing)}"
        + ("" if report.expected is not None else " (no --expected given)"),
        f"  missing (delivered):  {len(report.missing_delivered)}",
        f"  unknown to ledger:    {len(report.unknown_keys)}",
        f"  position mismatches:  {len(report.position_mismatches)}",
        f"  still in flight:      {len(report.in_flight)}",
        f"  unverifiable:         {len(report.unverifiable)}",
    ]
    if report.dropped_by_kcl:
        lines.append(f"  dropped as KCL would: {report.dropped_by_kcl}")
    for name, keys in (
        ("duplicate", list(report.duplicates)),
        ("missing", report.expected_missing + report.missing_delivered),
        ("unknown", report.unknown_keys),
        ("in flight", report.in_flight),
    ):
        if keys:
            lines.append(f"  {name}: {', '.join(map(repr, keys[:show]))}")
    lines.append("  verdict: " + ("CLEAN" if report.clean else f"{report.anomalies} ANOMALIES"))
    typer.echo("\n".join(lines), err=True)
