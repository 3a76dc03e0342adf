"""Plain data the ledger reads and writes. No pynamodb here: the protocol works on these."""

from __future__ import annotations

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


# --- replay mode: a run and its attempts --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunAttempt:
    """One attempt at a replay-mode run: a Spark task attempt (``task`` its partition,
    ``task_attempt`` its order among the task's attempts: Spark's task attempt id) of one
    driver execution, or a CLI process. It puts under its own lease; once ``superseded`` by a
    later attempt it can no longer renew."""

    attempt_id: str
    execution_id: str
    task: str
    task_attempt: int
    started_at_ms: int
    lease_expires_at_ms: int
    superseded: bool = False


@dataclass(frozen=True, slots=True)
class ReplayRun:
    """A replay-mode run (``run``: ``<query>/<batch id>``, or a named CLI run): OPEN while its
    attempts put, COMPLETE once its driver committed it. ``attempts`` in the order they
    started."""

    stream: str
    run: str
    state: RunState
    attempts: tuple[RunAttempt, ...] = ()
    completed_at_ms: int | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def attempt(self, attempt_id: str) -> RunAttempt | None:
        return next((a for a in self.attempts if a.attempt_id == attempt_id), None)

    @property
    def last_lease_expires_at_ms(self) -> int | None:
        """When the last lease of its attempts ends (None without attempts)."""
        return max((a.lease_expires_at_ms for a in self.attempts), default=None)

    def leases_ended_before(self, now_ms: int) -> bool:
        """True when every attempt's lease ended before ``now_ms``: an OPEN run is then left
        open past its leases (its driver did not commit it), with no attempt left to put."""
        last = self.last_lease_expires_at_ms
        return last is None or last < now_ms


@dataclass(frozen=True, slots=True)
class RunRegistration:
    """An attempt's registration: ``registered`` False when the run is already COMPLETE (a
    replay of a committed batch sends nothing); ``run`` as the registration left it, every
    attempt before this one included."""

    registered: bool
    run: ReplayRun


@dataclass(frozen=True, slots=True)
class AttemptRenewal:
    """A renewal of an attempt's lease: applied (``run`` shows the new lease), or refused
    because the attempt was superseded, its lease ran out, or the run is COMPLETE."""

    applied: bool
    run: ReplayRun | None
