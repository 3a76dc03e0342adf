"""``InMemoryLedger``: the :class:`dedupe_store.contract.Ledger` in a dict, for tests.

Same conditional semantics as :class:`dedupe_store.ledger.DynamoDBLedger`::

    claim:     absent ──── or RELEASED ──── or DELIVERED past its dedupe TTL   ──> IN_FLIGHT #n+1
    mark:      IN_FLIGHT and attempt = mine                                     ──> DELIVERED
    take over: IN_FLIGHT and attempt = seen                                     ──> #seen+1
    release / mark unverifiable: IN_FLIGHT and attempt = seen

Every write carries a fresh ``write_token``; a write whose condition fails reports "applied"
only when the current item carries its own token (a retried request whose first try applied).
The sparse in-flight index holds exactly the IN_FLIGHT items (they alone have a lease), ordered
like the GSI: by bucket, then lease expiry, then key.

Fault knobs (:meth:`InMemoryLedger.inject`) make the next call of an operation:

- ``unavailable``: raise :class:`LedgerUnavailableError`, nothing applied;
- ``apply_then_raise``: apply the write, then raise (the response was lost, retries exhausted);
- ``apply_then_retry``: apply, lose the response, and send the very same request again, as the
  SDK does; the retry fails its condition on its own effect and must be recognised.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import StrEnum

from dedupe_store.errors import InvalidTransitionError, LedgerUnavailableError
from dedupe_store.inflight import bucket_of, walk_in_flight
from dedupe_store.records import (
    BatchRecord,
    ClaimRequest,
    ClaimResult,
    LedgerRecord,
    Position,
    RunRecord,
    UpdateResult,
)
from dedupe_store.states import LedgerState, Transition, next_state

WRITE_OPERATIONS = frozenset(
    {"claim", "mark_delivered", "take_over", "release", "mark_unverifiable"}
)
READ_OPERATIONS = frozenset({"get", "batch_get", "scan", "stale_in_flight"})


class LedgerFault(StrEnum):
    UNAVAILABLE = "unavailable"
    APPLY_THEN_RAISE = "apply_then_raise"
    APPLY_THEN_RETRY = "apply_then_retry"


_Condition = Callable[[LedgerRecord | None], bool]
_Change = Callable[[LedgerRecord | None, str], LedgerRecord]


class InMemoryLedger:
    """The ledger of one process's imagination. Thread-safe: one lock around every call."""

    def __init__(
        self,
        *,
        table_name: str = "in-memory-ledger",
        dedupe_ttl_s: int = 7 * 24 * 3600,
        inflight_buckets: int = 16,
    ) -> None:
        self._table_name = table_name
        self.dedupe_ttl_s = dedupe_ttl_s
        self.inflight_buckets = inflight_buckets
        self._lock = threading.RLock()
        self._items: dict[tuple[str, str], LedgerRecord] = {}
        self._runs: dict[str, RunRecord] = {}
        self._batches: dict[tuple[str, str, int], tuple[BatchRecord, int]] = {}  # expires_at_s
        self._faults: deque[tuple[str, LedgerFault]] = deque()
        self.injected: list[tuple[str, LedgerFault]] = []
        self.write_calls = 0

    @property
    def table_name(self) -> str:
        return self._table_name

    # --- fault knobs ----------------------------------------------------------------------

    def inject(self, operation: str, fault: LedgerFault | str) -> None:
        """The next call of ``operation`` (or of any operation, ``"*"``) meets ``fault``."""
        fault = LedgerFault(fault)
        known = WRITE_OPERATIONS | READ_OPERATIONS | {"*"}
        if operation not in known:
            raise ValueError(f"unknown ledger operation {operation!r}; known: {sorted(known)}")
        if fault is not LedgerFault.UNAVAILABLE and operation in READ_OPERATIONS:
            raise ValueError(f"{fault} needs a write operation, not {operation}")
        with self._lock:
            self._faults.append((operation, fault))

    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(self, operation: str) -> LedgerFault | None:
        for index, (wanted, fault) in enumerate(self._faults):
            if wanted == operation or (
                wanted == "*"
                and (fault is LedgerFault.UNAVAILABLE or operation in WRITE_OPERATIONS)
            ):
                del self._faults[index]
                self.injected.append((operation, fault))
                return fault
        return None

    def _read_fault(self, operation: str, key: str | None = None) -> None:
        if self._take_fault(operation) is not None:
            raise LedgerUnavailableError(
                f"injected: the ledger is unavailable ({operation})",
                table=self._table_name,
                key=key,
            )

    # --- reads ------------------------------------------------------------------------------

    def get(self, stream: str, key: str, *, consistent: bool = True) -> LedgerRecord | None:  # noqa: ARG002 - always consistent
        with self._lock:
            self._read_fault("get", key)
            return self._items.get((stream, key))

    def batch_get(self, stream: str, keys: Iterable[str]) -> dict[str, LedgerRecord]:
        with self._lock:
            self._read_fault("batch_get")
            found: dict[str, LedgerRecord] = {}
            for key in keys:
                record = self._items.get((stream, key))
                if record is not None:
                    found[key] = record
            return found

    def scan(self, stream: str, *, page_size: int = 1000) -> Iterator[LedgerRecord]:  # noqa: ARG002 - one page
        with self._lock:
            self._read_fault("scan")
            records = [r for (s, _), r in self._items.items() if s == stream]
        return iter(records)

    def stale_in_flight(
        self,
        stream: str,
        *,
        now_ms: int,
        buckets: Sequence[int] | None = None,
        page_size: int = 500,
    ) -> Iterator[str]:
        """Keys whose lease ended before ``now_ms`` (strictly), bucket by bucket."""
        with self._lock:
            self._read_fault("stale_in_flight")
        pages = walk_in_flight(
            self, stream, before_ms=now_ms, page_limit=lambda: page_size, buckets=buckets
        )
        return iter([key for keys, _ in pages for key in keys])

    def in_flight_page(
        self,
        stream: str,
        bucket: int,
        *,
        before_ms: int | None,
        limit: int,
        after_lease_ms: int | None = None,
        after_pk: str | None = None,
    ) -> tuple[list[str], tuple[int, str] | None]:
        """One page of a bucket's in-flight keys in index order, with DynamoDB's cursor."""
        with self._lock:
            index = [
                (lease_ms, f"{stream}#{key}")
                for b, lease_ms, key in self._index(stream)
                if b == bucket and (before_ms is None or lease_ms < before_ms)
            ]
        if after_lease_ms is not None and after_pk is not None:
            index = [entry for entry in index if entry > (after_lease_ms, after_pk)]
        page = index[:limit]
        keys = [pk[len(stream) + 1 :] for _, pk in page]
        # like DynamoDB: a full page has a last key, even when nothing follows
        return keys, (page[-1] if len(page) == limit and page else None)

    def _index(self, stream: str) -> list[tuple[int, int, str]]:
        """The sparse GSI: (bucket, lease expiry, key) of the IN_FLIGHT items, sorted."""
        return sorted(
            (bucket_of(key, self.inflight_buckets), record.lease_expires_at_ms, key)
            for (s, key), record in self._items.items()
            if s == stream
            and record.state is LedgerState.IN_FLIGHT
            and record.lease_expires_at_ms is not None
        )

    # --- run records --------------------------------------------------------------------------

    def record_run(
        self, stream: str, *, started_ms: int, finished_ms: int, outcomes: dict[str, int]
    ) -> None:
        with self._lock:
            self._runs[stream] = RunRecord(stream, started_ms, finished_ms, dict(outcomes))

    def last_run(self, stream: str) -> RunRecord | None:
        with self._lock:
            return self._runs.get(stream)

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

    # --- conditional transitions ------------------------------------------------------------

    def claim(
        self, request: ClaimRequest, *, owner: str, now_ms: int, lease_ms: int
    ) -> ClaimResult:
        def claimable(current: LedgerRecord | None) -> bool:
            # the DynamoDB condition, including its second granularity for the TTL
            return (
                current is None
                or current.state is LedgerState.RELEASED
                or (current.expires_at_s is not None and current.is_expired(now_ms))
            )

        def change(current: LedgerRecord | None, token: str) -> LedgerRecord:
            return LedgerRecord(
                stream=request.stream,
                key=request.key,
                state=next_state(None, Transition.CLAIM),
                attempt=(current.attempt if current is not None else 0) + 1,
                owner=owner,
                claimed_at_ms=now_ms,
                payload_digest=request.payload_digest,
                routing_hash_key=request.routing_hash_key,
                lease_expires_at_ms=now_ms + lease_ms,
                write_token=token,
                payload=request.payload or None,
            )

        applied, current = self._update("claim", request.stream, request.key, claimable, change)
        return ClaimResult.won(_require(current)) if applied else ClaimResult.lost(current)

    def mark_delivered(
        self, record: LedgerRecord, position: Position, *, now_ms: int
    ) -> UpdateResult:
        next_state(LedgerState.IN_FLIGHT, Transition.MARK_DELIVERED)

        def change(current: LedgerRecord | None, token: str) -> LedgerRecord:
            return dataclasses.replace(
                _require(current),
                state=LedgerState.DELIVERED,
                position=position,
                delivered_at_ms=now_ms,
                expires_at_s=now_ms // 1000 + self.dedupe_ttl_s,
                lease_expires_at_ms=None,
                payload=None,
                write_token=token,
            )

        applied, current = self._update(
            "mark_delivered", record.stream, record.key, _held(record.attempt), change
        )
        return UpdateResult(applied, current)

    def take_over(
        self, seen: LedgerRecord, *, owner: str, now_ms: int, lease_ms: int
    ) -> ClaimResult:
        next_state(seen.state, Transition.TAKE_OVER)

        def change(current: LedgerRecord | None, token: str) -> LedgerRecord:
            return dataclasses.replace(
                _require(current),
                attempt=seen.attempt + 1,
                owner=owner,
                claimed_at_ms=now_ms,
                lease_expires_at_ms=now_ms + lease_ms,
                write_token=token,
            )

        applied, current = self._update(
            "take_over", seen.stream, seen.key, _held(seen.attempt), change
        )
        return ClaimResult.won(_require(current)) if applied else ClaimResult.lost(current)

    def release(self, seen: LedgerRecord) -> UpdateResult:
        return self._settle("release", seen, Transition.RELEASE, LedgerState.RELEASED)

    def mark_unverifiable(self, seen: LedgerRecord) -> UpdateResult:
        return self._settle(
            "mark_unverifiable", seen, Transition.MARK_UNVERIFIABLE, LedgerState.UNVERIFIABLE
        )

    def delete(self, stream: str, key: str) -> None:
        """Remove a key's item outright (tests only, like ``DynamoDBLedger.delete``)."""
        with self._lock:
            self._items.pop((stream, key), None)

    def _settle(
        self, operation: str, seen: LedgerRecord, transition: Transition, target: LedgerState
    ) -> UpdateResult:
        next_state(seen.state, transition)

        def change(current: LedgerRecord | None, token: str) -> LedgerRecord:
            return dataclasses.replace(
                _require(current), state=target, lease_expires_at_ms=None, write_token=token
            )

        applied, current = self._update(
            operation, seen.stream, seen.key, _held(seen.attempt), change
        )
        return UpdateResult(applied, current)

    def _update(
        self,
        operation: str,
        stream: str,
        key: str,
        condition: _Condition,
        change: _Change,
    ) -> tuple[bool, LedgerRecord | None]:
        """One conditional write with its own token, as ``DynamoDBLedger._update`` makes it."""
        token = uuid.uuid4().hex
        with self._lock:
            fault = self._take_fault(operation)
            if fault is LedgerFault.UNAVAILABLE:
                raise LedgerUnavailableError(
                    f"injected: the ledger is unavailable ({operation})",
                    table=self._table_name,
                    key=key,
                )
            result = self._apply(stream, key, condition, change, token)
            if fault is LedgerFault.APPLY_THEN_RAISE:
                raise LedgerUnavailableError(
                    f"injected: {operation} applied={result[0]}, its response was lost",
                    table=self._table_name,
                    key=key,
                )
            if fault is LedgerFault.APPLY_THEN_RETRY:
                # the SDK sends the very same request (same token) once more
                result = self._apply(stream, key, condition, change, token)
            return result

    def _apply(
        self, stream: str, key: str, condition: _Condition, change: _Change, token: str
    ) -> tuple[bool, LedgerRecord | None]:
        self.write_calls += 1  # a failed condition still costs a write
        current = self._items.get((stream, key))
        if not condition(current):
            return current is not None and current.write_token == token, current
        updated = change(current, token)
        self._items[(stream, key)] = updated
        return True, updated


def _held(attempt: int) -> _Condition:
    def condition(current: LedgerRecord | None) -> bool:
        return (
            current is not None
            and current.state is LedgerState.IN_FLIGHT
            and current.attempt == attempt
        )

    return condition


def _require(record: LedgerRecord | None) -> LedgerRecord:
    if record is None:  # a held condition never passes on an absent item
        raise InvalidTransitionError(None, "update of an absent item")
    return record
