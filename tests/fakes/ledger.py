"""``InMemoryLedger``: the :class:`dedupe_store.contract.Ledger` in dicts, for tests.

Same conditional semantics as :class:`dedupe_store.ledger.DynamoDBLedger` (ledger schema v2),
in its parts, to which it hands their calls on: the key claims (:mod:`fakes.claims`), the claim
groups (:mod:`fakes.groups`), the replay-mode runs (:mod:`fakes.runs`), Spark's batch records
and the reconciler's last run (:mod:`fakes.batches`).

Every write carries a fresh ``write_token``; a write whose condition fails reports "applied"
only when the current item carries its own token (a retried request whose first try applied).

Fault knobs (:meth:`InMemoryLedger.inject`) make the next call of an operation:

- ``unavailable``: raise :class:`LedgerUnavailableError`, nothing applied;
- ``apply_then_raise``: apply the write, then raise (the response was lost, retries exhausted);
- ``apply_then_retry``: apply, lose the response, and send the very same request again, as the
  SDK does; the retry fails its condition on its own effect and must be recognised;
- ``throttled``: DynamoDB throttles every try the SDK makes: its backoff passes (``delay_ms``
  on the ledger's ``sleep_ms``, the model's clock), then :class:`LedgerThrottledError`,
  nothing applied (reads too);
- ``throttled_then_applied``: throttled, then applied by an SDK retry after its backoff: the
  write applies late, as it was built when the call began (its ``now_ms``, its condition),
  and the caller hears of it only then.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from enum import StrEnum

from dedupe_store.batches import BatchesHandedOn
from dedupe_store.claims import ClaimsHandedOn
from dedupe_store.errors import (
    LedgerThrottledError,
    LedgerUnavailableError,
)
from dedupe_store.groups import GroupsHandedOn
from dedupe_store.records import (
    ClaimRequest,
    ClaimResult,
    Group,
    LedgerRecord,
    RunAttempt,
)
from dedupe_store.runs import RunsHandedOn
from fakes.batches import InMemoryBatchLedger
from fakes.claims import InMemoryClaimLedger
from fakes.groups import InMemoryGroupLedger
from fakes.items import Item
from fakes.runs import InMemoryRunLedger

KEY_WRITES = frozenset({"claim", "take_over_key", "release", "mark_unverifiable"})
GROUP_WRITES = frozenset({"open_group", "renew_lease", "take_over_group", "record_positions"})
WRITE_OPERATIONS = KEY_WRITES | GROUP_WRITES
READ_OPERATIONS = frozenset(
    {
        "record_run",
        "get",
        "batch_get",
        "scan",
        "stale_groups",
        "get_claim",
        "batch_get_claims",
        "get_group",
        "batch_get_groups",
        "judge_claims",
        # a replay run's calls: a fault there raises, nothing applied
        "register_attempt",
        "supersede_executions",
        "supersede_attempts",
        "renew_attempt",
        "finish_attempt",
        "complete_run",
        "get_run",
        "task_attempts",
        "open_runs",
    }
)


class LedgerFault(StrEnum):
    UNAVAILABLE = "unavailable"
    APPLY_THEN_RAISE = "apply_then_raise"
    APPLY_THEN_RETRY = "apply_then_retry"
    THROTTLED = "throttled"
    THROTTLED_THEN_APPLIED = "throttled_then_applied"


# the faults a read can meet: it raises (nothing to apply)
READ_FAULTS = frozenset({LedgerFault.UNAVAILABLE, LedgerFault.THROTTLED})


class InMemoryLedger(RunsHandedOn, GroupsHandedOn, ClaimsHandedOn, BatchesHandedOn):
    """The ledger of one process's imagination. Thread-safe: one lock around every call."""

    def __init__(
        self,
        *,
        table_name: str = "in-memory-ledger",
        dedupe_ttl_s: int = 7 * 24 * 3600,
        inflight_buckets: int = 16,
        sleep_ms: Callable[[int], None] | None = None,
    ) -> None:
        self._table_name = table_name
        self._sleep_ms = sleep_ms  # how a throttled call's backoff passes
        self.dedupe_ttl_s = dedupe_ttl_s
        self.inflight_buckets = inflight_buckets
        self._lock = threading.RLock()
        self._faults: deque[tuple[str, LedgerFault, int]] = deque()  # ..., delay_ms
        self.injected: list[tuple[str, LedgerFault]] = []
        self.write_calls = 0
        # called between a registration's two writes (the run item, then the task item), the
        # lock held (reentrant): a test registers another attempt there, as a race would
        self.between_registration_writes: Callable[[RunAttempt], None] = lambda _attempt: None
        self._run_ledger = InMemoryRunLedger(
            self._lock,
            self._read_fault,
            dedupe_ttl_s=dedupe_ttl_s,
            inflight_buckets=inflight_buckets,
            between_registration_writes=self._between_registration_writes,
        )
        self._group_ledger = InMemoryGroupLedger(
            self._lock,
            self._read_fault,
            self.write,
            dedupe_ttl_s=dedupe_ttl_s,
            inflight_buckets=inflight_buckets,
        )
        self._batch_ledger = InMemoryBatchLedger(
            self._lock, self._read_fault, dedupe_ttl_s=dedupe_ttl_s
        )
        self._claim_ledger = InMemoryClaimLedger(
            self._lock, self._read_fault, self.write, self._claim_one, dedupe_ttl_s=dedupe_ttl_s
        )
        # what the reads join (the parts' own items, under the lock)
        self._claims = self._claim_ledger.claims
        self._groups = self._group_ledger.groups

    def _between_registration_writes(self, attempt: RunAttempt) -> None:
        # looked up on the ledger at each registration: a test sets its race there
        self.between_registration_writes(attempt)

    def _claim_one(self, request: ClaimRequest, group: Group, now_ms: int) -> ClaimResult:
        # looked up on the ledger at each claim of a batch: a test's ledger wraps its claim
        return self.claim(request, group, now_ms=now_ms)

    @property
    def table_name(self) -> str:
        return self._table_name

    def ensure_ready(self) -> None:
        return None

    # --- fault knobs ----------------------------------------------------------------------

    def inject(self, operation: str, fault: LedgerFault | str, *, delay_ms: int = 0) -> None:
        """The next call of ``operation`` (or of any operation, ``"*"``) meets ``fault``; a
        throttled one ``delay_ms`` later (the SDK's backoff, on ``sleep_ms``)."""
        fault = LedgerFault(fault)
        known = WRITE_OPERATIONS | READ_OPERATIONS | {"*"}
        if operation not in known:
            raise ValueError(f"unknown ledger operation {operation!r}; known: {sorted(known)}")
        if fault not in READ_FAULTS and operation in READ_OPERATIONS:
            raise ValueError(f"{fault} needs a write operation, not {operation}")
        if delay_ms and self._sleep_ms is None:
            raise ValueError("a delayed fault needs the ledger's sleep_ms (a clock to move)")
        with self._lock:
            self._faults.append((operation, fault, delay_ms))

    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(self, operation: str) -> LedgerFault | None:
        """The fault the call meets, if any, once its delay (a throttled call's backoff) has
        passed."""
        for index, (wanted, fault, delay_ms) in enumerate(self._faults):
            if wanted == operation or (
                wanted == "*" and (fault in READ_FAULTS or operation in WRITE_OPERATIONS)
            ):
                del self._faults[index]
                self.injected.append((operation, fault))
                if delay_ms and self._sleep_ms is not None:
                    self._sleep_ms(delay_ms)
                return fault
        return None

    def _read_fault(self, operation: str, key: str | None = None) -> None:
        self._raise_for(self._take_fault(operation), operation, key)

    def _raise_for(self, fault: LedgerFault | None, operation: str, key: str | None) -> None:
        """The error of a call that applied nothing: ``unavailable`` or ``throttled``."""
        if fault is LedgerFault.THROTTLED:
            raise LedgerThrottledError(
                f"injected: DynamoDB throttled {operation}", table=self._table_name, key=key
            )
        if fault is LedgerFault.UNAVAILABLE:
            raise LedgerUnavailableError(
                f"injected: the ledger is unavailable ({operation})",
                table=self._table_name,
                key=key,
            )

    # --- reads ------------------------------------------------------------------------------

    def get(self, stream: str, key: str, *, consistent: bool = True) -> LedgerRecord | None:  # noqa: ARG002 - always consistent
        with self._lock:
            self._read_fault("get", key)
            claim = self._claims.get((stream, key))
            if claim is None:
                return None
            return LedgerRecord.of(claim, self._groups.get((stream, claim.group_id)))

    def batch_get(self, stream: str, keys: Iterable[str]) -> dict[str, LedgerRecord]:
        with self._lock:
            self._read_fault("batch_get")
            found: dict[str, LedgerRecord] = {}
            for key in keys:
                claim = self._claims.get((stream, key))
                if claim is not None:
                    group = self._groups.get((stream, claim.group_id))
                    found[key] = LedgerRecord.of(claim, group)
            return found

    def scan(self, stream: str, *, page_size: int = 1000) -> Iterator[LedgerRecord]:  # noqa: ARG002 - one page
        with self._lock:
            self._read_fault("scan")
            records = [
                LedgerRecord.of(claim, self._groups.get((s, claim.group_id)))
                for (s, _), claim in self._claims.items()
                if s == stream
            ]
        return iter(records)

    def delete(self, stream: str, key: str) -> None:
        """Remove a key's item outright (tests only, like ``DynamoDBLedger.delete``)."""
        self._claim_ledger.delete(stream, key)

    # --- one conditional write ----------------------------------------------------------------

    def write(
        self,
        operation: str,
        items: dict[tuple[str, str], Item],
        at: tuple[str, str],
        condition: Callable[[Item | None], bool],
        change: Callable[[Item | None, str], Item],
    ) -> tuple[bool, Item | None]:
        """One conditional write with its own token, as ``DynamoDBTable`` makes it, meeting the
        faults injected on ``operation`` (:class:`fakes.items.ConditionalWrite`)."""
        token = uuid.uuid4().hex
        with self._lock:
            fault = self._take_fault(operation)
            self._raise_for(fault, operation, at[1])
            result = self._apply(items, at, condition, change, token)
            if fault is LedgerFault.APPLY_THEN_RAISE:
                raise LedgerUnavailableError(
                    f"injected: {operation} applied={result[0]}, its response was lost",
                    table=self._table_name,
                    key=at[1],
                )
            if fault is LedgerFault.APPLY_THEN_RETRY:
                # the SDK sends the very same request (same token) once more
                result = self._apply(items, at, condition, change, token)
            return result

    def _apply(
        self,
        items: dict[tuple[str, str], Item],
        at: tuple[str, str],
        condition: Callable[[Item | None], bool],
        change: Callable[[Item | None, str], Item],
        token: str,
    ) -> tuple[bool, Item | None]:
        self.write_calls += 1  # a failed condition still costs a write
        current = items.get(at)
        if not condition(current):
            return current is not None and current.write_token == token, current
        updated = change(current, token)
        items[at] = updated
        return True, updated
