"""Read-back: decide where a claim's put went by reading the stream.

One implementation, used by the producer (ambiguous puts, expired claims of others) and by the
reconciler. Claims are grouped by shard so each shard window is read once, however many
claims it resolves: the GetRecords calls grow with the data in the window, not with the
number of claims.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from dedupe_store.clock import Clock
from dedupe_store.records import LedgerRecord, Position
from kinesis_store.kpl import UserRecord
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import Shard, kcl_view, lineage
from producer import metrics
from producer.key.decisions import Resolution
from producer.protocol import LeasePolicy, payload_digest

__all__ = ["ReadBackResolver", "ReadBackResult", "Resolution"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReadBackResult:
    key: str
    resolution: Resolution
    position: Position | None = None


@dataclass(frozen=True, slots=True)
class _Want:
    claim: LedgerRecord
    start_ms: int
    end_ms: int


class ReadBackResolver:
    def __init__(
        self,
        reader: KinesisReader,
        clock: Clock,
        lease: LeasePolicy,
        *,
        retention_hours: int,
    ) -> None:
        self._reader = reader
        self._clock = clock
        self._lease = lease
        self._retention_ms = retention_hours * 3600 * 1000

    @property
    def get_records_calls(self) -> int:
        return self._reader.get_records_calls

    def resolve(self, claims: Sequence[LedgerRecord]) -> dict[str, ReadBackResult]:
        """One result per claim's key. Claims must be IN_FLIGHT records read consistently."""
        now_ms = self._clock.now_ms()
        shards = self._reader.shards()
        by_shard: dict[str, list[_Want]] = defaultdict(list)
        for claim in claims:
            lease_end = claim.lease_expires_at_ms or (claim.claimed_at_ms + self._lease.lease_ms)
            start_ms, end_ms = self._lease.read_back_window(claim.claimed_at_ms, lease_end)
            want = _Want(claim, start_ms, end_ms)
            for shard in lineage(shards, int(claim.routing_hash_key)):
                by_shard[shard.shard_id].append(want)

        found: dict[str, ReadBackResult] = {}
        conflicts: dict[str, Position] = {}
        used: set[tuple[str, str, int | None]] = set()
        shard_by_id = {shard.shard_id: shard for shard in shards}
        for shard_id, wants in by_shard.items():
            self._scan(
                shard_by_id[shard_id],
                wants,
                now_ms=now_ms,
                found=found,
                conflicts=conflicts,
                used=used,
            )

        results: dict[str, ReadBackResult] = {}
        trim_horizon_ms = now_ms - self._retention_ms
        for claim in claims:
            key = claim.key
            if key in found:
                results[key] = found[key]
                continue
            lease_end = claim.lease_expires_at_ms or (claim.claimed_at_ms + self._lease.lease_ms)
            start_ms, _ = self._lease.read_back_window(claim.claimed_at_ms, lease_end)
            if start_ms < trim_horizon_ms:
                results[key] = ReadBackResult(key, Resolution.UNVERIFIABLE)
            elif key in conflicts:
                results[key] = ReadBackResult(key, Resolution.CONFLICT, conflicts[key])
            elif self._lease.expired_for_everyone(lease_end, now_ms):
                results[key] = ReadBackResult(key, Resolution.NOT_FOUND)
            else:
                results[key] = ReadBackResult(key, Resolution.PENDING)
        return results

    def _scan(
        self,
        shard: Shard,
        wants: list[_Want],
        *,
        now_ms: int,
        found: dict[str, ReadBackResult],
        conflicts: dict[str, Position],
        used: set[tuple[str, str, int | None]],
    ) -> None:
        by_key: dict[str, list[_Want]] = defaultdict(list)
        for want in wants:
            if want.claim.key not in found:
                by_key[want.claim.key].append(want)
        if not by_key:
            return
        start_ms = min(w.start_ms for ws in by_key.values() for w in ws)
        # never wait for the future: read to the tip as of now, PENDING covers the rest
        end_ms = min(max(w.end_ms for ws in by_key.values() for w in ws), now_ms)
        read = self._reader.read_window(shard.shard_id, start_ms, end_ms, now_ms=self._clock.now_ms)
        for record, delivered in kcl_view(read, shard):
            candidates = by_key.get(record.partition_key)
            if not delivered:
                # a stray aggregate: written, never delivered to a KCL consumer
                metrics.READ_DROPPED.labels(
                    self._reader.stream, metrics.DROPPED_OUTSIDE_SHARD
                ).inc()
                continue
            if not candidates:
                continue
            identity = (record.shard_id, record.sequence_number, record.sub_sequence_number)
            for want in candidates:
                if not want.start_ms <= record.arrival_ms <= want.end_ms or identity in used:
                    continue
                claim = want.claim
                if payload_digest(record.data, claim.routing_hash_key) == claim.payload_digest:
                    used.add(identity)
                    found[claim.key] = ReadBackResult(
                        claim.key, Resolution.FOUND, _position(record)
                    )
                    del by_key[claim.key]
                    break
                conflicts.setdefault(claim.key, _position(record))
            if not by_key:
                return


def _position(record: UserRecord) -> Position:
    return Position(record.shard_id, record.sequence_number, record.sub_sequence_number)
