"""``DynamoDBRunLedger``: replay-mode runs and their tasks' attempts, on the ledger's table.

Its three kinds of item::

    run item    pk "__keo__/run/<stream>/<run>"      a replay-mode run: state, counts, each
                                                      execution's bounds and counts (a few
                                                      attributes); in the in-flight index while
                                                      OPEN, in partitions of its own
    stripe item pk "__keo__/runpart/<stream>/<execution>/<k>/<run>"
                                                      the counts of an execution's tasks past
                                                      its first 256 (:mod:`dedupe_store.run_stripes`:
                                                      no item takes all of a batch's writes)
    task item   pk "__keo__/task/<stream>/<execution>/<task>/<run>"
                                                      one task's attempts in one execution (a
                                                      map each): small, whatever the run's size

:class:`DynamoDBRunReader` reads them, :class:`DynamoDBRunLedger` writes them too: every write
is a conditional update of :class:`dedupe_store.table.DynamoDBTable` (its token recognises an
SDK retry of an applied write); the conditions are in :mod:`dedupe_store.expressions`, the
transitions in :mod:`dedupe_store.states`, the items' keys and attributes in
:mod:`dedupe_store.run_items`.

Renewals write the run item about once a twentieth of a lease, not once each
(:data:`RENEWALS_SHARE_EXTENSION`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from dedupe_store import expressions as x
from dedupe_store.errors import LedgerUnavailableError
from dedupe_store.expressions import TTL_ATTRIBUTE
from dedupe_store.inflight import Cursor, bucket_of, run_bucket_partition, walk_items
from dedupe_store.records import (
    AttemptRenewal,
    RenewalRefused,
    ReplayRun,
    RunAttempt,
    RunRegistration,
)
from dedupe_store.run_items import (
    attempt_name,
    attempt_value,
    attempts_of,
    execution_names,
    execution_standing,
    replay_run_pk,
    replay_task_pk,
    stripe_of,
)
from dedupe_store.run_stripes import RunStripes, late_update
from dedupe_store.states import RunState, RunTransition, next_run_state
from dedupe_store.table import DynamoDBTable

if TYPE_CHECKING:
    from dedupe_store.contract import RunLedger

__all__ = ["RENEWALS_SHARE_EXTENSION", "DynamoDBRunLedger", "DynamoDBRunReader", "RunsHandedOn"]

# a renewal extends its execution's lease 1 / n of a lease past the lease it wants (3 s of the
# fence's 60 s), so that its siblings' renewals of the next 1 / n of a lease need not write it
# (a replay waits up to that much longer for a killed execution)
RENEWALS_SHARE_EXTENSION: Final = 20


class DynamoDBRunReader:
    """The replay-mode runs of :class:`dedupe_store.contract.RunReader` on the ledger's table:
    a run, a task's attempts, the runs left OPEN (the in-flight index), every run of a stream;
    each run with its executions' stripes added (:class:`dedupe_store.run_stripes.RunStripes`).
    Thread-safe."""

    def __init__(self, table: DynamoDBTable, *, inflight_buckets: int) -> None:
        self._table = table
        self._stripes = RunStripes(table)
        self.inflight_buckets = inflight_buckets

    def get_run(self, stream: str, run: str) -> ReplayRun | None:
        item = self._table.get_item(replay_run_pk(stream, run), None, "read a run", consistent=True)
        return None if item is None else self._stripes.run_of(stream, run, item)

    def open_runs(
        self,
        stream: str,
        *,
        now_ms: int | None,
        buckets: Sequence[int] | None = None,
        page_size: int = 100,
    ) -> Iterator[ReplayRun]:
        """:meth:`dedupe_store.contract.RunReader.open_runs`: with ``now_ms``, the index
        narrows the query to runs whose first lease ended before it, and each execution's own
        lease is read from the run's item."""
        prefix = replay_run_pk(stream, "")

        def read_page(
            bucket: int, limit: int, after: Cursor | None
        ) -> tuple[list[ReplayRun], Cursor | None]:
            page, cursor = self._table.query_index(
                run_bucket_partition(stream, bucket), before_ms=now_ms, limit=limit, after=after
            )
            items = self._table.batch_get_items([pk for _, pk in page], "get runs")
            runs = self._stripes.runs_of(
                stream, [(str(item["pk"]["S"])[len(prefix) :], item) for item in items]
            )
            return sorted(_left_open(runs, now_ms), key=lambda r: r.run), cursor

        yield from walk_items(
            read_page,
            buckets=buckets,
            inflight_buckets=self.inflight_buckets,
            page_size=page_size,
        )

    def task_attempts(
        self, stream: str, run: str, execution_id: str, task: str
    ) -> tuple[RunAttempt, ...]:
        item = self._table.get_item(
            replay_task_pk(stream, run, execution_id, task),
            None,
            "read a task's attempts",
            consistent=True,
        )
        return attempts_of(item or {})

    def replay_runs(self, stream: str, *, page_size: int = 1000) -> Iterator[ReplayRun]:
        prefix = replay_run_pk(stream, "")
        for item in self._table.scan(
            "begins_with(#pk, :runs)", {":runs": x.s(prefix)}, page_size=page_size
        ):
            yield self._stripes.run_of(stream, str(item["pk"]["S"])[len(prefix) :], item)


def _left_open(runs: Iterable[ReplayRun], now_ms: int | None) -> Iterator[ReplayRun]:
    """The runs still OPEN (the index lags), and with ``now_ms`` only those whose every
    attempt's lease ended before it."""
    for run in runs:
        if run.state is RunState.OPEN and (now_ms is None or run.leases_ended_before(now_ms)):
            yield run


class DynamoDBRunLedger(DynamoDBRunReader):
    """The replay-mode runs of :class:`dedupe_store.contract.RunLedger` on the ledger's table:
    the reads of :class:`DynamoDBRunReader`, and the writes. Thread-safe:
    :class:`dedupe_store.ledger.DynamoDBLedger` holds one and hands its calls on."""

    def __init__(self, table: DynamoDBTable, *, dedupe_ttl_s: int, inflight_buckets: int) -> None:
        super().__init__(table, inflight_buckets=inflight_buckets)
        self.dedupe_ttl_s = dedupe_ttl_s

    def register_attempt(
        self, stream: str, run: str, attempt: RunAttempt, *, keep_s: int = 0
    ) -> RunRegistration:
        """Two small writes: the attempt counted on its execution (the run item, or for a
        task past its execution's first 256 its stripe's item, :meth:`_count_attempt`), then
        the task item (the attempt). The run is not COMPLETE and the execution not
        superseded, or nothing is written to the task item. A third when a higher attempt of
        the task registered first: this one is outranked, and its count on the execution
        finished. The run it returns shows the other executions with their stripes; its own
        execution's counts as its stripe 0, the run item, holds them (its lease is there)."""
        next_run_state(None, RunTransition.REGISTER)
        opening = {
            ":open": x.s(RunState.OPEN.value),
            ":stream": x.s(stream),
            ":bucket": x.s(self._run_bucket(stream, run)),
            ":first_lease": x.n(attempt.lease_expires_at_ms),
            ":expires": x.n(self._run_expires_at_s(attempt.lease_expires_at_ms, keep_s)),
            ":now": x.n(attempt.started_at_ms),
        }
        applied, current = self._count_attempt(stream, run, attempt, opening)
        if not applied:
            return RunRegistration(False, current)
        bound = self._execution_bound(stream, run, current, attempt, keep_s)
        me = dataclasses.replace(attempt, lease_expires_at_ms=bound)
        registered, task_item = self._table.update(
            replay_task_pk(stream, run, attempt.execution_id, attempt.task),
            None,
            x.REGISTER_TASK_ATTEMPT,
            x.TASK_REGISTRABLE,
            {
                ":stream": x.s(stream),
                ":attempt": attempt_value(me),
                ":n": x.n(attempt.task_attempt),
                ":expires": x.n(attempt.started_at_ms // 1000 + max(self.dedupe_ttl_s, keep_s)),
            },
            names={"#me": attempt_name(attempt.attempt_id)},
        )
        task_attempts = attempts_of(task_item or {})
        if not registered and all(a.attempt_id != attempt.attempt_id for a in task_attempts):
            # a higher attempt of the task registered first: it owns the rows. Nothing of
            # this one is left open on its execution (a replay need not wait for it). (Its
            # own id there: the same attempt asked again, registered.)
            self.finish_attempt(stream, run, attempt)
            return RunRegistration(False, current, task_attempts, outranked=True)
        return RunRegistration(True, current, task_attempts, bound)

    def _count_attempt(
        self, stream: str, run: str, attempt: RunAttempt, opening: dict[str, Any]
    ) -> tuple[bool, ReplayRun]:
        """The attempt counted on its execution (``opening``: the values that open it on the
        run item): on the run item when its task is in stripe 0, else on its stripe's item.
        Whether it was (the run OPEN, the execution not superseded), and the run."""
        if stripe_of(attempt.task) > 0:
            return self._stripes.register(stream, run, attempt, opening)
        applied, item = self._table.update(
            replay_run_pk(stream, run),
            None,
            x.REGISTER_EXECUTION,
            x.EXECUTION_REGISTRABLE,
            {**opening, ":one": x.n(1), ":tag": x.n(attempt.tag)},
            names=execution_names(attempt.execution_id),
        )
        if item is None:  # pragma: no cover - a lost condition always has an item
            raise LedgerUnavailableError(
                f"run {run!r} vanished while registering", table=self._table.table_name
            )
        return applied, self._stripes.run_of(stream, run, item, skip={attempt.execution_id})

    def _run_expires_at_s(self, lease_expires_at_ms: int, keep_s: int) -> int:
        """When a run's item may go: the dedupe TTL or ``keep_s`` (the stream's retention),
        whichever is longer, after the last lease written to it, so after its last put."""
        return lease_expires_at_ms // 1000 + max(self.dedupe_ttl_s, keep_s)

    def _execution_bound(
        self, stream: str, run: str, current: ReplayRun, attempt: RunAttempt, keep_s: int
    ) -> int:
        """The lease an attempt registers with: its own, or its execution's when that ends
        first. An execution's lease is its first attempt's: one registering when less than
        half of a lease is left of it (a long batch's later tasks, a retry) extends it first."""
        execution = current.execution(attempt.execution_id)
        wanted = attempt.lease_expires_at_ms
        if execution is None:  # pragma: no cover - the registration just wrote it
            return wanted
        if execution.lease_expires_at_ms < wanted - attempt.half_lease_ms:
            extended = self._extend_execution(
                stream, run, attempt.execution_id, wanted=wanted, keep_s=keep_s
            )
            if isinstance(extended, RenewalRefused):
                extended = execution.lease_expires_at_ms
            return min(wanted, extended)
        return min(wanted, execution.lease_expires_at_ms)

    def supersede_executions(
        self, stream: str, run: str, execution_ids: Sequence[str]
    ) -> ReplayRun | None:
        """One write to the run item, then one to seal each stripe the superseded executions
        announced (none for a run of up to 256 tasks a batch)."""
        if not execution_ids:
            return self.get_run(stream, run)
        names: dict[str, str] = {}
        sets: list[str] = []
        conditions: list[str] = []
        for i, execution_id in enumerate(execution_ids):
            field_names = execution_names(execution_id)
            names[f"#s{i}"] = field_names["#xsuperseded"]
            names[f"#o{i}"] = field_names["#xopen"]
            sets.append(f"#s{i} = :true")
            conditions.append(f"attribute_exists(#o{i})")
        _, item = self._table.update(
            replay_run_pk(stream, run),
            None,
            "SET " + ", ".join(sets) + ", #token = :token",
            " AND ".join(conditions),
            {":true": {"BOOL": True}},
            names=names,
        )
        # the run item first, then the stripes it lists: the order run_stripes argues
        return None if item is None else self._stripes.seal(stream, run, item, execution_ids)

    def supersede_attempts(
        self, stream: str, run: str, me: RunAttempt, attempt_ids: Sequence[str]
    ) -> tuple[RunAttempt, ...]:
        pk = replay_task_pk(stream, run, me.execution_id, me.task)
        if not attempt_ids:
            item = self._table.get_item(pk, None, "read a task's attempts", consistent=True)
            return attempts_of(item or {})
        names = {f"#a{i}": attempt_name(a) for i, a in enumerate(attempt_ids)}
        update = "SET " + ", ".join(f"{n}.#superseded = :true" for n in names) + ", #token = :token"
        condition = " AND ".join(f"attribute_exists({n})" for n in names)
        _, item = self._table.update(
            pk, None, update, condition, {":true": {"BOOL": True}}, names=names
        )
        return attempts_of(item or {})

    def renew_attempt(
        self,
        stream: str,
        run: str,
        attempt: RunAttempt,
        *,
        now_ms: int,
        lease_ms: int,
        skew_ms: int,
        keep_s: int = 0,
    ) -> AttemptRenewal:
        """A read of the run item, and up to two writes: the execution's lease first, when the
        new lease would outgrow it (an attempt never puts past its execution's lease: what a
        replay reads up to; extended a twentieth of a lease further, for the siblings), then
        the attempt's own; a third for a task in a stripe k > 0: its stripe's item lives on
        with the lease, as the run item does."""
        next_run_state(RunState.OPEN, RunTransition.RENEW)
        wanted = now_ms + lease_ms
        bound = self._execution_lease(
            stream,
            run,
            attempt.execution_id,
            wanted=wanted,
            extended=wanted + lease_ms // RENEWALS_SHARE_EXTENSION,
            keep_s=keep_s,
        )
        if isinstance(bound, RenewalRefused):
            return AttemptRenewal(False, refused=bound)
        lease = min(wanted, bound)
        applied, item = self._table.update(
            replay_task_pk(stream, run, attempt.execution_id, attempt.task),
            None,
            x.RENEW_ATTEMPT,
            x.ATTEMPT_RENEWABLE,
            {
                ":false": {"BOOL": False},
                ":now_plus_skew": x.n(now_ms + skew_ms),
                ":lease": x.n(lease),
            },
            names={"#me": attempt_name(attempt.attempt_id)},
        )
        if applied:
            if stripe_of(attempt.task) > 0:
                expires_at_s = self._run_expires_at_s(lease, keep_s)
                self._stripes.live_on(stream, run, attempt, expires_at_s=expires_at_s)
            return AttemptRenewal(True, lease)
        mine = next(
            (a for a in attempts_of(item or {}) if a.attempt_id == attempt.attempt_id), None
        )
        superseded = mine is not None and mine.superseded
        refused = RenewalRefused.SUPERSEDED if superseded else RenewalRefused.LEASE_OVER
        return AttemptRenewal(False, refused=refused)

    def _execution_lease(
        self, stream: str, run: str, execution_id: str, *, wanted: int, extended: int, keep_s: int
    ) -> int | RenewalRefused:
        """The execution's lease for a renewal wanting ``wanted``: as the run item holds it
        when it reaches ``wanted`` (one consistent read; the item kept as long as that lease
        needs, which a registration since may have shortened), else extended to ``extended``;
        or why it can no longer grow."""
        pk = replay_run_pk(stream, run)
        item = self._table.get_item(pk, None, "read a run", consistent=True)
        standing = execution_standing(stream, run, item, execution_id)
        if isinstance(standing, RenewalRefused):
            return standing
        if standing < wanted:
            return self._extend_execution(stream, run, execution_id, wanted=extended, keep_s=keep_s)
        expires = self._run_expires_at_s(wanted, keep_s)
        if int((item or {}).get(TTL_ATTRIBUTE, {}).get("N", 0)) >= expires:
            return standing
        applied, kept = self._table.update(
            pk,
            None,
            x.KEEP_RUN,
            x.RUN_KEEPABLE,
            {":open": x.s(RunState.OPEN.value), ":expires": x.n(expires)},
            names=execution_names(execution_id),
        )
        return standing if applied else execution_standing(stream, run, kept, execution_id)

    def _extend_execution(
        self, stream: str, run: str, execution_id: str, *, wanted: int, keep_s: int
    ) -> int | RenewalRefused:
        """The execution's lease once it reaches ``wanted`` (extended, or already there), or
        why it can no longer grow: the run is not OPEN, or the execution superseded. The run's
        item lives on with it (:meth:`_run_expires_at_s`)."""
        values = {
            ":open": x.s(RunState.OPEN.value),
            ":lease": x.n(wanted),
            ":expires": x.n(self._run_expires_at_s(wanted, keep_s)),
        }
        applied, item = self._table.update(
            replay_run_pk(stream, run),
            None,
            x.EXTEND_EXECUTION,
            x.EXECUTION_EXTENDABLE,
            values,
            names=execution_names(execution_id),
        )
        if applied:
            return wanted
        # refused: extended as far or further by another, or fenced
        return execution_standing(stream, run, item, execution_id)

    def finish_attempt(
        self,
        stream: str,
        run: str,
        attempt: RunAttempt,
        *,
        late_rows: frozenset[str] = frozenset(),
    ) -> None:
        """Take the attempt's tag off its execution's open sum, and add ``late_rows`` to the
        execution's (one write, on the item it registered on: the run item, or its stripe's):
        once every attempt of the execution has, a replay waits for none of them, but for rows
        it does not find among those late rows."""
        if stripe_of(attempt.task) > 0:
            self._stripes.finish(stream, run, attempt, late_rows=late_rows)
            return
        update, values = late_update(x.FINISH_ATTEMPT, x.FINISH_ATTEMPT_LATE, attempt, late_rows)
        self._table.update(
            replay_run_pk(stream, run),
            None,
            update,
            x.EXECUTION_EXISTS,
            values,
            names=execution_names(attempt.execution_id),
        )

    def complete_run(
        self, stream: str, run: str, *, counts: dict[str, int], now_ms: int, keep_s: int = 0
    ) -> ReplayRun:
        """One write to the run item, then one to seal each stripe its executions announced
        (none for a run of up to 256 tasks a batch)."""
        next_run_state(RunState.OPEN, RunTransition.COMPLETE)
        values = {
            ":complete": x.s(RunState.COMPLETE.value),
            ":stream": x.s(stream),
            ":now": x.n(now_ms),
            ":counts": x.s(json.dumps(counts, sort_keys=True)),
            ":expires": x.n(now_ms // 1000 + max(self.dedupe_ttl_s, keep_s)),
        }
        # every writer of COMPLETE writes the same fact; the first one's time and counts stay
        values[":open"] = x.s(RunState.OPEN.value)
        _, item = self._table.update(
            replay_run_pk(stream, run), None, x.COMPLETE_RUN, x.RUN_COMPLETABLE, values
        )
        if item is None:  # pragma: no cover - an applied update returns the item
            raise LedgerUnavailableError(
                f"run {run!r} vanished while completing", table=self._table.table_name
            )
        # COMPLETE first, then every stripe sealed: no attempt registers after it
        return self._stripes.seal(stream, run, item, None, complete=True)

    def _run_bucket(self, stream: str, run: str) -> str:
        return run_bucket_partition(stream, bucket_of(run, self.inflight_buckets))


class RunsHandedOn:
    """The :class:`dedupe_store.contract.RunLedger` methods of a whole ledger, each handed on
    to its runs part (``_run_ledger``): :class:`dedupe_store.ledger.DynamoDBLedger` and the
    tests' in-memory ledger both hold one."""

    _run_ledger: RunLedger

    def get_run(self, stream: str, run: str) -> ReplayRun | None:
        return self._run_ledger.get_run(stream, run)

    def task_attempts(
        self, stream: str, run: str, execution_id: str, task: str
    ) -> tuple[RunAttempt, ...]:
        return self._run_ledger.task_attempts(stream, run, execution_id, task)

    def open_runs(
        self,
        stream: str,
        *,
        now_ms: int | None,
        buckets: Sequence[int] | None = None,
        page_size: int = 100,
    ) -> Iterator[ReplayRun]:
        return self._run_ledger.open_runs(
            stream, now_ms=now_ms, buckets=buckets, page_size=page_size
        )

    def replay_runs(self, stream: str, *, page_size: int = 1000) -> Iterator[ReplayRun]:
        return self._run_ledger.replay_runs(stream, page_size=page_size)

    def register_attempt(
        self, stream: str, run: str, attempt: RunAttempt, *, keep_s: int = 0
    ) -> RunRegistration:
        return self._run_ledger.register_attempt(stream, run, attempt, keep_s=keep_s)

    def supersede_executions(
        self, stream: str, run: str, execution_ids: Sequence[str]
    ) -> ReplayRun | None:
        return self._run_ledger.supersede_executions(stream, run, execution_ids)

    def supersede_attempts(
        self, stream: str, run: str, me: RunAttempt, attempt_ids: Sequence[str]
    ) -> tuple[RunAttempt, ...]:
        return self._run_ledger.supersede_attempts(stream, run, me, attempt_ids)

    def renew_attempt(
        self,
        stream: str,
        run: str,
        attempt: RunAttempt,
        *,
        now_ms: int,
        lease_ms: int,
        skew_ms: int,
        keep_s: int = 0,
    ) -> AttemptRenewal:
        return self._run_ledger.renew_attempt(
            stream, run, attempt, now_ms=now_ms, lease_ms=lease_ms, skew_ms=skew_ms, keep_s=keep_s
        )

    def finish_attempt(
        self,
        stream: str,
        run: str,
        attempt: RunAttempt,
        *,
        late_rows: frozenset[str] = frozenset(),
    ) -> None:
        self._run_ledger.finish_attempt(stream, run, attempt, late_rows=late_rows)

    def complete_run(
        self, stream: str, run: str, *, counts: dict[str, int], now_ms: int, keep_s: int = 0
    ) -> ReplayRun:
        return self._run_ledger.complete_run(
            stream, run, counts=counts, now_ms=now_ms, keep_s=keep_s
        )
