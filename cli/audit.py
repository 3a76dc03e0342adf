"""``keo audit``: read the whole stream and prove each key is in it exactly once."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import logs
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
from cli.stdout import write_json_line
from dedupe_store.records import MAX_KEY_CHARS
from kinesis_store.kpl import UserRecord
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import Shard
from producer.audit import LISTED_KEYS
from producer.errors import AuditTooLargeError
from producer.protocol import Message

if TYPE_CHECKING:
    from producer.audit import AuditReport


# keys one process audits: beyond, python -m spark_jobs.audit (its driver holds no key).
# keo audit holds each key of the stream and of the ledger, with its positions and items: 1.1 KB
# a key measured (sequential keys, 56-digit sequence numbers), so 2,000,000 keys take 2.3 GB.
DEFAULT_MAX_KEYS = 2_000_000


def read_expected(path: Path, *, max_keys: int | None = None) -> list[str]:
    """Keys, one per line; or, when the file is JSON lines (the input of 'keo send'), the
    "key" of every row that 'keo send' would accept (rows it rejects are not expected).

    A line that is not UTF-8, or a row 'keo send' would reject, is skipped with a warning on
    stderr naming its line: it cannot have been delivered. Past ``max_keys`` keys it raises
    :class:`AuditTooLargeError`.
    """
    keys: list[str] = []
    for key in _expected_keys(path):
        keys.append(key)
        if max_keys is not None and len(keys) > max_keys:
            raise AuditTooLargeError(f"--expected {path}", max_keys=max_keys)
    return keys


def _expected_keys(path: Path) -> Iterator[str]:
    json_lines: bool | None = None  # decided by the first readable line
    with path.open("rb") as source:
        for number, raw in numbered_lines(source):
            line = raw if isinstance(raw, BadLine) else decode_line(raw)
            if json_lines is None and isinstance(line, str):
                json_lines = line.lstrip().startswith("{")
            if isinstance(line, str) and not json_lines:
                yield line.rstrip("\r\n")
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
            yield parsed.key


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
        bool,
        typer.Option(
            "--json", help="the full report as JSON on stdout (the summary goes to stderr)"
        ),
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress", help="progress on stderr (default: on a terminal)"
        ),
    ] = None,
    show_keys: Annotated[int, typer.Option(help="keys listed per anomaly in the summary")] = 10,
    list_keys: Annotated[
        int,
        typer.Option(
            min=0,
            help="keys listed per anomaly in the JSON report, the first in key order "
            "(the counts are exact)",
        ),
    ] = LISTED_KEYS,
    max_keys: Annotated[
        int,
        typer.Option(
            min=1,
            help="stop, exit 2, when the stream, its ledger or --expected holds more keys: "
            "this process holds every key (audit larger streams with python -m "
            "spark_jobs.audit)",
        ),
    ] = DEFAULT_MAX_KEYS,
    kinesis_endpoint_url: KinesisEndpointOpt = None,
    dynamodb_endpoint_url: DynamoEndpointOpt = None,
) -> None:
    """Read every shard (open and closed) from TRIM_HORIZON to its end, as a consumer would,
    and report: keys present more than once (with positions), records the ledger does not
    know, DELIVERED keys missing from the stream, ledger positions that disagree with the
    stream, and claims still IN_FLIGHT. With --expected, every listed key must be present.

    Exit 0 when clean, 1 on any anomaly, 2 when the stream is too large for one process
    (--max-keys): audit it on Spark with python -m spark_jobs.audit.

    Example: keo audit --stream orders --table orders-ledger --expected events.jsonl --json
    """
    settings = load_settings(
        stream=stream,
        table=table,
        kinesis_endpoint_url=kinesis_endpoint_url,
        dynamodb_endpoint_url=dynamodb_endpoint_url,
    )
    from producer.audit import audit_stream
    from producer.wiring import kinesis_client, ledger_from

    show = progress if progress is not None else sys.stderr.isatty()
    with exit_on_errors(), Progress(show, "auditing", unit="shards") as bar:
        try:
            wanted = read_expected(expected, max_keys=max_keys) if expected is not None else None
            reader = ReaderWithProgress(
                kinesis_client(settings, for_put=False), settings.stream, bar
            )
            ledger = ledger_from(settings)
            ledger.ensure_ready()
            report = audit_stream(
                reader,
                ledger,
                expected=wanted,
                progress=bar.advance,
                listed=list_keys,
                max_keys=max_keys,
            )
        except AuditTooLargeError as exc:
            logs.report(
                f"keo audit: {exc} (--max-keys {max_keys}); audit it on Spark, whose driver "
                f"holds no key: python -m spark_jobs.audit --stream {settings.stream} "
                f"--table {settings.table}{f' --expected {expected}' if expected else ''}"
                f"{' --json' if as_json else ''}",
                event="command_failed",
                level=logging.ERROR,
            )
            raise typer.Exit(ExitCode.USAGE) from None
    if as_json:
        write_json_line(report.as_json())
    _summary(report, show_keys, to_stderr=as_json)
    if not report.clean:
        raise typer.Exit(ExitCode.FAILED)


class ReaderWithProgress(KinesisReader):
    """A reader that sets the progress total to the shard count and notes records read."""

    def __init__(self, client: Any, stream: str, progress: Progress) -> None:
        super().__init__(client, stream)
        self._progress = progress
        self._shards = 0
        self._shards_read = 0
        self._records = 0

    def shards(self) -> list[Shard]:
        found = super().shards()
        self._shards = len(found)
        self._progress.set_total(self._shards)
        return found

    def read_all(self, shard_id: str) -> Iterator[UserRecord]:
        for record in super().read_all(shard_id):
            self._records += 1
            if self._records % 1000 == 0:
                self._progress.note(f"{self._records:,} records")
            yield record
        self._shards_read += 1
        if self._shards_read == self._shards:  # the audit reads the ledger next
            self._progress.note(f"{self._records:,} records; comparing with the ledger")


def _summary(report: AuditReport, show: int, *, to_stderr: bool) -> None:
    typer.echo(report.summary(show), err=to_stderr)
