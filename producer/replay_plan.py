"""Replay mode's decisions (``dedupe=replay``), as pure functions over what the run item holds.

No I/O: each takes the attempts a task attempt got back when it registered with its run (the
run item, DESIGN.md "Replay mode"), its own attempt, its rows, the records a read-back found,
the clock's reading and the lease policy, and returns what to do. Identity is the row,
``(key, data)``, counted as a multiset: Spark promises neither the partitioning nor the row
order of a replay. ``tests/unit/test_replay_plan.py`` goes through every case.

::

    the run's attempts ── earlier_attempts:  those whose puts mine must not repeat: another
                                             execution's (a replay), my task's lower attempts
                                             (a Spark task retry); never mine, never a sibling
    earlier ──────────── to_supersede:       the ids whose renewals to fence before reading
                         still_running:      the leases that may still put (not expired for all)
                         read_windows:       where their puts can be, merged, sorted
    a task attempt ───── recovery_step ─┬─ DONE       the run is COMPLETE: send nothing
                                        ├─ FAST_PATH  no earlier attempt: plain puts
                                        ├─ WAIT       an earlier lease runs: wait, or fail the task
                                        └─ RECOVER    read the windows back, send the rest
    a read-back ──────── rows_left_to_send:  the rows no found record matches (multiset)
                         can_finish_early:   nothing left: done, whatever an earlier one does

Known limit (the design asks that it be said and tested): a task matches its own rows only.
Identical rows (same key and data) that a replay spreads over several tasks cannot be told
apart by one task: each counts the same found record for its own row. So an identical row is
delivered at least once per batch (a row is sent unless a copy of it was found), not as many
times as the batch holds it when an earlier attempt delivered fewer copies than that and the
replay spreads them over tasks; ``test_identical_rows_spread_over_tasks_...`` pins it. Distinct
rows are unaffected: a found record never matches another row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from enum import StrEnum

from dedupe_store.records import RunAttempt
from producer.protocol import LeasePolicy

__all__ = [
    "RecoveryStep",
    "can_finish_early",
    "earlier_attempts",
    "read_windows",
    "recovery_step",
    "rows_left_to_send",
    "still_running",
    "to_supersede",
]


# --- which attempts count ---------------------------------------------------------------------


def _is_earlier(other: RunAttempt, me: RunAttempt) -> bool:
    if other.attempt_id == me.attempt_id:
        return False
    if other.execution_id != me.execution_id:
        # a replay of the batch by another driver run: its tasks held these rows, split
        # however its partitioning split them
        return True
    # my execution: only my own task's retries held my rows; a sibling task's rows are others
    return other.task == me.task and other.task_attempt < me.task_attempt


def earlier_attempts(attempts: Iterable[RunAttempt], me: RunAttempt) -> list[RunAttempt]:
    """The attempts whose puts ``me`` must not repeat, oldest first: every attempt of another
    execution, and the lower attempts of my task in my execution. Never ``me`` itself, never
    a sibling task of my execution, never a later attempt of my task."""
    earlier = [other for other in attempts if _is_earlier(other, me)]
    return sorted(earlier, key=lambda a: (a.started_at_ms, a.attempt_id))


def to_supersede(earlier: Sequence[RunAttempt]) -> list[str]:
    """The ids of the earlier attempts not superseded yet. Their renewals are fenced before
    recovery reads them back: a lease that can no longer grow gives read-back an end."""
    return [attempt.attempt_id for attempt in earlier if not attempt.superseded]


def still_running(
    earlier: Sequence[RunAttempt], now_ms: int, lease: LeasePolicy
) -> list[RunAttempt]:
    """The earlier attempts whose lease some clock within the skew still thinks runs: their
    puts may still land, so a row not found while any of them runs cannot be decided."""
    return [
        attempt
        for attempt in earlier
        if not lease.expired_for_everyone(attempt.lease_expires_at_ms, now_ms)
    ]


def read_windows(earlier: Sequence[RunAttempt], lease: LeasePolicy) -> list[tuple[int, int]]:
    """Where the earlier attempts' puts can be: each ``[started_at - skew, lease_expires_at +
    skew]`` (both ends included, whole milliseconds), merged where they overlap or touch, sorted.

    Windows that touch (the next starts at most one millisecond after the last ends) leave no
    millisecond between them, so they are one read: a shard is read once per merged window."""
    windows = sorted(
        lease.read_back_window(attempt.started_at_ms, attempt.lease_expires_at_ms)
        for attempt in earlier
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
    FAST_PATH = "FAST_PATH"  # no earlier attempt: plain puts, the signature fence on each
    WAIT = "WAIT"  # an earlier attempt's lease still runs: wait for it, or fail the task
    RECOVER = "RECOVER"  # read the earlier windows back, send the rows not found
    DONE = "DONE"  # the run is COMPLETE: send nothing


def recovery_step(
    *, run_complete: bool, earlier: Sequence[RunAttempt], now_ms: int, lease: LeasePolicy
) -> RecoveryStep:
    """What a task attempt does first. A COMPLETE run is done, whatever its attempts; with no
    earlier attempt, nothing of these rows can be in the stream yet; an earlier lease still
    running may still put (read what is there first, and finish early if everything is found:
    :func:`can_finish_early`); otherwise every earlier put has landed or never will."""
    if run_complete:
        return RecoveryStep.DONE
    if not earlier:
        return RecoveryStep.FAST_PATH
    if still_running(earlier, now_ms, lease):
        return RecoveryStep.WAIT
    return RecoveryStep.RECOVER
