"""``keo audit``: read the whole stream and prove each key is in it exactly once, or (``--dedupe
replay``) that it holds each expected row as many times as it was sent."""

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
from kinesis_store.read_pacing import process_read_pacer
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import Shard
from producer.audit.rows import ExpectedRow
from producer.audit.stream import LISTED_KEYS
from producer.errors import AuditTooLargeError
from producer.protocol import Message
from producer.settings import Dedupe

if TYPE_CHECKING:
    from dedupe_store.contract import Ledger
    from producer.settings import ProducerSettings


# keys one process audits: beyond, python -m spark_jobs.audit (its driver holds no key).
# keo audit holds each key of the stream and of the ledger, with its positions and items: 1.1 KB
# a key measured (sequential keys, 56-digit sequence numbers), so 2,000,000 keys take 2.3 GB.
DEFAULT_MAX_KEYS = 2_000_000


def read_expected(
    path: Path, *, max_keys: int | None = None, encoding: DataEncoding = DataEncoding.TEXT
) -> list[str]:
    """Keys, one per line; or, when the file is JSON lines (the input of 'keo send'), the
    "key" of every row that 'keo send' would accept (rows it rejects are not expected).

    A line that is not UTF-8, or a row 'keo send' would reject, is skipped with a warning on
    stderr naming its line: it cannot have been delivered. Past ``max_keys`` keys it raises
    :class:`AuditTooLargeError`.
    """
    keys: list[str] = []
    for _, line in _expected_lines(path, encoding):
        keys.append(line if isinstance(line, str) else line.key)
        if max_keys is not None and len(keys) > max_keys:
            raise AuditTooLargeError(f"--expected {path}", max_keys=max_keys)
    return keys


def read_expected_rows(path: Path, encoding: DataEncoding) -> Iterator[ExpectedRow]:
    """The rows of JSON lines (the input of 'keo send'), data decoded as 'keo send' decodes it,
    skipping what :func:`read_expected` skips. A file of plain keys holds no rows: exit 2."""
    for number, line in _expected_lines(path, encoding):
        if isinstance(line, str):
            typer.echo(
                f"keo audit: --expected {path} line {number} is not a JSON row: --dedupe replay "
                'compares rows, so --expected must be the JSON lines given to keo send ({"key", '
                '"data"})',
                err=True,
            )
            raise typer.Exit(ExitCode.USAGE)
        yield ExpectedRow(line.key, line.data, number)


def _expected_lines(path: Path, encoding: DataEncoding) -> Iterator[tuple[int, str | Message]]:
    """Every line that counts, with its number: a key (a file of plain keys), or a row."""
    json_lines: bool | None = None  # decided by the first readable line
    with path.open("rb") as source:
        for number, raw in numbered_lines(source):
            line = raw if isinstance(raw, BadLine) else decode_line(raw)
            if json_lines is None and isinstance(line, str):
                json_lines = line.lstrip().startswith("{")
            if isinstance(line, str) and not json_lines:
                yield number, line.rstrip("\r\n")
                continue
            parsed = line if isinstance(line, BadLine) else parse_line(line, encoding)
            if isinstance(parsed, Message) and not 1 <= len(parsed.key) <= MAX_KEY_CHARS:
                parsed = BadLine(f"key has {len(parsed.key)} characters")
            if isinstance(parsed, BadLine):
                typer.echo(
                    f"keo audit: --expected {path} line {number} skipped: {parsed.reason}",
                    err=True,
                )
                continue
            yield number, parsed


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
            "JSON lines given to 'keo send'; with --dedupe replay, those JSON lines (required)",
        ),
    ] = None,
    dedupe: Annotated[
        Dedupe,
        typer.Option(
            help="how the stream was written: 'key' (each key once, checked against the "
            "ledger) or 'replay' (each row of --expected, key and data, as many times as it "
            "is there; the ledger is not read)",
        ),
    ] = Dedupe.KEY,
    data_encoding: Annotated[
        DataEncoding,
        typer.Option(help="how 'data' is written in --expected, as for keo send"),
    ] = DataEncoding.TEXT,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="with --dedupe replay: rows in the stream that --expected does not hold "
            "(other writers', as a rule) fail the audit too; without it they are only reported",
        ),
    ] = False,
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
    show_keys: Annotated[
        int,
        typer.Option(help="keys (rows, with --dedupe replay) listed per anomaly in the summary"),
    ] = 10,
    list_keys: Annotated[
        int,
        typer.Option(
            min=0,
            help="keys (rows) listed per anomaly in the JSON report, the first in key order "
            "(the counts are exact)",
        ),
    ] = LISTED_KEYS,
    max_keys: Annotated[
        int,
        typer.Option(
            min=1,
            help="stop, exit 2, when the stream, its ledger or --expected holds more keys "
            "(with --dedupe replay: distinct rows, the stream's and --expected's together): "
            "this process holds every one (audit larger streams with python -m "
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

    With --dedupe replay (a stream written in replay mode keeps no per-key state), the ledger
    is not read: --expected holds the JSON lines the run sent, and the audit counts rows, key
    and data together: a line there twice must be in the stream twice, and the same key with
    other data is another row. It reports rows MISSING (fewer copies than expected), DUPLICATED
    (more: the extra copies, the later ones in stream order, with their positions) and
    UNEXPECTED (in the stream, never expected: as a rule other writers' rows, so they fail the
    audit only with --strict).

    Exit 0 when clean, 1 on any anomaly, 2 when the stream is too large for one process
    (--max-keys): audit it on Spark with python -m spark_jobs.audit.

    Example: keo audit --stream orders --table orders-ledger --expected events.jsonl --json

    Example: keo audit --stream orders --expected batch-17.jsonl --dedupe replay
    """
    settings = load_settings(
        stream=stream,
        table=table,
        dedupe=dedupe,
        kinesis_endpoint_url=kinesis_endpoint_url,
        dynamodb_endpoint_url=dynamodb_endpoint_url,
    )
    from producer.audit.auditors import AuditLimits
    from producer.guarantees import guarantee_of

    auditor = guarantee_of(settings).auditor
    if auditor.compares_rows and expected is None:
        typer.echo(
            f"keo audit: --dedupe {settings.dedupe} needs --expected FILE: the JSON lines the "
            "run sent (a replay-mode stream keeps no per-key state to audit against)",
            err=True,
        )
        raise typer.Exit(ExitCode.USAGE)
    show = progress if progress is not None else sys.stderr.isatty()
    with exit_on_errors(), Progress(show, "auditing", unit="shards") as bar:
        limits = AuditLimits(
            listed=list_keys,
            max_items=max_keys,
            strict=strict,
            skew_ms=round(settings.clock_skew_s * 1000),
            progress=bar.advance,
        )
        sources = _Sources(settings, bar, expected, data_encoding, max_keys=max_keys)
        try:
            report = auditor.audit(sources, limits)
        except AuditTooLargeError as exc:
            spark = _spark_audit_command(
                settings, expected, as_json=as_json, data_encoding=data_encoding, strict=strict
            )
            logs.report(
                f"keo audit: {exc} (--max-keys {max_keys}); audit it on Spark, whose driver "
                f"holds no key: {spark}",
                event="command_failed",
                level=logging.ERROR,
            )
            raise typer.Exit(ExitCode.USAGE) from None
    if as_json:
        write_json_line(report.as_json())
    typer.echo(report.summary(show_keys), err=as_json)
    if not report.clean:
        raise typer.Exit(ExitCode.FAILED)


class _Sources:
    """What keo audit reads, as its auditor asks (:mod:`producer.audit.auditors`): --expected
    as keys or as rows, the stream with progress on stderr, the ledger made ready."""

    def __init__(
        self,
        settings: ProducerSettings,
        bar: Progress,
        expected: Path | None,
        encoding: DataEncoding,
        *,
        max_keys: int,
    ) -> None:
        self._settings = settings
        self._bar = bar
        self._expected = expected
        self._encoding = encoding
        self._max_keys = max_keys

    def expected_keys(self) -> list[str] | None:
        if self._expected is None:
            return None
        return read_expected(self._expected, max_keys=self._max_keys, encoding=self._encoding)

    def expected_rows(self) -> Iterator[ExpectedRow]:
        if self._expected is None:  # the command refuses a row audit without --expected
            return iter(())
        return read_expected_rows(self._expected, self._encoding)

    def reader(self, *, then: str) -> KinesisReader:
        from producer.clients import kinesis_read_client

        settings = self._settings
        return ReaderWithProgress(
            kinesis_read_client(settings), settings.stream, self._bar, then=then
        )

    def ledger(self) -> Ledger:
        from producer.wiring import ledger_from

        ledger = ledger_from(self._settings)
        ledger.ensure_ready()
        return ledger


def _spark_audit_command(
    settings: ProducerSettings,
    expected: Path | None,
    *,
    as_json: bool,
    data_encoding: DataEncoding,
    strict: bool,
) -> str:
    """The python -m spark_jobs.audit command that audits the same stream the same way."""
    words = [
        "python -m spark_jobs.audit",
        f"--stream {settings.stream}",
        f"--table {settings.table}",
        *([f"--expected {expected}"] if expected else []),
        # the mode as the flag says it, the default left out
        *([f"--dedupe {settings.dedupe}"] if settings.dedupe is not Dedupe.KEY else []),
        *(
            [f"--data-encoding {data_encoding.value}"]
            if data_encoding is not DataEncoding.TEXT
            else []
        ),
        *(["--strict"] if strict else []),
        *(["--json"] if as_json else []),
    ]
    return " ".join(words)


class ReaderWithProgress(KinesisReader):
    """A reader that sets the progress total to the shard count and notes records read."""

    def __init__(
        self, client: Any, stream: str, progress: Progress, then: str = "comparing with the ledger"
    ) -> None:
        # every shard's reads within its limits, room left for another consumer of it
        super().__init__(client, stream, pacer=process_read_pacer())
        self._progress = progress
        self._then = then  # what the audit does once every shard is read
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
        if self._shards_read == self._shards:
            self._progress.note(f"{self._records:,} records; {self._then}")
