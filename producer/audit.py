"""The audit: reads the whole stream as any consumer would and proves exactly-once.

The verdict comes from the stream itself (each key once, every expected key present); the
ledger is only compared against it (unknown records, DELIVERED keys missing, positions that
disagree, claims still IN_FLIGHT). Aggregated records are deaggregated, and user records
whose hash falls outside their shard's range are dropped, as KCL drops them.

Reading and judging are apart: :func:`read_tally` reads the stream here, in one process
(``keo audit``); ``spark_jobs.audit`` reads it on Spark, one task per shard. Either hands a
:class:`StreamTally` to :func:`judge`, the one comparison, which gives the same report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dedupe_store.contract import Ledger
from dedupe_store.records import LedgerRecord, Position
from dedupe_store.states import LedgerState
from producer.kinesis import KinesisReader
from producer.readback import visible_to_kcl


@dataclass
class AuditReport:
    stream: str
    shards: int = 0
    user_records: int = 0
    distinct_keys: int = 0
    dropped_by_kcl: int = 0
    duplicates: dict[str, list[Position]] = field(default_factory=dict)
    unknown_keys: list[str] = field(default_factory=list)
    missing_delivered: list[str] = field(default_factory=list)
    position_mismatches: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_flight: list[str] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)
    expected: int | None = None
    expected_missing: list[str] = field(default_factory=list)

    @property
    def anomalies(self) -> int:
        return (
            len(self.duplicates)
            + len(self.unknown_keys)
            + len(self.missing_delivered)
            + len(self.position_mismatches)
            + len(self.in_flight)
            + len(self.unverifiable)
            + len(self.expected_missing)
        )

    @property
    def clean(self) -> bool:
        return self.anomalies == 0

    def summary(self, show_keys: int = 10) -> str:
        """The report for a person: counts, the first ``show_keys`` keys of each anomaly, and
        the verdict."""
        lines = [
            f"keo audit: stream {self.stream}: {self.shards} shards, "
            f"{self.user_records} records, {self.distinct_keys} keys",
            f"  duplicates:           {len(self.duplicates)}",
            f"  missing (expected):   {len(self.expected_missing)}"
            + ("" if self.expected is not None else " (no --expected given)"),
            f"  missing (delivered):  {len(self.missing_delivered)}",
            f"  unknown to ledger:    {len(self.unknown_keys)}",
            f"  position mismatches:  {len(self.position_mismatches)}",
            f"  still in flight:      {len(self.in_flight)}",
            f"  unverifiable:         {len(self.unverifiable)}",
        ]
        if self.dropped_by_kcl:
            lines.append(f"  dropped as KCL would: {self.dropped_by_kcl}")
        for name, keys in (
            ("duplicate", list(self.duplicates)),
            ("missing", self.expected_missing + self.missing_delivered),
            ("unknown", self.unknown_keys),
            ("in flight", self.in_flight),
        ):
            if keys:
                lines.append(f"  {name}: {', '.join(map(repr, keys[:show_keys]))}")
        lines.append("  verdict: " + ("CLEAN" if self.clean else f"{self.anomalies} ANOMALIES"))
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "clean": self.clean,
            "shards": self.shards,
            "user_records": self.user_records,
            "distinct_keys": self.distinct_keys,
            "dropped_by_kcl": self.dropped_by_kcl,
            "duplicates": {
                key: [_position_json(p) for p in positions]
                for key, positions in self.duplicates.items()
            },
            "duplicate_count": len(self.duplicates),
            "unknown_keys": self.unknown_keys,
            "missing_delivered": self.missing_delivered,
            "position_mismatches": self.position_mismatches,
            "in_flight": self.in_flight,
            "unverifiable": self.unverifiable,
            "expected": self.expected,
            "expected_missing": self.expected_missing,
            "missing_count": len(self.expected_missing) + len(self.missing_delivered),
        }


@dataclass
class StreamTally:
    """What a read of the whole stream found: every visible user record's position, by key."""

    stream: str
    shards: int = 0
    user_records: int = 0
    dropped_by_kcl: int = 0
    seen: dict[str, list[Position]] = field(default_factory=lambda: defaultdict(list))


def audit_stream(
    reader: KinesisReader,
    ledger: Ledger | None,
    *,
    expected: Iterable[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> AuditReport:
    tally = read_tally(reader, progress=progress)
    return judge(
        tally, ledger.scan(reader.stream) if ledger is not None else None, expected=expected
    )


def read_tally(
    reader: KinesisReader, *, progress: Callable[[int], None] | None = None
) -> StreamTally:
    """Read every shard, open and closed, from TRIM_HORIZON to its end, as KCL would."""
    tally = StreamTally(reader.stream)
    shards = reader.shards()
    tally.shards = len(shards)
    for shard in shards:
        for record in reader.read_all(shard.shard_id):
            if not visible_to_kcl(record, shard):
                tally.dropped_by_kcl += 1
                continue
            tally.user_records += 1
            tally.seen[record.partition_key].append(
                Position(record.shard_id, record.sequence_number, record.sub_sequence_number)
            )
        if progress is not None:
            progress(1)
    return tally


def judge(
    tally: StreamTally,
    ledger_records: Iterable[LedgerRecord] | None,
    *,
    expected: Iterable[str] | None = None,
) -> AuditReport:
    """The verdict on a read stream: keys twice, expected keys absent and, given the ledger's
    records of the stream, everything the ledger and the stream disagree on."""
    seen = tally.seen
    report = AuditReport(
        tally.stream,
        shards=tally.shards,
        user_records=tally.user_records,
        distinct_keys=len(seen),
        dropped_by_kcl=tally.dropped_by_kcl,
    )
    report.duplicates = {
        key: sorted(pos, key=_stream_order) for key, pos in seen.items() if len(pos) > 1
    }

    if expected is not None:
        wanted = list(dict.fromkeys(expected))
        report.expected = len(wanted)
        report.expected_missing = [key for key in wanted if key not in seen]

    if ledger_records is not None:
        _compare_with_ledger(report, ledger_records, seen)
    return report


def _compare_with_ledger(
    report: AuditReport, records: Iterable[LedgerRecord], seen: dict[str, list[Position]]
) -> None:
    known: set[str] = set()
    for record in records:
        known.add(record.key)
        positions = seen.get(record.key)
        if record.state is LedgerState.IN_FLIGHT:
            report.in_flight.append(record.key)
        elif record.state is LedgerState.UNVERIFIABLE:
            report.unverifiable.append(record.key)
        elif record.state is LedgerState.DELIVERED:
            if not positions:
                report.missing_delivered.append(record.key)
            elif record.position is not None and not any(
                _same_record(record.position, p) for p in positions
            ):
                report.position_mismatches[record.key] = {
                    "ledger": _position_json(record.position),
                    "stream": [_position_json(p) for p in positions],
                }
    report.unknown_keys = sorted(key for key in seen if key not in known)


def _same_record(a: Position, b: Position) -> bool:
    # sequence numbers are unique per shard only; compare them as integers
    return (
        a.shard_id == b.shard_id
        and int(a.sequence_number) == int(b.sequence_number)
        and (a.sub_sequence_number or 0) == (b.sub_sequence_number or 0)
    )


def _stream_order(position: Position) -> tuple[str, int, int]:
    return (position.shard_id, int(position.sequence_number), position.sub_sequence_number or 0)


def _position_json(position: Position) -> dict[str, Any]:
    body: dict[str, Any] = {
        "shard_id": position.shard_id,
        "sequence_number": position.sequence_number,
    }
    if position.sub_sequence_number is not None:
        body["sub_sequence_number"] = position.sub_sequence_number
    return body
