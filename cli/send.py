"""``keo send``: deliver JSON lines exactly once; one JSON outcome per line on stdout."""

from __future__ import annotations

import base64
import json
import sys
from collections import Counter
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import IO, Annotated

import typer

from cli.exit_codes import ExitCode
from cli.options import (
    DynamoEndpointOpt,
    KinesisEndpointOpt,
    StreamOpt,
    TableOpt,
    exit_on_errors,
    load_settings,
)
from cli.progress import Progress
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import Message, chunked


class DataEncoding(StrEnum):
    TEXT = "text"
    BASE64 = "base64"


def send(
    input_path: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help="JSON lines file, or - for stdin. Each line: "
            '{"key": "...", "data": "...", "routing_key": "..." (optional)}',
        ),
    ],
    stream: StreamOpt = None,
    table: TableOpt = None,
    data_encoding: Annotated[
        DataEncoding,
        typer.Option(help="how 'data' is written: UTF-8 text, or base64 of the bytes"),
    ] = DataEncoding.TEXT,
    chunk_size: Annotated[
        int, typer.Option(min=1, max=100_000, help="messages handed to the producer at once")
    ] = 5_000,
    progress: Annotated[
        bool | None,
        typer.Option("--progress/--no-progress", help="progress bar (default: on a terminal)"),
    ] = None,
    aggregate: Annotated[
        bool | None,
        typer.Option(
            "--aggregate/--no-aggregate",
            help="pack user records per shard into KPL aggregates (KCL deaggregates them) "
            "[env KEO_AGGREGATE]",
        ),
    ] = None,
    kinesis_endpoint_url: KinesisEndpointOpt = None,
    dynamodb_endpoint_url: DynamoEndpointOpt = None,
) -> None:
    """Send messages exactly once: each key is claimed in the ledger, put once, and marked.

    Prints one JSON outcome per input line on stdout (index = line number from 0): SENT,
    DUPLICATE (already delivered, nothing sent), CONFLICT (key used for other data),
    REJECTED (bad input, with the reason), IN_FLIGHT (unresolved: run 'keo reconcile'),
    TAKEN_OVER, UNVERIFIABLE or FAILED. A summary goes to stderr.

    Exit 0 when every message is SENT or DUPLICATE, 1 otherwise.

    Example: keo send --stream orders --table orders-ledger --input events.jsonl
    """
    settings = load_settings(
        stream=stream,
        table=table,
        aggregate=aggregate,
        kinesis_endpoint_url=kinesis_endpoint_url,
        dynamodb_endpoint_url=dynamodb_endpoint_url,
    )
    from devstack import failpoints
    from producer.wiring import build_stack

    source = _open_input(input_path)
    show_progress = progress if progress is not None else sys.stderr.isatty()
    counts: Counter[str] = Counter()
    with exit_on_errors():
        stack = build_stack(settings, hooks=failpoints.from_env())
        with stack.producer() as producer, Progress(show_progress, "sending") as advance:
            for chunk in chunked(_parse_lines(source, data_encoding), chunk_size):
                messages = [m for _, m in chunk if isinstance(m, Message)]
                sent = iter(producer.send(messages))
                for index, parsed in chunk:
                    if isinstance(parsed, Message):
                        outcome = next(sent)
                        outcome = Outcome(
                            index,
                            outcome.key,
                            outcome.status,
                            outcome.position,
                            outcome.reason,
                            outcome.attempt,
                            outcome.ledger_marked,
                        )
                    else:
                        outcome = Outcome(index, None, OutcomeStatus.REJECTED, reason=parsed)
                    counts[outcome.status.value] += 1
                    sys.stdout.write(json.dumps(outcome.as_json(), ensure_ascii=False) + "\n")
                sys.stdout.flush()
                advance(len(chunk))
    total = sum(counts.values())
    summary = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
    typer.echo(f"keo send: {total} messages: {summary or 'none'}", err=True)
    ok = counts[OutcomeStatus.SENT.value] + counts[OutcomeStatus.DUPLICATE.value]
    if ok != total:
        raise typer.Exit(ExitCode.FAILED)


def _open_input(path: str) -> IO[str]:
    if path == "-":
        return sys.stdin
    try:
        return Path(path).open(encoding="utf-8")
    except OSError as exc:
        typer.echo(f"keo send: cannot read --input {path}: {exc.strerror}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None


def _parse_lines(source: IO[str], encoding: DataEncoding) -> Iterator[tuple[int, Message | str]]:
    """Each line as a Message, or the reason it is not one (the line is then REJECTED)."""
    for index, line in enumerate(source):
        yield index, parse_line(line, encoding)


def parse_line(line: str, encoding: DataEncoding) -> Message | str:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"line is not JSON: {exc.msg} at column {exc.colno}"
    if not isinstance(row, dict):
        return "line must be a JSON object with 'key' and 'data'"
    key, data, routing = row.get("key"), row.get("data"), row.get("routing_key")
    if not isinstance(key, str):
        return "'key' is missing or not a string"
    if not isinstance(data, str):
        return "'data' is missing or not a string (use --data-encoding base64 for bytes)"
    if routing is not None and not isinstance(routing, str):
        return "'routing_key' must be a string when given"
    if encoding is DataEncoding.BASE64:
        try:
            payload = base64.b64decode(data, validate=True)
        except ValueError:  # binascii.Error, or non-ASCII text
            return "'data' is not valid base64"
    else:
        try:
            payload = data.encode("utf-8")
        except UnicodeEncodeError:
            return "'data' contains an unpaired surrogate; send it as base64"
    return Message(key, payload, routing)
