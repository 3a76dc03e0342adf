"""The two guarantees as objects: a write's ``dedupe`` mode is read here, once, and every
writer (``keo send``, ``format("keo")``, ``ExactlyOnceSink``) asks its :class:`Guarantee`.

::

    guarantee_of(settings) ── KEY or REPLAY
      ├─ sender(stack, party) ─── what one party of a write sends through: key mode's producer
      │                           (claims under the party's owner) or one replay attempt at the
      │                           party's run; send(messages) per chunk, finish() at the end;
      │                           given what the write's driver read for it (DriverReads)
      ├─ done_before(stack, ...)  whether a batch is settled already, asked before any task runs
      │                           (key mode's batch record; replay mode's tasks learn it from
      │                           their run)
      ├─ plan_recovery(stack, runs)  on a driver, before the tasks: what a replay's tasks
      │                           would read back, read once (replay mode), for their senders;
      │                           an execution that may still put superseded and waited for
      ├─ completer(stack, ...) ── what records a settled batch or run, so that a replay of it
      │                           does nothing: the batch's record, or the run COMPLETE
      ├─ named_runs ───────────── whether a write is a run a re-run finds by its name (keo
      │                           send's --run-id, format("keo")'s query_name and run_id)
      └─ auditor ──────────────── how keo audit proves the stream (producer.audit.auditors):
                                  each key once against the ledger, or the rows sent counted

``read_on_driver(stack, runs)`` is what a Spark write's driver reads once for all its tasks
and ships with them (:class:`DriverReads`): both of Spark's doors build it here, and a task's
sender takes it whole.

A third mode is a third :class:`Guarantee` here, and its tests. ``keo send``, ``keo audit``,
``format("keo")`` (its options too) and ``ExactlyOnceSink`` ask the guarantee, never the mode.
Each mode's modules are imported when its guarantee first needs them: a process of one
mode does not load the other's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from dedupe_store.errors import KeoError
from kinesis_store.errors import StreamError
from kinesis_store.shards import ListedShards, Shard, StreamInfo
from producer.hooks import Hooks
from producer.outcomes import Outcome
from producer.parties import Party
from producer.protocol import Message
from producer.settings import Dedupe, ProducerSettings

if TYPE_CHECKING:
    from producer.audit.auditors import Auditor
    from producer.key.producer import ExactlyOnceProducer
    from producer.replay.attempt import ReplayAttempt
    from producer.replay.producer import ReplayProducer
    from producer.replay.shared_reads import PlannedReads
    from producer.wiring import Stack

__all__ = [
    "KEY",
    "LISTING_ROUTES_S",
    "REPLAY",
    "Completer",
    "DriverReads",
    "Guarantee",
    "Party",
    "RunEnd",
    "SendEnd",
    "Sender",
    "guarantee_of",
    "read_on_driver",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DriverReads:
    """What a write's driver read once for all its tasks, shipped with them (picklable), so
    that neither the control-plane calls nor the recovery reads grow with the tasks::

        checked    its check of the stream and the table: a task's clients ask neither
        planned    what a replay's tasks would read back (Guarantee.plan_recovery)
        shard_map  the stream's open shards, listed before any task put: the puts are paced
                   by it, and a replay attempt's read-back of its execution's own puts is
                   routed by it for an hour (:meth:`listed_before`)

    Empty where nothing was read for the tasks (``keo send``): each reads for itself."""

    checked: StreamInfo | None = None
    planned: tuple[PlannedReads, ...] = ()
    shard_map: ListedShards | None = None

    def listed_before(self, now_s: float) -> tuple[Shard, ...] | None:
        """The open shards to route a read-back of this execution's own puts by, at
        ``now_s`` (epoch seconds): the driver's listing while it is younger than
        :data:`LISTING_ROUTES_S`, else None (the stream is listed). A streaming query ships
        the listing it started with to every batch: a shard it holds that closed since is
        deleted once the stream's retention (24 h at least) is over, and a read of it fails."""
        listed = self.shard_map
        if listed is None or now_s - listed.listed_at_s > LISTING_ROUTES_S:
            return None
        return listed.shards


NOTHING_READ: Final = DriverReads()
# how long a driver's listing routes its tasks' read-backs: well within the shortest retention
# (24 h), after which a shard it lists may be gone
LISTING_ROUTES_S: Final = 3600


def read_on_driver(stack: Stack, runs: Sequence[str]) -> DriverReads:
    """On a driver, before a write's tasks start: its check of the stream and the table, what
    a replay of ``runs`` would read back (:meth:`Guarantee.plan_recovery`), and the stream's
    open shards (listed at most once a minute: the writer's own map)."""
    return DriverReads(
        checked=stack.info,
        planned=guarantee_of(stack.settings).plan_recovery(stack, runs),
        shard_map=_listed_shard_map(stack),
    )


def _listed_shard_map(stack: Stack) -> ListedShards | None:
    """None where the puts are not paced, or the shards cannot be listed: the tasks list for
    themselves (pacing is a courtesy, and a read-back lists without it)."""
    shards = stack.writer.shards
    if shards is None:
        return None
    try:
        return shards.listed()
    except StreamError as exc:
        log.warning("shard map not shipped: %s stream=%s", exc, stack.settings.stream)
        return None


@dataclass(frozen=True, slots=True)
class SendEnd:
    """What a party's sends came to: ``skipped`` when its run was COMPLETE before (nothing
    sent), and what its log line says (``notes``)."""

    skipped: bool = False
    notes: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunEnd:
    """A run a party sent whole (``keo send --run-id``): whether it is COMPLETE now."""

    run: str
    complete: bool


class Sender(Protocol):
    """One party's sends: a context manager (an error leaves its leases running)."""

    def __enter__(self) -> Sender: ...

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None: ...

    def send(self, messages: Sequence[Message]) -> list[Outcome]:
        """One outcome per message, in order."""
        ...

    def send_each(self, batches: Iterable[Sequence[Message]]) -> Iterator[list[Outcome]]:
        """:meth:`send` of each of ``batches``, one after the other; where the mode can,
        the next batch starts while this one finishes (key mode's claim groups)."""
        ...

    def interrupt(self) -> None:
        """Finish the call in flight early (Ctrl-C); thread-safe."""
        ...

    def finish(self) -> SendEnd:
        """Every put has its result: what the sends came to."""
        ...

    def settle_run(self, counts: Mapping[str, int], *, delivered: bool) -> RunEnd | None:
        """For a party that is its whole run: record the run COMPLETE once every message was
        ``delivered``; None where the mode has no runs."""
        ...


Completer = Callable[[Mapping[str, int], "int | None"], None]


class Guarantee(Protocol):
    @property
    def dedupe(self) -> Dedupe: ...

    @property
    def retries_unresolved_tasks(self) -> bool:
        """Whether a task left with unresolved rows fails, for Spark to retry it alone (a
        replay attempt's retry reads back what it put); else the batch fails as a whole at
        the commit (key mode's sink)."""
        ...

    @property
    def settles_the_rest(self) -> str:
        """How a replay of a write that failed part-way settles the rest (the abort's log)."""
        ...

    @property
    def named_runs(self) -> bool:
        """Whether a write is a run that a re-run finds by its name (replay mode): ``keo send``
        needs ``--run-id``, a streaming ``format("keo")`` write ``query_name`` (its runs are
        ``<query_name>/<batch id>``), and only such a mode takes a run's name (``run_id``);
        key mode needs none, each key being found by itself."""
        ...

    @property
    def auditor(self) -> Auditor:
        """How ``keo audit`` proves a stream written in this mode exactly-once."""
        ...

    def sender(
        self,
        stack: Stack,
        party: Party,
        *,
        hooks: Hooks | None = None,
        driver: DriverReads = NOTHING_READ,
    ) -> Sender:
        """What ``party`` sends through; ``driver``: what the write's driver read for its
        tasks (:func:`read_on_driver`), which the party then need not read."""
        ...

    def plan_recovery(self, stack: Stack, runs: Sequence[str]) -> tuple[PlannedReads, ...]:
        """On a driver, before a write's tasks start: what its tasks would read back of the
        ``runs`` it may replay, read once (none where they must read for themselves)."""
        ...

    def done_before(self, stack: Stack, query: str | None, batch_id: int | None) -> bool: ...

    def completer(self, stack: Stack, *, query: str | None, run: str) -> Completer | None: ...


class _KeySender:
    """Key mode: a per-key claim for every message, under the party's owner."""

    def __init__(self, producer: ExactlyOnceProducer) -> None:
        self._producer = producer

    def __enter__(self) -> _KeySender:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._producer.close()

    def send(self, messages: Sequence[Message]) -> list[Outcome]:
        return self._producer.send(list(messages))

    def send_each(self, batches: Iterable[Sequence[Message]]) -> Iterator[list[Outcome]]:
        return self._producer.send_each(batches)

    def interrupt(self) -> None:
        self._producer.interrupt()

    def finish(self) -> SendEnd:
        return SendEnd()

    def settle_run(self, counts: Mapping[str, int], *, delivered: bool) -> RunEnd | None:  # noqa: ARG002 - the ledger holds every key's claim: nothing to record
        return None


class _ReplaySender:
    """Replay mode: one attempt at the party's run."""

    def __init__(self, producer: ReplayProducer, attempt: ReplayAttempt) -> None:
        self._producer = producer
        self._attempt = attempt

    def __enter__(self) -> _ReplaySender:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._attempt.__exit__(exc_type, *rest)  # an error leaves the lease running

    def send(self, messages: Sequence[Message]) -> list[Outcome]:
        return self._attempt.send(messages)

    def send_each(self, batches: Iterable[Sequence[Message]]) -> Iterator[list[Outcome]]:
        return (self._attempt.send(messages) for messages in batches)

    def interrupt(self) -> None:
        self._producer.interrupt()

    def finish(self) -> SendEnd:
        from producer.replay.plan import RecoveryStep

        attempt = self._attempt
        attempt.finish()
        return SendEnd(
            skipped=attempt.step is RecoveryStep.DONE,
            notes={
                "step": attempt.step.value,
                "found": attempt.rows_found,
                "matched_ambiguously": attempt.rows_matched_ambiguously,
            },
        )

    def settle_run(self, counts: Mapping[str, int], *, delivered: bool) -> RunEnd | None:
        """The run is COMPLETE once every message was delivered (a rejected one keeps it
        open: fixed and re-run, the rows delivered are not sent again)."""
        run = self._attempt.task.run
        if self.finish().skipped:
            self._producer.skipped(run)
            return RunEnd(run, complete=True)
        if delivered:
            self._producer.complete(run, dict(counts))
        return RunEnd(run, complete=delivered)


@dataclass(frozen=True)
class _Key:
    dedupe: Dedupe = Dedupe.KEY
    retries_unresolved_tasks: bool = False
    settles_the_rest: str = "through the per-key claims"
    named_runs: bool = False

    @property
    def auditor(self) -> Auditor:
        from producer.audit.auditors import KEY_AUDIT  # the audit wing: keo audit's alone

        return KEY_AUDIT

    def sender(
        self,
        stack: Stack,
        party: Party,
        *,
        hooks: Hooks | None = None,
        driver: DriverReads = NOTHING_READ,  # noqa: ARG002 - key mode reads back no run
    ) -> Sender:
        return _KeySender(stack.producer(owner=party.owner, hooks=hooks))

    def plan_recovery(self, stack: Stack, runs: Sequence[str]) -> tuple[PlannedReads, ...]:  # noqa: ARG002 - key mode reads back no run
        return ()

    def done_before(self, stack: Stack, query: str | None, batch_id: int | None) -> bool:
        """True when the batch ledger says this query's batch settled every row already."""
        if query is None or batch_id is None:
            return False
        stream = stack.settings.stream
        now_ms = stack.clock.now_ms()
        if stack.ledger.completed_batch(stream, query, batch_id, now_ms=now_ms) is None:
            return False
        log.info(
            "batch already complete, skipped stream=%s query=%s batch=%d", stream, query, batch_id
        )
        return True

    def completer(self, stack: Stack, *, query: str | None, run: str) -> Completer | None:  # noqa: ARG002 - key mode records batches, not runs
        """The batch of ``query`` recorded COMPLETE (a replay of it skips all per-key work);
        None for a write no query names."""
        if query is None:
            return None

        def complete(counts: Mapping[str, int], batch_id: int | None) -> None:
            if batch_id is not None:
                stack.ledger.mark_batch_complete(
                    stack.settings.stream,
                    query,
                    batch_id,
                    counts=dict(counts),
                    now_ms=stack.clock.now_ms(),
                )

        return complete


@dataclass(frozen=True)
class _Replay:
    dedupe: Dedupe = Dedupe.REPLAY
    retries_unresolved_tasks: bool = True
    settles_the_rest: str = "by reading the stream back"
    named_runs: bool = True

    @property
    def auditor(self) -> Auditor:
        from producer.audit.auditors import ROW_AUDIT  # the audit wing: keo audit's alone

        return ROW_AUDIT

    def sender(
        self,
        stack: Stack,
        party: Party,
        *,
        hooks: Hooks | None = None,
        driver: DriverReads = NOTHING_READ,
    ) -> Sender:
        from producer.replay.context import ReplayTask
        from producer.replay.shared_reads import shared_by

        shared = shared_by(stack.reader)
        for plan in driver.planned:
            if plan.run == party.run:
                shared.seed(plan)
        producer = stack.replay_producer(hooks=hooks)
        task = ReplayTask(party.run, party.execution_id, party.task, party.task_attempt)
        listed_before = driver.listed_before(stack.clock.now_ms() / 1000)
        attempt = producer.attempt(task, listed_before=listed_before)
        return _ReplaySender(producer, attempt)

    def done_before(self, stack: Stack, query: str | None, batch_id: int | None) -> bool:  # noqa: ARG002 - the tasks learn it from their run
        return False

    def plan_recovery(self, stack: Stack, runs: Sequence[str]) -> tuple[PlannedReads, ...]:
        from producer.replay.recovery import plan_reads_once_over

        lease = stack.settings.lease_policy()
        try:
            plans = [
                plan_reads_once_over(stack.ledger, stack.reader, stack.clock, lease, run)
                for run in runs
            ]
        except KeoError as exc:  # a courtesy: the tasks then read for themselves
            log.warning(
                "replay recovery not planned on the driver stream=%s error=%s",
                stack.settings.stream,
                exc,
            )
            return ()
        return tuple(plan for plan in plans if plan is not None)

    def completer(self, stack: Stack, *, query: str | None, run: str) -> Completer | None:  # noqa: ARG002 - the run names the batch
        """The batch's run marked COMPLETE (one write): a replay of it sends nothing."""

        def complete(counts: Mapping[str, int], _batch_id: int | None) -> None:
            stack.replay_producer().complete(run, dict(counts))

        return complete


KEY: Final[Guarantee] = _Key()
REPLAY: Final[Guarantee] = _Replay()
_BY_DEDUPE: Final = {guarantee.dedupe: guarantee for guarantee in (KEY, REPLAY)}


def guarantee_of(settings: ProducerSettings) -> Guarantee:
    """The guarantee ``settings`` choose (``KEO_DEDUPE``): the one place the mode is read."""
    return _BY_DEDUPE[settings.dedupe]
