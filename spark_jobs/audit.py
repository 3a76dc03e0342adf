"""The audit on Spark: ``keo audit``'s verdict, report and exit codes, for a stream of any size.

Example::

    python -m spark_jobs.audit --stream orders --table orders-ledger --expected keys.txt --json

Every key is judged on the executors; the driver holds no key, only the findings::

    executors                                              driver
    the stream: read_records, one task per shard ───┐
    the ledger: a parallel Scan, one task a segment ├─ union, grouped by key
    --expected: spark.read.text                   ──┘    (one shuffle)
        └─ each partition of keys: Findings.add_key per key (producer.audit.stream's rule)
             └─ its findings (counts, the first --list-keys keys of each anomaly)
                  └─ one task merges them ──────────────────────> one row: the report

The ledger is read by ``--ledger-segments`` tasks (default: ``spark.sql.shuffle.partitions``),
each scanning one segment of the table (DynamoDB's ``Segment`` / ``TotalSegments``) and
emitting its key items (state, group) and, for each group item, the position of every member
it records (members are unpacked on the executors). Grouped by key, a key's delivery is its
claim's state and the position its claim's group records for it, as
:meth:`dedupe_store.records.LedgerRecord.of` joins the two items.

So the report is the same as ``keo audit``'s, counts exact and the key lists bounded
(``--list-keys``, the first keys in key order); the driver's memory does not grow with the
stream. Only DataFrame operations and ``mapInArrow``: it runs on Spark Connect too.

``--expected`` is read by Spark too: keys one per line, or JSON lines (the input of
``keo send``) whose ``key`` is a string of 1 to 256 characters and whose ``data`` is present
(and, with ``--data-encoding base64``, base64; ``keo audit`` also skips rows whose data
``keo send`` could not encode). Other settings come from ``KEO_*`` variables (endpoints,
region). Exit codes are ``keo``'s: 0 clean, 1 anomalies, 2 usage, 3 configuration, 4 a
backend could not be reached.

``--dedupe replay`` is ``keo audit --dedupe replay`` (:mod:`producer.audit.rows`): no ledger;
the stream's records and ``--expected``'s rows are hashed on the executors
(:func:`producer.audit.rows.row_digest`) and grouped by digest, each row judged there by the
same rule, the driver getting one row. Its report is ``keo audit``'s but for the rows'
``line``: Spark reads ``--expected`` without line numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from dedupe_store.records import MAX_KEY_CHARS, Group, Position
from dedupe_store.states import KeyState, delivery_state
from kinesis_store.reader import KinesisReader
from producer.audit.findings import in_stream_order
from producer.audit.rows import LISTED_ROWS, RowAuditReport, RowFindings, row_digest
from producer.audit.stream import LISTED_KEYS, AuditReport, Findings
from producer.clients import kinesis_client
from producer.errors import ConfigurationError, KeoError, StreamNotFoundError
from producer.guarantees import guarantee_of
from producer.settings import Dedupe
from producer.wiring import ledger_from
from spark_jobs.batch_read import read_records
from spark_jobs.job_runner import ExitCode
from spark_jobs.options import setting_options
from spark_jobs.writer import producer_settings, settings_from_env

if TYPE_CHECKING:
    import pyarrow as pa

    from producer.settings import ProducerSettings

log = logging.getLogger(__name__)

POSITION_TYPE = "struct<shard_id:string,sequence_number:string,sub_sequence_number:bigint>"
# what is known of a key, one row per fact: a record of the stream (``position`` if KCL
# delivers it, else ``dropped``), its key item, its position in a group, its being expected
EVIDENCE_COLUMNS = {
    "key": "string",
    "position": POSITION_TYPE,
    "dropped": "int",
    "claim_state": "string",
    "claim_group": "string",
    "member_group": "string",
    "member_position": POSITION_TYPE,
    "expected": "boolean",
}
LEDGER_SCHEMA = (
    "key string, claim_state string, claim_group string, member_group string, "
    f"member_position {POSITION_TYPE}"
)
FINDINGS_SCHEMA = "findings string"
# the replay audit's evidence, one row per record of the stream or row of --expected
ROW_COLUMNS = {
    "key": "string",
    "data": "binary",
    "position": POSITION_TYPE,
    "dropped": "int",
    "expected": "int",
}
ROWS_SCHEMA = f"digest binary, key string, position {POSITION_TYPE}, dropped int, expected int"
DEDUPE_MODES = tuple(mode.value for mode in Dedupe)
DATA_ENCODINGS = ("text", "base64")
_ROWS_PER_BATCH = 10_000
F = TypeVar("F", Findings, RowFindings)  # the key audit's findings, or the replay audit's


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return _parser().parse_args(argv)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.audit",
        description="Audit a stream on Spark: each key exactly once, the ledger agreeing.",
    )
    parser.add_argument("--stream", help="Kinesis stream (default: KEO_STREAM)")
    parser.add_argument("--table", help="DynamoDB ledger table (default: KEO_TABLE)")
    parser.add_argument(
        "--expected",
        help="keys that must each be in the stream once: one per line, or keo send's JSON lines",
    )
    parser.add_argument(
        "--dedupe",
        choices=DEDUPE_MODES,
        default="key",
        help="how the stream was written: key (each key once, with the ledger) or replay "
        "(each row of --expected, key and data, as many times as it is there; no ledger)",
    )
    parser.add_argument(
        "--data-encoding",
        choices=DATA_ENCODINGS,
        default="text",
        help="how 'data' is written in --expected, as for keo send",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="with --dedupe replay: rows --expected does not hold fail the audit too",
    )
    parser.add_argument(
        "--json", action="store_true", help="the full report as JSON on stdout (summary: stderr)"
    )
    parser.add_argument("--show-keys", type=int, default=10, help="keys listed per anomaly")
    parser.add_argument(
        "--list-keys",
        type=_not_negative,
        default=LISTED_KEYS,
        help="keys listed per anomaly in the report, the first in key order (counts are exact)",
    )
    parser.add_argument(
        "--ledger-segments",
        type=_positive,
        help="parallel Scan segments of the ledger, one task each "
        "(default: spark.sql.shuffle.partitions)",
    )
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--log-level", default="WARNING", help="Python log level of the job")
    return parser


def _not_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


# --- the evidence, one row per fact about a key ----------------------------------------------


def _evidence(frame: Any, **columns: Any) -> Any:
    """``frame`` as evidence rows: ``columns`` by name, every other column null."""
    return _shaped(frame, EVIDENCE_COLUMNS, columns)


def _shaped(frame: Any, kinds: dict[str, str], columns: dict[str, Any]) -> Any:
    """``frame`` as the columns of ``kinds``: ``columns`` by name, every other one null."""
    from pyspark.sql import functions as f

    return frame.select(
        *(columns.get(name, f.lit(None)).cast(kind).alias(name) for name, kind in kinds.items())
    )


def stream_frame(spark: Any, values: dict[str, str]) -> Any:
    """Every user record of the stream, read on Spark (one task per shard), those KCL drops
    kept and marked (``visible_to_kcl``)."""
    return read_records(spark, setting_options(values), kcl_filter=False)


def _where_in_stream() -> dict[str, Any]:
    """A stream record's evidence: its key, and its position if KCL delivers it, else dropped."""
    from pyspark.sql import functions as f

    visible = f.col("visible_to_kcl")
    return {
        "key": f.col("key"),
        "position": f.when(visible, f.struct("shard_id", "sequence_number", "sub_sequence_number")),
        "dropped": f.when(visible, 0).otherwise(1),
    }


def stream_evidence(spark: Any, values: dict[str, str]) -> Any:
    """Every user record of the stream, read on Spark (one task per shard)."""
    return _evidence(stream_frame(spark, values), **_where_in_stream())


def ledger_evidence(spark: Any, values: dict[str, str], segments: int) -> Any:
    """The stream's key items and its groups' recorded positions, scanned by ``segments``
    tasks (one segment of a parallel Scan each)."""
    from pyspark.sql import functions as f

    rows = spark.range(0, segments, 1, segments).mapInArrow(
        partial(_scan_segments, values, segments), LEDGER_SCHEMA
    )
    return _evidence(rows, **{name: f.col(name) for name in rows.columns})


def _scan_segments(
    values: dict[str, str], total_segments: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """On an executor: the segments whose numbers come in ``batches``, as ledger rows."""
    import pyarrow as pa

    settings = producer_settings(values)
    ledger = ledger_from(settings)
    schema = _ledger_arrow_schema()
    rows: list[dict[str, Any]] = []
    for batch in batches:
        for segment in batch.column(0).to_pylist():
            for item in ledger.scan_items(
                settings.stream, segment=segment, total_segments=total_segments
            ):
                if isinstance(item, Group):
                    rows.extend(
                        {
                            "key": key,
                            "member_group": item.group_id,
                            "member_position": _position_row(position),
                        }
                        for key, position in item.positions_by_key().items()
                    )
                else:
                    rows.append(
                        {
                            "key": item.key,
                            "claim_state": item.state.value,
                            "claim_group": item.group_id,
                        }
                    )
                if len(rows) >= _ROWS_PER_BATCH:
                    yield pa.RecordBatch.from_pylist(rows, schema=schema)
                    rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=schema)


def expected_evidence(spark: Any, path: str, encoding: str = "text") -> Any:
    """The keys of ``--expected``, read on Spark (see the module's docstring)."""
    from pyspark.sql import functions as f

    lines, json_lines = _expected_lines(spark, path)
    if json_lines:
        keys = _accepted_rows(lines, path, encoding).select("key")
    else:
        keys = lines.select(f.col("value").alias("key"))
    return _evidence(keys, key=f.col("key"), expected=f.lit(True))


def _expected_lines(spark: Any, path: str) -> tuple[Any, bool]:
    """The non-blank lines of ``path``, and whether they are JSON lines (by the first)."""
    from pyspark.sql import functions as f

    lines = spark.read.text(path).where(f.length(f.trim("value")) > 0)
    first = lines.first()
    return lines, first is not None and first["value"].lstrip().startswith("{")


def _accepted_rows(lines: Any, path: str, encoding: str) -> Any:
    """``key`` and ``data`` (its bytes, decoded as keo send does) of the JSON rows keo send
    would accept; says on stderr how many it skipped."""
    from pyspark.sql import functions as f

    text = f.get_json_object("value", "$.data")
    data = (
        f.try_to_binary(text, f.lit("base64")) if encoding == "base64" else f.encode(text, "UTF-8")
    )
    rows = lines.select(f.get_json_object("value", "$.key").alias("key"), data.alias("data")).where(
        f.col("data").isNotNull() & f.char_length("key").between(1, MAX_KEY_CHARS)
    )
    skipped = lines.count() - rows.count()
    if skipped:
        sys.stderr.write(
            f"spark_jobs.audit: --expected {path}: {skipped} rows keo send would refuse "
            "were skipped\n"
        )
    return rows


# --- the judgement, key by key on the executors ------------------------------------------------


def findings_frame(
    spark: Any,
    values: dict[str, str],
    *,
    expected: str | None,
    listed: int = LISTED_KEYS,
    segments: int | None = None,
    encoding: str = "text",
) -> Any:
    """One row, one column: the audit's findings as JSON (:meth:`Findings.to_json`)."""
    from pyspark.sql import functions as f

    evidence = stream_evidence(spark, values).unionByName(
        ledger_evidence(spark, values, segments or default_segments(spark))
    )
    if expected is not None:
        evidence = evidence.unionByName(expected_evidence(spark, expected, encoding))
    member = f.col("member_group").isNotNull()
    by_key = evidence.groupBy("key").agg(
        f.collect_list("position").alias("positions"),  # nulls (dropped records) left out
        f.sum("dropped").alias("dropped"),
        f.max("claim_state").alias("claim_state"),  # one key item per key, or none
        f.max("claim_group").alias("claim_group"),
        f.collect_list(f.when(member, f.struct("member_group", "member_position"))).alias(
            "memberships"
        ),
        f.max("expected").alias("expected"),
    )
    expecting = expected is not None
    partials = by_key.mapInArrow(partial(_judge_keys, listed, expecting), FINDINGS_SCHEMA)
    empty = partial(Findings, listed=listed, expected=0 if expecting else None)
    return partials.repartition(1).mapInArrow(partial(_merge_findings, empty), FINDINGS_SCHEMA)


def default_segments(spark: Any) -> int:
    """As many segments as the session's shuffle partitions: the parallelism it is tuned for."""
    try:
        return max(1, int(spark.conf.get("spark.sql.shuffle.partitions")))
    except (TypeError, ValueError):  # "auto" on some platforms
        return 200


def _judge_keys(
    listed: int, expecting: bool, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """On an executor: the findings of one partition of keys."""
    findings = Findings(listed=listed, expected=0 if expecting else None)
    for batch in batches:
        for row in batch.to_pylist():
            findings.dropped_by_kcl += row["dropped"] or 0
            claim_state = row["claim_state"]
            # the claim's group's position for the key: LedgerRecord.of's join of the items
            position = next(
                (
                    _position(m["member_position"])
                    for m in row["memberships"]
                    if m["member_group"] == row["claim_group"]
                ),
                None,
            )
            findings.add_key(
                row["key"],
                [_position(p) for p in row["positions"]],
                ledger_read=True,
                ledger_state=(
                    delivery_state(KeyState(claim_state), has_position=position is not None)
                    if claim_state is not None
                    else None
                ),
                ledger_position=position,
                expected=bool(row["expected"]),
            )
    yield _findings_batch(findings)


def _merge_findings(
    empty: Callable[[], F], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """In one task: the partitions' findings merged (``empty()``: none yet, of their kind)."""
    total = empty()
    for batch in batches:
        for text in batch.column(0).to_pylist():
            total.merge(type(total).from_json(json.loads(text)))
    yield _findings_batch(total)


def _findings_batch(findings: Findings | RowFindings) -> pa.RecordBatch:
    import pyarrow as pa

    return pa.RecordBatch.from_pylist(
        [{"findings": json.dumps(findings.to_json(), ensure_ascii=False)}],
        schema=pa.schema([("findings", pa.string())]),
    )


def _ledger_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    position = pa.struct(
        [
            ("shard_id", pa.string()),
            ("sequence_number", pa.string()),
            ("sub_sequence_number", pa.int64()),
        ]
    )
    return pa.schema(
        [
            ("key", pa.string()),
            ("claim_state", pa.string()),
            ("claim_group", pa.string()),
            ("member_group", pa.string()),
            ("member_position", position),
        ]
    )


def _position_row(position: Position) -> dict[str, Any]:
    return {
        "shard_id": position.shard_id,
        "sequence_number": position.sequence_number,
        "sub_sequence_number": position.sub_sequence_number,
    }


def _position(row: dict[str, Any]) -> Position:
    return Position(row["shard_id"], row["sequence_number"], row["sub_sequence_number"])


# --- replay mode: rows counted, by digest on the executors ---------------------------------------


def row_findings_frame(
    spark: Any,
    values: dict[str, str],
    *,
    expected: str,
    encoding: str = "text",
    listed: int = LISTED_ROWS,
) -> Any:
    """One row, one column: the replay audit's findings as JSON (:meth:`RowFindings.to_json`).

    The stream's records and --expected's rows, hashed on the executors and grouped by digest:
    a row's copies expected, the positions of those found (a shuffle of digests and positions,
    never data past the hashing)."""
    from pyspark.sql import functions as f

    lines, json_lines = _expected_lines(spark, expected)
    if not json_lines:
        raise ExpectedNotRowsError(expected)
    sent = _accepted_rows(lines, expected, encoding)
    expected_rows = _shaped(
        sent, ROW_COLUMNS, {"key": f.col("key"), "data": f.col("data"), "expected": f.lit(1)}
    )
    evidence = _row_evidence(stream_frame(spark, values)).unionByName(expected_rows)
    digested = evidence.mapInArrow(_digest_rows, ROWS_SCHEMA)
    by_row = digested.groupBy("digest").agg(
        f.max("key").alias("key"),  # one key per digest
        f.collect_list("position").alias("positions"),  # nulls (dropped records) left out
        f.sum("dropped").alias("dropped"),
        f.sum("expected").alias("expected"),
    )
    partials = by_row.mapInArrow(partial(_judge_rows, listed), FINDINGS_SCHEMA)
    empty = partial(RowFindings, listed=listed)
    return partials.repartition(1).mapInArrow(partial(_merge_findings, empty), FINDINGS_SCHEMA)


class ExpectedNotRowsError(ValueError):
    """--dedupe replay was given a file that is not JSON lines (plain keys hold no data)."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"--expected {path} is not JSON lines: --dedupe replay compares rows, so "
            'it must be the JSON lines given to keo send ({"key", "data"})'
        )


def _row_evidence(stream: Any) -> Any:
    from pyspark.sql import functions as f

    columns = {**_where_in_stream(), "data": f.col("data"), "expected": f.lit(0)}
    return _shaped(stream, ROW_COLUMNS, columns)


def _digest_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """On an executor: each row's digest in place of its data."""
    import pyarrow as pa

    for batch in batches:
        keys = batch.column("key").to_pylist()
        data = batch.column("data")
        digests = pa.array(
            [row_digest(k, d) for k, d in zip(keys, data.to_pylist(), strict=True)],
            type=data.type,
        )
        columns = [digests, *(batch.column(n) for n in ("key", "position", "dropped", "expected"))]
        yield pa.RecordBatch.from_arrays(
            columns, names=["digest", "key", "position", "dropped", "expected"]
        )


def _judge_rows(listed: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """On an executor: the findings of one partition of rows. The extra copies are the later
    ones in stream order, as ``keo audit`` names them."""
    findings = RowFindings(listed=listed)
    for batch in batches:
        for row in batch.to_pylist():
            findings.totals["dropped_by_kcl"] += row["dropped"] or 0
            positions = in_stream_order(_position(p) for p in row["positions"])
            expected = row["expected"] or 0
            findings.add_row(
                row["digest"],
                row["key"],
                expected=expected,
                found=len(positions),
                extra=positions[expected:],
            )
    yield _findings_batch(findings)


# --- the job -----------------------------------------------------------------------------------


def audit(
    spark: Any,
    values: dict[str, str],
    *,
    expected: str | None,
    listed: int = LISTED_KEYS,
    segments: int | None = None,
    encoding: str = "text",
) -> AuditReport:
    settings = producer_settings(values)
    shards = _ready(settings, ledger=True)
    frame = findings_frame(
        spark, values, expected=expected, listed=listed, segments=segments, encoding=encoding
    )
    empty = Findings(listed=listed, expected=0 if expected is not None else None)
    return _collected(frame, empty).report(settings.stream, shards=shards)


def audit_rows(
    spark: Any,
    values: dict[str, str],
    *,
    expected: str,
    encoding: str = "text",
    strict: bool = False,
    listed: int = LISTED_ROWS,
) -> RowAuditReport:
    """The replay audit (``--dedupe replay``): no ledger, rows counted by digest."""
    settings = producer_settings(values)
    shards = _ready(settings, ledger=False)
    frame = row_findings_frame(spark, values, expected=expected, encoding=encoding, listed=listed)
    report = _collected(frame, RowFindings(listed=listed))
    return report.report(settings.stream, shards=shards, strict=strict)


def _ready(settings: ProducerSettings, *, ledger: bool) -> int:
    """The stream's shard count (it exists, before Spark starts reading), the ledger ready if
    it is read."""
    reader = KinesisReader(kinesis_client(settings, for_put=False), settings.stream)
    shards = len(reader.shards())
    if ledger:
        ledger_from(settings).ensure_ready()
    return shards


def _collected(frame: Any, empty: F) -> F:
    """The one row of a findings frame (merged findings, never a key or a row per row)."""
    rows = frame.collect()
    return type(empty).from_json(json.loads(rows[0]["findings"])) if rows else empty


def main(argv: Sequence[str] | None = None, *, session: Any = None) -> int:
    """Run the audit; ``session`` is a SparkSession the caller owns (else the job makes one)."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    values = settings_from_env(stream=args.stream, table=args.table, dedupe=args.dedupe)
    try:
        settings = producer_settings(values)
    except ValueError as exc:
        sys.stderr.write(f"spark_jobs.audit: {exc}\n")
        return ExitCode.CONFIG
    # the mode, read from the settings by its guarantee: which audit, and what it needs
    auditor = guarantee_of(settings).auditor
    if auditor.compares_rows and args.expected is None:
        _parser().error(f"--dedupe {settings.dedupe} needs --expected: the JSON lines the run sent")
    from spark_jobs.session import job_session

    spark = session if session is not None else job_session(args.master, "keo-audit")
    report: AuditReport | RowAuditReport
    try:
        if auditor.compares_rows:
            report = audit_rows(
                spark,
                values,
                expected=args.expected,
                encoding=args.data_encoding,
                strict=args.strict,
                listed=args.list_keys,
            )
        else:
            report = audit(
                spark,
                values,
                expected=args.expected,
                listed=args.list_keys,
                segments=args.ledger_segments,
                encoding=args.data_encoding,
            )
    except ExpectedNotRowsError as exc:
        sys.stderr.write(f"spark_jobs.audit: {exc}\n")
        return ExitCode.USAGE
    except (StreamNotFoundError, ConfigurationError) as exc:
        sys.stderr.write(f"spark_jobs.audit: {exc}\n")
        return ExitCode.CONFIG
    except KeoError as exc:
        sys.stderr.write(f"spark_jobs.audit: {exc}\n")
        return ExitCode.UNAVAILABLE
    finally:
        if session is None:
            spark.stop()
    if args.json:
        sys.stdout.write(json.dumps(report.as_json(), ensure_ascii=False) + "\n")
    (sys.stderr if args.json else sys.stdout).write(report.summary(args.show_keys) + "\n")
    return ExitCode.OK if report.clean else ExitCode.FAILED


if __name__ == "__main__":
    sys.exit(main())
