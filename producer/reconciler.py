"""The reconciler: resolves stale in-flight claims by reading the stream back.

For each claim whose lease expired for everyone (lease + skew), from the sparse in-flight
index, re-read consistently and resolve by read-back, grouped by shard:

    FOUND         -> mark DELIVERED at the found position (conditional on the attempt seen)
    NOT_FOUND     -> the claim stored its payload: take over and send it; else RELEASE
    UNVERIFIABLE  -> mark UNVERIFIABLE; never resend
    CONFLICT      -> leave it and report: an operator decides

Every write is conditional on the attempt seen, so two reconcilers (or a reconciler and a
producer) racing over the same claims never both act.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from dedupe_store.clock import Clock
from dedupe_store.contract import Ledger
from dedupe_store.errors import LedgerError
from dedupe_store.records import ClaimStatus, LedgerRecord, Position
from dedupe_store.states import LedgerState
from producer import metrics
from producer.hooks import NO_HOOKS, Hooks, Step
from producer.kinesis import KinesisWriter
from producer.protocol import LeasePolicy, PutResultKind, chunked, put_entry
from producer.readback import ReadBackResolver, Resolution

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    stream: str
    scanned: int = 0
    delivered: int = 0  # found in the stream and marked
    resent: int = 0  # not found, sent again from the stored payload
    released: int = 0  # not found, no payload: the next producer sends it
    unverifiable: int = 0
    conflicts: list[str] = field(default_factory=list)
    pending: int = 0  # could not be settled this run (the put may land, or a resend is unsure)
    lost_races: int = 0  # another party changed the claim first: nothing to do
    errors: int = 0
    get_records_calls: int = 0

    @property
    def unresolved(self) -> int:
        return len(self.conflicts) + self.pending + self.errors

    def as_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["unresolved"] = self.unresolved
        return body


class Reconciler:
    def __init__(
        self,
        *,
        stream: str,
        ledger: Ledger,
        resolver: ReadBackResolver,
        writer: KinesisWriter,
        clock: Clock,
        lease: LeasePolicy,
        owner: str,
        buckets: Sequence[int] | None = None,
        chunk_size: int = 10_000,  # claims resolved together: each shard window is read once per chunk
        concurrency: int = 32,
        hooks: Hooks = NO_HOOKS,
    ) -> None:
        self._concurrency = concurrency
        self._hooks = hooks
        self.stream = stream
        self._ledger = ledger
        self._resolver = resolver
        self._writer = writer
        self._clock = clock
        self._lease = lease
        self.owner = owner
        self._buckets = buckets
        self._chunk_size = chunk_size

    def run_once(self, progress: Callable[[int], None] | None = None) -> ReconcileReport:
        report = ReconcileReport(self.stream)
        started_ms = self._clock.now_ms()
        calls_before = self._resolver.get_records_calls
        # stale for everyone: lease + skew has passed by our clock
        cutoff_ms = self._clock.now_ms() - self._lease.skew_ms
        keys = self._ledger.stale_in_flight(self.stream, now_ms=cutoff_ms, buckets=self._buckets)
        for chunk in chunked(keys, self._chunk_size):
            self._reconcile_chunk(chunk, report)
            if progress is not None:
                progress(len(chunk))
        report.get_records_calls = self._resolver.get_records_calls - calls_before
        self._ledger.record_run(
            self.stream,
            started_ms=started_ms,
            finished_ms=self._clock.now_ms(),
            outcomes={
                "scanned": report.scanned,
                "delivered": report.delivered,
                "resent": report.resent,
                "released": report.released,
                "unverifiable": report.unverifiable,
                "conflicts": len(report.conflicts),
                "pending": report.pending,
                "lost_races": report.lost_races,
                "errors": report.errors,
            },
        )
        log.info(
            "reconcile stream=%s scanned=%d delivered=%d resent=%d released=%d "
            "unverifiable=%d conflicts=%d pending=%d lost_races=%d errors=%d",
            self.stream,
            report.scanned,
            report.delivered,
            report.resent,
            report.released,
            report.unverifiable,
            len(report.conflicts),
            report.pending,
            report.lost_races,
            report.errors,
        )
        return report

    def _reconcile_chunk(self, keys: list[str], report: ReconcileReport) -> None:
        now_ms = self._clock.now_ms()
        # the index is eventually consistent: act only on what a consistent read shows
        current = self._ledger.batch_get(self.stream, keys)
        claims = [
            record
            for record in current.values()
            if record.state is LedgerState.IN_FLIGHT
            and self._lease.expired_for_everyone(record.lease_expires_at_ms or 0, now_ms)
        ]
        report.scanned += len(claims)
        if not claims:
            return
        results = self._resolver.resolve(claims)

        def act(claim: LedgerRecord) -> tuple[str, str]:
            result = results[claim.key]
            metrics.READ_BACKS.labels(self.stream, result.resolution.value).inc()
            try:
                return claim.key, self._act(claim, result.resolution, result.position)
            except LedgerError as exc:
                log.warning("reconcile action failed stream=%s error=%s", self.stream, exc)
                return claim.key, "errors"

        # ledger latency is hidden by concurrency; every write is conditional on its attempt
        with ThreadPoolExecutor(self._concurrency, thread_name_prefix="keo-reconcile") as pool:
            for key, counted in pool.map(act, claims):
                if counted == "conflicts":
                    report.conflicts.append(key)
                else:
                    setattr(report, counted, getattr(report, counted) + 1)

    def _act(self, claim: LedgerRecord, resolution: Resolution, position: Position | None) -> str:
        """Settle one claim; returns the report field it counts in."""
        if resolution is Resolution.FOUND and position is not None:
            self._hooks.at(Step.RECONCILE_BEFORE_MARK)
            marked = self._ledger.mark_delivered(claim, position, now_ms=self._clock.now_ms())
            return _counted(marked.applied, "delivered")
        if resolution is Resolution.NOT_FOUND:
            if claim.payload is not None:
                return self._resend(claim, claim.payload)
            return _counted(self._ledger.release(claim).applied, "released")
        if resolution is Resolution.UNVERIFIABLE:
            return _counted(self._ledger.mark_unverifiable(claim).applied, "unverifiable")
        if resolution is Resolution.CONFLICT:
            return "conflicts"
        return "pending"

    def _resend(self, claim: LedgerRecord, payload: bytes) -> str:
        """Send a stored payload under a new attempt; ambiguous again means: next run."""
        taken = self._ledger.take_over(
            claim, owner=self.owner, now_ms=self._clock.now_ms(), lease_ms=self._lease.lease_ms
        )
        if taken.status is not ClaimStatus.WON or taken.record is None:
            return "lost_races"
        record = taken.record
        if not self._lease.safe_to_send(record.lease_expires_at_ms or 0, self._clock.now_ms()):
            return "pending"
        (result,) = self._writer.put_entries(
            [put_entry(claim.key, payload, claim.routing_hash_key)]
        )
        if result.kind is not PutResultKind.WRITTEN:
            return "pending"  # still IN_FLIGHT under our attempt; the next run settles it
        position = Position(str(result.shard_id), str(result.sequence_number))
        marked = self._ledger.mark_delivered(record, position, now_ms=self._clock.now_ms())
        return _counted(marked.applied, "resent")


def _counted(applied: bool, name: str) -> str:
    # a conditional write that lost means another party settled the claim first
    return name if applied else "lost_races"
