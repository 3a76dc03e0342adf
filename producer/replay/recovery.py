"""Where a replay-mode attempt starts, and how it recovers what earlier attempts put.

::

    start_attempt(registration)   the earlier executions' and my task's earlier attempts
      │                           superseded first (their leases stop growing: the bounds the
      │                           ledger shows then are final), then the step decided
      │                           (producer.replay.plan.recovery_step) and, to recover or wait,
      │                           the windows to read: an AttemptStart
      └─ Recovery.recover(rows)   per call: a row found is DUPLICATE (not sent again); rows not
                                  found while an earlier lease runs (or a late row of a
                                  finished execution, until its lease ends): wait for it, read
                                  again; the rest are left to send

A recovery whose windows reach past the stream's trim horizon fails (nothing sent), unless the
policy accepts the risk of duplicates (checked as the attempt starts and before each shard is
read).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dedupe_store.clock import Clock
from dedupe_store.contract import RunLedger, RunReader
from dedupe_store.records import ReplayRun, RunAttempt, RunRegistration
from dedupe_store.states import RunState
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import Shard
from producer import metrics
from producer.errors import ReplayWindowTrimmedError
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import LeasePolicy, PreparedMessage
from producer.replay.context import ReplayContext, ReplayTask
from producer.replay.lease import AttemptLease
from producer.replay.plan import (
    Earlier,
    EarlierKind,
    RecoveryStep,
    earlier_of,
    landing_late,
    past_trim_horizon,
    read_windows,
    recovery_step,
    still_running,
    to_supersede,
)
from producer.replay.readback import EarlierPuts, records_in, row_tag_of
from producer.replay.shared_reads import MAX_PLANNED_RECORDS, PlannedReads, RecordRead

__all__ = [
    "AttemptStart",
    "Recovery",
    "plan_reads",
    "plan_reads_once_over",
    "start_attempt",
    "unresolved",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AttemptStart:
    """Where a registered attempt starts: ``me`` with the lease it registered (its own, or its
    execution's when that ends first), its first ``step``, whether a higher attempt of its task
    ``outranked`` it, and, to recover or wait, the earlier attempts' ``windows`` and when the
    last earlier lease that can still put ends (``earlier_end_ms``: none can grow now);
    ``in_execution``: every earlier attempt is of my execution (a task retry: each put of
    theirs was sent after my execution's driver listed the shards)."""

    me: RunAttempt
    step: RecoveryStep
    outranked: bool
    windows: list[tuple[int, int]]
    landing_late: list[Earlier]  # finished executions whose late rows may still land
    earlier_end_ms: int
    in_execution: bool = False

    @property
    def recovers(self) -> bool:
        return self.step in (RecoveryStep.RECOVER, RecoveryStep.WAIT)


def start_attempt(
    context: ReplayContext, task: ReplayTask, me: RunAttempt, registration: RunRegistration
) -> AttemptStart:
    """Supersede what is earlier (ledger writes), then decide the attempt's first step."""
    me = dataclasses.replace(
        me, lease_expires_at_ms=registration.lease_expires_at_ms or me.lease_expires_at_ms
    )
    # the attempts of my task that registered before me: the task item as my registration
    # wrote it (one that registers later recovers against me)
    registered_before = frozenset(
        a.attempt_id for a in registration.task_attempts if a.attempt_id != me.attempt_id
    )
    run = registration.run
    complete = run.state is RunState.COMPLETE
    earlier = earlier_of(run, registration.task_attempts, me, registered_before=registered_before)
    if earlier and registration.registered and not complete:
        run, task_attempts = _supersede(context, task.run, me, run, earlier)
        earlier = earlier_of(
            run,
            registration.task_attempts if task_attempts is None else task_attempts,
            me,
            registered_before=registered_before,
        )
    # read after the ledger answered: an execution it showed finished put everything before
    now_ms = context.clock.now_ms()
    step = recovery_step(
        run_complete=complete,
        superseded=registration.superseded,
        earlier=earlier,
        now_ms=now_ms,
        lease=context.lease,
    )
    running = still_running(earlier, now_ms, context.lease)
    late = landing_late(earlier, now_ms, context.lease)
    metrics.REPLAY_ATTEMPTS.labels(context.stream, step.value).inc()
    start = AttemptStart(
        me=me,
        step=step,
        outranked=registration.outranked,
        windows=[],
        landing_late=late,
        earlier_end_ms=max((e.lease_expires_at_ms for e in [*running, *late]), default=0),
        in_execution=all(e.kind is EarlierKind.ATTEMPT for e in earlier),
    )
    if start.recovers:
        metrics.REPLAY_RECOVERIES.labels(context.stream).inc()
        start = dataclasses.replace(start, windows=read_windows(earlier, context.lease, now_ms))
    log.info(
        "replay attempt stream=%s run=%s attempt=%s execution=%s task=%s task_attempt=%d "
        "step=%s earlier=%d running=%d",
        context.stream,
        task.run,
        me.attempt_id,
        task.execution_id,
        task.task,
        task.task_attempt,
        step,
        len(earlier),
        len(running),
    )
    return start


def _supersede(
    context: ReplayContext, run_name: str, me: RunAttempt, run: ReplayRun, earlier: list[Earlier]
) -> tuple[ReplayRun, tuple[RunAttempt, ...] | None]:
    """Fence the earlier executions' and attempts' leases: the run and my task's attempts as
    the fencing writes left them (None: no attempt was fenced)."""
    executions = to_supersede(earlier, EarlierKind.EXECUTION)
    if executions:
        run = context.ledger.supersede_executions(context.stream, run_name, executions) or run
    attempts = to_supersede(earlier, EarlierKind.ATTEMPT)
    task_attempts = (
        context.ledger.supersede_attempts(context.stream, run_name, me, attempts)
        if attempts
        else None
    )
    return run, task_attempts


def plan_reads(
    ledger: RunReader,
    reader: KinesisReader,
    clock: Clock,
    lease: LeasePolicy,
    run: str,
    *,
    max_records: int = MAX_PLANNED_RECORDS,
    found: ReplayRun | None = None,
) -> PlannedReads | None:
    """On a driver, before a write's tasks start: what every task of a replay of ``run`` would
    read back, read once: every shard's records in the windows of the run's executions so far
    (each one earlier to every task of a new execution). None where the tasks must read for
    themselves: no earlier execution, the run COMPLETE, an earlier lease not over for every
    clock or a window not ended (a later read could find more), or more than ``max_records``
    (what the tasks are sent travels with each)."""
    if found is None:  # else the run as the caller just read it
        found = ledger.get_run(reader.stream, run)
    now_ms = clock.now_ms()
    if found is None or found.state is RunState.COMPLETE or not found.executions:
        return None
    earlier = [Earlier.of_execution(e) for e in found.executions]
    if any(not lease.expired_for_everyone(e.lease_expires_at_ms, now_ms) for e in earlier):
        return None
    windows = tuple(read_windows(earlier, lease, now_ms))
    if any(end_ms + lease.skew_ms >= now_ms for _, end_ms in windows):
        return None
    shards = tuple(reader.shards())
    reads: dict[str, tuple[RecordRead, ...]] = {}
    for shard in shards:
        reads[shard.shard_id] = tuple(records_in(reader, shard, windows, clock.now_ms()))
        if sum(len(read) for read in reads.values()) > max_records:
            log.info(
                "replay recovery not planned on the driver stream=%s run=%s: over %d records",
                reader.stream,
                run,
                max_records,
            )
            return None
    planned = PlannedReads(run, now_ms, shards, windows, reads)
    log.info(
        "replay recovery planned on the driver stream=%s run=%s shards=%d records=%d",
        reader.stream,
        run,
        len(shards),
        planned.records,
    )
    return planned


def plan_reads_once_over(
    ledger: RunLedger,
    reader: KinesisReader,
    clock: Clock,
    lease: LeasePolicy,
    run: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> PlannedReads | None:
    """:func:`plan_reads`, on a driver that may wait before its tasks start (``foreachBatch``'s,
    a batch write's), also for a replay that starts while an earlier execution may still put
    (a driver restarted within a lease of its crash: the common case). Its executions are
    superseded first, as each task's registration would (their leases stop growing: the ends
    the ledger shows then are final), then the driver waits until those ends are over for
    every clock and plans. The tasks would wait as long: a row not found while an earlier
    lease runs cannot be decided, and an execution left unfinished put only part of its rows;
    each would then read every shard its rows go to, T reads a shard for T tasks.

    Where the only leases left are of executions that finished, their puts all landed (a
    driver killed in its commit), nothing is waited for: the tasks find what they put
    without a wait (:func:`plan_reads` plans nothing then)."""
    found = ledger.get_run(reader.stream, run)
    now_ms = clock.now_ms()
    if found is None or found.state is RunState.COMPLETE:
        return None
    earlier = [Earlier.of_execution(e) for e in found.executions]
    if still_running(earlier, now_ms, lease):
        executions = to_supersede(earlier, EarlierKind.EXECUTION)
        if executions:
            found = ledger.supersede_executions(reader.stream, run, executions) or found
        # over for every clock, and their windows (each lease plus the skew) ended before the read
        over_ms = max(e.lease_expires_at_ms for e in found.executions) + 2 * lease.skew_ms + 1
        log.info(
            "replay recovery waits on the driver for earlier leases stream=%s run=%s "
            "executions=%d wait_s=%.1f",
            reader.stream,
            run,
            len(found.executions),
            max(0, over_ms - now_ms) / 1000,
        )
        while (left_ms := over_ms - clock.now_ms()) > 0:
            sleep(min(left_ms / 1000, 1.0))
        return plan_reads(ledger, reader, clock, lease, run)  # read again after the wait
    return plan_reads(ledger, reader, clock, lease, run, found=found)


class Recovery:
    """What the earlier attempts of a run put, read back over their ``start.windows`` once per
    shard (:class:`producer.replay.readback.EarlierPuts`), while the attempt keeps its
    ``lease``. ``on_trimmed``: what the attempt does before a recovery past the stream's
    retention raises (it finishes, no put of it in flight). ``listed_before``: the open shards
    the execution's driver listed before its tasks started, which route the read-back of a
    task retry (every earlier attempt of this execution) without a listing of its own."""

    def __init__(
        self,
        context: ReplayContext,
        task: ReplayTask,
        start: AttemptStart,
        lease: AttemptLease,
        *,
        on_trimmed: Callable[[], None],
        listed_before: Sequence[Shard] | None = None,
    ) -> None:
        self._context = context
        self._task = task
        self._lease = lease
        self._windows = start.windows
        self._on_trimmed = on_trimmed
        self._landing_late = start.landing_late
        self._earlier_end_ms = start.earlier_end_ms
        self._past_retention_accepted = False  # reads past the trim horizon, the risk taken
        self.earlier = EarlierPuts(
            context.reader,
            context.clock,
            start.windows,
            final=start.step is RecoveryStep.RECOVER,
            skew_ms=context.lease.skew_ms,
            keep_alive=lease.keep,
            before_read=self.check_retention,
            listed_before=listed_before if start.in_execution else None,
        )

    def check_retention(self, now_ms: int) -> None:
        """Refuse to recover from windows the stream no longer holds (nothing more sent),
        unless the policy accepts the risk of duplicates. Checked as the attempt starts, and
        again before each shard is read."""
        context = self._context
        windows = self._windows
        horizon_ms = past_trim_horizon(windows, now_ms, context.retention_ms, context.lease.skew_ms)
        if horizon_ms is None or self._past_retention_accepted:
            return
        send = context.policy.send_past_retention
        self._past_retention_accepted = send  # counted and told once
        metrics.REPLAY_PAST_RETENTION.labels(context.stream, "sent" if send else "failed").inc()
        log.error(
            "replay recovery window past the stream's retention stream=%s run=%s "
            "window_start_ms=%d trim_horizon_ms=%d action=%s",
            context.stream,
            self._task.run,
            windows[0][0],
            horizon_ms,
            "send rows not found (duplicates possible)" if send else "fail, nothing sent",
        )
        if send:
            return
        self._on_trimmed()
        raise ReplayWindowTrimmedError(
            context.stream,
            self._task.run,
            window_start_ms=windows[0][0],
            trim_horizon_ms=horizon_ms,
        )

    def recover(
        self, items: list[PreparedMessage], decided: dict[int, Outcome]
    ) -> list[PreparedMessage]:
        """The items no earlier attempt put; the others are DUPLICATE at their position, or
        IN_FLIGHT when an earlier put of them may still land and the wait for it failed."""
        earlier = self.earlier
        left = self._take_found(items, decided)
        # not found while an earlier put of them may still land: wait until none can, read
        # again (every row while an earlier lease runs; else only a late-landing row's)
        undecided = left if not earlier.final else [i for i in left if self._may_land_late(i)]
        if undecided:
            reason = (
                f"an earlier attempt of run {self._task.run!r} may still put this row until "
                f"{self._earlier_end_ms + self._context.lease.skew_ms} (epoch ms): re-run"
            )
            if not self._lease.wait_until_over(self._earlier_end_ms):
                for item in undecided:
                    decided[item.index] = unresolved(item, OutcomeStatus.IN_FLIGHT, reason)
                waiting = {item.index for item in undecided}
                return [item for item in left if item.index not in waiting]
            self._landing_late = []
            earlier.read_again()
            left = self._take_found(left, decided)
        return left

    def _may_land_late(self, item: PreparedMessage) -> bool:
        if not self._landing_late:
            return False
        tag = row_tag_of(item)
        return any(e.may_land_late(tag) for e in self._landing_late)

    def _take_found(
        self, items: list[PreparedMessage], decided: dict[int, Outcome]
    ) -> list[PreparedMessage]:
        left: list[PreparedMessage] = []
        for item, position in zip(items, self.earlier.match(items), strict=True):
            if position is None:
                left.append(item)
            else:
                metrics.REPLAY_ROWS_FOUND.labels(self._context.stream).inc()
                decided[item.index] = Outcome(
                    item.index,
                    item.key,
                    OutcomeStatus.DUPLICATE,
                    position=position,
                    reason="put by an earlier attempt of this run",
                )
        return left


def unresolved(item: PreparedMessage, status: OutcomeStatus, reason: str) -> Outcome:
    """An outcome with no position: FAILED (not sent) or IN_FLIGHT (may have landed)."""
    return Outcome(item.index, item.key, status, reason=reason)
