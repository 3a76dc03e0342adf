"""The contract every ledger backend meets: :class:`DynamoDBLedger` in production, an
in-memory fake in tests. Both pass the same contract test suite (``tests/ledger_contract/``).

Ledger schema v2 (claim groups, see :mod:`dedupe_store.states`): a producer opens a group for
a chunk of keys, claims each key with one conditional write naming the group, and settles the
group with every key's position in one conditional write. Readers see the join of the two
items as a :class:`LedgerRecord`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from dedupe_store.errors import LedgerError
from dedupe_store.records import (
    AttemptRenewal,
    BatchRecord,
    ClaimRequest,
    ClaimResult,
    Group,
    GroupUpdate,
    KeyClaim,
    KeyUpdate,
    LedgerRecord,
    PendingClaim,
    Position,
    ReplayRun,
    RunAttempt,
    RunRecord,
    RunRegistration,
)

__all__ = [
    "BatchLedger",
    "BatchReader",
    "ClaimLedger",
    "GroupLedger",
    "GroupReader",
    "Ledger",
    "LedgerReader",
    "RunLedger",
    "RunReader",
]


class RunReader(Protocol):
    """What a reader needs of replay-mode runs (the API, the reconciler's reads)."""

    def get_run(self, stream: str, run: str) -> ReplayRun | None:
        """The run, read consistently; None when it has no item."""
        ...

    def task_attempts(
        self, stream: str, run: str, execution_id: str, task: str
    ) -> tuple[RunAttempt, ...]:
        """One task's attempts in one execution, read consistently (empty when none)."""
        ...

    def open_runs(
        self,
        stream: str,
        *,
        now_ms: int | None,
        buckets: Sequence[int] | None = None,
        page_size: int = 100,
    ) -> Iterator[ReplayRun]:
        """OPEN runs of ``stream`` from the sparse in-flight index (no table scan), each read
        consistently, bucket after bucket (``buckets``: a share of the index; all when None);
        within a page, by run name.

        ``now_ms``: only the runs left OPEN past their leases, every execution's lease ended
        (or every attempt finished) before ``now_ms`` (a reconciler passes its clock less the
        skew); None: every OPEN run.
        A run completed since the index was read is left out.
        """
        ...


class RunLedger(RunReader, Protocol):
    """Replay-mode runs: an item per run (its executions), one per task (its attempts)."""

    def replay_runs(self, stream: str, *, page_size: int = 1000) -> Iterator[ReplayRun]:
        """Every replay-mode run of ``stream``, OPEN or COMPLETE, in no order (a full table
        scan: for audits only, of a stream that holds records its keys' items do not know)."""
        ...

    def register_attempt(
        self, stream: str, run: str, attempt: RunAttempt, *, keep_s: int = 0
    ) -> RunRegistration:
        """Count ``attempt`` in its execution on ``run`` (opening the run, in the in-flight
        index), unless the run is COMPLETE or the execution superseded; then add it to its
        task's attempts. The run comes back with every execution so far, and the task's
        attempts with it: the earlier ones are what recovery reads (every other execution
        with all its counts; its own execution's counts may leave out the tasks a store
        counts apart, :mod:`dedupe_store.run_stripes`). The run's items live the
        dedupe TTL or ``keep_s`` (the stream's retention), whichever is longer, past the lease
        registered (and past each lease its execution is extended to)."""
        ...

    def supersede_executions(
        self, stream: str, run: str, execution_ids: Sequence[str]
    ) -> ReplayRun | None:
        """Mark earlier executions superseded: none of their leases can grow any more and
        none of them can register another attempt, so the bounds the run now shows are
        final, and its counts hold every attempt of theirs that can still put. None when the
        run is gone."""
        ...

    def supersede_attempts(
        self, stream: str, run: str, me: RunAttempt, attempt_ids: Sequence[str]
    ) -> tuple[RunAttempt, ...]:
        """Mark earlier attempts of ``me``'s task (in ``me``'s execution) superseded: none of
        them can renew its lease any more. The task's attempts as the write left them."""
        ...

    def renew_attempt(
        self,
        stream: str,
        run: str,
        attempt: RunAttempt,
        *,
        now_ms: int,
        lease_ms: int,
        skew_ms: int,
        keep_s: int = 0,
    ) -> AttemptRenewal:
        """A new lease from ``now_ms`` for an attempt not superseded, whose lease is still
        valid by more than ``skew_ms``, bounded by its execution's lease (extended first, the
        run OPEN and the execution not superseded; the run's items then live ``keep_s`` or the
        dedupe TTL past that lease)."""
        ...

    def finish_attempt(
        self,
        stream: str,
        run: str,
        attempt: RunAttempt,
        *,
        late_rows: frozenset[str] = frozenset(),
    ) -> None:
        """The attempt puts nothing more: once every attempt of its execution finished, a
        replay waits for none of them. Every put it made is definite but those of
        ``late_rows`` (:attr:`dedupe_store.records.RunExecution.late_rows`, added to its
        execution's): a replay that does not find one of those rows waits for the lease."""
        ...

    def complete_run(
        self, stream: str, run: str, *, counts: dict[str, int], now_ms: int, keep_s: int = 0
    ) -> ReplayRun:
        """OPEN (or absent) -> COMPLETE, out of the in-flight index; a run already COMPLETE
        stays as it was, but lives on: the dedupe TTL or ``keep_s`` (the stream's retention)
        from ``now_ms``, whichever is longer, so a re-run finds it while its rows are in the
        stream."""
        ...


class GroupReader(Protocol):
    """What a reader needs of claim groups (the API's in-flight keys)."""

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
        """One page of OPEN groups of a bucket (by lease expiry), expanded into the keys they
        list, with a cursor after the page's last group. Keys may since have moved on: the
        caller re-reads them. Groups only: replay runs are never listed here."""
        ...


class GroupLedger(GroupReader, Protocol):
    """Claim groups: an item per group (its owner, lease, members and their positions)."""

    def open_group(
        self,
        stream: str,
        members: Sequence[str],
        *,
        owner: str,
        now_ms: int,
        lease_ms: int,
    ) -> Group:
        """A new OPEN group (epoch 1) listing ``members``, in the in-flight index. Written
        before any claim names it, so the reconciler can find every claim that may be sent."""
        ...

    def get_group(self, stream: str, group_id: str) -> Group | None: ...

    def batch_get_groups(self, stream: str, group_ids: Iterable[str]) -> dict[str, Group]: ...

    def stale_groups(
        self,
        stream: str,
        *,
        now_ms: int,
        buckets: Sequence[int] | None = None,
        page_size: int = 500,
    ) -> Iterator[str]:
        """Ids of OPEN groups whose lease expired by ``now_ms``, from the eventually
        consistent index: re-read each one before acting on it."""
        ...

    def renew_lease(self, group: Group, *, now_ms: int, lease_ms: int, skew_ms: int) -> GroupUpdate:
        """OPEN(e) -> OPEN(e + 1) with a lease from ``now_ms``, only while the held lease is
        still valid by more than ``skew_ms`` (after that, the owner resolves like anyone)."""
        ...

    def take_over_group(
        self, seen: Group, *, owner: str, now_ms: int, lease_ms: int, skew_ms: int
    ) -> GroupUpdate:
        """OPEN(e) -> OPEN(e + 1) under a new owner, once the lease expired for everyone: the
        old owner can no longer record or settle it."""
        ...

    def record_positions(
        self, group: Group, positions: Mapping[str, Position], *, settle: bool, now_ms: int
    ) -> GroupUpdate:
        """Add ``positions`` (by member key) to the group; with ``settle`` also SETTLED and out
        of the in-flight index. Conditional on OPEN and the epoch held in ``group``."""
        ...


class ClaimLedger(Protocol):
    """Key claims: an item per message key (its state, attempt and claim group)."""

    def claim(self, request: ClaimRequest, group: Group, *, now_ms: int) -> ClaimResult:
        """Claim a key for ``group`` if it is absent, RELEASED, or past its dedupe TTL."""
        ...

    # many keys are claimed in two halves, the caller running each half's requests
    # concurrently (the producer's SendContext.claim_all): insert_claims, then judge_claims of
    # the claims the inserts left pending (several inserts' together, 100 to a read), then
    # claim of each one the judge hands back; each key ends as its single claim would have

    @property
    def claims_per_request(self) -> int:
        """How many claims one :meth:`insert_claims` request carries (1: one write each)."""
        ...

    def insert_claims(
        self, requests: Sequence[ClaimRequest], group: Group, *, now_ms: int
    ) -> list[ClaimResult | LedgerError | PendingClaim]:
        """The first half, ``claims_per_request`` keys to a request: a result or a ledger
        error for each request it decided, in order, and a :class:`PendingClaim` for each key
        whose item must decide (it existed, or the write may have applied). A backend that
        claims one key a request leaves none pending."""
        ...

    @property
    def judged_per_request(self) -> int:
        """How many pending claims one :meth:`judge_claims` request reads (100)."""
        ...

    def judge_claims(
        self, pending: Sequence[PendingClaim], *, now_ms: int
    ) -> list[ClaimResult | LedgerError | ClaimRequest]:
        """The second half: each pending claim judged from its key item, read consistently,
        ``judged_per_request`` to a request, in order. Ours (the INSERT's token) is won; one a
        claim can take (absent, RELEASED, past its TTL) is its :class:`ClaimRequest` back, to
        :meth:`claim` singly; any other is lost to its holder. A read that fails gives each
        of its keys its ledger error."""
        ...

    def get_claim(self, stream: str, key: str) -> KeyClaim | None: ...

    def batch_get_claims(self, stream: str, keys: Iterable[str]) -> dict[str, KeyClaim]: ...

    def take_over_key(self, seen: KeyClaim, group: Group, *, now_ms: int) -> ClaimResult:
        """CLAIMED(n, G) -> CLAIMED(n + 1, ``group``): its put can no longer land (read-back
        said so). Conditional on the attempt and group seen."""
        ...

    def release(self, seen: KeyClaim) -> KeyUpdate:
        """CLAIMED -> RELEASED: not in the stream and no data to resend."""
        ...

    def mark_unverifiable(self, seen: KeyClaim) -> KeyUpdate:
        """CLAIMED -> UNVERIFIABLE: the read-back window reaches past the stream's retention."""
        ...


class BatchReader(Protocol):
    """What a reader needs of the run records (the API's summary)."""

    def last_run(self, stream: str) -> RunRecord | None:
        """The reconciler's last run over ``stream``, None before its first."""
        ...


class BatchLedger(BatchReader, Protocol):
    """Spark's batch records (a streaming query's batch that settled every row) and the
    reconciler's run records."""

    def record_run(
        self, stream: str, *, started_ms: int, finished_ms: int, outcomes: dict[str, int]
    ) -> None:
        """Remember the reconciler's last run over ``stream`` (read by the API's summary)."""
        ...

    def completed_batch(
        self, stream: str, query: str, batch_id: int, *, now_ms: int
    ) -> BatchRecord | None:
        """The record of a streaming query's batch that settled every row, if there is one
        (one past its expiry by ``now_ms`` counts as absent)."""
        ...

    def mark_batch_complete(
        self, stream: str, query: str, batch_id: int, *, counts: dict[str, int], now_ms: int
    ) -> None:
        """Record a settled batch; it expires with the dedupe window, like the keys it sent."""
        ...


class LedgerReader(RunReader, GroupReader, BatchReader, Protocol):
    """What a reader needs (the API): it never writes the ledger. Its replay-mode runs are
    :class:`RunReader`'s, its claim groups :class:`GroupReader`'s, its run records
    :class:`BatchReader`'s."""

    dedupe_ttl_s: int
    inflight_buckets: int

    @property
    def table_name(self) -> str: ...

    def ensure_ready(self) -> None: ...

    def get(self, stream: str, key: str, *, consistent: bool = True) -> LedgerRecord | None:
        """A key's delivery (its key item joined with its group), or None if never claimed."""
        ...

    def batch_get(self, stream: str, keys: Iterable[str]) -> dict[str, LedgerRecord]: ...


class Ledger(LedgerReader, RunLedger, GroupLedger, ClaimLedger, BatchLedger, Protocol):
    """The whole ledger: the reads, and the conditional transitions of the protocol. Its
    replay-mode runs are :class:`RunLedger`'s, its claim groups :class:`GroupLedger`'s, its
    key claims :class:`ClaimLedger`'s, its batch and run records :class:`BatchLedger`'s."""

    def scan(self, stream: str, *, page_size: int = 1000) -> Iterator[LedgerRecord]:
        """Every key of ``stream`` with its delivery (a full table scan: for audits only)."""
        ...
