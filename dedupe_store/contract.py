"""The contract every ledger backend meets: :class:`DynamoDBLedger` in production, an
in-memory fake in tests. Both pass the same contract test suite."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from dedupe_store.records import (
    BatchRecord,
    ClaimRequest,
    ClaimResult,
    LedgerRecord,
    Position,
    RunRecord,
    UpdateResult,
)


class LedgerReader(Protocol):
    """What a reader needs (the API): it never writes the ledger."""

    dedupe_ttl_s: int
    inflight_buckets: int

    @property
    def table_name(self) -> str: ...

    def ensure_ready(self) -> None: ...

    def get(self, stream: str, key: str, *, consistent: bool = True) -> LedgerRecord | None: ...

    def batch_get(self, stream: str, keys: Iterable[str]) -> dict[str, LedgerRecord]: ...

    def last_run(self, stream: str) -> RunRecord | None: ...

    def in_flight_page(
        self,
        stream: str,
        bucket: int,
        *,
        before_ms: int | None,
        limit: int,
        after_lease_ms: int | None = None,
        after_pk: str | None = None,
    ) -> tuple[list[str], tuple[int, str] | None]: ...


class Ledger(LedgerReader, Protocol):
    """The whole ledger: the reads, and the conditional transitions of the protocol."""

    def scan(self, stream: str, *, page_size: int = 1000) -> Iterator[LedgerRecord]: ...

    def stale_in_flight(
        self,
        stream: str,
        *,
        now_ms: int,
        buckets: Sequence[int] | None = None,
        page_size: int = 500,
    ) -> Iterator[str]: ...

    def claim(
        self, request: ClaimRequest, *, owner: str, now_ms: int, lease_ms: int
    ) -> ClaimResult: ...

    def mark_delivered(
        self, record: LedgerRecord, position: Position, *, now_ms: int
    ) -> UpdateResult: ...

    def take_over(
        self, seen: LedgerRecord, *, owner: str, now_ms: int, lease_ms: int
    ) -> ClaimResult: ...

    def release(self, seen: LedgerRecord) -> UpdateResult: ...

    def mark_unverifiable(self, seen: LedgerRecord) -> UpdateResult: ...

    def record_run(
        self, stream: str, *, started_ms: int, finished_ms: int, outcomes: dict[str, int]
    ) -> None: ...

    def completed_batch(
        self, stream: str, query: str, batch_id: int, *, now_ms: int
    ) -> BatchRecord | None: ...

    def mark_batch_complete(
        self, stream: str, query: str, batch_id: int, *, counts: dict[str, int], now_ms: int
    ) -> None: ...
