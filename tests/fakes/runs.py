"""``InMemoryRunLedger``: the replay-mode runs of :class:`dedupe_store.contract.RunLedger` in
dicts, the part of :class:`fakes.ledger.InMemoryLedger` that keeps them.

Same conditional semantics as :class:`dedupe_store.runs.DynamoDBRunLedger`. The OPEN runs are
in an index of their own, by the lease their first attempt registered with. It shares the
ledger's lock (reentrant) and its fault knobs: a fault injected on a run's call raises,
nothing applied.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence

from dedupe_store.inflight import bucket_of
from dedupe_store.names import check_stream_name
from dedupe_store.records import (
    AttemptRenewal,
    RenewalRefused,
    ReplayRun,
    RunAttempt,
    RunExecution,
    RunRegistration,
    late_rows_of,
)
from dedupe_store.runs import RENEWALS_SHARE_EXTENSION
from dedupe_store.states import RunState, RunTransition, next_run_state


class InMemoryRunLedger:
    """Replay-mode runs and their tasks' attempts. Thread-safe: the ledger's lock around every
    call."""

    def __init__(
        self,
        lock: threading.RLock,
        read_fault: Callable[[str], None],
        *,
        dedupe_ttl_s: int,
        inflight_buckets: int,
        between_registration_writes: Callable[[RunAttempt], None],
    ) -> None:
        """``read_fault``: raises the fault injected on the ledger for a call, if any;
        ``between_registration_writes``: called between a registration's two writes, the lock
        held (a test registers another attempt there, as a race would)."""
        self._lock = lock
        self._read_fault = read_fault
        self.dedupe_ttl_s = dedupe_ttl_s
        self.inflight_buckets = inflight_buckets
        self.between_registration_writes = between_registration_writes
        self._replay_runs: dict[tuple[str, str], ReplayRun] = {}
        # the index entries of OPEN runs: the lease their first attempt registered with
        self._run_index: dict[tuple[str, str], int] = {}
        # (stream, run, execution, task) -> that task's attempts in that execution
        self._task_attempts: dict[tuple[str, str, str, str], tuple[RunAttempt, ...]] = {}

    def register_attempt(
        self, stream: str, run: str, attempt: RunAttempt, *, keep_s: int = 0
    ) -> RunRegistration:
        next_run_state(None, RunTransition.REGISTER)
        with self._lock:
            self._read_fault("register_attempt")
            current = self._replay_runs.get((check_stream_name(stream), run))
            execution = current.execution(attempt.execution_id) if current is not None else None
            if current is not None and (
                current.state is RunState.COMPLETE
                or (execution is not None and execution.superseded)
            ):
                return RunRegistration(False, current)
            if execution is None:
                execution = RunExecution(
                    attempt.execution_id, attempt.started_at_ms, attempt.lease_expires_at_ms
                )
            counted = dataclasses.replace(
                execution,
                attempts=execution.attempts + 1,
                open_tags=execution.open_tags + attempt.tag,
            )
            others = current.executions if current is not None else ()
            registered = ReplayRun(
                stream,
                run,
                RunState.OPEN,
                _sorted_executions(
                    [e for e in others if e.execution_id != counted.execution_id] + [counted]
                ),
                expires_at_s=self._run_expires_at_s(attempt.lease_expires_at_ms, keep_s),
            )
            self._replay_runs[(stream, run)] = registered
            self._run_index.setdefault((stream, run), attempt.lease_expires_at_ms)
            wanted = attempt.lease_expires_at_ms
            if counted.lease_expires_at_ms < wanted - attempt.half_lease_ms:
                counted = self._extended(stream, run, counted, wanted, keep_s)
            me = dataclasses.replace(
                attempt, lease_expires_at_ms=min(wanted, counted.lease_expires_at_ms)
            )
            self.between_registration_writes(attempt)
            task = (stream, run, attempt.execution_id, attempt.task)
            mine = self._task_attempts.get(task, ())
            if any(a.attempt_id == me.attempt_id for a in mine):
                return RunRegistration(True, registered, mine, me.lease_expires_at_ms)
            if any(a.task_attempt > me.task_attempt for a in mine):
                # outranked: a higher attempt of the task registered first; its count is
                # finished on the execution, as the real ledger's third write does
                self._finish_locked(stream, run, attempt)
                return RunRegistration(False, registered, mine, outranked=True)
            mine = _sorted_attempts([*mine, me])
            self._task_attempts[task] = mine
            return RunRegistration(True, registered, mine, me.lease_expires_at_ms)

    def supersede_executions(
        self, stream: str, run: str, execution_ids: Sequence[str]
    ) -> ReplayRun | None:
        with self._lock:
            self._read_fault("supersede_executions")
            current = self._replay_runs.get((check_stream_name(stream), run))
            if current is None or not all(current.execution(e) for e in execution_ids):
                return current
            wanted = set(execution_ids)
            updated = dataclasses.replace(
                current,
                executions=tuple(
                    dataclasses.replace(e, superseded=True) if e.execution_id in wanted else e
                    for e in current.executions
                ),
            )
            self._replay_runs[(stream, run)] = updated
            return updated

    def supersede_attempts(
        self, stream: str, run: str, me: RunAttempt, attempt_ids: Sequence[str]
    ) -> tuple[RunAttempt, ...]:
        with self._lock:
            self._read_fault("supersede_attempts")
            task = (check_stream_name(stream), run, me.execution_id, me.task)
            mine = self._task_attempts.get(task, ())
            ids = {a.attempt_id for a in mine}
            if not set(attempt_ids) <= ids:
                return mine
            wanted = set(attempt_ids)
            mine = tuple(
                dataclasses.replace(a, superseded=True) if a.attempt_id in wanted else a
                for a in mine
            )
            self._task_attempts[task] = mine
            return mine

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
        next_run_state(RunState.OPEN, RunTransition.RENEW)
        with self._lock:
            self._read_fault("renew_attempt")
            current = self._replay_runs.get((check_stream_name(stream), run))
            execution = current.execution(attempt.execution_id) if current is not None else None
            if current is None or execution is None or current.state is not RunState.OPEN:
                return AttemptRenewal(False, refused=RenewalRefused.RUN_NOT_OPEN)
            if execution.superseded:
                return AttemptRenewal(False, refused=RenewalRefused.EXECUTION_SUPERSEDED)
            wanted = now_ms + lease_ms
            if execution.lease_expires_at_ms < wanted:
                extended = wanted + lease_ms // RENEWALS_SHARE_EXTENSION
                execution = self._extended(stream, run, execution, extended, keep_s)
            expires_at_s = self._run_expires_at_s(wanted, keep_s)
            latest = self._replay_runs[(stream, run)]
            if (latest.expires_at_s or 0) < expires_at_s:  # a registration moved it back
                self._replay_runs[(stream, run)] = dataclasses.replace(
                    latest, expires_at_s=expires_at_s
                )
            task = (stream, run, attempt.execution_id, attempt.task)
            mine = next(
                (
                    a
                    for a in self._task_attempts.get(task, ())
                    if a.attempt_id == attempt.attempt_id
                ),
                None,
            )
            if mine is not None and mine.superseded:
                return AttemptRenewal(False, refused=RenewalRefused.SUPERSEDED)
            if mine is None or mine.lease_expires_at_ms <= now_ms + skew_ms:
                return AttemptRenewal(False, refused=RenewalRefused.LEASE_OVER)
            lease = min(wanted, execution.lease_expires_at_ms)
            renewed = dataclasses.replace(mine, lease_expires_at_ms=lease)
            self._task_attempts[task] = tuple(
                renewed if a is mine else a for a in self._task_attempts[task]
            )
            return AttemptRenewal(True, lease)

    def _run_expires_at_s(self, lease_expires_at_ms: int, keep_s: int) -> int:
        return lease_expires_at_ms // 1000 + max(self.dedupe_ttl_s, keep_s)

    def _extended(
        self, stream: str, run: str, execution: RunExecution, wanted: int, keep_s: int
    ) -> RunExecution:
        """``execution`` with its lease extended to ``wanted`` when shorter, the run's item
        living on with it (under the lock)."""
        if execution.lease_expires_at_ms >= wanted:
            return execution
        extended = dataclasses.replace(execution, lease_expires_at_ms=wanted)
        current = self._replay_runs[(stream, run)]
        self._replay_runs[(stream, run)] = dataclasses.replace(
            current,
            executions=tuple(
                extended if e.execution_id == execution.execution_id else e
                for e in current.executions
            ),
            expires_at_s=self._run_expires_at_s(wanted, keep_s),
        )
        return extended

    def finish_attempt(
        self,
        stream: str,
        run: str,
        attempt: RunAttempt,
        *,
        late_rows: frozenset[str] = frozenset(),
    ) -> None:
        with self._lock:
            self._read_fault("finish_attempt")
            self._finish_locked(check_stream_name(stream), run, attempt, late_rows)

    def _finish_locked(
        self, stream: str, run: str, attempt: RunAttempt, late_rows: frozenset[str] = frozenset()
    ) -> None:
        current = self._replay_runs.get((stream, run))
        execution = current.execution(attempt.execution_id) if current is not None else None
        if current is None or execution is None:
            return
        finished = dataclasses.replace(
            execution,
            open_tags=execution.open_tags - attempt.tag,
            late_rows=execution.late_rows | late_rows_of(late_rows),
        )
        self._replay_runs[(stream, run)] = dataclasses.replace(
            current,
            executions=tuple(finished if e is execution else e for e in current.executions),
        )

    def task_attempts(
        self, stream: str, run: str, execution_id: str, task: str
    ) -> tuple[RunAttempt, ...]:
        with self._lock:
            self._read_fault("task_attempts")
            return self._task_attempts.get((check_stream_name(stream), run, execution_id, task), ())

    def complete_run(
        self, stream: str, run: str, *, counts: dict[str, int], now_ms: int, keep_s: int = 0
    ) -> ReplayRun:
        with self._lock:
            self._read_fault("complete_run")
            current = self._replay_runs.get((check_stream_name(stream), run))
            next_run_state(current.state if current else None, RunTransition.COMPLETE)
            expires_at_s = now_ms // 1000 + max(self.dedupe_ttl_s, keep_s)
            if current is not None and current.state is RunState.COMPLETE:
                lives_on = dataclasses.replace(current, expires_at_s=expires_at_s)
                self._replay_runs[(stream, run)] = lives_on
                return lives_on
            completed = ReplayRun(
                stream,
                run,
                RunState.COMPLETE,
                current.executions if current is not None else (),
                completed_at_ms=now_ms,
                counts=dict(counts),
                expires_at_s=expires_at_s,
            )
            self._replay_runs[(stream, run)] = completed
            self._run_index.pop((stream, run), None)
            return completed

    def get_run(self, stream: str, run: str) -> ReplayRun | None:
        with self._lock:
            self._read_fault("get_run")
            return self._replay_runs.get((check_stream_name(stream), run))

    def replay_runs(self, stream: str, *, page_size: int = 1000) -> Iterator[ReplayRun]:  # noqa: ARG002 - one page
        with self._lock:
            self._read_fault("scan")
            runs = [run for (s, _), run in self._replay_runs.items() if s == stream]
        yield from runs

    def open_runs(
        self,
        stream: str,
        *,
        now_ms: int | None,
        buckets: Sequence[int] | None = None,
        page_size: int = 100,  # noqa: ARG002 - one page
    ) -> Iterator[ReplayRun]:
        """OPEN runs bucket after bucket, by name within each; with ``now_ms`` only those
        whose first lease ended before it (the index) and then every lease (the run)."""
        with self._lock:
            self._read_fault("open_runs")
            wanted = set(buckets) if buckets is not None else set(range(self.inflight_buckets))
            indexed = [
                self._replay_runs[(stream, run)]
                for (s, run), first_lease_ms in self._run_index.items()
                if s == check_stream_name(stream)
                and bucket_of(run, self.inflight_buckets) in wanted
                and (now_ms is None or first_lease_ms < now_ms)
            ]
        found = [run for run in indexed if now_ms is None or run.leases_ended_before(now_ms)]
        return iter(sorted(found, key=lambda r: (bucket_of(r.run, self.inflight_buckets), r.run)))


def _sorted_executions(executions: list[RunExecution]) -> tuple[RunExecution, ...]:
    return tuple(sorted(executions, key=lambda e: (e.started_at_ms, e.execution_id)))


def _sorted_attempts(attempts: list[RunAttempt]) -> tuple[RunAttempt, ...]:
    return tuple(sorted(attempts, key=lambda a: (a.task_attempt, a.started_at_ms, a.attempt_id)))
