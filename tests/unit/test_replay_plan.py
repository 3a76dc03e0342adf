"""Replay mode's decisions: which attempts are earlier, where their puts can be, what is left.

Identity is the row, ``(key, data)``, counted as a multiset (DESIGN.md "Replay mode").
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedupe_store.records import RunAttempt
from producer.protocol import LeasePolicy
from producer.replay_plan import (
    RecoveryStep,
    can_finish_early,
    earlier_attempts,
    read_windows,
    recovery_step,
    rows_left_to_send,
    still_running,
    to_supersede,
)

# the design's defaults: 2 s connect + 5 s read, 5 s skew, 60 s lease
PUT_TIMEOUT_MS = 7_000
SKEW_MS = 5_000
LEASE_MS = 60_000
T0_MS = 1_700_000_000_000

Row = tuple[str, bytes]


@pytest.fixture
def lease() -> LeasePolicy:
    return LeasePolicy(lease_ms=LEASE_MS, put_timeout_ms=PUT_TIMEOUT_MS, skew_ms=SKEW_MS)


def attempt(
    attempt_id: str,
    *,
    execution_id: str = "exec-2",
    task: str = "3",
    task_attempt: int = 0,
    started_at_ms: int = T0_MS,
    lease_expires_at_ms: int | None = None,
    superseded: bool = False,
) -> RunAttempt:
    return RunAttempt(
        attempt_id=attempt_id,
        execution_id=execution_id,
        task=task,
        task_attempt=task_attempt,
        started_at_ms=started_at_ms,
        lease_expires_at_ms=(
            started_at_ms + LEASE_MS if lease_expires_at_ms is None else lease_expires_at_ms
        ),
        superseded=superseded,
    )


# me: the second attempt of task 3 in the replay's execution "exec-2"
ME = attempt("me", task_attempt=1, started_at_ms=T0_MS + 600_000)


# --- RunAttempt ----------------------------------------------------------------------------


# --- earlier_attempts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("other", "earlier"),
    [
        (ME, False),
        (attempt("me", task_attempt=1, started_at_ms=T0_MS), False),  # my id: me, re-read
        (attempt("o1", execution_id="exec-1", task="3"), True),
        (attempt("o2", execution_id="exec-1", task="7"), True),
        (attempt("o3", execution_id="exec-1", task="3", task_attempt=4), True),
        (attempt("o4", execution_id="exec-1", task="cli"), True),
        (attempt("r0", task="3", task_attempt=0), True),
        (attempt("r1", task="3", task_attempt=1), False),
        (attempt("r2", task="3", task_attempt=2), False),
        (attempt("s0", task="4", task_attempt=0), False),
        (attempt("s1", task="4", task_attempt=1), False),
    ],
    ids=[
        "me",
        "my-id",
        "other-execution-same-task",
        "other-execution-other-task",
        "other-execution-higher-task-attempt",
        "other-execution-cli",
        "my-task-lower-attempt",
        "my-task-same-attempt-other-id",
        "my-task-later-attempt",
        "sibling-task-lower-attempt",
        "sibling-task-same-attempt",
    ],
)
def test_earlier_attempts_are_other_executions_and_my_tasks_retries(
    other: RunAttempt, earlier: bool
) -> None:
    # GIVEN one attempt registered with the run besides me
    # WHEN the attempts earlier than mine are chosen
    chosen = earlier_attempts([other, ME], ME)
    # THEN it is earlier only when it held my rows before me: a replay's or my task's retry
    assert chosen == ([other] if earlier else [])


def test_earlier_attempts_are_sorted_by_start() -> None:
    # GIVEN earlier attempts registered out of order
    late = attempt("late", execution_id="exec-1", started_at_ms=T0_MS + 300)
    early = attempt("early", execution_id="exec-0", started_at_ms=T0_MS + 100)
    retry = attempt("retry", task_attempt=0, started_at_ms=T0_MS + 200)
    # WHEN they are chosen
    # THEN they come oldest first
    assert earlier_attempts([late, ME, retry, early], ME) == [early, retry, late]


def test_a_cli_rerun_sees_the_earlier_run_of_its_run_id() -> None:
    # GIVEN a CLI run re-run under the same --run-id: a new process, a new execution
    first = attempt("p1", execution_id="proc-1", task="cli")
    rerun = attempt("p2", execution_id="proc-2", task="cli", started_at_ms=T0_MS + 90_000)
    # WHEN the re-run chooses its earlier attempts
    # THEN the first run is one, and the re-run is not its own
    assert earlier_attempts([first, rerun], rerun) == [first]
    assert earlier_attempts([first, rerun], first) == [rerun]  # any other execution counts


# --- to_supersede -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("superseded", "expected"),
    [
        ((), []),
        ((False, False), ["a0", "a1"]),
        ((True, False), ["a1"]),
        ((True, True), []),
    ],
    ids=["none", "none-superseded", "one-superseded", "all-superseded"],
)
def test_to_supersede_names_the_earlier_attempts_not_fenced_yet(
    superseded: tuple[bool, ...], expected: list[str]
) -> None:
    # GIVEN earlier attempts, some superseded already
    earlier = [attempt(f"a{i}", superseded=flag) for i, flag in enumerate(superseded)]
    # WHEN the attempts to supersede are chosen
    # THEN only those whose renewals are not fenced yet, in order
    assert to_supersede(earlier) == expected


# --- still_running ------------------------------------------------------------------------

LEASE_END_MS = T0_MS + LEASE_MS


@pytest.mark.parametrize(
    ("now_ms", "running"),
    [
        (T0_MS, True),
        (LEASE_END_MS, True),  # its clock may be behind ours
        (LEASE_END_MS + SKEW_MS - 1, True),
        (LEASE_END_MS + SKEW_MS, False),
        (LEASE_END_MS + SKEW_MS + 1, False),
    ],
    ids=["at-start", "at-lease-end", "1ms-before-end-plus-skew", "exactly-end-plus-skew", "after"],
)
def test_an_earlier_attempt_runs_until_its_lease_expired_for_everyone(
    lease: LeasePolicy, now_ms: int, running: bool
) -> None:
    # GIVEN an earlier attempt and its lease end
    earlier = attempt("a0", execution_id="exec-1", lease_expires_at_ms=LEASE_END_MS)
    # WHEN a recovering attempt asks whether it may still put
    # THEN it may until the lease's end plus the skew has passed
    assert still_running([earlier], now_ms, lease) == ([earlier] if running else [])


def test_still_running_keeps_only_the_live_leases(lease: LeasePolicy) -> None:
    # GIVEN one earlier attempt long over and one still running
    over = attempt("over", execution_id="exec-0", started_at_ms=T0_MS - 600_000)
    live = attempt("live", execution_id="exec-1")
    # WHEN the running ones are chosen during the live one's lease
    # THEN only it is
    assert still_running([over, live], T0_MS + 1_000, lease) == [live]


# --- read_windows -------------------------------------------------------------------------


def window_of(start_ms: int, end_ms: int) -> RunAttempt:
    """An attempt whose read-back window is exactly ``[start_ms, end_ms]``."""
    return attempt(
        f"w{start_ms}",
        execution_id="exec-1",
        started_at_ms=start_ms + SKEW_MS,
        lease_expires_at_ms=end_ms - SKEW_MS,
    )


@pytest.mark.parametrize(
    ("windows", "expected"),
    [
        ([], []),
        ([(0, 20_000)], [(0, 20_000)]),
        ([(0, 20_000), (30_000, 50_000)], [(0, 20_000), (30_000, 50_000)]),
        ([(30_000, 50_000), (0, 20_000)], [(0, 20_000), (30_000, 50_000)]),
        ([(0, 20_000), (10_000, 40_000)], [(0, 40_000)]),
        ([(0, 40_000), (10_000, 20_000)], [(0, 40_000)]),
        ([(0, 20_000), (20_000, 40_000)], [(0, 40_000)]),
        ([(0, 20_000), (20_001, 40_000)], [(0, 40_000)]),
        ([(0, 20_000), (20_002, 40_000)], [(0, 20_000), (20_002, 40_000)]),
        ([(0, 20_000), (50_000, 70_000), (15_000, 55_000)], [(0, 70_000)]),
    ],
    ids=[
        "none",
        "one",
        "disjoint",
        "disjoint-unsorted",
        "overlapping",
        "contained",
        "sharing-an-end",
        "adjacent-millisecond",
        "one-millisecond-gap",
        "bridged",
    ],
)
def test_read_windows_are_merged_where_they_overlap_or_touch(
    lease: LeasePolicy, windows: list[tuple[int, int]], expected: list[tuple[int, int]]
) -> None:
    # GIVEN earlier attempts with these read-back windows
    earlier = [window_of(start, end) for start, end in windows]
    # WHEN the windows to read are computed
    # THEN they are merged where no millisecond lies between them, and sorted
    assert read_windows(earlier, lease) == expected


def test_a_read_window_is_start_minus_skew_to_lease_end_plus_skew(lease: LeasePolicy) -> None:
    # GIVEN one earlier attempt
    earlier = attempt("a0", execution_id="exec-1", lease_expires_at_ms=LEASE_END_MS)
    # WHEN its window is computed
    # THEN it is [started_at - skew, lease_expires_at + skew], as the design says
    assert read_windows([earlier], lease) == [(T0_MS - SKEW_MS, LEASE_END_MS + SKEW_MS)]


# --- rows_left_to_send --------------------------------------------------------------------

A: Row = ("k1", b"a")
B: Row = ("k2", b"b")
A_OTHER_DATA: Row = ("k1", b"z")


@pytest.mark.parametrize(
    ("rows", "found", "left"),
    [
        ([A, B], [], [0, 1]),
        ([A, B], [B, A], []),
        ([], [A], []),
        ([A, B], [B], [0]),
        ([A, A], [A], [1]),
        ([A, B, A], [A], [1, 2]),
        ([A, A], [A, A, A], []),
        ([A], [A_OTHER_DATA], [0]),
        ([A], [("k9", b"a")], [0]),
        ([A, B], [("other-task", b"x"), A], [1]),
    ],
    ids=[
        "nothing-found",
        "all-found",
        "no-rows",
        "one-found",
        "twin-rows-one-found-the-later-left",
        "twin-rows-apart-one-found",
        "more-found-than-held",
        "same-key-other-data",
        "same-data-other-key",
        "another-tasks-row-ignored",
    ],
)
def test_rows_left_to_send_are_those_no_found_record_matches(
    rows: list[Row], found: list[Row], left: list[int]
) -> None:
    # GIVEN a task's rows and the records read back from the earlier windows
    # WHEN the rows left to send are chosen
    # THEN each found record matches at most one row, the earliest unmatched one
    assert rows_left_to_send(rows, found) == left


def test_identical_rows_spread_over_tasks_are_delivered_at_least_once_per_batch() -> None:
    # GIVEN a batch holding row A twice; its first execution put A once (task 1) and died
    # before task 2 put its copy; the replay spreads the two copies over two tasks again
    found_by_each_task = [A]  # both read the same windows, and find the same single record
    # WHEN each replay task chooses what it still sends
    left_task_1 = rows_left_to_send([A, B], found_by_each_task)
    left_task_2 = rows_left_to_send([A], found_by_each_task)
    # THEN neither sends A again: the known limit, A is in the stream once, not twice
    # (one task cannot tell its copy from its sibling's), while B is still sent
    assert (left_task_1, left_task_2) == ([1], [])


def test_identical_rows_in_one_task_are_counted() -> None:
    # GIVEN the same batch, the replay putting both copies of A in one task
    # WHEN it chooses what it still sends
    # THEN it sends the copy that was not found: the stream ends with A twice
    assert rows_left_to_send([A, A], [A]) == [1]


# --- recovery_step and can_finish_early ---------------------------------------------------

RUNNING = attempt("run", execution_id="exec-1", lease_expires_at_ms=LEASE_END_MS)
OVER = attempt("over", execution_id="exec-0", started_at_ms=T0_MS - 600_000)
NOW_MS = T0_MS + 1_000


@pytest.mark.parametrize(
    ("run_complete", "earlier", "now_ms", "step"),
    [
        (True, [RUNNING], NOW_MS, RecoveryStep.DONE),
        (True, [], NOW_MS, RecoveryStep.DONE),
        (False, [], NOW_MS, RecoveryStep.FAST_PATH),
        (False, [RUNNING], NOW_MS, RecoveryStep.WAIT),
        (False, [OVER, RUNNING], NOW_MS, RecoveryStep.WAIT),
        (False, [OVER], NOW_MS, RecoveryStep.RECOVER),
        (False, [RUNNING], LEASE_END_MS + SKEW_MS - 1, RecoveryStep.WAIT),
        (False, [RUNNING], LEASE_END_MS + SKEW_MS, RecoveryStep.RECOVER),
    ],
    ids=[
        "complete-while-one-runs",
        "complete",
        "no-earlier",
        "earlier-running",
        "one-over-one-running",
        "earlier-over",
        "1ms-before-end-plus-skew",
        "exactly-end-plus-skew",
    ],
)
def test_recovery_step(
    lease: LeasePolicy,
    run_complete: bool,
    earlier: list[RunAttempt],
    now_ms: int,
    step: RecoveryStep,
) -> None:
    # GIVEN a run's state and the attempts earlier than mine
    # WHEN a task attempt decides how to start
    # THEN COMPLETE sends nothing, no earlier attempt puts plainly, a live lease waits, else recover
    assert (
        recovery_step(run_complete=run_complete, earlier=earlier, now_ms=now_ms, lease=lease)
        is step
    )


@pytest.mark.parametrize(("rows_left", "early"), [(0, True), (1, False), (500, False)])
def test_can_finish_early_only_when_nothing_is_left(rows_left: int, early: bool) -> None:
    # GIVEN how many rows no found record matched
    # WHEN the attempt asks whether it is done
    # THEN it is exactly when none is left
    assert can_finish_early(rows_left) is early


def test_a_driver_killed_after_its_puts_recovers_with_no_wait(lease: LeasePolicy) -> None:
    # GIVEN a driver that put every row of task 3 and was killed before its commit; its
    # replay's task 3 starts while the dead attempt's lease still runs
    dead = attempt("dead", execution_id="exec-1", task="3")
    me = attempt("me", execution_id="exec-2", task="7", started_at_ms=T0_MS + 2_000)
    rows: list[Row] = [A, B, A]
    earlier = earlier_attempts([dead, me], me)
    # WHEN it decides how to start, reads the earlier windows back and finds every row
    step = recovery_step(run_complete=False, earlier=earlier, now_ms=T0_MS + 2_000, lease=lease)
    windows = read_windows(earlier, lease)
    left = rows_left_to_send(rows, found=[B, A, A])
    # THEN the lease alone would make it wait, but nothing is left: it is done at once
    assert step is RecoveryStep.WAIT
    assert windows == [(T0_MS - SKEW_MS, T0_MS + LEASE_MS + SKEW_MS)]
    assert to_supersede(earlier) == ["dead"]
    assert can_finish_early(len(left))


# --- properties ---------------------------------------------------------------------------

SMALL_ROWS = st.tuples(st.sampled_from(["k1", "k2", "k3"]), st.sampled_from([b"a", b"b"]))


@given(rows=st.lists(SMALL_ROWS, max_size=20), found=st.lists(SMALL_ROWS, max_size=20))
def test_rows_left_are_the_rows_minus_those_found(rows: list[Row], found: list[Row]) -> None:
    # GIVEN any rows and any records found, identical ones among both
    # WHEN the rows left are chosen
    left = rows_left_to_send(rows, found)
    # THEN they are, as a multiset, the rows minus the found records among them
    held, seen = Counter(rows), Counter(found)
    assert Counter(rows[i] for i in left) == held - (held & seen)
    # AND they keep the input order
    assert left == sorted(set(left))
    # AND the later copies of a row are the ones left (earliest rows are matched first)
    for row in held:
        copies = [i for i, r in enumerate(rows) if r == row]
        copies_left = [i for i in left if rows[i] == row]
        assert copies_left == copies[len(copies) - len(copies_left) :]


@given(rows=st.lists(SMALL_ROWS, max_size=20), extra=st.lists(SMALL_ROWS, max_size=10))
def test_nothing_is_left_when_every_row_is_found(rows: list[Row], extra: list[Row]) -> None:
    # GIVEN found records holding every row (and perhaps others')
    # WHEN the rows left are chosen
    # THEN none is
    assert rows_left_to_send(rows, [*extra, *reversed(rows)]) == []


@given(rows=st.lists(SMALL_ROWS, max_size=20))
def test_everything_is_left_when_nothing_is_found(rows: list[Row]) -> None:
    # GIVEN no record found
    # WHEN the rows left are chosen
    # THEN every row is, in order
    assert rows_left_to_send(rows, []) == list(range(len(rows)))


@st.composite
def small_attempts(draw: st.DrawFn) -> tuple[LeasePolicy, list[RunAttempt]]:
    skew_ms = draw(st.integers(0, 5))
    policy = LeasePolicy(lease_ms=1 + 2 * skew_ms, put_timeout_ms=1, skew_ms=skew_ms)
    spans = draw(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=8))
    attempts = [
        attempt(f"a{i}", execution_id="exec-1", started_at_ms=start, lease_expires_at_ms=start + n)
        for i, (start, n) in enumerate(spans)
    ]
    return policy, attempts


@given(case=small_attempts())
def test_merged_windows_cover_every_window_and_nothing_else(
    case: tuple[LeasePolicy, list[RunAttempt]],
) -> None:
    # GIVEN any earlier attempts
    policy, earlier = case
    # WHEN their windows are merged
    merged = read_windows(earlier, policy)
    # THEN the merged windows hold exactly the milliseconds of the attempts' windows
    own = [policy.read_back_window(a.started_at_ms, a.lease_expires_at_ms) for a in earlier]
    assert {ms for s, e in merged for ms in range(s, e + 1)} == {
        ms for s, e in own for ms in range(s, e + 1)
    }
    # AND each attempt's window lies inside one merged window
    assert all(any(s <= start and end <= e for s, e in merged) for start, end in own)
    # AND they are sorted, neither overlapping nor touching
    assert all(e_prev + 1 < s_next for (_, e_prev), (s_next, _) in pairwise(merged))
    assert all(s <= e for s, e in merged)


ATTEMPTS = st.builds(
    lambda i, execution, task, task_attempt, start: attempt(
        f"a{i}",
        execution_id=execution,
        task=task,
        task_attempt=task_attempt,
        started_at_ms=start,
    ),
    st.integers(0, 1_000),
    st.sampled_from(["exec-1", "exec-2", "exec-3"]),
    st.sampled_from(["0", "1", "cli"]),
    st.integers(0, 3),
    st.integers(0, 10_000),
)


@given(others=st.lists(ATTEMPTS, max_size=12), me=ATTEMPTS)
def test_earlier_attempts_never_hold_me_or_my_siblings(
    others: list[RunAttempt], me: RunAttempt
) -> None:
    # GIVEN any attempts registered with a run, me among them
    # WHEN the attempts earlier than mine are chosen
    earlier = earlier_attempts([*others, me], me)
    # THEN never me, never a sibling task of my execution, never a later attempt of my task
    assert me not in earlier
    assert all(a.attempt_id != me.attempt_id for a in earlier)
    mine = [a for a in earlier if a.execution_id == me.execution_id]
    assert all(a.task == me.task and a.task_attempt < me.task_attempt for a in mine)
    # AND every other execution's attempt is there, oldest first
    replays = {
        a for a in others if a.execution_id != me.execution_id and a.attempt_id != me.attempt_id
    }
    assert replays <= set(earlier)
    assert [a.started_at_ms for a in earlier] == sorted(a.started_at_ms for a in earlier)
