"""Replay mode's decisions (``dedupe=replay``), as pure functions over what the run item holds.

No I/O: each takes what a task attempt got back when it registered with its run (the run
item's executions and its task's attempts, DESIGN.md "Replay mode"), its own attempt, its
rows, the records a read-back found,
the clock's reading and the lease policy, and returns what to do. Identity is the row,
``(key, data)``, counted as a multiset: Spark promises neither the partitioning nor the row
order of a replay. ``tests/unit/test_replay_plan.py`` goes through every case.

::

    the run, my task ──── earlier_of:        what may hold my rows: another execution (a
                                             replay), my task's attempts registered before me
                                             (a retry, a speculative copy); never mine, never a
                                             sibling
    earlier ──────────── to_supersede:       the ids whose leases to fence before reading
                         still_running:      those that may still put (not finished, a lease
                                             not expired for all)
                         landing_late:       finished ones whose late rows may still land (a
                                             put settled by a record found early)
                         read_windows:       where their puts can be, merged, sorted
    a task attempt ───── recovery_step ─┬─ DONE       the run is COMPLETE: send nothing
                                        ├─ SUPERSEDED a replay superseded my execution, or
                                        │             a higher attempt registered first
                                        ├─ FAST_PATH  nothing earlier: plain puts
                                        ├─ WAIT       an earlier lease runs: wait, or fail the task
                                        └─ RECOVER    read the windows back, send the rest
    a read-back ──────── rows_left_to_send:  the rows no found record matches (multiset)
                         match_since:        an ambiguous put's rows, each matched only from
                                             its own request's send time minus the skew
                         possibly_others:    the matches with an identical record left beside
                                             them: another writer's copy was in the window
                         can_finish_early:   nothing left: done, whatever an earlier one does

Known limit (the design asks that it be said and tested): identity is ``(key, data)``, and
nothing in the stream says which writer put a record. A found record of a row is taken for this
run's put of it when it lies on a shard the row routes to, inside the window read: for recovery,
an earlier attempt's ``[started_at - skew, lease end + skew]``; for an ambiguous put of this
attempt, ``[its request's send time - skew, lease end + skew]``; never a record this attempt
knows it wrote, nor (for its own puts) one of the earlier attempts' records. So an identical
row that another writer put there in that window (another run; a sibling task of this
execution, whose attempts the ledger does not show a task; another task of an earlier
execution, when a replay spreads identical rows over tasks) can be taken for this run's, and
when this run's own put of it never landed, the stream holds one copy where two belong.
:func:`possibly_others` counts every match made beside an identical record left unmatched
(the evidence that another writer put the row there); a match with no copy left beside it
cannot be told from this run's own and is not counted. Rows that differ in key or data are
never affected. Where a row must be counted exactly whatever other writers do, key mode is
the answer. ``tests/unit/test_replay_producer.py`` pins the narrowing and the count
(``test_an_ambiguous_put_is_not_matched_to_an_identical_row_written_before_it_was_sent``,
``test_a_recovery_match_beside_an_identical_record_of_another_writer_is_counted_and_warned``);
``test_identical_rows_spread_over_tasks_...`` the uncounted case.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from dedupe_store.records import ANY_ROW, ReplayRun, RunAttempt, RunExecution
from producer.protocol import LeasePolicy

_R = TypeVar("_R", bound=Hashable)  # a row's identity
_P = TypeVar("_P")  # a record's position

__all__ = [
    "Earlier",
    "EarlierKind",
    "RecoveryStep",
    "can_finish_early",
    "earlier_of",
    "landing_late",
    "match_since",
    "past_trim_horizon",
    "possibly_others",
    "read_windows",
    "recovery_step",
    "rows_left_to_send",
    "still_running",
    "to_supersede",
]


# --- which puts count ---------------------------------------------------------------------------


class EarlierKind(StrEnum):
    EXECUTION = "execution"  # another execution of the run: a replay; its bounds on the run item
    ATTEMPT = "attempt"  # a lower attempt of my task in my execution: a Spark task retry


@dataclass(frozen=True, slots=True)
class Earlier:
    """What may have put my rows before me, with where its puts can be: from
    ``started_at_ms`` until ``lease_expires_at_ms``, or until it ``finished`` (every put
    definite: none can land after)."""

    kind: EarlierKind
    id: str
    started_at_ms: int
    lease_expires_at_ms: int
    superseded: bool
    finished: bool = False
    # finished, but these rows' puts may land until the lease ends (RunExecution.late_rows)
    late_rows: frozenset[str] = frozenset()

    @classmethod
    def of_execution(cls, execution: RunExecution) -> Earlier:
        return cls(
            EarlierKind.EXECUTION,
            execution.execution_id,
            execution.started_at_ms,
            execution.lease_expires_at_ms,
            execution.superseded,
            execution.finished,
            execution.late_rows,
        )

    @property
    def puts_landed(self) -> bool:
        """Finished, with no put left that may land later: the stream holds all it put."""
        return self.finished and not self.late_rows

    def may_land_late(self, tag: str) -> bool:
        """Whether a put of the row tagged ``tag`` (:func:`dedupe_store.records.row_tag`)
        may land after this one finished."""
        return tag in self.late_rows or ANY_ROW in self.late_rows

    @classmethod
    def of_attempt(cls, attempt: RunAttempt) -> Earlier:
        return cls(
            EarlierKind.ATTEMPT,
            attempt.attempt_id,
            attempt.started_at_ms,
            attempt.lease_expires_at_ms,
            attempt.superseded,
        )


def earlier_of(
    run: ReplayRun,
    task_attempts: Iterable[RunAttempt],
    me: RunAttempt,
    *,
    registered_before: Collection[str],
) -> list[Earlier]:
    """What ``me`` must not repeat, oldest first: every other execution of the run (a replay
    of it, split however its partitioning split the rows), and the attempts of my task in my
    execution that registered before me (``registered_before``: their ids, as my
    registration found them on the task's item). Registration order, not attempt numbers,
    says what is earlier (attempt 10 may register after attempt 11: a stalled worker, a slow
    start, a speculative copy); the ledger refuses a registration below the highest number
    registered (outranked), so every attempt registered before me has a number no higher
    than mine. A higher one among ``registered_before`` registered after me, and my
    registration read it only because an SDK retry of it read the item again: it recovers
    against me, never I against it. Never ``me``, never a sibling task of my execution."""
    earlier = [Earlier.of_execution(e) for e in run.executions if e.execution_id != me.execution_id]
    earlier += [
        Earlier.of_attempt(a)
        for a in task_attempts
        if a.attempt_id != me.attempt_id
        and a.attempt_id in registered_before
        and a.task_attempt <= me.task_attempt
        and a.execution_id == me.execution_id
        and a.task == me.task
    ]
    return sorted(earlier, key=lambda e: (e.started_at_ms, e.kind, e.id))


def to_supersede(earlier: Sequence[Earlier], kind: EarlierKind) -> list[str]:
    """The ids of the earlier ones of ``kind`` not superseded yet. Their leases are fenced
    before recovery reads them back: a lease that can no longer grow gives read-back an end."""
    return [e.id for e in earlier if e.kind is kind and not e.superseded]


def still_running(earlier: Sequence[Earlier], now_ms: int, lease: LeasePolicy) -> list[Earlier]:
    """The earlier ones that may still put: not finished, and a lease some clock within the
    skew still thinks runs. A row not found while any of them runs cannot be decided."""
    return [
        e
        for e in earlier
        if not e.finished and not lease.expired_for_everyone(e.lease_expires_at_ms, now_ms)
    ]


def landing_late(earlier: Sequence[Earlier], now_ms: int, lease: LeasePolicy) -> list[Earlier]:
    """The finished earlier ones with rows whose puts may still land (their ``late_rows``:
    settled by a record that may have been another writer's copy), their leases not over for
    every clock. A row of those not found cannot be decided until that lease is over; every
    other row can."""
    return [
        e
        for e in earlier
        if e.finished
        and e.late_rows
        and not lease.expired_for_everyone(e.lease_expires_at_ms, now_ms)
    ]


def read_windows(
    earlier: Sequence[Earlier], lease: LeasePolicy, now_ms: int
) -> list[tuple[int, int]]:
    """Where the earlier puts can be: each ``[started_at - skew, end + skew]`` (both ends
    included, whole milliseconds), merged where they overlap or touch, sorted. ``end`` is the
    lease's, or ``now_ms`` for a finished one whose lease runs on and whose puts all landed
    before the ledger said it finished, so before now (:attr:`Earlier.puts_landed`).

    Windows that touch (the next starts at most one millisecond after the last ends) leave no
    millisecond between them, so they are one read: a shard is read once per merged window."""
    windows = sorted(
        lease.read_back_window(
            e.started_at_ms,
            min(e.lease_expires_at_ms, now_ms) if e.puts_landed else e.lease_expires_at_ms,
        )
        for e in earlier
    )
    merged: list[tuple[int, int]] = []
    for start, end in windows:
        if merged and start <= merged[-1][1] + 1:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


# --- what is left to send ---------------------------------------------------------------------


def rows_left_to_send(
    rows: Sequence[tuple[str, bytes]], found: Iterable[tuple[str, bytes]]
) -> list[int]:
    """The indexes (in input order) of the rows no found record matches.

    A row is its ``(key, data)``, counted: each found record matches at most one row, the
    earliest unmatched one, so of two identical rows with one found, the later is left. Found
    records that are none of these rows are another task's, and ignored."""
    unmatched = Counter(found)
    left: list[int] = []
    for index, row in enumerate(rows):
        if unmatched[row] > 0:
            unmatched[row] -= 1
        else:
            left.append(index)
    return left


def past_trim_horizon(
    windows: Sequence[tuple[int, int]], now_ms: int, retention_ms: int, skew_ms: int
) -> int | None:
    """The trim horizon when the earliest window starts before it, else None: records that
    arrived before ``now - retention`` are gone (a clock ``skew_ms`` behind Kinesis' counts
    them gone sooner), so rows put there cannot be found, and a row not found there may
    have been put."""
    horizon_ms = now_ms - retention_ms + skew_ms
    return horizon_ms if windows and windows[0][0] < horizon_ms else None


def match_since(
    wanted: Sequence[tuple[_R, int]], found: Mapping[_R, Sequence[tuple[int, _P]]]
) -> tuple[list[_P | None], int]:
    """Per wanted row, in order: a found record of it that arrived at or after the row's own
    ``since`` (epoch ms), each record matched once, or None; and how many of those matches are
    :func:`possibly_others` (another writer's identical record was left beside them).

    ``wanted``: ``(row, since_ms)``: an ambiguous put of the row, which cannot have landed
    before the moment its request was sent, minus the skew. ``found``: per row, the records
    read back, ``(arrival_ms, position)``. A row's most restrictive puts (the latest
    ``since``) choose first, each the oldest record it may have written: as many puts are
    matched as any assignment could match."""
    by_row: dict[_R, list[int]] = {}
    for index, (row, _) in enumerate(wanted):
        by_row.setdefault(row, []).append(index)
    matched: list[_P | None] = [None] * len(wanted)
    taken: Counter[_R] = Counter()
    left: Counter[_R] = Counter()
    for row, indexes in by_row.items():
        records = sorted(found.get(row, ()), key=lambda record: record[0])
        free = [True] * len(records)
        for index in sorted(indexes, key=lambda i: (-wanted[i][1], i)):
            since_ms = wanted[index][1]
            for at, (arrival_ms, position) in enumerate(records):
                if free[at] and arrival_ms >= since_ms:
                    free[at] = False
                    matched[index] = position
                    taken[row] += 1
                    break
        earliest_ms = min(wanted[i][1] for i in indexes)
        left[row] = sum(
            1
            for at, (arrival_ms, _) in enumerate(records)
            if free[at] and arrival_ms >= earliest_ms
        )
    return matched, possibly_others(taken, left)


def possibly_others(taken: Mapping[_R, int], left: Mapping[_R, int]) -> int:
    """How many of the matches ``taken`` (per row) could be another writer's copy, by the
    evidence read: every match of a row of which an identical record was left unmatched in the
    windows read (``left``). Such a record is another writer's (another run, a sibling task,
    another task of an earlier execution), so which copies are this run's is a guess, and a
    copy this run never wrote may have been counted as its own.

    The rule cannot see the rest: a match whose row has no record left beside it may still be
    another writer's identical record, when this run's own put of it never landed. Only key
    mode counts a row exactly whatever other writers do."""
    return sum(count for row, count in taken.items() if count and left.get(row, 0) > 0)


def can_finish_early(rows_left: int) -> bool:
    """Whether this attempt is done with nothing more to read or wait for.

    When every row is found in the windows read so far, nothing is left to send, whatever an
    earlier attempt still running does: each attempt sends a row at most once, and found rows
    are not sent again, so a put of it still in flight can only add a copy the earlier attempt
    owns, never one of ours. WAIT applies only to rows not found: a driver killed after its puts
    and before its commit (the common case) recovers with no wait."""
    return rows_left == 0


# --- the step -----------------------------------------------------------------------------


class RecoveryStep(StrEnum):
    FAST_PATH = "FAST_PATH"  # nothing earlier: plain puts, the signature fence on each
    WAIT = "WAIT"  # an earlier lease still runs: wait for it, or fail the task
    RECOVER = "RECOVER"  # read the earlier windows back, send the rows not found
    DONE = "DONE"  # the run is COMPLETE: send nothing
    SUPERSEDED = "SUPERSEDED"  # my execution superseded, or outranked: send nothing, fail


def recovery_step(
    *,
    run_complete: bool,
    superseded: bool = False,
    earlier: Sequence[Earlier],
    now_ms: int,
    lease: LeasePolicy,
) -> RecoveryStep:
    """What a task attempt does first. A COMPLETE run is done, whatever its attempts; an
    attempt of an execution a replay superseded must not put (the replay delivers the run);
    with nothing earlier, none of these rows can be in the stream yet; an earlier one still
    running may still put (read what is there first, and finish early if everything is found:
    :func:`can_finish_early`); otherwise every earlier put has landed or never will."""
    if run_complete:
        return RecoveryStep.DONE
    if superseded:
        return RecoveryStep.SUPERSEDED
    if not earlier:
        return RecoveryStep.FAST_PATH
    if still_running(earlier, now_ms, lease):
        return RecoveryStep.WAIT
    return RecoveryStep.RECOVER
