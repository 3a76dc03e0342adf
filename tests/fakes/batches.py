"""``InMemoryBatchLedger``: Spark's batch records and the reconciler's last run of
:class:`dedupe_store.contract.BatchLedger` in dicts, the part of
:class:`fakes.ledger.InMemoryLedger` that keeps them.

Same semantics as :class:`dedupe_store.batches.DynamoDBBatchLedger`: unconditional puts, a
batch record past its expiry read as absent. It shares the ledger's lock (reentrant) and its
fault knobs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dedupe_store.records import BatchRecord, RunRecord


class InMemoryBatchLedger:
    """Batch and run records. Thread-safe: the ledger's lock around every call."""

    def __init__(
        self, lock: threading.RLock, read_fault: Callable[[str], None], *, dedupe_ttl_s: int
    ) -> None:
        """``read_fault``: raises the fault injected on the ledger for a call, if any."""
        self._lock = lock
        self._read_fault = read_fault
        self.dedupe_ttl_s = dedupe_ttl_s
        self._run_records: dict[str, RunRecord] = {}
        self._batches: dict[tuple[str, str, int], tuple[BatchRecord, int]] = {}  # expires_at_s

    def record_run(
        self, stream: str, *, started_ms: int, finished_ms: int, outcomes: dict[str, int]
    ) -> None:
        with self._lock:
            self._read_fault("record_run")
            self._run_records[stream] = RunRecord(stream, started_ms, finished_ms, dict(outcomes))

    def last_run(self, stream: str) -> RunRecord | None:
        with self._lock:
            return self._run_records.get(stream)

    def completed_batch(
        self, stream: str, query: str, batch_id: int, *, now_ms: int
    ) -> BatchRecord | None:
        with self._lock:
            self._read_fault("completed_batch")
            found = self._batches.get((stream, query, batch_id))
        if found is None or found[1] <= now_ms // 1000:
            return None
        return found[0]

    def mark_batch_complete(
        self, stream: str, query: str, batch_id: int, *, counts: dict[str, int], now_ms: int
    ) -> None:
        with self._lock:
            self._read_fault("mark_batch_complete")
            record = BatchRecord(stream, query, batch_id, now_ms, dict(counts))
            self._batches[(stream, query, batch_id)] = (record, now_ms // 1000 + self.dedupe_ttl_s)
