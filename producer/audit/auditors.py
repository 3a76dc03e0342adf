"""Which audit proves a stream exactly-once, by the guarantee it was written in: the
:class:`Auditor` each :class:`producer.guarantees.Guarantee` names (``Guarantee.auditor``).

::

    guarantee_of(settings).auditor
      ├─ KEY_AUDIT   key mode: each key in the stream once, compared with the ledger
      │              (audit_stream); expected keys optional
      └─ ROW_AUDIT   replay mode: each expected row, key and data, as many times as it was
                     sent (audit_rows); the expected rows required, the ledger not read
                     (replay mode keeps no per-key state)

An entry point (``keo audit``) hands the auditor its :class:`AuditSources`, each opened when
asked, and the auditor asks for what its audit reads and nothing else: the row audit opens no
ledger and reads no expected keys. ``python -m spark_jobs.audit`` judges by the same rules on
Spark, choosing its job by :attr:`Auditor.compares_rows`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from dedupe_store.contract import Ledger
from kinesis_store.reader import KinesisReader
from producer.audit.rows import ExpectedRow, RowAuditReport
from producer.audit.stream import AuditReport, audit_rows, audit_stream

__all__ = [
    "KEY_AUDIT",
    "ROW_AUDIT",
    "AuditLimits",
    "AuditSources",
    "AuditVerdict",
    "Auditor",
]


class AuditVerdict(Protocol):
    """What an audit reports, whichever it is."""

    @property
    def clean(self) -> bool: ...

    def summary(self, show: int = 10, /) -> str:
        """The report for a person, ``show`` keys (or rows) listed per anomaly."""
        ...

    def as_json(self) -> dict[str, Any]: ...


class AuditSources(Protocol):
    """What an audit may read, each opened when the auditor asks for it."""

    def expected_keys(self) -> list[str] | None:
        """The keys that must each be in the stream (None: none given)."""
        ...

    def expected_rows(self) -> Iterable[ExpectedRow]:
        """The rows a replay-mode write sent, key and data."""
        ...

    def reader(self, *, then: str) -> KinesisReader:
        """The stream's reader; ``then``: what the audit does once every shard is read."""
        ...

    def ledger(self) -> Ledger:
        """The stream's ledger, ready to be read."""
        ...


@dataclass(frozen=True)
class AuditLimits:
    """How much an audit holds and lists, and what it reports as it reads."""

    listed: int  # keys (rows) listed per anomaly in the report; the counts are exact
    max_items: int | None = None  # keys (or distinct rows) held: past it, AuditTooLargeError
    strict: bool = False  # the row audit: rows nobody expected fail it too
    skew_ms: int = 5_000  # the key audit: the writers' clocks against Kinesis's arrival times
    progress: Callable[[int], None] | None = None  # called with 1 after each shard


class Auditor(Protocol):
    @property
    def compares_rows(self) -> bool:
        """True: the audit counts rows (key and data) against the expected rows, which it
        needs, and reads no ledger; False: each key once, against the ledger."""
        ...

    def audit(self, sources: AuditSources, limits: AuditLimits) -> AuditVerdict:
        """The audit in this process."""
        ...


@dataclass(frozen=True)
class _KeyAudit:
    compares_rows: bool = False

    def audit(self, sources: AuditSources, limits: AuditLimits) -> AuditReport:
        # the expected keys first: past max_items the audit stops before reading anything
        expected = sources.expected_keys()
        reader = sources.reader(then="comparing with the ledger")
        return audit_stream(
            reader,
            sources.ledger(),
            expected=expected,
            progress=limits.progress,
            listed=limits.listed,
            max_keys=limits.max_items,
            skew_ms=limits.skew_ms,
        )


@dataclass(frozen=True)
class _RowAudit:
    compares_rows: bool = True

    def audit(self, sources: AuditSources, limits: AuditLimits) -> RowAuditReport:
        reader = sources.reader(then="comparing the rows")
        return audit_rows(
            reader,
            sources.expected_rows(),
            strict=limits.strict,
            progress=limits.progress,
            listed=limits.listed,
            max_rows=limits.max_items,
        )


KEY_AUDIT: Final[Auditor] = _KeyAudit()
ROW_AUDIT: Final[Auditor] = _RowAudit()
