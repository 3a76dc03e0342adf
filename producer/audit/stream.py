"""The audit: reads the whole stream as any consumer would and proves exactly-once.

The verdict comes from the stream itself (each key once, every expected key present); the
ledger is only compared against it (unknown records, DELIVERED keys missing, positions that
disagree, claims still IN_FLIGHT). Aggregated records are deaggregated, and user records
whose hash falls outside their shard's range are dropped, as KCL drops them.

The verdict is key by key: :func:`key_anomalies` is the one rule, over what the stream, the
ledger and the expected keys say of one key. :class:`Findings` adds keys up (exact counts, and
the first ``listed`` keys of each anomaly in key order) and merges with other findings, so the
report does not depend on how the keys were split:

- ``keo audit`` reads the stream here, in one process (:func:`read_tally`), and :func:`judge`
  adds up every key; it holds every key of the stream, so it stops past ``max_keys``
  (:class:`~producer.errors.AuditTooLargeError`).
- ``spark_jobs.audit`` groups the stream, the ledger and the expected keys by key on Spark;
  each partition adds up its keys on an executor, and the driver gets the merged findings.

A replay-mode stream (``dedupe=replay``) keeps no per-key state in the ledger: its audit,
:func:`audit_rows`, reads the stream the same way (:func:`visible_records`) and compares it with
a multiset of expected rows, ``(key, data)`` counted (:mod:`producer.audit.rows`). A stream
written in both modes (Spark in replay mode, ``keo send`` in key mode) holds rows the ledger
has no key of: the key audit counts those that arrived while one of the stream's replay runs
was writing (:class:`ReplayWindows`) as replay-mode rows, not as unknown, and names the runs.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import chain
from typing import Any, Protocol

from dedupe_store.contract import Ledger
from dedupe_store.records import LedgerRecord, Position, ReplayRun
from dedupe_store.states import LedgerState
from kinesis_store.kpl import UserRecord
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import kcl_view
from producer import metrics
from producer.audit.findings import AnomalyLists, in_stream_order, position_json, position_of_json
from producer.audit.rows import LISTED_ROWS, ExpectedRow, RowAuditReport, RowTally
from producer.errors import AuditTooLargeError

# keys listed per anomaly in a report: the counts are exact, the lists are the first keys
LISTED_KEYS = 1000


class Anomaly(StrEnum):
    """What can be wrong with a key; each counts once per key."""

    DUPLICATE = "duplicate"  # in the stream more than once
    EXPECTED_MISSING = "expected_missing"  # expected, not in the stream
    DELIVERED_MISSING = "missing_delivered"  # DELIVERED in the ledger, not in the stream
    UNKNOWN = "unknown"  # in the stream, not in the ledger
    POSITION_MISMATCH = "position_mismatch"  # DELIVERED at a position the stream does not hold
    IN_FLIGHT = "in_flight"  # a claim not settled
    UNVERIFIABLE = "unverifiable"  # a claim the ledger could not verify within retention


@dataclass
class AuditReport:
    """The verdict. ``counts`` are exact; the key lists hold the first ``listed`` keys of each
    anomaly, in key order."""

    stream: str
    shards: int = 0
    user_records: int = 0
    distinct_keys: int = 0
    dropped_by_kcl: int = 0
    malformed_aggregates: int = 0
    counts: dict[Anomaly, int] = field(default_factory=dict)
    listed: int = LISTED_KEYS
    duplicates: dict[str, list[Position]] = field(default_factory=dict)
    unknown_keys: list[str] = field(default_factory=list)
    missing_delivered: list[str] = field(default_factory=list)
    position_mismatches: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_flight: list[str] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)
    expected: int | None = None
    expected_missing: list[str] = field(default_factory=list)
    # keys the ledger does not know whose records arrived while a replay run of the stream
    # wrote (not anomalies: replay mode keeps no key in the ledger), and those runs
    replay_rows: int = 0
    replay_runs: list[str] = field(default_factory=list)

    def count(self, anomaly: Anomaly) -> int:
        return self.counts.get(anomaly, 0)

    @property
    def anomalies(self) -> int:
        return sum(self.counts.values())

    @property
    def clean(self) -> bool:
        return self.anomalies == 0

    @property
    def missing(self) -> int:
        return self.count(Anomaly.EXPECTED_MISSING) + self.count(Anomaly.DELIVERED_MISSING)

    def summary(self, show_keys: int = 10) -> str:
        """The report for a person: counts, the first ``show_keys`` keys of each anomaly (at
        most the ``listed`` ones), and the verdict."""
        lines = [
            f"keo audit: stream {self.stream}: {self.shards} shards, "
            f"{self.user_records} records, {self.distinct_keys} keys",
            f"  duplicates:           {self.count(Anomaly.DUPLICATE)}",
            f"  missing (expected):   {self.count(Anomaly.EXPECTED_MISSING)}"
            + ("" if self.expected is not None else " (no --expected given)"),
            f"  missing (delivered):  {self.count(Anomaly.DELIVERED_MISSING)}",
            f"  unknown to ledger:    {self.count(Anomaly.UNKNOWN)}",
            f"  position mismatches:  {self.count(Anomaly.POSITION_MISMATCH)}",
            f"  still in flight:      {self.count(Anomaly.IN_FLIGHT)}",
            f"  unverifiable:         {self.count(Anomaly.UNVERIFIABLE)}",
        ]
        if self.replay_rows:
            lines.append(
                f"  replay-mode keys:     {self.replay_rows} (no key in the ledger by design: "
                f"written while replay runs {_some(self.replay_runs, show_keys)} wrote; "
                "audit them with 'keo audit --dedupe replay --expected FILE', FILE the rows "
                "the run was given)"
            )
        if self.dropped_by_kcl:
            lines.append(f"  dropped as KCL would: {self.dropped_by_kcl}")
        if self.malformed_aggregates:
            lines.append(f"  malformed aggregates: {self.malformed_aggregates} (read as KCL does)")
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
            "malformed_aggregates": self.malformed_aggregates,
            "anomalies": self.anomalies,
            "counts": {anomaly.value: self.count(anomaly) for anomaly in Anomaly},
            "listed_keys": self.listed,
            "duplicates": {
                key: [position_json(p) for p in positions]
                for key, positions in self.duplicates.items()
            },
            "duplicate_count": self.count(Anomaly.DUPLICATE),
            "unknown_keys": self.unknown_keys,
            "missing_delivered": self.missing_delivered,
            "position_mismatches": self.position_mismatches,
            "in_flight": self.in_flight,
            "unverifiable": self.unverifiable,
            "expected": self.expected,
            "expected_missing": self.expected_missing,
            "replay_rows": self.replay_rows,
            "replay_runs": self.replay_runs,
            "missing_count": self.missing,
        }


def _some(names: Sequence[str], shown: int) -> str:
    listed = ", ".join(map(repr, names[:shown]))
    return listed if len(names) <= shown else f"{listed} and {len(names) - shown} more"


def key_anomalies(
    positions: Sequence[Position],
    *,
    ledger_read: bool,
    ledger_state: LedgerState | None,
    ledger_position: Position | None,
    expected: bool,
    replay_row: bool = False,
) -> list[tuple[Anomaly, Any]]:
    """The rule: what is wrong with one key, each anomaly with its detail (JSON-ready).

    ``positions`` are the key's records in the stream (those KCL delivers); ``ledger_state``
    and ``ledger_position`` its delivery in the ledger (None: the ledger has no claim of it),
    compared only when ``ledger_read``; ``expected``: the key was listed as sent;
    ``replay_row``: its records arrived while a replay run of the stream wrote (a key the
    ledger does not know is then replay mode's, not unknown).
    """
    found: list[tuple[Anomaly, Any]] = []
    if len(positions) > 1:
        found.append((Anomaly.DUPLICATE, [position_json(p) for p in in_stream_order(positions)]))
    if expected and not positions:
        found.append((Anomaly.EXPECTED_MISSING, None))
    if not ledger_read:
        return found
    if ledger_state is None:
        if positions and not replay_row:
            found.append((Anomaly.UNKNOWN, None))
    elif ledger_state is LedgerState.IN_FLIGHT:
        found.append((Anomaly.IN_FLIGHT, None))
    elif ledger_state is LedgerState.UNVERIFIABLE:
        found.append((Anomaly.UNVERIFIABLE, None))
    elif ledger_state is LedgerState.DELIVERED:
        if not positions:
            found.append((Anomaly.DELIVERED_MISSING, None))
        elif ledger_position is not None and not any(
            _same_record(ledger_position, p) for p in positions
        ):
            detail = {
                "ledger": position_json(ledger_position),
                "stream": [position_json(p) for p in in_stream_order(positions)],
            }
            found.append((Anomaly.POSITION_MISMATCH, detail))
    return found


@dataclass
class Findings:
    """Keys added up: totals, exact counts of each anomaly, and the first ``listed`` keys of
    each (in key order) with their details. Any split of the keys, each part added up and
    the parts merged, gives the same findings: its memory is bounded by ``listed``, never by
    the number of keys."""

    listed: int = LISTED_KEYS
    user_records: int = 0
    distinct_keys: int = 0
    dropped_by_kcl: int = 0
    malformed_aggregates: int = 0
    expected: int | None = None  # None: no expected keys were given
    replay_rows: int = 0  # keys the ledger does not know, written while a replay run wrote
    lists: AnomalyLists[Anomaly] = field(init=False)

    def __post_init__(self) -> None:
        self.lists = AnomalyLists(self.listed)

    @property
    def counts(self) -> dict[Anomaly, int]:
        return self.lists.counts

    @property
    def keys(self) -> dict[Anomaly, list[tuple[str, Any]]]:
        return self.lists.entries

    def add_key(
        self,
        key: str,
        positions: Sequence[Position],
        *,
        ledger_read: bool,
        ledger_state: LedgerState | None,
        ledger_position: Position | None,
        expected: bool,
        replay_row: bool = False,
    ) -> None:
        """One key, with everything known of it (see :func:`key_anomalies`); once per key."""
        if positions:
            self.distinct_keys += 1
            self.user_records += len(positions)
        if expected:
            self.expected = (self.expected or 0) + 1
        if replay_row and ledger_read and ledger_state is None and positions:
            self.replay_rows += 1
        for anomaly, detail in key_anomalies(
            positions,
            ledger_read=ledger_read,
            ledger_state=ledger_state,
            ledger_position=ledger_position,
            expected=expected,
            replay_row=replay_row,
        ):
            self.lists.add(anomaly, key, detail)

    def merge(self, other: Findings) -> None:
        self.user_records += other.user_records
        self.distinct_keys += other.distinct_keys
        self.dropped_by_kcl += other.dropped_by_kcl
        self.malformed_aggregates += other.malformed_aggregates
        if other.expected is not None:
            self.expected = (self.expected or 0) + other.expected
        self.replay_rows += other.replay_rows
        self.lists.merge(other.lists)

    def listed_keys(self, anomaly: Anomaly) -> list[tuple[str, Any]]:
        return self.lists.first(anomaly)

    def report(self, stream: str, *, shards: int, replay_runs: Sequence[str] = ()) -> AuditReport:
        def keys_of(anomaly: Anomaly) -> list[str]:
            return [key for key, _ in self.listed_keys(anomaly)]

        return AuditReport(
            stream,
            shards=shards,
            user_records=self.user_records,
            distinct_keys=self.distinct_keys,
            dropped_by_kcl=self.dropped_by_kcl,
            malformed_aggregates=self.malformed_aggregates,
            counts={anomaly: self.counts.get(anomaly, 0) for anomaly in Anomaly},
            listed=self.listed,
            duplicates={
                key: [position_of_json(p) for p in detail]
                for key, detail in self.listed_keys(Anomaly.DUPLICATE)
            },
            unknown_keys=keys_of(Anomaly.UNKNOWN),
            missing_delivered=keys_of(Anomaly.DELIVERED_MISSING),
            position_mismatches=dict(self.listed_keys(Anomaly.POSITION_MISMATCH)),
            in_flight=keys_of(Anomaly.IN_FLIGHT),
            unverifiable=keys_of(Anomaly.UNVERIFIABLE),
            expected=self.expected,
            expected_missing=keys_of(Anomaly.EXPECTED_MISSING),
            replay_rows=self.replay_rows,
            replay_runs=list(replay_runs)[: self.listed] if self.replay_rows else [],
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON, for findings that travel between processes (Spark's executors)."""
        return {
            "listed": self.listed,
            "user_records": self.user_records,
            "distinct_keys": self.distinct_keys,
            "dropped_by_kcl": self.dropped_by_kcl,
            "malformed_aggregates": self.malformed_aggregates,
            "expected": self.expected,
            "replay_rows": self.replay_rows,
            "counts": self.lists.counts_json(),
            "keys": self.lists.entries_json(),
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Findings:
        findings = cls(
            listed=int(body["listed"]),
            user_records=int(body["user_records"]),
            distinct_keys=int(body["distinct_keys"]),
            dropped_by_kcl=int(body["dropped_by_kcl"]),
            malformed_aggregates=int(body.get("malformed_aggregates", 0)),
            expected=body["expected"],
            replay_rows=int(body.get("replay_rows", 0)),
        )
        findings.lists.load_json(Anomaly, body["counts"], body["keys"])
        return findings


@dataclass
class StreamTally:
    """What a read of the whole stream found: every visible user record's position, by key."""

    stream: str
    shards: int = 0
    user_records: int = 0
    dropped_by_kcl: int = 0
    malformed_aggregates: int = 0
    seen: dict[str, list[Position]] = field(default_factory=lambda: defaultdict(list))
    # each key's first record's arrival (Kinesis's clock, epoch ms): whether a replay run wrote it
    arrival_ms: dict[str, int] = field(default_factory=dict)


def audit_stream(
    reader: KinesisReader,
    ledger: Ledger | None,
    *,
    expected: Iterable[str] | None = None,
    progress: Callable[[int], None] | None = None,
    listed: int = LISTED_KEYS,
    max_keys: int | None = None,
    skew_ms: int = 5_000,
) -> AuditReport:
    """The audit in this process; past ``max_keys`` keys in the stream it raises
    :class:`~producer.errors.AuditTooLargeError` rather than run out of memory. When the
    stream holds keys the ledger does not know, the ledger's replay runs of the stream are
    read (a second scan) and the keys written while one wrote are replay mode's
    (:class:`ReplayWindows`, ``skew_ms`` either side)."""
    tally = read_tally(reader, progress=progress, max_keys=max_keys)
    if ledger is None:
        return judge(tally, None, expected=expected, listed=listed, max_keys=max_keys)
    return judge(
        tally,
        ledger.scan(reader.stream),
        expected=expected,
        listed=listed,
        max_keys=max_keys,
        replay=lambda: ReplayWindows(ledger.replay_runs(reader.stream), skew_ms=skew_ms),
    )


class ReplayWindows:
    """When the replay runs of a stream could put records: each execution of each from its
    start to the end of its lease (no attempt of it puts past it), ``skew_ms`` wider either
    side (the writers' clocks against Kinesis's arrival times). Overlapping windows are
    merged, so that a key is placed in log time however many runs there are (a streaming
    query runs one a micro-batch)."""

    def __init__(self, runs: Iterable[ReplayRun], *, skew_ms: int) -> None:
        windows = sorted(
            (execution.started_at_ms - skew_ms, execution.lease_expires_at_ms + skew_ms, run.run)
            for run in runs
            for execution in run.executions
        )
        self._merged: list[tuple[int, int, set[str]]] = []
        for start_ms, end_ms, run in windows:
            if self._merged and start_ms <= self._merged[-1][1]:
                last_start_ms, last_end_ms, writers = self._merged[-1]
                writers.add(run)
                self._merged[-1] = (last_start_ms, max(last_end_ms, end_ms), writers)
            else:
                self._merged.append((start_ms, end_ms, {run}))
        self._starts = [start_ms for start_ms, _, _ in self._merged]

    def writing_at(self, at_ms: int) -> set[str]:
        """The runs whose (merged) window holds ``at_ms``; none outside every window."""
        index = bisect.bisect_right(self._starts, at_ms) - 1
        if index < 0 or at_ms > self._merged[index][1]:
            return set()
        return self._merged[index][2]


def audit_rows(
    reader: KinesisReader,
    expected: Iterable[ExpectedRow],
    *,
    strict: bool = False,
    progress: Callable[[int], None] | None = None,
    listed: int = LISTED_ROWS,
    max_rows: int | None = None,
) -> RowAuditReport:
    """The replay audit in this process (:mod:`producer.audit.rows`): the stream's records
    against the multiset of ``expected`` rows. No ledger: replay mode keeps no per-key state.
    Past ``max_rows`` rows it raises :class:`~producer.errors.AuditTooLargeError`."""
    tally = RowTally(reader.stream, expected, max_rows=max_rows)
    for record in visible_records(reader, tally, progress):
        tally.add(record.partition_key, record.data, position_of(record))
    return tally.findings(listed=listed).report(reader.stream, shards=tally.shards, strict=strict)


def read_tally(
    reader: KinesisReader,
    *,
    progress: Callable[[int], None] | None = None,
    max_keys: int | None = None,
) -> StreamTally:
    """Read every shard, open and closed, from TRIM_HORIZON to its end, as KCL would."""
    tally = StreamTally(reader.stream)
    for record in visible_records(reader, tally, progress):
        tally.user_records += 1
        tally.seen[record.partition_key].append(position_of(record))
        tally.arrival_ms.setdefault(record.partition_key, record.arrival_ms)
        if max_keys is not None and len(tally.seen) > max_keys:
            raise AuditTooLargeError(f"stream {reader.stream}", max_keys=max_keys)
    return tally


class ReadCounts(Protocol):
    shards: int
    dropped_by_kcl: int
    malformed_aggregates: int


def visible_records(
    reader: KinesisReader, counts: ReadCounts, progress: Callable[[int], None] | None = None
) -> Iterator[UserRecord]:
    """Every user record KCL delivers: every shard, open and closed, in shard-id order, each
    from TRIM_HORIZON to its end, aggregates split as the KCL splits them. Sets
    ``counts.shards``, counts the records KCL drops (every member of an aggregate with a member
    outside its shard's hash range, :func:`kinesis_store.shards.kcl_view`) in
    ``counts.dropped_by_kcl`` and the malformed aggregates read (their members before the
    fault delivered, the rest dropped, or the record delivered raw) in
    ``counts.malformed_aggregates``; ``progress(1)`` after each shard."""
    shards = sorted(reader.shards(), key=lambda shard: shard.shard_id)
    counts.shards = len(shards)
    for shard in shards:
        for record, delivered in kcl_view(reader.read_all(shard.shard_id), shard):
            if delivered:
                yield record
            else:
                counts.dropped_by_kcl += 1
                metrics.READ_DROPPED.labels(reader.stream, metrics.DROPPED_OUTSIDE_SHARD).inc()
        counts.malformed_aggregates += reader.shard_reads(shard.shard_id).malformed_aggregates
        if progress is not None:
            progress(1)


def position_of(record: UserRecord) -> Position:
    return Position(record.shard_id, record.sequence_number, record.sub_sequence_number)


def judge(
    tally: StreamTally,
    ledger_records: Iterable[LedgerRecord] | None,
    *,
    expected: Iterable[str] | None = None,
    listed: int = LISTED_KEYS,
    max_keys: int | None = None,
    replay: Callable[[], ReplayWindows] | None = None,
) -> AuditReport:
    """The verdict on a read stream: keys twice, expected keys absent and, given the ledger's
    records of the stream, everything the ledger and the stream disagree on. A key the ledger
    does not know whose first record arrived within a window of ``replay()``
    (:class:`ReplayWindows`, asked only when the stream holds such a key) is replay mode's.
    Past ``max_keys`` keys in the ledger it raises
    :class:`~producer.errors.AuditTooLargeError`."""
    seen = tally.seen
    in_ledger: dict[str, LedgerRecord] = {}
    for record in ledger_records if ledger_records is not None else ():
        in_ledger[record.key] = record
        if max_keys is not None and len(in_ledger) > max_keys:
            raise AuditTooLargeError(f"the ledger of stream {tally.stream}", max_keys=max_keys)
    wanted = set(expected) if expected is not None else set()
    windows = replay() if replay is not None and any(k not in in_ledger for k in seen) else None
    replay_runs: set[str] = set()
    findings = Findings(
        listed=listed,
        dropped_by_kcl=tally.dropped_by_kcl,
        malformed_aggregates=tally.malformed_aggregates,
        expected=0 if expected is not None else None,
    )
    # every key anyone knows of, once: the stream's, then the ledger's, then the expected
    for key in chain(
        seen,
        (k for k in in_ledger if k not in seen),
        (k for k in wanted if k not in seen and k not in in_ledger),
    ):
        found = in_ledger.get(key)
        writers = (
            windows.writing_at(tally.arrival_ms[key])
            if windows is not None and found is None and key in tally.arrival_ms
            else set()
        )
        replay_runs.update(writers)
        findings.add_key(
            key,
            seen.get(key, ()),
            ledger_read=ledger_records is not None,
            ledger_state=found.state if found is not None else None,
            ledger_position=found.position if found is not None else None,
            expected=key in wanted,
            replay_row=bool(writers),
        )
    return findings.report(tally.stream, shards=tally.shards, replay_runs=sorted(replay_runs))


def _same_record(a: Position, b: Position) -> bool:
    # sequence numbers are unique per shard only; compare them as integers
    return (
        a.shard_id == b.shard_id
        and int(a.sequence_number) == int(b.sequence_number)
        and (a.sub_sequence_number or 0) == (b.sub_sequence_number or 0)
    )
