"""Plain data the ledger reads and writes. No pynamodb here: the protocol works on these."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dedupe_store.states import LedgerState

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
    """One ledger item: the delivery state of one message key in one stream."""

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


class ClaimStatus(StrEnum):
    WON = "WON"
    LOST = "LOST"


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """A claim either won (``record`` is ours, IN_FLIGHT) or lost (``record`` is the holder's)."""

    status: ClaimStatus
    record: LedgerRecord | None

    @classmethod
    def won(cls, record: LedgerRecord) -> ClaimResult:
        return cls(ClaimStatus.WON, record)

    @classmethod
    def lost(cls, existing: LedgerRecord | None) -> ClaimResult:
        # existing is None only when the item vanished between the failed write and the read
        return cls(ClaimStatus.LOST, existing)


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """A conditional update of a claim: applied, or lost to whoever changed it first."""

    applied: bool
    current: LedgerRecord | None


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
