"""Plain data the ledger reads and writes. No pynamodb here: the protocol works on these."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from dedupe_store.states import GroupState, KeyState, LedgerState, RunState, delivery_state

# A message key is its Kinesis partition key: 1 to 256 Unicode characters. The producer
# validates keys against it; the API refuses longer ones before asking the ledger.
MAX_KEY_CHARS = 256


@dataclass(frozen=True, slots=True)
class Position:
    """Where a record sits in the stream. Sequence numbers are unique per shard only."""

    shard_id: str
    sequence_number: str
    sub_sequence_number: int | None = None


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """A key's delivery as readers see it: its key item joined with its group's lease and
    position (:meth:`of`). The producer and the reconciler act on the items themselves."""

    stream: str
    key: str
    state: LedgerState
    attempt: int
    owner: str
    claimed_at_ms: int
    payload_digest: str
    routing_hash_key: str
    lease_expires_at_ms: int | None = None
    write_token: str | None = None
    position: Position | None = None
    delivered_at_ms: int | None = None
    expires_at_s: int | None = None
    payload: bytes | None = None
    group_id: str | None = None

    @classmethod
    def of(cls, claim: KeyClaim, group: Group | None) -> LedgerRecord:
        """The delivery of ``claim``; ``group`` None (expired and deleted) counts as a lease
        long gone: readers resolve such a claim like any expired one."""
        position = group.position_of(claim.key) if group is not None else None
        return cls(
            stream=claim.stream,
            key=claim.key,
            state=delivery_state(claim.state, has_position=position is not None),
            attempt=claim.attempt,
            owner=group.owner if group is not None else "",
            claimed_at_ms=claim.claimed_at_ms,
            payload_digest=claim.payload_digest,
            routing_hash_key=claim.routing_hash_key,
            lease_expires_at_ms=group.lease_expires_at_ms if group is not None else 0,
            write_token=claim.write_token,
            position=position,
            delivered_at_ms=(group.recorded_at_ms if position is not None and group else None),
            expires_at_s=claim.expires_at_s,
            payload=claim.payload,
            group_id=claim.group_id,
        )

    def is_expired(self, now_ms: int) -> bool:
        """True when the dedupe TTL has passed: the item then counts as absent."""
        # the same second-granularity test as the claim condition (expires_at <= now)
        return self.expires_at_s is not None and self.expires_at_s <= now_ms // 1000

    def lease_expired(self, now_ms: int, skew_ms: int = 0) -> bool:
        return self.lease_expires_at_ms is not None and self.lease_expires_at_ms + skew_ms <= now_ms


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What a producer asks the ledger for: the right to send ``key`` under a new attempt."""

    stream: str
    key: str
    payload_digest: str
    routing_hash_key: str
    payload: bytes | None = None


@dataclass(frozen=True, slots=True)
class KeyClaim:
    """A key item: which attempt and which group hold the key. Written once per attempt."""

    stream: str
    key: str
    state: KeyState
    attempt: int
    group_id: str
    claimed_at_ms: int
    payload_digest: str
    routing_hash_key: str
    expires_at_s: int
    write_token: str | None = None
    payload: bytes | None = None

    def is_expired(self, now_ms: int) -> bool:
        """True when the dedupe TTL has passed: the item then counts as absent."""
        return self.expires_at_s <= now_ms // 1000


@dataclass(frozen=True, slots=True)
class Group:
    """A claim group item: what the keys a producer sends together share.

    ``members`` is fixed when the group opens; ``positions`` maps a member's index to where
    its record landed. Only the holder of ``epoch`` writes the group (every write is
    conditional on it), so a holder may add positions to the ones it read.
    """

    stream: str
    group_id: str
    state: GroupState
    epoch: int
    owner: str
    claimed_at_ms: int
    lease_expires_at_ms: int
    members: tuple[str, ...]
    positions: dict[int, Position] = field(default_factory=dict)
    recorded_at_ms: int | None = None
    expires_at_s: int | None = None
    write_token: str | None = None
    # member -> index, built on first use: a group of 500 is asked about each of its keys
    _member_index: dict[str, int] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def index_of(self, key: str) -> int | None:
        """A member's index; a key listed twice (never written so) has its first one."""
        return self._indexes().get(key)

    def _indexes(self) -> dict[str, int]:
        index = self._member_index
        if index is None:
            index = {}
            for i, member in enumerate(self.members):
                index.setdefault(member, i)
            object.__setattr__(self, "_member_index", index)  # a cache: the group stays frozen
        return index

    def position_of(self, key: str) -> Position | None:
        index = self.index_of(key)
        return None if index is None else self.positions.get(index)

    def with_positions(self, positions: Mapping[str, Position]) -> dict[int, Position]:
        """The group's positions by member index, with ``positions`` (by key) added: what a
        holder of the epoch records. A key that is not a member is a bug of the caller."""
        merged = dict(self.positions)
        for key, position in positions.items():
            index = self.index_of(key)
            if index is None:
                raise ValueError(f"{key!r} is not a member of group {self.group_id}")
            merged[index] = position
        return merged

    def positions_by_key(self) -> dict[str, Position]:
        """Each member's position as :meth:`position_of` gives it: a key listed twice has
        the position of its first index, if any."""
        return {
            key: self.positions[index]
            for key, index in self._indexes().items()
            if index in self.positions
        }

    def lease_expired(self, now_ms: int, skew_ms: int = 0) -> bool:
        return self.lease_expires_at_ms + skew_ms <= now_ms


class ClaimStatus(StrEnum):
    WON = "WON"
    LOST = "LOST"


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """A claim either won (``claim`` is ours) or lost (``claim`` is the holder's item)."""

    status: ClaimStatus
    claim: KeyClaim | None

    @classmethod
    def won(cls, claim: KeyClaim) -> ClaimResult:
        return cls(ClaimStatus.WON, claim)

    @classmethod
    def lost(cls, existing: KeyClaim | None) -> ClaimResult:
        # existing is None only when the item vanished between the failed write and the read
        return cls(ClaimStatus.LOST, existing)


@dataclass(frozen=True, slots=True)
class PendingClaim:
    """A batched claim its ``INSERT`` did not decide: the key's item existed, or the statement
    may have applied though its answer was lost. The item, read consistently, decides
    (:meth:`dedupe_store.contract.Ledger.judge_claims`); ``token`` is the one the ``INSERT``
    carried, so an item holding it is ours."""

    request: ClaimRequest
    token: str


@dataclass(frozen=True, slots=True)
class KeyUpdate:
    """A conditional update of a key item: applied, or lost to whoever changed it first."""

    applied: bool
    current: KeyClaim | None


@dataclass(frozen=True, slots=True)
class GroupUpdate:
    """A conditional update of a group item: applied (``current`` is the new item), or lost
    (``current`` is the item that won instead, None if it is gone)."""

    applied: bool
    current: Group | None


@dataclass(frozen=True, slots=True)
class RunRecord:
    """The reconciler's last run over a stream."""

    stream: str
    started_ms: int
    finished_ms: int
    outcomes: dict[str, int]


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A Spark batch that settled every row: a replay of it skips the per-key work."""

    stream: str
    query: str
    batch_id: int
    completed_ms: int
    counts: dict[str, int]


# --- replay mode: a run, its executions, their attempts -----------------------------------------


@dataclass(frozen=True, slots=True)
class RunAttempt:
    """One attempt at a replay-mode run: a Spark task attempt (``task`` its partition,
    ``task_attempt`` its order among the task's attempts: Spark's task attempt id) of one
    driver execution, or a CLI process. It puts under its own lease, never past its
    execution's; once ``superseded`` by a later attempt of its task it can no longer renew."""

    attempt_id: str
    execution_id: str
    task: str
    task_attempt: int
    started_at_ms: int
    lease_expires_at_ms: int
    superseded: bool = False

    @property
    def half_lease_ms(self) -> int:
        """Half the lease it asked for: when its execution's lease has less left than this,
        its registration extends that lease first."""
        return (self.lease_expires_at_ms - self.started_at_ms) // 2

    @property
    def tag(self) -> int:
        """A 60-bit number drawn from the id: added to its execution's ``open_tags`` when it
        registers, taken off when it finishes (:class:`RunExecution`)."""
        digest = hashlib.blake2b(self.attempt_id.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 4


# An execution's late rows, when an attempt has more than LATE_ROWS_MAX to list: every row.
ANY_ROW = "*"
LATE_ROWS_MAX = 1_000


def row_tag(key: str, data_digest: bytes) -> str:
    """A row's short tag on a run's item: 16 hex digits of a BLAKE2b digest of its key and
    its data's digest (a tag two rows share costs a replay a wait, never a duplicate)."""
    digest = hashlib.blake2b(key.encode() + b"\0" + data_digest, digest_size=8)
    return digest.hexdigest()


def late_rows_of(tags: frozenset[str]) -> frozenset[str]:
    """What an attempt records of ``tags`` on its execution: the tags, or every row when
    there are more than :data:`LATE_ROWS_MAX` (the run's item stays small)."""
    return tags if len(tags) <= LATE_ROWS_MAX else frozenset({ANY_ROW})


@dataclass(frozen=True, slots=True)
class RunExecution:
    """One execution of a run: a driver run of a Spark query or batch write (every task
    attempt of it), or one CLI process. The run item holds its bounds, never its attempts, so
    a write to the run costs the same at 2 tasks or 2,000.

    ``started_at_ms``: when its first attempt registered; ``lease_expires_at_ms``: no attempt
    of it puts past this (an attempt's lease never outgrows it; it only grows, until a replay
    supersedes the execution). ``attempts``: registrations counted. ``open_tags``: the sum of
    the tags of its attempts not finished: 0 when every attempt that registered finished with
    every put definite. A repeated request can only leave it off zero (a replay then waits
    for the lease, never sends a row twice). ``late_rows``: the :func:`row tags <row_tag>` of
    rows whose ambiguous put an attempt settled by a record found before that put's lease was
    over; the record may have been another writer's identical copy (a sibling task's), so the
    put may still land after the execution finished, until its lease ends (:data:`ANY_ROW`:
    too many to list, every row)."""

    execution_id: str
    started_at_ms: int
    lease_expires_at_ms: int
    superseded: bool = False
    attempts: int = 0
    open_tags: int = 0
    late_rows: frozenset[str] = frozenset()

    @property
    def finished(self) -> bool:
        """Every attempt that registered finished: none of them puts any more."""
        return self.open_tags == 0

    def puts_ended_before(self, now_ms: int) -> bool:
        """No put of it can land at ``now_ms``: all its attempts finished with none left to
        land late, or its lease ended before."""
        return (self.finished and not self.late_rows) or self.lease_expires_at_ms < now_ms


@dataclass(frozen=True, slots=True)
class ReplayRun:
    """A replay-mode run (``run``: ``<query>/<batch id>``, or a named CLI run): OPEN while its
    attempts put, COMPLETE once its driver committed it. ``executions`` in the order they
    started."""

    stream: str
    run: str
    state: RunState
    executions: tuple[RunExecution, ...] = ()
    completed_at_ms: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    # when the item may be deleted (DynamoDB TTL, epoch s): at least the stream's retention
    # after its first registration and after its completion, for recovery reads the stream
    expires_at_s: int | None = field(default=None, compare=False)

    def execution(self, execution_id: str) -> RunExecution | None:
        return next((e for e in self.executions if e.execution_id == execution_id), None)

    @property
    def attempts(self) -> int:
        """Attempts registered, over every execution."""
        return sum(e.attempts for e in self.executions)

    @property
    def last_lease_expires_at_ms(self) -> int | None:
        """When the last lease of its executions ends (None without one)."""
        return max((e.lease_expires_at_ms for e in self.executions), default=None)

    def leases_ended_before(self, now_ms: int) -> bool:
        """True when no execution can put at ``now_ms``: an OPEN run is then left open past
        its leases (its driver did not commit it), with no attempt left to put."""
        return all(e.puts_ended_before(now_ms) for e in self.executions)


@dataclass(frozen=True, slots=True)
class RunRegistration:
    """An attempt's registration: ``registered`` False when the run is already COMPLETE (a
    replay of a committed batch sends nothing) or the attempt's execution was superseded by a
    replay (this one must not put), or ``outranked``: a higher attempt of its task registered
    first (it owns the rows; this one must not put). ``run`` as the registration left it,
    every execution before this one's included (with all their counts; this one's own may
    count only its tasks on the run item: a batch past 256 tasks counts the others on
    stripes, :mod:`dedupe_store.run_stripes`); ``task_attempts`` the attempts of its task in
    its execution registered before it, and itself (the task item as its registration wrote
    it: registration order is the order of the writes to that one item);
    ``lease_expires_at_ms`` the attempt's lease: its own, or its execution's when that ends
    first."""

    registered: bool
    run: ReplayRun
    task_attempts: tuple[RunAttempt, ...] = ()
    lease_expires_at_ms: int = 0
    outranked: bool = False

    @property
    def superseded(self) -> bool:
        return self.run.state is RunState.OPEN and not self.registered


class RenewalRefused(StrEnum):
    """Why an attempt's lease could not be renewed."""

    SUPERSEDED = "superseded"  # a later attempt of its task recovered its rows
    EXECUTION_SUPERSEDED = "execution_superseded"  # a replay of the run recovered them
    RUN_NOT_OPEN = "run_not_open"  # the run is COMPLETE (or gone)
    LEASE_OVER = "lease_over"  # its own lease ran out


@dataclass(frozen=True, slots=True)
class AttemptRenewal:
    """A renewal of an attempt's lease: applied (``lease_expires_at_ms`` the new lease), or
    ``refused``, and why."""

    applied: bool
    lease_expires_at_ms: int | None = None
    refused: RenewalRefused | None = None
