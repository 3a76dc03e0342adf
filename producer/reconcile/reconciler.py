"""The reconciler: settles claim groups left OPEN by crashes, by reading the stream back.

For each OPEN group whose lease expired for everyone (lease + skew), from the sparse in-flight
index: re-read it consistently, take it over (epoch + 1, so its stalled owner can no longer
settle it), read its members' key items, and resolve the members the group still holds by
read-back, one pass per shard window for all of them:

    FOUND         -> the position, recorded in the group
    NOT_FOUND     -> the claim stored its payload: take it over into a new group and send it;
                     else RELEASE it for the next producer
    UNVERIFIABLE  -> mark the key UNVERIFIABLE; never resend
    CONFLICT      -> leave the group OPEN and report it: an operator decides

then settle the group with every position in one write (SETTLED when nothing is left open).
Every write is conditional on the epoch or attempt seen, so two reconcilers (or a reconciler
and a producer) racing over the same group never both act.

Replay-mode runs (``dedupe=replay``) left OPEN past every attempt's lease, from the same index,
are reported (a warning each, ``open_runs`` in the report, the ``keo_replay_runs_open`` gauge):
their driver did not commit them, and there is nothing to resend (the ledger holds no rows of
theirs). A replay of the run recovers and commits it; else its TTL ends it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from tenacity import wait_exponential

from dedupe_store.clock import Clock
from dedupe_store.contract import Ledger
from dedupe_store.errors import LedgerError
from dedupe_store.records import Group, KeyClaim, LedgerRecord, Position, ReplayRun
from dedupe_store.states import GroupState, KeyState
from kinesis_store.writer import KinesisWriter
from producer import metrics
from producer.errors import StreamError
from producer.hooks import NO_HOOKS, Hooks, Step
from producer.key.context import LedgerCalls
from producer.key.decisions import ReadBackAction, read_back_action
from producer.key.readback import ReadBackResolver, ReadBackResult
from producer.protocol import LeasePolicy, chunked
from producer.reconcile.resend import PayloadResender
from producer.retries import call_retrying

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_R = TypeVar("_R")


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
    groups: int = 0  # stale groups taken over and resolved
    get_records_calls: int = 0
    # buckets of the in-flight index that could not be read, with why (their groups wait
    # for the next run); the others were settled all the same
    failed_buckets: dict[str, str] = field(default_factory=dict)
    # replay-mode runs left OPEN past every attempt's lease, by name: reported, nothing to
    # resend, not unresolved (a replay of the run ends it; the reconciler cannot)
    open_runs: list[str] = field(default_factory=list)
    run_recorded: bool = True  # the run's record in the ledger (the API's summary reads it)

    @property
    def unresolved(self) -> int:
        return len(self.conflicts) + self.pending + self.errors

    @property
    def complete(self) -> bool:
        """Every bucket was read and the run was recorded."""
        return not self.failed_buckets and self.run_recorded

    def counts(self) -> dict[str, int]:
        """How many stale claims the pass looked at (``scanned``), and what became of them."""
        return {
            "scanned": self.scanned,
            "delivered": self.delivered,
            "resent": self.resent,
            "released": self.released,
            "unverifiable": self.unverifiable,
            "conflicts": len(self.conflicts),
            "pending": self.pending,
            "lost_races": self.lost_races,
            "errors": self.errors,
        }

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
        chunk_size: int = 40,  # groups resolved together (up to 20,000 claims): one read per shard window
        concurrency: int = 32,
        hooks: Hooks = NO_HOOKS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._concurrency = concurrency
        self._hooks = hooks
        self._sleep = sleep
        self._read_wait = wait_exponential(multiplier=0.2, max=2.0)
        self.stream = stream
        self._ledger = ledger
        self._resolver = resolver
        self._clock = clock
        self._lease = lease
        self.owner = owner
        self._buckets = buckets
        self._chunk_size = chunk_size
        self._resender = PayloadResender(
            LedgerCalls(stream=stream, owner=owner, ledger=ledger, clock=clock, lease=lease),
            writer=writer,
            map_each=self._map,
            where=self._where,
        )

    def run_once(self, progress: Callable[[int], None] | None = None) -> ReconcileReport:
        report = ReconcileReport(self.stream)
        started_ms = self._clock.now_ms()
        calls_before = self._resolver.get_records_calls
        # stale for everyone: lease + skew has passed by our clock
        cutoff_ms = self._clock.now_ms() - self._lease.skew_ms
        buckets = (
            list(self._buckets)
            if self._buckets is not None
            else list(range(self._ledger.inflight_buckets))
        )
        group_ids = self._per_bucket(
            buckets, functools.partial(self._stale, cutoff_ms=cutoff_ms), report
        )
        # groups of every bucket resolved together: each shard window is read once per chunk
        for chunk in chunked(group_ids, self._chunk_size):
            try:
                self._reconcile_chunk(chunk, report)
            except (LedgerError, StreamError) as exc:
                # taken-over groups keep our lease: the next run settles them
                log.warning(
                    "reconcile chunk failed stream=%s groups=%d error=%s",
                    self.stream,
                    len(chunk),
                    exc,
                )
                report.errors += len(chunk)
            if progress is not None:
                progress(len(chunk))
        open_runs = self._per_bucket(
            buckets, functools.partial(self._open_runs, cutoff_ms=cutoff_ms), report
        )
        for run in open_runs:
            self._report_open_run(run, report)
        report.get_records_calls = self._resolver.get_records_calls - calls_before
        counts = {
            **report.counts(),
            "failed_buckets": len(report.failed_buckets),
            "open_runs": len(report.open_runs),
        }
        try:
            self._retrying(
                lambda: self._ledger.record_run(
                    self.stream,
                    started_ms=started_ms,
                    finished_ms=self._clock.now_ms(),
                    outcomes=counts,
                )
            )
        except LedgerError as exc:
            # what was settled stays settled; the report still says what the run did
            log.warning("reconcile run not recorded stream=%s error=%s", self.stream, exc)
            report.run_recorded = False
        _count(report, finished_s=self._clock.now_ms() / 1000)
        counts = {**report.counts(), "open_runs": len(report.open_runs)}
        log.info(
            "reconcile stream=%s %s",
            self.stream,
            " ".join(f"{name}={count}" for name, count in counts.items()),
            extra={**self._where(), "event": "reconcile_pass", "counts": counts},
        )
        return report

    def _per_bucket(
        self, buckets: Sequence[int], read: Callable[[int], list[_T]], report: ReconcileReport
    ) -> list[_T]:
        """What ``read`` finds in each bucket of the index, retried. One bucket that cannot be
        read does not stop the others: it is reported, and what it holds waits for the next
        pass."""
        found: list[_T] = []
        for bucket in buckets:
            try:
                found.extend(self._retrying(functools.partial(read, bucket)))
            except LedgerError as exc:
                log.warning(
                    "reconcile bucket failed stream=%s bucket=%d error=%s", self.stream, bucket, exc
                )
                report.failed_buckets.setdefault(str(bucket), str(exc))
        return found

    def _report_open_run(self, run: ReplayRun, report: ReconcileReport) -> None:
        """A run its driver did not commit: said, never acted on (the ledger has no rows of it)."""
        log.warning(
            "replay run left open stream=%s run=%s attempts=%d last_lease_expires_at_ms=%d",
            self.stream,
            run.run,
            run.attempts,
            run.last_lease_expires_at_ms or 0,
            extra={**self._where(), "event": "replay_run_open", "run": run.run},
        )
        report.open_runs.append(run.run)

    def _where(self) -> dict[str, str]:
        """The fields of every log line of the reconciler (JSON logs show them as such)."""
        return {"stream": self.stream, "table": self._ledger.table_name}

    def _reconcile_chunk(self, group_ids: list[str], report: ReconcileReport) -> None:
        taken = self._take_over_stale(group_ids, report)
        if not taken:
            return
        report.groups += len(taken)
        members = {key for group, _ in taken for key in group.members}
        claims = self._retrying(lambda: self._ledger.batch_get_claims(self.stream, members))
        # the members each group still holds, unresolved: the others moved on or are done
        held_claims = {
            group.group_id: [
                claim
                for key in dict.fromkeys(group.members)
                if (claim := claims.get(key)) is not None
                and claim.state is KeyState.CLAIMED
                and claim.group_id == group.group_id
                and group.position_of(key) is None
            ]
            for group, _ in taken
        }
        # the window runs to the lease its owner sent under, not the one we just took
        targets = [
            LedgerRecord.of(claim, group)
            for group, _ in taken
            for claim in held_claims[group.group_id]
        ]
        report.scanned += len(targets)
        results = self._resolver.resolve(targets) if targets else {}
        to_resend: list[KeyClaim] = []
        settles: list[tuple[Group, dict[str, Position], bool, set[str]]] = []
        for group, held in taken:
            positions: dict[str, Position] = {}
            resending: set[str] = set()
            open_left = False
            for claim in held_claims[group.group_id]:
                counted = self._act(claim, results[claim.key], positions)
                if counted == "resend":
                    to_resend.append(claim)
                    resending.add(claim.key)
                    continue
                if counted == "conflicts":
                    report.conflicts.append(claim.key)
                else:
                    setattr(report, counted, getattr(report, counted) + 1)
                open_left = open_left or counted in {"pending", "errors", "conflicts"}
            settles.append((held, positions, open_left, resending))
        # a key to resend moves to a new group first; one that could not stays in its group
        moved = self._resender.resend(to_resend, report) if to_resend else set()
        for held, positions, open_left, resending in settles:
            self._settle(
                held, positions, open_left=open_left or bool(resending - moved), report=report
            )

    def _take_over_stale(
        self, group_ids: list[str], report: ReconcileReport
    ) -> list[tuple[Group, Group]]:
        """Take over each group still OPEN and past its lease for everyone; returns each as
        its owner left it and as we now hold it. The index is eventually consistent: act only
        on what a consistent read shows."""
        now_ms = self._clock.now_ms()
        seen = [
            group
            for group in self._retrying(
                lambda: self._ledger.batch_get_groups(self.stream, group_ids)
            ).values()
            if group.state is GroupState.OPEN
            and self._lease.expired_for_everyone(group.lease_expires_at_ms, now_ms)
        ]
        taken: list[tuple[Group, Group]] = []
        for group, held in zip(seen, self._map(self._take_over_group, seen), strict=True):
            if isinstance(held, LedgerError):
                report.errors += 1
            elif held is None:
                report.lost_races += 1
            else:
                taken.append((group, held))
        return taken

    def _stale(self, bucket: int, *, cutoff_ms: int) -> list[str]:
        return list(self._ledger.stale_groups(self.stream, now_ms=cutoff_ms, buckets=[bucket]))

    def _open_runs(self, bucket: int, *, cutoff_ms: int) -> list[ReplayRun]:
        return list(self._ledger.open_runs(self.stream, now_ms=cutoff_ms, buckets=[bucket]))

    def _retrying(self, call: Callable[[], _T]) -> _T:
        """Reads of the ledger, and the run record: a retriable error is tried again."""
        return call_retrying(call, attempts=3, wait=self._read_wait, sleep=self._sleep)

    def _take_over_group(self, group: Group) -> Group | LedgerError | None:
        try:
            taken = self._ledger.take_over_group(
                group,
                owner=self.owner,
                now_ms=self._clock.now_ms(),
                lease_ms=self._lease.lease_ms,
                skew_ms=self._lease.skew_ms,
            )
        except LedgerError as exc:
            log.warning(
                "group take over failed stream=%s error=%s", self.stream, exc, extra=self._where()
            )
            return exc
        return taken.current if taken.applied else None

    def _act(self, claim: KeyClaim, result: ReadBackResult, positions: dict[str, Position]) -> str:
        """Settle one member of a group we took over; returns the report field it counts in
        (or "resend"). The claim's data is at hand only when it stored its payload."""
        metrics.READ_BACKS.labels(self.stream, result.resolution.value).inc()
        position = result.position
        action = read_back_action(
            result.resolution, ours=True, can_resend=claim.payload is not None
        )
        try:
            if action is ReadBackAction.RECORD and position is not None:
                positions[claim.key] = position
                return "delivered"
            if action is ReadBackAction.RESEND:
                return "resend"
            if action is ReadBackAction.RELEASE:
                return _counted(self._ledger.release(claim).applied, "released")
            if action is ReadBackAction.UNVERIFIABLE:
                return _counted(self._ledger.mark_unverifiable(claim).applied, "unverifiable")
        except LedgerError as exc:
            log.warning(
                "reconcile action failed stream=%s error=%s", self.stream, exc, extra=self._where()
            )
            return "errors"
        if action is ReadBackAction.CONFLICT:
            return "conflicts"
        return "pending"

    def _settle(
        self,
        group: Group,
        positions: dict[str, Position],
        *,
        open_left: bool,
        report: ReconcileReport,
    ) -> None:
        """Record what was found; SETTLED unless a member is left open (the next run retries)."""
        self._hooks.at(Step.RECONCILE_BEFORE_MARK)
        try:
            settled = self._ledger.record_positions(
                group, positions, settle=not open_left, now_ms=self._clock.now_ms()
            )
        except LedgerError as exc:
            log.warning(
                "settle failed stream=%s group=%s error=%s",
                self.stream,
                group.group_id,
                exc,
                extra={**self._where(), "group": group.group_id},
            )
            report.delivered -= len(positions)
            report.errors += len(positions)
            return
        if not settled.applied:  # another reconciler took the group over from us
            report.delivered -= len(positions)
            report.lost_races += len(positions)

    def _map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        # ledger latency is hidden by concurrency; every write is conditional on its epoch
        if len(items) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(self._concurrency, thread_name_prefix="keo-reconcile") as pool:
            return list(pool.map(fn, items))


def _count(report: ReconcileReport, *, finished_s: float) -> None:
    """A pass's outcomes in the process's metrics."""
    stream = report.stream
    metrics.RECONCILE_RUNS.labels(stream).inc()
    metrics.STALE_GROUPS.labels(stream).set(report.groups)
    metrics.REPLAY_RUNS_OPEN.labels(stream).set(len(report.open_runs))
    metrics.LAST_RECONCILE.labels(stream).set(finished_s)
    for outcome, count in report.counts().items():
        if outcome != "scanned":
            metrics.RECONCILE_CLAIMS.labels(stream, outcome).inc(count)


def _counted(applied: bool, name: str) -> str:
    # a conditional write that lost means another party settled the claim first
    return name if applied else "lost_races"
