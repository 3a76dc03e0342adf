"""Replay mode (``dedupe=replay``): the stream holds exactly what a run without failures would
have written, however often the run is retried or replayed, with no per-message ledger write.

A *run* is what can be replayed (a Spark micro-batch ``<query>/<batch id>``, a batch write, a
CLI run named with ``--run-id``); each task attempt or process that puts its rows is an
*attempt*, registered in the run's ledger item (DESIGN.md "Replay mode"). The decisions are
pure (:mod:`producer.replay.plan`); the read-back is :mod:`producer.replay.readback`; the puts
go through the put loop key mode uses (:mod:`producer.put_loop`), under the attempt's lease.

::

    ReplayProducer.attempt(task)                 two small ledger writes: register with the run
      │                                          (its execution counted; the run not COMPLETE)
      │                                          and with the task's own item
      └─ ReplayAttempt ── recovery_step:
           ├─ DONE ────── the run is COMPLETE: every row DUPLICATE, nothing sent
           ├─ SUPERSEDED  a replay superseded this execution, or a higher attempt of the task
           │              registered first: every row FAILED, nothing sent
           ├─ FAST_PATH ─ nothing earlier: plain puts
           └─ RECOVER, WAIT: supersede the earlier executions and my task's earlier attempts
              (their leases stop growing), then
              per call, EarlierPuts.match(rows): a row found is DUPLICATE (not sent again);
              rows not found while an earlier lease runs (or a late row of a finished
              execution, until its lease ends): wait for it, read again, then send
         send(messages) ── puts: full requests, SDK retries off, the fence against the attempt's
         │                 lease (renewed when short: one write), per-record errors resent
         │                 ├─ written ───── SENT at its position
         │                 ├─ ambiguous ─── read back from its request's send time - skew
         │                 │                to its lease's end + skew: found is SENT; not
         │                 │                found once the lease it left under is over:
         │                 │                sent again; else IN_FLIGHT
         │                 └─ not written ─ FAILED (the lease lost, or not retriable)
         finish() ──────── every put has a definite result: the attempt is finished (one
                           write); once all of its execution's are, a replay waits for none,
                           but for a late row it does not find: a row whose ambiguous put was
                           settled by a record found before its lease was over (that record
                           may be a sibling's copy: the put may still land), listed on the
                           execution. Rows matched beside another writer's identical record
                           are counted (rows_matched_ambiguously) and warned of, once
    ReplayProducer.complete(run)                 one write: COMPLETE; a replay sends nothing

Outcomes are key mode's: SENT, DUPLICATE (found from an earlier attempt, or the run is
COMPLETE), REJECTED, FAILED (not sent: re-run), IN_FLIGHT (may have landed: re-run, the next
attempt reads it back). A run is complete only when every row is SENT, DUPLICATE or REJECTED.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dedupe_store.clock import Clock
from dedupe_store.contract import Ledger
from dedupe_store.errors import LedgerError
from dedupe_store.records import Position, ReplayRun, RunAttempt, RunRegistration
from dedupe_store.states import RunState
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from kinesis_store.provisioning import DEFAULT_RETENTION_HOURS
from kinesis_store.reader import KinesisReader
from kinesis_store.results import RecordResult
from kinesis_store.shards import OpenShards, Shard
from kinesis_store.writer import KinesisWriter
from producer import metrics
from producer.errors import ReplayWindowTrimmedError
from producer.hooks import NO_HOOKS, Hooks, Step
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import LeasePolicy, Message, PreparedMessage, prepare
from producer.put_loop import PutLoop
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
from producer.replay.readback import EarlierPuts, read_rows, row_tag_of
from producer.retries import (
    PUT_MAX_ATTEMPTS,
    PUT_RETRY_INITIAL_MS,
    PUT_RETRY_MAX_MS,
    wait_full_jitter,
)

if TYPE_CHECKING:
    from tenacity.wait import wait_base

__all__ = ["ReplayAttempt", "ReplayPolicy", "ReplayProducer", "ReplayTask", "new_execution_id"]

log = logging.getLogger(__name__)

# The outcomes a run may be completed with: nothing more will happen to these rows.
_FINAL = frozenset({OutcomeStatus.SENT, OutcomeStatus.DUPLICATE, OutcomeStatus.REJECTED})


@dataclass(frozen=True, slots=True)
class ReplayTask:
    """Who puts a run's rows: ``execution_id`` names one driver run of a query (or one CLI
    process), ``task`` Spark's partition, ``task_attempt`` an ordinal that grows with each
    attempt of that task in the execution (Spark's task attempt id)."""

    run: str
    execution_id: str
    task: str = "0"
    task_attempt: int = 0


@dataclass(frozen=True, slots=True)
class ReplayPolicy:
    lease: LeasePolicy
    put_max_attempts: int = PUT_MAX_ATTEMPTS
    retry_initial_ms: int = PUT_RETRY_INITIAL_MS
    retry_max_ms: int = PUT_RETRY_MAX_MS
    wait_poll_ms: int = 1_000  # how often a wait looks at the clock, the lease and the interrupt
    max_wait_ms: int | None = None  # the longest wait for a lease; None: as long as it runs
    # a recovery whose windows reach past the trim horizon: fail (nothing sent), or send the
    # rows not found anyway (duplicates possible)
    send_past_retention: bool = False


@dataclass
class _Context:
    """What an attempt shares with its producer (and the put loop: a PutContext)."""

    stream: str
    ledger: Ledger
    writer: KinesisWriter
    reader: KinesisReader
    clock: Clock
    policy: ReplayPolicy
    hooks: Hooks
    sleep: Callable[[float], None]
    shards: OpenShards | None
    max_record_bytes: int
    resend_wait: wait_base
    retention_ms: int
    interrupted: threading.Event = field(default_factory=threading.Event)

    @property
    def keep_s(self) -> int:
        """How long a run's items must live at least: the stream's retention (recovery reads
        the stream back that far)."""
        return self.retention_ms // 1000

    @property
    def lease(self) -> LeasePolicy:
        return self.policy.lease


class ReplayProducer:
    """Delivers runs' rows into one stream in replay mode. One attempt per task or process."""

    def __init__(
        self,
        *,
        stream: str,
        ledger: Ledger,
        writer: KinesisWriter,
        reader: KinesisReader,
        clock: Clock,
        policy: ReplayPolicy,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        retention_hours: int = DEFAULT_RETENTION_HOURS,
        shard_map: Callable[[], list[Shard]] | None = None,
        hooks: Hooks = NO_HOOKS,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        """``retention_hours``: the stream's (``StreamInfo``); the default, Kinesis' least,
        is the cautious guess: a recovery fails rather than read a window that may be gone."""
        self.stream = stream
        self._context = _Context(
            stream=stream,
            ledger=ledger,
            writer=writer,
            reader=reader,
            clock=clock,
            policy=policy,
            hooks=hooks,
            sleep=sleep,
            # aggregation is on when a shard map is given: user records are packed per shard
            shards=OpenShards(shard_map) if shard_map is not None else None,
            max_record_bytes=max_record_bytes,
            retention_ms=retention_hours * 3_600_000,
            resend_wait=wait_full_jitter(
                initial_s=policy.retry_initial_ms / 1000,
                max_s=policy.retry_max_ms / 1000,
                rng=rng or random.Random(),
            ),
        )

    def interrupt(self) -> None:
        """Finish the call in flight early (Ctrl-C): send nothing more, wait for nothing; rows
        not sent are FAILED, puts not resolved IN_FLIGHT. Thread-safe."""
        self._context.interrupted.set()

    def attempt(self, task: ReplayTask) -> ReplayAttempt:
        """Register an attempt at ``task.run`` (two small conditional writes) and decide its
        first step. Raises :class:`dedupe_store.errors.LedgerError` when the ledger cannot
        say."""
        context = self._context
        # before the clock is read: an attempt held here registers with a fresh lease
        context.hooks.at(Step.REPLAY_BEFORE_REGISTER)
        now_ms = context.clock.now_ms()
        me = RunAttempt(
            attempt_id=uuid.uuid4().hex,
            execution_id=task.execution_id,
            task=task.task,
            task_attempt=task.task_attempt,
            started_at_ms=now_ms,
            lease_expires_at_ms=context.lease.lease_expires_at_ms(now_ms),
        )
        registration = context.ledger.register_attempt(
            self.stream, task.run, me, keep_s=context.keep_s
        )
        context.hooks.at(Step.REPLAY_AFTER_REGISTER)
        return ReplayAttempt(context, task, me, registration)

    def send(self, task: ReplayTask, messages: Sequence[Message]) -> list[Outcome]:
        """Deliver ``messages`` as one attempt at ``task.run``; one outcome per message, in
        order. The run is not completed: :meth:`complete` does that, once every attempt of
        it succeeded."""
        with self.attempt(task) as attempt:
            return attempt.send(messages)

    def send_run(self, run: str, messages: Sequence[Message]) -> list[Outcome]:
        """Deliver ``messages`` as run ``run`` from this process, and complete the run when
        every message is SENT or DUPLICATE: the whole of replay mode for a caller's own code
        (what ``keo send --dedupe replay --run-id`` does). Call it again with the same ``run``
        and messages after a crash: only what no earlier call delivered is sent; a COMPLETE
        run sends nothing. One outcome per message, in order."""
        with self.attempt(ReplayTask(run, new_execution_id(), task="api")) as attempt:
            outcomes = attempt.send(messages)
            attempt.finish()
        delivered = {OutcomeStatus.SENT, OutcomeStatus.DUPLICATE}
        if attempt.step is RecoveryStep.DONE:
            self.skipped(run)
        elif all(o.status in delivered for o in outcomes):
            self.complete(run, dict(attempt.counts))
        return outcomes

    def skipped(self, run: str) -> None:
        """Count a replay of ``run`` that found it COMPLETE and sent nothing (once per run)."""
        metrics.REPLAY_RUNS.labels(self.stream, "skipped").inc()
        log.info("replay run already complete, nothing sent stream=%s run=%s", self.stream, run)

    def complete(self, run: str, counts: dict[str, int]) -> ReplayRun:
        """Mark ``run`` COMPLETE (one write): a replay of it sends nothing."""
        context = self._context
        completed = context.ledger.complete_run(
            self.stream, run, counts=counts, now_ms=context.clock.now_ms(), keep_s=context.keep_s
        )
        metrics.REPLAY_RUNS.labels(self.stream, "completed").inc()
        log.info(
            "replay run complete stream=%s run=%s attempts=%d counts=%s",
            self.stream,
            run,
            completed.attempts,
            counts,
        )
        return completed

    def run_of(self, run: str) -> ReplayRun | None:
        return self._context.ledger.get_run(self.stream, run)


class ReplayAttempt:
    """One registered attempt at a run: recovery (when earlier attempts exist), then puts under
    its own lease. Used by one thread; ``send`` may be called once per chunk of the task's rows
    (the rows found from earlier attempts are matched across calls, as one multiset)."""

    def __init__(
        self,
        context: _Context,
        task: ReplayTask,
        me: RunAttempt,
        registration: RunRegistration,
    ) -> None:
        self._context = context
        self.task = task
        # the lease registered: the attempt's own, or its execution's when that ends first
        self.me = me = dataclasses.replace(
            me, lease_expires_at_ms=registration.lease_expires_at_ms or me.lease_expires_at_ms
        )
        self.counts: Counter[str] = Counter()
        self._lease_end_ms = me.lease_expires_at_ms
        self._lease_lost = False
        self._finished = False
        self._unresolved = 0  # puts that may still land: the attempt must not finish
        self._written: set[Position] = set()  # where this attempt's records are, all calls
        self._given_up: list[tuple[PreparedMessage, RecordResult]] = []
        self._sent_at_ms: dict[int, int] = {}  # per item of the call: when its request left
        self._others_own = 0  # own read-back matches with another writer's copy beside them
        # rows whose ambiguous put was settled by a record found before its lease was over:
        # if that record was another writer's copy, the put may still land (row tags)
        self._late_rows: set[str] = set()
        self._others_reported = False
        self._past_retention_accepted = False  # reads past the trim horizon, the risk taken
        self._puts = PutLoop(context, self, max_attempts=context.policy.put_max_attempts)
        self._earlier: EarlierPuts | None = None
        self._earlier_end_ms = 0  # when the last earlier lease ends (they cannot grow now)
        # finished earlier executions whose late rows may still land (until _earlier_end_ms)
        self._landing_late: list[Earlier] = []
        self._outranked = registration.outranked
        # the attempts of my task that registered before me: the task item as my
        # registration wrote it (one that registers later recovers against me)
        self._registered_before = frozenset(
            a.attempt_id for a in registration.task_attempts if a.attempt_id != me.attempt_id
        )
        run = registration.run
        complete = run.state is RunState.COMPLETE
        earlier = earlier_of(
            run, registration.task_attempts, me, registered_before=self._registered_before
        )
        if earlier and registration.registered and not complete:
            earlier = self._supersede(run, registration.task_attempts, earlier)
        # read after the ledger answered: an execution it showed finished put everything before
        now_ms = context.clock.now_ms()
        self.step = recovery_step(
            run_complete=complete,
            superseded=registration.superseded,
            earlier=earlier,
            now_ms=now_ms,
            lease=context.lease,
        )
        running = still_running(earlier, now_ms, context.lease)
        self._landing_late = landing_late(earlier, now_ms, context.lease)
        metrics.REPLAY_ATTEMPTS.labels(context.stream, self.step.value).inc()
        if self.step in (RecoveryStep.RECOVER, RecoveryStep.WAIT):
            metrics.REPLAY_RECOVERIES.labels(context.stream).inc()
            windows = read_windows(earlier, context.lease, now_ms)
            self._check_retention(windows, now_ms)
            self._earlier = EarlierPuts(
                context.reader,
                context.clock,
                windows,
                final=self.step is RecoveryStep.RECOVER,
                keep_alive=self._keep_lease,
                before_read=lambda now_ms: self._check_retention(windows, now_ms),
            )
            self._earlier_end_ms = max(
                (e.lease_expires_at_ms for e in [*running, *self._landing_late]), default=0
            )
        log.info(
            "replay attempt stream=%s run=%s attempt=%s execution=%s task=%s task_attempt=%d "
            "step=%s earlier=%d running=%d",
            context.stream,
            task.run,
            me.attempt_id,
            task.execution_id,
            task.task,
            task.task_attempt,
            self.step,
            len(earlier),
            len(running),
        )

    def _supersede(
        self, run: ReplayRun, task_attempts: tuple[RunAttempt, ...], earlier: list[Earlier]
    ) -> list[Earlier]:
        """Fence the earlier executions' and attempts' leases first: the bounds the ledger
        shows then are final. What is earlier, as the fencing writes left it."""
        ledger = self._context.ledger
        stream, name = self._context.stream, self.task.run
        executions = to_supersede(earlier, EarlierKind.EXECUTION)
        if executions:
            run = ledger.supersede_executions(stream, name, executions) or run
        attempts = to_supersede(earlier, EarlierKind.ATTEMPT)
        if attempts:
            task_attempts = ledger.supersede_attempts(stream, name, self.me, attempts)
        return earlier_of(run, task_attempts, self.me, registered_before=self._registered_before)

    def _check_retention(self, windows: list[tuple[int, int]], now_ms: int) -> None:
        """Refuse to recover from windows the stream no longer holds (nothing more sent; the
        attempt finished when no put of it is in flight), unless the policy accepts the risk
        of duplicates. Checked as the attempt starts, and again before each shard is read."""
        context = self._context
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
            self.task.run,
            windows[0][0],
            horizon_ms,
            "send rows not found (duplicates possible)" if send else "fail, nothing sent",
        )
        if send:
            return
        self.finish()
        raise ReplayWindowTrimmedError(
            context.stream, self.task.run, window_start_ms=windows[0][0], trim_horizon_ms=horizon_ms
        )

    def __enter__(self) -> ReplayAttempt:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        # a call that raised may have left a put in flight: the lease must keep running
        if exc_type is None:
            self.finish()

    @property
    def rows_found(self) -> int:
        """Rows found put by earlier attempts, and so not sent again."""
        return self._earlier.rows_found if self._earlier is not None else 0

    @property
    def rows_matched_ambiguously(self) -> int:
        """Rows matched (found from an earlier attempt, or an ambiguous put of this one found)
        beside an identical record left unmatched in the window read: another writer's copy
        (another run, a sibling task) was there, so the one taken may be it
        (:func:`producer.replay.plan.possibly_others`). Final once the attempt sent its rows."""
        earlier = self._earlier.possibly_others(self._written) if self._earlier is not None else 0
        return earlier + self._others_own

    @property
    def get_records_calls(self) -> int:
        return self._context.reader.get_records_calls

    @property
    def completable(self) -> bool:
        """Whether every row this attempt was given is SENT, DUPLICATE or REJECTED."""
        return all(status in _FINAL for status in map(OutcomeStatus, self.counts))

    def send(self, messages: Sequence[Message]) -> list[Outcome]:
        """Deliver ``messages`` (more rows of this attempt); one outcome per message, in order."""
        prepared, rejections = prepare(messages, self._context.max_record_bytes)
        decided: dict[int, Outcome] = {
            r.index: Outcome(r.index, r.key, OutcomeStatus.REJECTED, reason=r.reason)
            for r in rejections
        }
        if self.step is RecoveryStep.DONE:
            for item in prepared:
                decided[item.index] = Outcome(
                    item.index,
                    item.key,
                    OutcomeStatus.DUPLICATE,
                    reason=f"run {self.task.run!r} is COMPLETE: a replay of it sends nothing",
                )
        elif self.step is RecoveryStep.SUPERSEDED:
            reason = (
                (
                    f"a later attempt of task {self.task.task!r} of run {self.task.run!r} "
                    f"registered before this one (attempt {self.task.task_attempt}): not "
                    "sent; that attempt delivers these rows"
                )
                if self._outranked
                else (
                    f"a replay of run {self.task.run!r} superseded this execution "
                    f"({self.task.execution_id}): not sent; the replay delivers the run"
                )
            )
            for item in prepared:
                decided[item.index] = _unresolved(item, OutcomeStatus.FAILED, reason)
        else:
            try:
                left = prepared
                if self._earlier is not None:
                    left = self._recover(self._earlier, prepared, decided)
                self._deliver(left, decided)
            except BaseException:
                # a bug, a stream gone, the interpreter interrupted: a request may be in
                # flight, so the lease is never ended early (a replay waits for it)
                self._unresolved += 1
                raise
        ordered = [decided[i] for i in range(len(messages))]
        for outcome in ordered:
            self.counts[outcome.status.value] += 1
            metrics.OUTCOMES.labels(self._context.stream, outcome.status.value).inc()
        return ordered

    def finish(self) -> None:
        """Say the attempt finished when every put it made has a definite result: once every
        attempt of its execution has, a replay of the run waits for none of them (one write;
        best effort: one left unfinished costs a replay a wait, never a duplicate). Once: the
        attempt sends nothing after."""
        context = self._context
        self._report_possibly_others()
        if self._finished or self._unresolved:
            return
        self._finished = True
        if self.step in (RecoveryStep.DONE, RecoveryStep.SUPERSEDED):
            return
        try:
            context.ledger.finish_attempt(
                context.stream, self.task.run, self.me, late_rows=frozenset(self._late_rows)
            )
        except LedgerError as exc:
            log.warning(
                "replay attempt lease left running stream=%s run=%s attempt=%s error=%s",
                context.stream,
                self.task.run,
                self.me.attempt_id,
                exc,
            )

    def _report_possibly_others(self) -> None:
        """Count, once, the rows matched beside another writer's identical record, and warn."""
        if self._others_reported:
            return
        self._others_reported = True
        count = self.rows_matched_ambiguously
        if not count:
            return
        metrics.REPLAY_ROWS_MATCHED_AMBIGUOUSLY.labels(self._context.stream).inc(count)
        log.warning(
            "replay rows matched beside another writer's identical record stream=%s run=%s "
            "attempt=%s rows=%d: each may be the other writer's copy, leaving this run's "
            "short; rows that must be counted exactly whatever other writers do need key mode",
            self._context.stream,
            self.task.run,
            self.me.attempt_id,
            count,
        )

    # --- recovery ----------------------------------------------------------------------------

    def _recover(
        self, earlier: EarlierPuts, items: list[PreparedMessage], decided: dict[int, Outcome]
    ) -> list[PreparedMessage]:
        """The items no earlier attempt put; the others are DUPLICATE at their position."""
        left = self._take_found(earlier, items, decided)
        # not found while an earlier put of them may still land: wait until none can, read
        # again (every row while an earlier lease runs; else only a late-landing row's)
        undecided = left if not earlier.final else [i for i in left if self._may_land_late(i)]
        if undecided:
            reason = (
                f"an earlier attempt of run {self.task.run!r} may still put this row until "
                f"{self._earlier_end_ms + self._context.lease.skew_ms} (epoch ms): re-run"
            )
            if not self._wait_until_over(self._earlier_end_ms):
                for item in undecided:
                    decided[item.index] = _unresolved(item, OutcomeStatus.IN_FLIGHT, reason)
                self._unresolved += len(undecided)
                waiting = {item.index for item in undecided}
                return [item for item in left if item.index not in waiting]
            self._landing_late = []
            earlier.read_again()
            left = self._take_found(earlier, left, decided)
        return left

    def _may_land_late(self, item: PreparedMessage) -> bool:
        if not self._landing_late:
            return False
        tag = row_tag_of(item)
        return any(e.may_land_late(tag) for e in self._landing_late)

    def _take_found(
        self, earlier: EarlierPuts, items: list[PreparedMessage], decided: dict[int, Outcome]
    ) -> list[PreparedMessage]:
        left: list[PreparedMessage] = []
        for item, position in zip(items, earlier.match(items), strict=True):
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

    # --- puts ----------------------------------------------------------------------------------

    def _deliver(self, items: list[PreparedMessage], decided: dict[int, Outcome]) -> None:
        context = self._context
        written = self._written
        self._sent_at_ms.clear()
        for _ in range(context.policy.put_max_attempts):
            if not items:
                return
            if context.interrupted.is_set():
                for item in items:
                    decided[item.index] = _unresolved(
                        item, OutcomeStatus.FAILED, "interrupted before it was sent; re-run"
                    )
                return
            report = self._puts.put(items)
            for item, result in self._given_up:
                decided[item.index] = _unresolved(item, OutcomeStatus.FAILED, result.failure_reason)
            self._given_up.clear()
            for item, position in report.written:
                decided[item.index] = Outcome(
                    item.index, item.key, OutcomeStatus.SENT, position=position
                )
                written.add(position)
            for item in report.diverted:
                decided[item.index] = _unresolved(
                    item,
                    OutcomeStatus.FAILED,
                    f"not sent: the attempt's lease could not be renewed (a later attempt of "
                    f"run {self.task.run!r} superseded it, or it ran out): re-run",
                )
            items = self._read_back_ambiguous(report.ambiguous, written, decided)
        for item in items:
            decided[item.index] = _unresolved(
                item, OutcomeStatus.IN_FLIGHT, "put ambiguous too many times: re-run"
            )
        self._unresolved += len(items)

    def _read_back_ambiguous(
        self,
        items: list[PreparedMessage],
        written: set[Position],
        decided: dict[int, Outcome],
    ) -> list[PreparedMessage]:
        """Settle ambiguous puts from the stream; returns those that can no longer land and
        were not found: to send again. The ones that may still land are IN_FLIGHT.

        Each item is matched only from its own request's send time minus the skew (a record
        that arrived before cannot be its put) up to the lease's end plus the skew; records
        this attempt knows it wrote and the earlier attempts' records are never matched."""
        if not items:
            return []
        context = self._context
        lease = context.lease
        # every ambiguous request left under a lease that ends by now's lease end
        bound_ms = self._lease_end_ms
        excluding = written | (self._earlier.positions() if self._earlier is not None else set())
        while True:
            over = lease.expired_for_everyone(bound_ms, context.clock.now_ms())
            since_ms = [
                lease.read_back_window(
                    self._sent_at_ms.get(item.index, self.me.started_at_ms), bound_ms
                )[0]
                for item in items
            ]
            window = (min(since_ms), lease.read_back_window(self.me.started_at_ms, bound_ms)[1])
            found = read_rows(
                context.reader,
                context.clock,
                items,
                window,
                excluding=excluding,
                since_ms=since_ms,
            )
            self._others_own += found.possibly_others
            left: list[PreparedMessage] = []
            for item, position in zip(items, found.positions, strict=True):
                if position is None:
                    left.append(item)
                    continue
                if not over:  # found early: if it is another writer's, mine may still land
                    self._late_rows.add(row_tag_of(item))
                decided[item.index] = Outcome(
                    item.index, item.key, OutcomeStatus.SENT, position=position
                )
                written.add(position)
                excluding.add(position)
            if not left or over:
                return left
            items = left
            if not self._wait_until_over(bound_ms):
                for item in items:
                    decided[item.index] = _unresolved(
                        item,
                        OutcomeStatus.IN_FLIGHT,
                        "put ambiguous and not found yet; it may still land: re-run, the "
                        "run's next attempt reads it back",
                    )
                self._unresolved += len(items)
                return []

    def _wait_until_over(self, lease_end_ms: int) -> bool:
        """Wait until a lease that ends at ``lease_end_ms`` is over for every clock, keeping
        this attempt's own lease; False when interrupted, the wait would outlast
        ``max_wait_ms``, or this attempt lost its lease."""
        context = self._context
        policy = context.policy
        lease = context.lease
        started_ms = context.clock.now_ms()
        wait_ms = lease_end_ms + lease.skew_ms - started_ms
        if policy.max_wait_ms is not None and wait_ms > policy.max_wait_ms:
            return False
        if wait_ms > 0:
            log.info(
                "replay attempt waiting stream=%s run=%s attempt=%s wait_s=%.1f",
                context.stream,
                self.task.run,
                self.me.attempt_id,
                wait_ms / 1000,
            )
        while not lease.expired_for_everyone(lease_end_ms, context.clock.now_ms()):
            if context.interrupted.is_set() or not self._keep_lease():
                return False
            left_ms = lease_end_ms + lease.skew_ms - context.clock.now_ms()
            context.sleep(max(0.0, min(policy.wait_poll_ms, left_ms)) / 1000)
        return True

    def _keep_lease(self) -> bool:
        """Renew this attempt's lease when a put sent now could outlive it; False once it
        cannot be (superseded, ran out, the run completed, or the ledger failed)."""
        context = self._context
        lease = context.lease
        now_ms = context.clock.now_ms()
        if self._lease_lost:
            return False
        if lease.safe_to_send(self._lease_end_ms, now_ms):
            return True
        try:
            renewal = context.ledger.renew_attempt(
                context.stream,
                self.task.run,
                self.me,
                now_ms=now_ms,
                lease_ms=lease.lease_ms,
                skew_ms=lease.skew_ms,
                keep_s=context.keep_s,
            )
        except LedgerError as exc:
            log.warning(
                "replay lease renewal failed stream=%s run=%s error=%s",
                context.stream,
                self.task.run,
                exc,
            )
            return False
        if not renewal.applied or renewal.lease_expires_at_ms is None:
            self._lease_lost = True
            log.warning(
                "replay attempt lease lost stream=%s run=%s attempt=%s refused=%s",
                context.stream,
                self.task.run,
                self.me.attempt_id,
                renewal.refused,
            )
            return False
        self._lease_end_ms = renewal.lease_expires_at_ms
        return True

    # --- the put loop's party (producer.put_loop.PutParty) ---------------------------------------

    @staticmethod
    def item_of(message: PreparedMessage) -> PreparedMessage:
        return message

    def lease_of(self, message: PreparedMessage) -> int:  # noqa: ARG002 - one lease for all
        return self._lease_end_ms

    def ready_to_put(
        self, messages: list[PreparedMessage]
    ) -> tuple[list[PreparedMessage], list[PreparedMessage]]:
        if self._keep_lease():
            # read after any renewal: no request carrying these can have left before now
            now_ms = self._context.clock.now_ms()
            for message in messages:
                self._sent_at_ms[message.index] = now_ms
            return messages, []
        return [], messages

    def give_up(self, message: PreparedMessage, result: RecordResult) -> None:
        self._given_up.append((message, result))


def _unresolved(item: PreparedMessage, status: OutcomeStatus, reason: str) -> Outcome:
    return Outcome(item.index, item.key, status, reason=reason)


def new_execution_id() -> str:
    """A fresh execution id: one per driver run of a query, or per CLI process."""
    return uuid.uuid4().hex
