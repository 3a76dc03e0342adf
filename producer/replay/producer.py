"""Replay mode (``dedupe=replay``): the stream holds exactly what a run without failures would
have written, however often the run is retried or replayed, with no per-message ledger write.

A *run* is what can be replayed (a Spark micro-batch ``<query>/<batch id>``, a batch write, a
CLI run named with ``--run-id``); each task attempt or process that puts its rows is an
*attempt*, registered in the run's ledger item (DESIGN.md "Replay mode"). The decisions are
pure (:mod:`producer.replay.plan`); where an attempt starts and its recovery are
:mod:`producer.replay.recovery`, the attempt itself :mod:`producer.replay.attempt`; the puts
go through the put loop key mode uses (:mod:`producer.put_loop`), under the attempt's lease.

::

    ReplayProducer.attempt(task)     two small ledger writes: register with the run (its
      │                              execution counted; the run not COMPLETE) and with the
      │                              task's own item; then supersede what is earlier and
      │                              decide the first step (start_attempt)
      └─ ReplayAttempt               recover, send, finish (producer.replay.attempt)
    ReplayProducer.complete(run)     one write: COMPLETE; a replay sends nothing

Outcomes are key mode's: SENT, DUPLICATE (found from an earlier attempt, or the run is
COMPLETE), REJECTED, FAILED (not sent: re-run), IN_FLIGHT (may have landed: re-run, the next
attempt reads it back). A run is complete only when every row is SENT, DUPLICATE or REJECTED.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence

from dedupe_store.clock import Clock
from dedupe_store.contract import Ledger
from dedupe_store.records import ReplayRun, RunAttempt
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from kinesis_store.provisioning import DEFAULT_RETENTION_HOURS
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import OpenShards, Shard
from kinesis_store.writer import KinesisWriter
from producer import metrics
from producer.hooks import NO_HOOKS, Hooks, Step
from producer.outcomes import Outcome, OutcomeStatus
from producer.parties import new_execution_id
from producer.protocol import Message
from producer.replay.attempt import ReplayAttempt
from producer.replay.context import ReplayContext, ReplayPolicy, ReplayTask
from producer.replay.plan import RecoveryStep
from producer.replay.recovery import start_attempt
from producer.retries import wait_full_jitter

__all__ = ["ReplayProducer"]

log = logging.getLogger(__name__)


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
        self._context = ReplayContext(
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

    def attempt(
        self, task: ReplayTask, *, listed_before: Sequence[Shard] | None = None
    ) -> ReplayAttempt:
        """Register an attempt at ``task.run`` (two small conditional writes), supersede what
        is earlier and decide its first step. Raises :class:`dedupe_store.errors.LedgerError`
        when the ledger cannot say, :class:`producer.errors.ReplayWindowTrimmedError` when
        what it must recover is past the stream's retention. ``listed_before``: the stream's
        open shards as the execution's driver listed them before any of its tasks put (a
        Spark write's :class:`producer.guarantees.DriverReads`), which route its read-backs
        of the execution's own puts."""
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
        attempt = ReplayAttempt(
            context,
            task,
            start_attempt(context, task, me, registration),
            listed_before=listed_before,
        )
        attempt.check_retention()
        return attempt

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
