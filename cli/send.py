"""``keo send``: deliver JSON lines exactly once; one JSON outcome per line on stdout."""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated

import typer

from cli.exit_codes import ExitCode
from cli.input_lines import BadLine, DataEncoding, numbered_lines, parse_line
from cli.interrupt import GracefulStop, StopReadingError
from cli.metrics_export import MetricsFileOpt, MetricsHostOpt, MetricsPortOpt, exporting
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
from producer.hooks import Hooks, Step
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import Message, chunked
from producer.settings import Dedupe

if TYPE_CHECKING:
    from producer.guarantees import RunEnd, Sender
    from producer.settings import ProducerSettings


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
            "\\[env KEO_AGGREGATE]",
        ),
    ] = None,
    dedupe: Annotated[
        Dedupe | None,
        typer.Option(
            help="key: each key once, ever (one ledger write per message); replay: what one "
            "run without failures writes, however often it is re-run (needs --run-id) "
            "\\[env KEO_DEDUPE; default key]",
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            help="replay mode: the run's name; re-running with the same name after a crash, a "
            "kill or Ctrl-C sends only the rows the earlier runs did not deliver",
        ),
    ] = None,
    kinesis_endpoint_url: KinesisEndpointOpt = None,
    dynamodb_endpoint_url: DynamoEndpointOpt = None,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1",
    metrics_file: MetricsFileOpt = None,
) -> None:
    """Send messages exactly once: each key is claimed in the ledger, put once, and marked
    (--dedupe key, the default), or each line of a named run once (--dedupe replay).

    Prints one JSON outcome per non-blank input line on stdout, in input order (index = line
    number from 0; every reason starts with 'line N:', counting from 1): SENT, DUPLICATE
    (already delivered, nothing sent), CONFLICT (key used for other data), REJECTED (bad
    input: not UTF-8, not JSON, a missing field, ...; the rest is still sent), IN_FLIGHT
    (unresolved: run 'keo reconcile'), TAKEN_OVER, UNVERIFIABLE or FAILED. Blank lines are
    skipped. A summary goes to stderr.

    The signature fence (KEO_PUT_FENCE=signature, the default) lets a put leave only if
    Kinesis would refuse it (its signature expired) before its lease ends: a process stalled
    between its lease check and its put never writes a duplicate. The price: the lease
    (KEO_LEASE_S, 360 s) outlives the 300 s signature window, so the keys of a producer that
    crashed wait one lease for 'keo reconcile'. KEO_PUT_FENCE=off allows a 60 s lease and
    checks the clock as each put leaves (the put's timeouts + skew of lease left), but a stall
    after that check, or a put the network holds, longer than the lease can write a duplicate,
    which 'keo audit' reports; it says so once on stderr.

    Replay mode (--dedupe replay --run-id NAME) writes no ledger item per message: the stream
    holds what one run without failures would write, however often the run is re-run. A re-run
    with the same NAME (after a crash, kill -9 or Ctrl-C) reads back what the earlier runs put
    and sends only the rest: DUPLICATE for a line found, SENT for a line sent now. A line found
    nowhere while an earlier run's lease may still let it land is waited for (at most one
    KEO_LEASE_S; a kill -9 leaves its lease running). When every line is delivered the run is
    COMPLETE: a re-run of it sends nothing. Identity is the line, key and data, counted: keys
    are not compared across runs, and two equal lines are two records.

    Exit 0 when every message is SENT or DUPLICATE, 1 otherwise. Ctrl-C (or SIGTERM) stops
    reading input, finishes the chunk in flight and prints its outcomes, then exits 130; a
    second Ctrl-C exits at once.

    Metrics: --metrics-port serves them while it runs, --metrics-file writes them at the end.

    Example: keo send --stream orders --table orders-ledger --input events.jsonl
    """
    settings = load_settings(
        stream=stream,
        table=table,
        aggregate=aggregate,
        dedupe=dedupe,
        kinesis_endpoint_url=kinesis_endpoint_url,
        dynamodb_endpoint_url=dynamodb_endpoint_url,
    )
    from producer.guarantees import guarantee_of

    named_runs = guarantee_of(settings).named_runs
    if named_runs and not run_id:
        typer.echo(
            f"keo send: --dedupe {settings.dedupe} needs --run-id NAME: the run a re-run "
            "continues (re-run with the same name after a crash; a new name sends everything "
            "again)",
            err=True,
        )
        raise typer.Exit(ExitCode.USAGE)
    if run_id is not None and not named_runs:
        typer.echo("keo send: --run-id names a replay-mode run: add --dedupe replay", err=True)
        raise typer.Exit(ExitCode.USAGE)
    with exporting("send", port=metrics_port, host=metrics_host, file=metrics_file):
        _send(settings, input_path, data_encoding, chunk_size, progress, run_id)


def _send(
    settings: ProducerSettings,
    input_path: str,
    data_encoding: DataEncoding,
    chunk_size: int,
    progress: bool | None,
    run_id: str | None,
) -> None:
    from devstack import failpoints
    from producer.guarantees import Party, guarantee_of
    from producer.wiring import build_stack, warn_if_unfenced

    source = _open_input(input_path)
    warn_if_unfenced(settings)
    show_progress = progress if progress is not None else sys.stderr.isatty()
    lines = _count_lines(input_path) if show_progress else None
    counts: Counter[str] = Counter()
    last_line = 0  # the last input line with an outcome printed
    with (
        exit_on_errors(),
        Progress(show_progress, "sending", unit="lines", total=lines) as bar,
    ):
        puts = itertools.count(1)
        hooks = PutCounter(failpoints.from_env(), lambda: bar.note(f"{next(puts)} put requests"))
        stack = build_stack(settings, hooks=hooks)
        party = Party(run_id or "", task="cli")
        with (
            guarantee_of(settings).sender(stack, party) as sender,
            GracefulStop(_say, sender.interrupt) as stop,
        ):
            chunks = chunked(_parse_lines(source, data_encoding), chunk_size)
            try:
                while not stop.requested:
                    with stop.reading():
                        chunk = next(chunks, None)
                    if chunk is None:
                        break
                    for outcome in _outcomes(sender, chunk):
                        counts[outcome.status.value] += 1
                        write_json_line(outcome.as_json())
                    sys.stdout.flush()
                    last_line = chunk[-1][0]
                    bar.advance(len(chunk))
            except StopReadingError:
                pass  # the lines read since the last chunk were never sent
            total = sum(counts.values())
            ok = counts[OutcomeStatus.SENT.value] + counts[OutcomeStatus.DUPLICATE.value]
            run = None if stop.requested else sender.settle_run(counts, delivered=ok == total)
    summary = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
    if stop.requested:
        typer.echo(
            f"keo send: interrupted: {total} messages: {summary or 'none'}; input after line "
            f"{last_line} was not sent ({_resume_hint(run_id, last_line + 1)})",
            err=True,
        )
        raise typer.Exit(ExitCode.INTERRUPTED)
    typer.echo(f"keo send: {total} messages: {summary or 'none'}{_run_summary(run)}", err=True)
    if ok != total:
        raise typer.Exit(ExitCode.FAILED)


def _resume_hint(run_id: str | None, line: int) -> str:
    if run_id is None:
        return f"send it again from line {line}"
    return f"re-run with --run-id {run_id} and the same input: nothing is sent twice"


def _run_summary(run: RunEnd | None) -> str:
    if run is None:
        return ""
    if run.complete:
        return f"; run {run.run!r} COMPLETE"
    return f"; run {run.run!r} left OPEN: re-run with --run-id {run.run} to finish it"


def _outcomes(sender: Sender, chunk: list[tuple[int, Message | BadLine]]) -> Iterator[Outcome]:
    """One outcome per line of ``chunk``, in order: the producer's, or REJECTED."""
    sent = iter(sender.send([m for _, m in chunk if isinstance(m, Message)]))
    for number, parsed in chunk:
        if isinstance(parsed, Message):
            yield _for_line(number, next(sent))
        else:
            rejected = Outcome(0, parsed.key, OutcomeStatus.REJECTED, reason=parsed.reason)
            yield _for_line(number, rejected)


def _say(text: str) -> None:
    typer.echo(text, err=True)


def _open_input(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    try:
        return Path(path).open("rb")
    except OSError as exc:
        typer.echo(f"keo send: cannot read --input {path}: {exc.strerror}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None


def _count_lines(path: str) -> int | None:
    """Non-blank lines of a regular file (the progress total); None for stdin or a pipe."""
    if path == "-" or not Path(path).is_file():
        return None
    with Path(path).open("rb") as source:
        return sum(1 for _ in numbered_lines(source))


class PutCounter:
    """Hooks that call ``on_put`` after each PutRecords request, then the wrapped hooks'."""

    def __init__(self, inner: Hooks, on_put: Callable[[], None]) -> None:
        self._inner = inner
        self._on_put = on_put

    def at(self, step: Step, *, batch_id: int | None = None) -> None:
        if step is Step.AFTER_PUT:
            self._on_put()
        self._inner.at(step, batch_id=batch_id)


def _parse_lines(
    source: IO[bytes], encoding: DataEncoding
) -> Iterator[tuple[int, Message | BadLine]]:
    for number, raw in numbered_lines(source):
        yield number, raw if isinstance(raw, BadLine) else parse_line(raw, encoding)


def _for_line(number: int, outcome: Outcome) -> Outcome:
    """The outcome of input line ``number`` (from 1): its index is the line's from 0, and its
    reason starts with the line number."""
    reason = None if outcome.reason is None else f"line {number}: {outcome.reason}"
    return dataclasses.replace(outcome, index=number - 1, reason=reason)
