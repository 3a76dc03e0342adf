"""The replay audit (``keo audit --dedupe replay``): the stream against a multiset of expected
rows. Pure: no I/O.

Replay mode (DESIGN.md "Replay mode") delivers what a run without failures would have written.
Its identity is the row, ``(key, data)``, counted as a multiset: two identical rows are two
records, and a key sent again with other data is another row. So the audit counts copies, row
by row; :func:`row_anomaly` is the one rule::

    a row expected E times, found F times in the stream (the records KCL delivers)
      F == E        matched
      F <  E        MISSING      E - F copies missing
      F >  E > 0    DUPLICATED   F - E extra copies, with their positions
      F >  E == 0   UNEXPECTED   F copies no one expected: as a rule another writer's rows;
                                 they fail the audit only when it is strict

A row is held as a 16-byte BLAKE2b digest of its key and data (:func:`row_digest`), with its
key and counts, never its data. :class:`RowTally` counts the expected rows first, then the
stream's records in stream order: a copy within its row's expected count is only counted, a
copy past it keeps its position. So the *extra* copies a report names are the later ones in
stream order (shard by shard in shard-id order, then by sequence number); the earlier ones are
those counted as expected.

:class:`RowFindings` adds rows up as :class:`producer.audit.stream.Findings` adds keys: exact counts,
the first ``listed`` rows of each anomaly in (key, digest) order, mergeable. ``keo audit``
adds up its :class:`RowTally`; ``spark_jobs.audit`` groups the stream and the expected rows by
digest on Spark, adds up each partition on an executor and merges the parts: the same report.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dedupe_store.records import Position
from producer.audit.findings import AnomalyLists, Entry, position_json
from producer.errors import AuditTooLargeError

__all__ = [
    "LISTED_ROWS",
    "ExpectedRow",
    "RowAnomaly",
    "RowAuditReport",
    "RowFindings",
    "RowTally",
    "row_anomaly",
    "row_digest",
]

# rows listed per anomaly in a report: the counts are exact, the lists are the first rows
LISTED_ROWS = 1000
ROW_DIGEST_BYTES = 16


def row_digest(key: str, data: bytes) -> bytes:
    """The row's identity: BLAKE2b-128 over the key's length, the key and the data.

    The length goes first so that no two rows hash the same bytes (with a separator, a key that
    holds it would read as another split). A key with an unpaired surrogate (which keo send
    refuses, and the stream never holds) is hashed as it is, so it is reported missing."""
    key_bytes = key.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(digest_size=ROW_DIGEST_BYTES)
    digest.update(len(key_bytes).to_bytes(4, "big"))
    digest.update(key_bytes)
    digest.update(data)
    return digest.digest()


class RowAnomaly(StrEnum):
    """What can be wrong with a row; each counts once per row."""

    MISSING = "missing"  # expected more times than the stream holds it
    DUPLICATED = "duplicated"  # expected, and in the stream more times than expected
    UNEXPECTED = "unexpected"  # in the stream, never expected


def row_anomaly(expected: int, found: int) -> RowAnomaly | None:
    """The rule: what is wrong with a row expected ``expected`` times and found ``found``
    times; the copies concerned are always ``abs(found - expected)``."""
    if found < expected:
        return RowAnomaly.MISSING
    if found == expected:
        return None
    return RowAnomaly.DUPLICATED if expected else RowAnomaly.UNEXPECTED


@dataclass(frozen=True, slots=True)
class ExpectedRow:
    """One expected copy of a row; ``line``: where ``--expected`` holds it (from 1)."""

    key: str
    data: bytes
    line: int | None = None


def _by_key_then_digest(entry: Entry) -> tuple[str, str]:
    return entry[1]["key"], entry[0]


# what a report adds up, besides the anomalies: copies in the stream, distinct rows found,
# expected copies, distinct rows expected, rows found as many times as expected, and records
# KCL drops (every member of an aggregate with a member outside its shard's hash range), and
# malformed aggregates read as the KCL reads them
TOTALS = (
    "user_records",
    "found_rows",
    "expected_records",
    "expected_rows",
    "matched_rows",
    "dropped_by_kcl",
    "malformed_aggregates",
)


@dataclass
class RowFindings:
    """Rows added up: ``totals`` (:data:`TOTALS`), exact counts of rows and of ``copies`` per
    anomaly, and the first ``listed`` rows of each (in key order, then digest) with their
    details. Any split of the rows, each part added up and the parts merged, gives the same
    findings."""

    listed: int = LISTED_ROWS
    totals: Counter[str] = field(default_factory=Counter)
    copies: Counter[RowAnomaly] = field(default_factory=Counter)
    lists: AnomalyLists[RowAnomaly] = field(init=False)

    def __post_init__(self) -> None:
        self.lists = AnomalyLists(self.listed, _by_key_then_digest)

    def add_row(
        self,
        digest: bytes,
        key: str,
        *,
        expected: int,
        found: int,
        extra: Sequence[Position] = (),
        line: int | None = None,
    ) -> None:
        """One row, once: its copies expected and found, the positions of the copies past the
        expected count (in stream order), and its first line in ``--expected``."""
        anomaly = row_anomaly(expected, found)
        self.totals.update(
            user_records=found,
            found_rows=int(found > 0),
            expected_records=expected,
            expected_rows=int(expected > 0),
            matched_rows=int(anomaly is None and expected > 0),
        )
        if anomaly is None:
            return
        copies = abs(found - expected)
        self.copies[anomaly] += copies
        detail: dict[str, Any] = {"key": key, "expected": expected, "found": found}
        if line is not None:
            detail["line"] = line
        if anomaly is RowAnomaly.MISSING:
            detail["missing"] = copies
        else:
            detail["extra"] = copies
            detail["positions"] = [position_json(p) for p in extra]
        self.lists.add(anomaly, digest.hex(), detail)

    def merge(self, other: RowFindings) -> None:
        self.totals.update(other.totals)
        self.copies.update(other.copies)
        self.lists.merge(other.lists)

    def report(self, stream: str, *, shards: int, strict: bool = False) -> RowAuditReport:
        return RowAuditReport(
            stream,
            strict=strict,
            shards=shards,
            totals={name: self.totals[name] for name in TOTALS},
            counts={anomaly: self.lists.count(anomaly) for anomaly in RowAnomaly},
            copies={anomaly: self.copies[anomaly] for anomaly in RowAnomaly},
            listed=self.listed,
            rows={
                anomaly: [{"digest": name, **detail} for name, detail in self.lists.first(anomaly)]
                for anomaly in RowAnomaly
            },
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON, for findings that travel between processes (Spark's executors)."""
        return {
            "listed": self.listed,
            "totals": dict(self.totals),
            "copies": {anomaly.value: n for anomaly, n in self.copies.items()},
            "counts": self.lists.counts_json(),
            "rows": self.lists.entries_json(),
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> RowFindings:
        findings = cls(
            listed=int(body["listed"]),
            totals=Counter({name: int(n) for name, n in body["totals"].items()}),
            copies=Counter({RowAnomaly(name): int(n) for name, n in body["copies"].items()}),
        )
        findings.lists.load_json(RowAnomaly, body["counts"], body["rows"])
        return findings


@dataclass(slots=True)
class _Row:
    key: str
    expected: int = 0
    found: int = 0
    line: int | None = None  # the first line of --expected that holds it
    extra: list[Position] | None = None  # the copies found past ``expected``, in stream order


class RowTally:
    """The expected rows, then the stream's records, counted row by row (by digest).

    It holds every row either side names (about 300 bytes a row: digest, key, counts); past
    ``max_rows`` rows it raises :class:`~producer.errors.AuditTooLargeError`."""

    def __init__(
        self, stream: str, expected: Iterable[ExpectedRow], *, max_rows: int | None = None
    ) -> None:
        self.stream = stream
        self.shards = 0
        self.dropped_by_kcl = 0
        self.malformed_aggregates = 0
        self._max_rows = max_rows
        self._rows: dict[bytes, _Row] = {}
        for row in expected:
            held = self._hold(row.key, row.data, source="the expected rows")
            held.expected += 1
            if held.line is None:
                held.line = row.line

    def add(self, key: str, data: bytes, position: Position) -> None:
        """One record of the stream that KCL delivers, in stream order."""
        row = self._hold(key, data, source=f"stream {self.stream} with the expected rows")
        row.found += 1
        if row.found > row.expected:
            if row.extra is None:
                row.extra = []
            row.extra.append(position)

    def _hold(self, key: str, data: bytes, *, source: str) -> _Row:
        digest = row_digest(key, data)
        row = self._rows.get(digest)
        if row is None:
            if self._max_rows is not None and len(self._rows) >= self._max_rows:
                raise AuditTooLargeError(source, max_keys=self._max_rows, unit="rows")
            row = self._rows[digest] = _Row(key)
        return row

    def findings(self, *, listed: int = LISTED_ROWS) -> RowFindings:
        findings = RowFindings(
            listed=listed,
            totals=Counter(
                dropped_by_kcl=self.dropped_by_kcl, malformed_aggregates=self.malformed_aggregates
            ),
        )
        for digest, row in self._rows.items():
            findings.add_row(
                digest,
                row.key,
                expected=row.expected,
                found=row.found,
                extra=row.extra or (),
                line=row.line,
            )
        return findings


@dataclass
class RowAuditReport:
    """The replay audit's verdict. ``counts`` are rows, ``copies`` the copies concerned (missing,
    extra, unexpected); the row lists hold the first ``listed`` rows of each anomaly, in key
    order. Missing and duplicated rows fail the audit; unexpected rows only when ``strict``."""

    stream: str
    strict: bool = False
    shards: int = 0
    totals: dict[str, int] = field(default_factory=dict)
    counts: dict[RowAnomaly, int] = field(default_factory=dict)
    copies: dict[RowAnomaly, int] = field(default_factory=dict)
    listed: int = LISTED_ROWS
    rows: dict[RowAnomaly, list[dict[str, Any]]] = field(default_factory=dict)

    def count(self, anomaly: RowAnomaly) -> int:
        return self.counts.get(anomaly, 0)

    @property
    def failing(self) -> tuple[RowAnomaly, ...]:
        """The anomalies that fail the audit."""
        if self.strict:
            return tuple(RowAnomaly)
        return RowAnomaly.MISSING, RowAnomaly.DUPLICATED

    @property
    def anomalies(self) -> int:
        """Rows that fail the audit."""
        return sum(self.count(anomaly) for anomaly in self.failing)

    @property
    def clean(self) -> bool:
        return self.anomalies == 0

    def summary(self, show_rows: int = 10) -> str:
        """The report for a person: counts, the first ``show_rows`` rows of each anomaly (at
        most the ``listed`` ones), and the verdict."""
        total = self.totals.get
        copies = self.copies.get
        unexpected = self.count(RowAnomaly.UNEXPECTED)
        lines = [
            f"keo audit: stream {self.stream} (replay: rows counted): {self.shards} shards, "
            f"{total('user_records', 0)} records, {total('found_rows', 0)} distinct rows",
            f"  expected:    {total('expected_records', 0)} records, "
            f"{total('expected_rows', 0)} distinct rows, {total('matched_rows', 0)} found as "
            "many times as expected",
            f"  missing:     {self.count(RowAnomaly.MISSING)} rows "
            f"({copies(RowAnomaly.MISSING, 0)} copies missing)",
            f"  duplicated:  {self.count(RowAnomaly.DUPLICATED)} rows "
            f"({copies(RowAnomaly.DUPLICATED, 0)} extra copies)",
            f"  unexpected:  {unexpected} rows ({copies(RowAnomaly.UNEXPECTED, 0)} copies)"
            + ("" if self.strict or not unexpected else ": not a failure without --strict"),
        ]
        if total("dropped_by_kcl", 0):
            lines.append(f"  dropped as KCL would: {total('dropped_by_kcl', 0)}")
        if total("malformed_aggregates", 0):
            lines.append(
                f"  malformed aggregates: {total('malformed_aggregates', 0)} (read as KCL does)"
            )
        for anomaly in RowAnomaly:
            shown = self.rows.get(anomaly, [])[:show_rows]
            if shown:
                lines.append(f"  {anomaly.value}: {', '.join(_row_text(r) for r in shown)}")
        lines.append("  verdict: " + ("CLEAN" if self.clean else f"{self.anomalies} ANOMALIES"))
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "dedupe": "replay",
            "strict": self.strict,
            "clean": self.clean,
            "shards": self.shards,
            **self.totals,
            "anomalies": self.anomalies,
            "counts": {anomaly.value: self.count(anomaly) for anomaly in RowAnomaly},
            "copies": {anomaly.value: self.copies.get(anomaly, 0) for anomaly in RowAnomaly},
            "listed_rows": self.listed,
            **{anomaly.value: self.rows.get(anomaly, []) for anomaly in RowAnomaly},
        }


def _row_text(row: dict[str, Any]) -> str:
    """A row in the summary: its key, where --expected holds it, the start of its digest, and
    its copies found of those expected."""
    where = f"line {row['line']}, " if "line" in row else ""
    found = f"found {row['found']}" + (f" of {row['expected']}" if row["expected"] else "")
    return f"{row['key']!r} ({where}{row['digest'][:8]}): {found}"
