"""``DynamoDBBatchLedger``: Spark's batch records and the reconciler's last run, on the
ledger's table.

Its kinds of item::

    batch item  pk "__keo__/spark-batch/<stream>/<query>/<batch id>"
                                                      COMPLETE, when, the batch's counts; TTL
    run record  pk "__keo__/reconcile-run/<stream>"   the reconciler's last run over the stream

Both are put unconditionally: every writer of one writes the same fact (a batch COMPLETE), or
the latest (a run). Neither is a key item: their keys start with "__keo__/", which
"<stream>#<key>" never does (a stream name has no "/" and no "#").
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from dedupe_store.expressions import TTL_ATTRIBUTE
from dedupe_store.names import check_stream_name
from dedupe_store.records import BatchRecord, RunRecord
from dedupe_store.table import DynamoDBTable

if TYPE_CHECKING:
    from dedupe_store.contract import BatchLedger

__all__ = [
    "BATCH_COMPLETE",
    "BatchesHandedOn",
    "DynamoDBBatchLedger",
    "reconcile_run_pk",
    "spark_batch_pk",
]

BATCH_COMPLETE = "COMPLETE"


# Built from a stream name that passed the rule (no "/", no "#"): never another kind's key.


def reconcile_run_pk(stream: str) -> str:
    return f"__keo__/reconcile-run/{check_stream_name(stream)}"


def spark_batch_pk(stream: str, query: str, batch_id: int) -> str:
    return f"__keo__/spark-batch/{check_stream_name(stream)}/{query}/{batch_id}"


class DynamoDBBatchLedger:
    """The batch and run records of :class:`dedupe_store.contract.BatchLedger` on the ledger's
    table. Thread-safe: :class:`dedupe_store.ledger.DynamoDBLedger` holds one and hands its
    calls on."""

    def __init__(self, table: DynamoDBTable, *, dedupe_ttl_s: int) -> None:
        self._table = table
        self.dedupe_ttl_s = dedupe_ttl_s

    # --- the reconciler's last run ----------------------------------------------------------

    def record_run(
        self, stream: str, *, started_ms: int, finished_ms: int, outcomes: dict[str, int]
    ) -> None:
        """Remember the reconciler's last run over ``stream`` (read by the API's summary)."""
        with self._table.translated("record a run"):
            self._table.client.put_item(
                TableName=self._table.table_name,
                Item={
                    "pk": {"S": reconcile_run_pk(stream)},
                    "started_at_ms": {"N": str(started_ms)},
                    "finished_at_ms": {"N": str(finished_ms)},
                    "outcomes": {"S": json.dumps(outcomes, sort_keys=True)},
                },
            )

    def last_run(self, stream: str) -> RunRecord | None:
        item = self._table.get_item(
            reconcile_run_pk(stream), None, "read the last run", consistent=True
        )
        if item is None:
            return None
        return RunRecord(
            stream=stream,
            started_ms=int(item["started_at_ms"]["N"]),
            finished_ms=int(item["finished_at_ms"]["N"]),
            outcomes={k: int(v) for k, v in json.loads(item["outcomes"]["S"]).items()},
        )

    # --- Spark batch records: (stream, query, batch_id) -> COMPLETE -------------------------

    def completed_batch(
        self, stream: str, query: str, batch_id: int, *, now_ms: int
    ) -> BatchRecord | None:
        """The record of a streaming query's batch that settled every row, if there is one."""
        pk = spark_batch_pk(stream, query, batch_id)
        item = self._table.get_item(pk, pk, "read a batch record", consistent=True)
        if item is None or item.get("batch_state", {}).get("S") != BATCH_COMPLETE:
            return None
        expires_at = item.get(TTL_ATTRIBUTE, {}).get("N")
        if expires_at is not None and int(expires_at) <= now_ms // 1000:
            return None  # TTL deletion lags: an item past its expiry counts as absent
        return BatchRecord(
            stream=stream,
            query=query,
            batch_id=batch_id,
            completed_ms=int(item["completed_at_ms"]["N"]),
            counts={k: int(v) for k, v in json.loads(item["counts"]["S"]).items()},
        )

    def mark_batch_complete(
        self, stream: str, query: str, batch_id: int, *, counts: dict[str, int], now_ms: int
    ) -> None:
        """Record a settled batch; it expires with the dedupe window, like the keys it sent.

        Unconditional: every writer of this item writes the same fact (COMPLETE).
        """
        pk = spark_batch_pk(stream, query, batch_id)
        item: dict[str, Any] = {
            "pk": {"S": pk},
            "batch_state": {"S": BATCH_COMPLETE},
            "query_id": {"S": query},
            "batch_id": {"N": str(batch_id)},
            "completed_at_ms": {"N": str(now_ms)},
            TTL_ATTRIBUTE: {"N": str(now_ms // 1000 + self.dedupe_ttl_s)},
            "counts": {"S": json.dumps(counts, sort_keys=True)},
        }
        with self._table.translated("record a batch", pk):
            self._table.client.put_item(TableName=self._table.table_name, Item=item)


class BatchesHandedOn:
    """The :class:`dedupe_store.contract.BatchLedger` methods of a whole ledger, each handed
    on to its batches part (``_batch_ledger``): :class:`dedupe_store.ledger.DynamoDBLedger` and
    the tests' in-memory ledger both hold one."""

    _batch_ledger: BatchLedger

    def record_run(
        self, stream: str, *, started_ms: int, finished_ms: int, outcomes: dict[str, int]
    ) -> None:
        self._batch_ledger.record_run(
            stream, started_ms=started_ms, finished_ms=finished_ms, outcomes=outcomes
        )

    def last_run(self, stream: str) -> RunRecord | None:
        return self._batch_ledger.last_run(stream)

    def completed_batch(
        self, stream: str, query: str, batch_id: int, *, now_ms: int
    ) -> BatchRecord | None:
        return self._batch_ledger.completed_batch(stream, query, batch_id, now_ms=now_ms)

    def mark_batch_complete(
        self, stream: str, query: str, batch_id: int, *, counts: dict[str, int], now_ms: int
    ) -> None:
        self._batch_ledger.mark_batch_complete(
            stream, query, batch_id, counts=counts, now_ms=now_ms
        )
