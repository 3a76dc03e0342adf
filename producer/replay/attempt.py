"""``ReplayAttempt``: one registered attempt at a run, from its start to its finish.

::

    ReplayAttempt(start) ── start.step:
      ├─ DONE ────── the run is COMPLETE: every row DUPLICATE, nothing sent
      ├─ SUPERSEDED  a replay superseded this execution, or a higher attempt of the task
      │              registered first: every row FAILED, nothing sent
      ├─ FAST_PATH ─ nothing earlier: plain puts
      └─ RECOVER, WAIT: per call, the rows earlier attempts put are DUPLICATE
                     (producer.replay.recovery.Recovery), the rest are sent
    send(messages) ── puts: full requests, SDK retries off, the fence against the attempt's
    │                 lease (renewed when short: one write), per-record errors resent
    │                 ├─ written ───── SENT at its position
    │                 ├─ ambiguous ─── read back from its request's send time - skew to its
    │                 │                lease's end + skew: found is SENT; not found once the
    │                 │                lease it left under is over: sent again; else IN_FLIGHT
    │                 └─ not written ─ FAILED (the lease lost, or not retriable)
    finish() ──────── every put has a definite result: the attempt is finished (one write);
                      once all of its execution's are, a replay waits for none, but for a
                      late row it does not find: a row whose ambiguous put was settled by a
                      record found before its lease was over (that record may be a sibling's
                      copy: the put may still land), listed on the execution. Rows matched
                      beside another writer's identical record are counted
                      (rows_matched_ambiguously) and warned of, once
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from dedupe_store.errors import LedgerError
from dedupe_store.records import Position
from kinesis_store.results import RecordResult
from kinesis_store.shards import Shard
from producer import metrics
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import Message, PreparedMessage, prepare
from producer.put_loop import PutLoop
from producer.replay.context import ReplayContext, ReplayTask
from producer.replay.lease import AttemptLease
from producer.replay.plan import RecoveryStep
from producer.replay.readback import read_rows, row_tag_of
from producer.replay.recovery import AttemptStart, Recovery, unresolved

__all__ = ["ReplayAttempt"]

log = logging.getLogger(__name__)

# The outcomes a run may be completed with: nothing more will happen to these rows.
_FINAL = frozenset({OutcomeStatus.SENT, OutcomeStatus.DUPLICATE, OutcomeStatus.REJECTED})


class ReplayAttempt:
    """One registered attempt at a run: recovery (when earlier attempts exist), then puts under
    its own lease. Used by one thread; ``send`` may be called once per chunk of the task's rows
    (the rows found from earlier attempts are matched across calls, as one multiset). Built
    from where it starts (:func:`producer.replay.recovery.start_attempt`); builds nothing
    else: the first call does I/O. ``listed_before``: the open shards its execution's driver
    listed before any of its tasks put: a read-back of this execution's puts is routed by it
    (:class:`producer.replay.readback.EarlierPuts`), not by a listing of its own."""

    def __init__(
        self,
        context: ReplayContext,
        task: ReplayTask,
        start: AttemptStart,
        *,
        listed_before: Sequence[Shard] | None = None,
    ) -> None:
        self._context = context
        self._listed_before = listed_before
        self.task = task
        self.me = start.me
        self.step = start.step
        self._outranked = start.outranked
        self.counts: Counter[str] = Counter()
        self._lease = AttemptLease(context, task, start.me)
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
        self._puts = PutLoop(context, self, max_attempts=context.policy.put_max_attempts)
        self._recovery = (
            Recovery(
                context,
                task,
                start,
                self._lease,
                on_trimmed=self.finish,
                listed_before=listed_before,
            )
            if start.recovers
            else None
        )

    def check_retention(self) -> None:
        """Refuse to start a recovery from windows the stream no longer holds: the attempt
        finishes and raises :class:`producer.errors.ReplayWindowTrimmedError` (nothing sent),
        unless the policy accepts the risk of duplicates."""
        if self._recovery is not None:
            self._recovery.check_retention(self._context.clock.now_ms())

    def __enter__(self) -> ReplayAttempt:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        # a call that raised may have left a put in flight: the lease must keep running
        if exc_type is None:
            self.finish()

    @property
    def rows_found(self) -> int:
        """Rows found put by earlier attempts, and so not sent again."""
        return self._recovery.earlier.rows_found if self._recovery is not None else 0

    @property
    def rows_matched_ambiguously(self) -> int:
        """Rows matched (found from an earlier attempt, or an ambiguous put of this one found)
        beside an identical record left unmatched in the window read: another writer's copy
        (another run, a sibling task) was there, so the one taken may be it
        (:func:`producer.replay.plan.possibly_others`). Final once the attempt sent its rows."""
        recovery = self._recovery
        earlier = recovery.earlier.possibly_others(self._written) if recovery is not None else 0
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
            reason = self._superseded_reason()
            for item in prepared:
                decided[item.index] = unresolved(item, OutcomeStatus.FAILED, reason)
        else:
            try:
                left = prepared
                if self._recovery is not None:
                    left = self._recovery.recover(prepared, decided)
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
            if outcome.status is OutcomeStatus.IN_FLIGHT:
                self._unresolved += 1  # may still land: the attempt must not finish
        return ordered

    def _superseded_reason(self) -> str:
        task = self.task
        if self._outranked:
            return (
                f"a later attempt of task {task.task!r} of run {task.run!r} registered before "
                f"this one (attempt {task.task_attempt}): not sent; that attempt delivers "
                "these rows"
            )
        return (
            f"a replay of run {task.run!r} superseded this execution ({task.execution_id}): "
            "not sent; the replay delivers the run"
        )

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
                    decided[item.index] = unresolved(
                        item, OutcomeStatus.FAILED, "interrupted before it was sent; re-run"
                    )
                return
            report = self._puts.put(items)
            for item, result in self._given_up:
                decided[item.index] = unresolved(item, OutcomeStatus.FAILED, result.failure_reason)
            self._given_up.clear()
            for item, position in report.written:
                decided[item.index] = Outcome(
                    item.index, item.key, OutcomeStatus.SENT, position=position
                )
                written.add(position)
            for item in report.diverted:
                decided[item.index] = unresolved(
                    item,
                    OutcomeStatus.FAILED,
                    f"not sent: the attempt's lease could not be renewed (a later attempt of "
                    f"run {self.task.run!r} superseded it, or it ran out): re-run",
                )
            items = self._read_back_ambiguous(report.ambiguous, written, decided)
        for item in items:
            decided[item.index] = unresolved(
                item, OutcomeStatus.IN_FLIGHT, "put ambiguous too many times: re-run"
            )

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
        bound_ms = self._lease.end_ms
        recovery = self._recovery
        excluding = written | (recovery.earlier.positions() if recovery is not None else set())
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
                listed_before=self._listed_before,
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
            if not self._lease.wait_until_over(bound_ms):
                for item in items:
                    decided[item.index] = unresolved(
                        item,
                        OutcomeStatus.IN_FLIGHT,
                        "put ambiguous and not found yet; it may still land: re-run, the "
                        "run's next attempt reads it back",
                    )
                return []

    # --- the put loop's party (producer.put_loop.PutParty) ---------------------------------------

    @staticmethod
    def item_of(message: PreparedMessage) -> PreparedMessage:
        return message

    def lease_of(self, message: PreparedMessage) -> int:  # noqa: ARG002 - one lease for all
        return self._lease.end_ms

    def ready_to_put(
        self, messages: list[PreparedMessage]
    ) -> tuple[list[PreparedMessage], list[PreparedMessage]]:
        if self._lease.keep():
            # read after any renewal: no request carrying these can have left before now
            now_ms = self._context.clock.now_ms()
            for message in messages:
                self._sent_at_ms[message.index] = now_ms
            return messages, []
        return [], messages

    def give_up(self, message: PreparedMessage, result: RecordResult) -> None:
        self._given_up.append((message, result))
