"""The contract's Spark batch records (``dedupe_store.batches``): a streaming query's batch marked
complete for the dedupe window, per query, stream and batch.
"""

from __future__ import annotations

from dedupe_store.contract import Ledger
from dedupe_store.records import BatchRecord
from ledger_contract.staging import STREAM, T0_MS, TTL_S


def test_a_batch_is_complete_once_marked_until_the_dedupe_window_ends(ledger: Ledger) -> None:
    # GIVEN a streaming query's batch 7, not yet recorded
    assert ledger.completed_batch(STREAM, "query-a", 7, now_ms=T0_MS) is None
    # WHEN its driver marks it complete
    ledger.mark_batch_complete(STREAM, "query-a", 7, counts={"sent": 3}, now_ms=T0_MS)
    # THEN a replay of that batch sees it complete with its counts, until the dedupe TTL ends
    assert ledger.completed_batch(STREAM, "query-a", 7, now_ms=T0_MS + 1) == BatchRecord(
        STREAM, "query-a", 7, T0_MS, {"sent": 3}
    )
    assert ledger.completed_batch(STREAM, "query-a", 7, now_ms=T0_MS + TTL_S * 1000) is None


def test_batch_records_are_per_query_stream_and_batch_and_never_read_as_keys(
    ledger: Ledger,
) -> None:
    # GIVEN batch 1 of query-a on STREAM is complete
    ledger.mark_batch_complete(STREAM, "query-a", 1, counts={}, now_ms=T0_MS)
    # THEN another batch, another query or another stream is not
    assert ledger.completed_batch(STREAM, "query-a", 2, now_ms=T0_MS) is None
    assert ledger.completed_batch(STREAM, "query-b", 1, now_ms=T0_MS) is None
    assert ledger.completed_batch("other-stream", "query-a", 1, now_ms=T0_MS) is None
    # AND the audit's scan of the stream's keys does not see it
    assert list(ledger.scan(STREAM)) == []
