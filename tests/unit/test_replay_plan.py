"""Replay mode's decisions: what is earlier, where its puts can be, what is left.

Identity is the row, ``(key, data)``, counted as a multiset (DESIGN.md "Replay mode").
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedupe_store.records import ANY_ROW, ReplayRun, RunAttempt, RunExecution
from dedupe_store.states import RunState
from producer.protocol import LeasePolicy
from producer.replay.plan import (
    Earlier,
    EarlierKind,
    RecoveryStep,
    can_finish_early,
    earlier_of,
    landing_late,
    match_since,
    past_trim_horizon,
    possibly_others,
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


def execution(
    execution_id: str,
    *,
    started_at_ms: int = T0_MS,
    lease_expires_at_ms: int | None = None,
    superseded: bool = False,
    finished: bool = False,
) -> RunExecution:
    return RunExecution(
        execution_id,
        started_at_ms,
        started_at_ms + LEASE_MS if lease_expires_at_ms is None else lease_expires_at_ms,
        superseded=superseded,
        attempts=1,
        open_tags=0 if finished else 1,
    )


def run_of(*executions: RunExecution) -> ReplayRun:
    return ReplayRun("orders", "q/7", RunState.OPEN, executions)


def earlier(kind: EarlierKind = EarlierKind.EXECUTION, **fields: int | bool) -> Earlier:
    """An earlier one of ``kind`` over ``[T0, T0 + lease]`` unless told otherwise."""
    values: dict[str, int | bool] = {
        "started_at_ms": T0_MS,
        "lease_expires_at_ms": T0_MS + LEASE_MS,
        "superseded": False,
        "finished": False,
    }
    values.update(fields)
    return Earlier(
        kind,
        f"{kind}-{values['started_at_ms']}-{values['lease_expires_at_ms']}",
        int(values["started_at_ms"]),
        int(values["lease_expires_at_ms"]),
        bool(values["superseded"]),
        bool(values["finished"]),
    )


# me: the second attempt of task 3 in the replay's execution "exec-2"
ME = attempt("me", task_attempt=1, started_at_ms=T0_MS + 600_000)
MINE = execution("exec-2", started_at_ms=T0_MS + 600_000)


# --- earlier_of -----------------------------------------------------------------------------


def test_every_other_execution_is_earlier_mine_is_not() -> None:
    # GIVEN a run with my execution and two others (a first run and a replay before mine)
    first = execution("exec-0", started_at_ms=T0_MS - 100)
    replay = execution("exec-1", started_at_ms=T0_MS + 100, superseded=True)
    # WHEN what is earlier than me is chosen
    chosen = earlier_of(run_of(first, MINE, replay), [ME], ME, registered_before=())
    # THEN both other executions are, oldest first, with their bounds; mine is not
    assert chosen == [Earlier.of_execution(first), Earlier.of_execution(replay)]
    assert [e.kind for e in chosen] == [EarlierKind.EXECUTION] * 2


@pytest.mark.parametrize(
    ("other", "registered_before_me", "is_earlier"),
    [
        (ME, True, False),
        (attempt("me", task_attempt=1, started_at_ms=T0_MS), True, False),  # my id: me, re-read
        (attempt("r0", task="3", task_attempt=0), True, True),
        (attempt("r1", task="3", task_attempt=1), True, True),
        (attempt("r2", task="3", task_attempt=2), True, False),
        (attempt("r0", task="3", task_attempt=0), False, False),
        (attempt("r2", task="3", task_attempt=2), False, False),
        (attempt("s0", task="4", task_attempt=0), True, False),
        (attempt("x0", execution_id="exec-1", task="3", task_attempt=0), True, False),
    ],
    ids=[
        "me",
        "my-id",
        "my-task-lower-attempt-registered-before",
        "my-task-same-attempt-other-id-registered-before",
        "my-task-higher-attempt-read-by-a-retried-registration",
        "my-task-lower-attempt-registered-after",
        "my-task-higher-attempt-registered-after",
        "sibling-task-lower-attempt",
        "another-executions-attempt",
    ],
)
def test_my_tasks_attempts_registered_before_me_are_earlier_whatever_their_number(
    other: RunAttempt, registered_before_me: bool, is_earlier: bool
) -> None:
    # GIVEN one attempt besides me among my task's attempts, registered before me or after
    before = {other.attempt_id} if registered_before_me else set()
    # WHEN what is earlier than me is chosen (my execution the run's only one)
    chosen = earlier_of(run_of(MINE), [other, ME], ME, registered_before=before)
    # THEN it is earlier when it is of my task and registered before me, by the ledger's
    # order (attempt 10 may register after attempt 11: the ledger outranks 10), and a higher
    # attempt is never earlier: one the registration read registered after it (an SDK retry
    # of the registration read the item again), and recovers against me
    assert chosen == ([Earlier.of_attempt(other)] if is_earlier else [])


def test_a_cli_rerun_sees_the_earlier_run_of_its_run_id() -> None:
    # GIVEN a CLI run re-run under the same --run-id: a new process, a new execution
    first, rerun = execution("proc-1"), execution("proc-2", started_at_ms=T0_MS + 90_000)
    me = attempt("p2", execution_id="proc-2", task="cli", started_at_ms=T0_MS + 90_000)
    # WHEN the re-run chooses what is earlier
    # THEN the first run is, and the re-run's own execution is not
    assert earlier_of(run_of(first, rerun), [me], me, registered_before=()) == [
        Earlier.of_execution(first)
    ]


# --- to_supersede -------------------------------------------------------------------------


def test_to_supersede_names_those_of_a_kind_not_fenced_yet() -> None:
    # GIVEN earlier executions and attempts, some superseded already
    found = [
        Earlier(EarlierKind.EXECUTION, "e0", T0_MS, T0_MS, superseded=True),
        Earlier(EarlierKind.EXECUTION, "e1", T0_MS, T0_MS, superseded=False),
        Earlier(EarlierKind.ATTEMPT, "a0", T0_MS, T0_MS, superseded=False),
        Earlier(EarlierKind.ATTEMPT, "a1", T0_MS, T0_MS, superseded=True),
    ]
    # WHEN those to supersede are chosen, per kind
    # THEN only those whose leases are not fenced yet, in order
    assert to_supersede(found, EarlierKind.EXECUTION) == ["e1"]
    assert to_supersede(found, EarlierKind.ATTEMPT) == ["a0"]
    assert to_supersede([], EarlierKind.ATTEMPT) == []


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
@pytest.mark.parametrize("kind", list(EarlierKind))
def test_an_earlier_one_runs_until_its_lease_expired_for_everyone(
    lease: LeasePolicy, now_ms: int, running: bool, kind: EarlierKind
) -> None:
    # GIVEN an earlier execution or attempt and its lease end
    found = earlier(kind, lease_expires_at_ms=LEASE_END_MS)
    # WHEN a recovering attempt asks whether it may still put
    # THEN it may until the lease's end plus the skew has passed
    assert still_running([found], now_ms, lease) == ([found] if running else [])


def test_still_running_keeps_only_the_live_ones(lease: LeasePolicy) -> None:
    # GIVEN one earlier execution long over, one whose attempts all finished (its lease
    # running), and one still running
    over = earlier(started_at_ms=T0_MS - 600_000, lease_expires_at_ms=T0_MS - 540_000)
    finished = earlier(finished=True, started_at_ms=T0_MS - 1)
    live = earlier()
    # WHEN the running ones are chosen during the live one's lease
    # THEN only it is: a finished execution puts nothing more, whatever its lease
    assert still_running([over, finished, live], T0_MS + 1_000, lease) == [live]


# --- read_windows -------------------------------------------------------------------------


def window_of(start_ms: int, end_ms: int) -> Earlier:
    """An earlier one whose read-back window is exactly ``[start_ms, end_ms]``."""
    return earlier(started_at_ms=start_ms + SKEW_MS, lease_expires_at_ms=end_ms - SKEW_MS)


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
    # GIVEN earlier ones with these read-back windows
    found = [window_of(start, end) for start, end in windows]
    # WHEN the windows to read are computed
    # THEN they are merged where no millisecond lies between them, and sorted
    assert read_windows(found, lease, now_ms=10**6) == expected


def test_a_read_window_is_start_minus_skew_to_lease_end_plus_skew(lease: LeasePolicy) -> None:
    # GIVEN one earlier execution
    found = earlier(lease_expires_at_ms=LEASE_END_MS)
    # WHEN its window is computed
    # THEN it is [started_at - skew, lease_expires_at + skew], as the design says
    assert read_windows([found], lease, now_ms=T0_MS + 1) == [
        (T0_MS - SKEW_MS, LEASE_END_MS + SKEW_MS)
    ]


def test_a_finished_executions_window_ends_now_not_at_its_lease(lease: LeasePolicy) -> None:
    # GIVEN an earlier execution whose attempts all finished, its lease running on
    found = earlier(finished=True, lease_expires_at_ms=LEASE_END_MS)
    # WHEN its window is computed a second after it started
    # THEN it ends at now (plus the skew): every put of it landed before the ledger said so
    assert read_windows([found], lease, now_ms=T0_MS + 1_000) == [
        (T0_MS - SKEW_MS, T0_MS + 1_000 + SKEW_MS)
    ]


def test_a_finished_execution_with_late_rows_is_read_to_its_lease(lease: LeasePolicy) -> None:
    # GIVEN a finished execution one of whose puts was settled by a record found early
    found = dataclasses.replace(
        earlier(finished=True, lease_expires_at_ms=LEASE_END_MS), late_rows=frozenset({"r1"})
    )
    # WHEN its window is computed a second after it started
    # THEN it runs to its lease's end: that put may land until then
    assert read_windows([found], lease, now_ms=T0_MS + 1_000) == [
        (T0_MS - SKEW_MS, LEASE_END_MS + SKEW_MS)
    ]


# --- landing_late -------------------------------------------------------------------------


def test_late_rows_may_land_until_the_lease_is_over_for_everyone(lease: LeasePolicy) -> None:
    # GIVEN finished executions: one with a late row, one listing every row, one with none,
    # and a running one with a late row
    late = dataclasses.replace(earlier(finished=True), late_rows=frozenset({"r1"}))
    every = dataclasses.replace(earlier(finished=True), late_rows=frozenset({ANY_ROW}))
    clean = earlier(finished=True)
    running = dataclasses.replace(earlier(), late_rows=frozenset({"r1"}))
    # WHEN a replay asks which may still land, during their leases and after
    during = landing_late([late, every, clean, running], T0_MS + 1_000, lease)
    after = landing_late([late, every], LEASE_END_MS + SKEW_MS, lease)
    # THEN the finished ones with late rows, until their leases are over; only their rows
    assert during == [late, every]
    assert after == []
    assert (late.may_land_late("r1"), late.may_land_late("r2")) == (True, False)
    assert every.may_land_late("r2")
    assert (late.puts_landed, clean.puts_landed) == (False, True)


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


# --- an ambiguous put's own read-back, and matches that could be another writer's -----------


def test_an_ambiguous_put_is_matched_only_from_its_own_send_time() -> None:
    # GIVEN row A put ambiguously from 1,000 ms (its send time minus the skew), and a copy of
    # A that another writer put at 900 ms
    # WHEN its read-back matches it
    matched, others = match_since([(A, 1_000)], {A: [(900, "other")]})
    # THEN the other writer's copy is not taken for it: it is not found, nothing counted
    assert (matched, others) == ([None], 0)


def test_the_latest_put_of_a_row_chooses_first_so_every_put_that_can_be_matched_is() -> None:
    # GIVEN two ambiguous puts of A, from 0 and from 500 ms, and copies of A at 100 and 600 ms
    # WHEN they are matched (the earlier put listed first)
    matched, others = match_since([(A, 0), (A, 500)], {A: [(600, "late"), (100, "early")]})
    # THEN both are found, the later put with the later copy; none left: nothing counted
    assert (matched, others) == (["early", "late"], 0)


def test_a_match_beside_an_identical_record_left_unmatched_is_counted() -> None:
    # GIVEN one put of A and one of B, from 0 ms; two copies of A read back, one of B
    # WHEN they are matched
    matched, others = match_since([(A, 0), (B, 0)], {A: [(5, "a1"), (7, "a2")], B: [(6, "b")]})
    # THEN A takes its oldest copy and counts as possibly another writer's (a copy is left
    # beside it: which one is this run's is a guess); B, alone in the window, does not
    assert (matched, others) == (["a1", "b"], 1)


def test_a_copy_older_than_every_put_of_its_row_is_not_evidence_of_another_writer() -> None:
    # GIVEN a put of A from 1,000 ms, its copy at 1,200 ms, and an older copy at 100 ms
    # WHEN it is matched
    # THEN the older copy is outside its window: the match is not counted
    assert match_since([(A, 1_000)], {A: [(100, "old"), (1_200, "mine")]}) == (["mine"], 0)


@pytest.mark.parametrize(
    ("taken", "left", "counted"),
    [
        ({A: 1}, {}, 0),
        ({A: 1}, {A: 0}, 0),
        ({A: 2}, {A: 1}, 2),
        ({A: 1, B: 3}, {B: 1}, 3),
        ({A: 0}, {A: 4}, 0),
    ],
    ids=["alone", "none-left", "one-left-beside-two", "only-the-row-with-one-left", "none-taken"],
)
def test_possibly_others_counts_every_match_of_a_row_with_a_copy_left_beside_it(
    taken: dict[Row, int], left: dict[Row, int], counted: int
) -> None:
    # GIVEN the matches per row and the identical records left unmatched in the windows read
    # WHEN the matches that could be another writer's are counted
    # THEN they are every match of a row with a record left, and no other
    assert possibly_others(taken, left) == counted


def test_identical_rows_spread_over_tasks_with_every_copy_found_are_counted() -> None:
    # GIVEN a batch holding row A twice, both put by its first execution (tasks 1 and 2), and a
    # replay that spreads the copies over two tasks: each reads both records, takes one
    # WHEN each counts the matches that could be another writer's
    # THEN each counts its match (the other copy, left beside it, is its sibling's or ours)
    for _task in range(2):
        assert possibly_others({A: 1}, {A: 1}) == 1


# --- recovery_step and can_finish_early ---------------------------------------------------

RUNNING = earlier(lease_expires_at_ms=LEASE_END_MS)
OVER = earlier(started_at_ms=T0_MS - 600_000, lease_expires_at_ms=T0_MS - 540_000)
FINISHED = earlier(finished=True)
NOW_MS = T0_MS + 1_000


@pytest.mark.parametrize(
    ("run_complete", "superseded", "found", "now_ms", "step"),
    [
        (True, False, [RUNNING], NOW_MS, RecoveryStep.DONE),
        (True, False, [], NOW_MS, RecoveryStep.DONE),
        (False, True, [RUNNING], NOW_MS, RecoveryStep.SUPERSEDED),
        (False, False, [], NOW_MS, RecoveryStep.FAST_PATH),
        (False, False, [RUNNING], NOW_MS, RecoveryStep.WAIT),
        (False, False, [OVER, RUNNING], NOW_MS, RecoveryStep.WAIT),
        (False, False, [OVER], NOW_MS, RecoveryStep.RECOVER),
        (False, False, [FINISHED], NOW_MS, RecoveryStep.RECOVER),
        (False, False, [RUNNING], LEASE_END_MS + SKEW_MS - 1, RecoveryStep.WAIT),
        (False, False, [RUNNING], LEASE_END_MS + SKEW_MS, RecoveryStep.RECOVER),
    ],
    ids=[
        "complete-while-one-runs",
        "complete",
        "my-execution-superseded",
        "nothing-earlier",
        "earlier-running",
        "one-over-one-running",
        "earlier-over",
        "earlier-finished-lease-running",
        "1ms-before-end-plus-skew",
        "exactly-end-plus-skew",
    ],
)
def test_recovery_step(
    lease: LeasePolicy,
    run_complete: bool,
    superseded: bool,
    found: list[Earlier],
    now_ms: int,
    step: RecoveryStep,
) -> None:
    # GIVEN a run's state, whether a replay superseded my execution, what is earlier
    # WHEN a task attempt decides how to start
    # THEN COMPLETE sends nothing, superseded sends nothing, nothing earlier puts plainly, a
    # live lease waits, else recover
    assert (
        recovery_step(
            run_complete=run_complete,
            superseded=superseded,
            earlier=found,
            now_ms=now_ms,
            lease=lease,
        )
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
    # replay's task 7 starts while the dead execution's lease still runs
    dead = execution("exec-1")
    me = attempt("me", execution_id="exec-2", task="7", started_at_ms=T0_MS + 2_000)
    rows: list[Row] = [A, B, A]
    found = earlier_of(
        run_of(dead, execution("exec-2", started_at_ms=T0_MS + 2_000)),
        [me],
        me,
        registered_before=(),
    )
    # WHEN it decides how to start, reads the earlier windows back and finds every row
    step = recovery_step(run_complete=False, earlier=found, now_ms=T0_MS + 2_000, lease=lease)
    windows = read_windows(found, lease, now_ms=T0_MS + 2_000)
    left = rows_left_to_send(rows, found=[B, A, A])
    # THEN the lease alone would make it wait, but nothing is left: it is done at once
    assert step is RecoveryStep.WAIT
    assert windows == [(T0_MS - SKEW_MS, T0_MS + LEASE_MS + SKEW_MS)]
    assert to_supersede(found, EarlierKind.EXECUTION) == ["exec-1"]
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


def _maximum_matching(wanted: list[tuple[Row, int]], found: list[tuple[Row, int]]) -> int:
    owner: dict[int, int] = {}

    def augment(put: int, seen: set[int]) -> bool:
        row, since_ms = wanted[put]
        for record, (found_row, arrival_ms) in enumerate(found):
            if found_row != row or arrival_ms < since_ms or record in seen:
                continue
            seen.add(record)
            if record not in owner or augment(owner[record], seen):
                owner[record] = put
                return True
        return False

    return sum(augment(put, set()) for put in range(len(wanted)))


@given(
    wanted=st.lists(st.tuples(SMALL_ROWS, st.integers(0, 10)), max_size=12),
    found=st.lists(st.tuples(SMALL_ROWS, st.integers(0, 10)), max_size=12),
)
def test_match_since_takes_each_record_once_and_never_before_its_put(
    wanted: list[tuple[Row, int]], found: list[tuple[Row, int]]
) -> None:
    # GIVEN any puts (row, since) and any records read back (row, arrival)
    records: dict[Row, list[tuple[int, int]]] = {}
    for position, (row, arrival_ms) in enumerate(found):
        records.setdefault(row, []).append((arrival_ms, position))
    # WHEN they are matched
    matched, others = match_since(wanted, records)
    # THEN each match is a record of the put's row that arrived at or after its since, each
    # record matched once
    taken = [p for p in matched if p is not None]
    assert len(taken) == len(set(taken))
    for (row, since_ms), position in zip(wanted, matched, strict=True):
        if position is not None:
            assert found[position][0] == row
            assert found[position][1] >= since_ms
    # AND as many puts are matched as any assignment allows (a maximum matching, by
    # augmenting paths)
    assert len(taken) == _maximum_matching(wanted, found)
    # AND the count of possibly others' never exceeds the matches
    assert 0 <= others <= len(taken)


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
def small_windows(draw: st.DrawFn) -> tuple[LeasePolicy, list[Earlier]]:
    skew_ms = draw(st.integers(0, 5))
    policy = LeasePolicy(lease_ms=1 + 2 * skew_ms, put_timeout_ms=1, skew_ms=skew_ms)
    spans = draw(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=8))
    found = [earlier(started_at_ms=start, lease_expires_at_ms=start + n) for start, n in spans]
    return policy, found


@given(case=small_windows())
def test_merged_windows_cover_every_window_and_nothing_else(
    case: tuple[LeasePolicy, list[Earlier]],
) -> None:
    # GIVEN any earlier ones
    policy, found = case
    # WHEN their windows are merged
    merged = read_windows(found, policy, now_ms=10**6)
    # THEN the merged windows hold exactly the milliseconds of their own windows
    own = [policy.read_back_window(e.started_at_ms, e.lease_expires_at_ms) for e in found]
    assert {ms for s, e in merged for ms in range(s, e + 1)} == {
        ms for s, e in own for ms in range(s, e + 1)
    }
    # AND each window lies inside one merged window
    assert all(any(s <= start and end <= e for s, e in merged) for start, end in own)
    # AND they are sorted, neither overlapping nor touching
    assert all(e_prev + 1 < s_next for (_, e_prev), (s_next, _) in pairwise(merged))
    assert all(s <= e for s, e in merged)


ATTEMPTS = st.builds(
    lambda i, execution_id, task, task_attempt, start: attempt(
        f"a{i}",
        execution_id=execution_id,
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
EXECUTIONS = st.builds(
    lambda execution_id, start: execution(execution_id, started_at_ms=start),
    st.sampled_from(["exec-1", "exec-2", "exec-3"]),
    st.integers(0, 10_000),
)


@given(
    executions=st.lists(EXECUTIONS, max_size=3, unique_by=lambda e: e.execution_id),
    task_attempts=st.lists(ATTEMPTS, max_size=12, unique_by=lambda a: a.attempt_id),
    me=ATTEMPTS,
)
def test_what_is_earlier_never_holds_me_or_my_siblings(
    executions: list[RunExecution], task_attempts: list[RunAttempt], me: RunAttempt
) -> None:
    # GIVEN any executions of a run and any attempts, me among them, the first half of them
    # registered before me
    before = {a.attempt_id for a in task_attempts[: len(task_attempts) // 2]}
    # WHEN what is earlier than me is chosen
    found = earlier_of(run_of(*executions), [*task_attempts, me], me, registered_before=before)
    # THEN never my execution, never me, never a sibling task, never one registered after me
    assert all(e.id not in (me.execution_id, me.attempt_id) for e in found)
    mine = {a.attempt_id: a for a in task_attempts if a.attempt_id != me.attempt_id}
    for e in found:
        if e.kind is EarlierKind.ATTEMPT:
            retry_of = mine[e.id]
            assert retry_of.execution_id == me.execution_id
            assert retry_of.task == me.task
            assert retry_of.attempt_id in before
            assert retry_of.task_attempt <= me.task_attempt
    # AND every attempt of my task registered before me, numbered no higher, is there
    assert {e.id for e in found if e.kind is EarlierKind.ATTEMPT} == {
        a.attempt_id
        for a in mine.values()
        if a.attempt_id in before
        and a.task_attempt <= me.task_attempt
        and a.execution_id == me.execution_id
        and a.task == me.task
    }
    # AND every other execution is there, oldest first
    others = {x.execution_id for x in executions if x.execution_id != me.execution_id}
    assert others == {e.id for e in found if e.kind is EarlierKind.EXECUTION}
    assert [e.started_at_ms for e in found] == sorted(e.started_at_ms for e in found)


# --- past_trim_horizon --------------------------------------------------------------------

RETENTION_MS = 24 * 3_600_000


@pytest.mark.parametrize(
    ("first_start_ms", "past"),
    [
        (T0_MS - RETENTION_MS + 60_000, False),  # inside the retention, past the skew margin
        (T0_MS - RETENTION_MS + SKEW_MS, False),  # at the horizon a slow clock sees
        (T0_MS - RETENTION_MS + SKEW_MS - 1, True),
        (T0_MS - 2 * RETENTION_MS, True),
    ],
    ids=["inside", "at-the-horizon", "one-ms-before", "a-day-before"],
)
def test_a_window_starting_before_the_trim_horizon_is_past_it(
    first_start_ms: int, past: bool
) -> None:
    # GIVEN windows, the earliest starting at first_start_ms, read at T0 on a 24 h stream
    windows = [(first_start_ms, first_start_ms + 10_000), (T0_MS - 5_000, T0_MS)]
    # WHEN the trim horizon is checked
    horizon = past_trim_horizon(windows, T0_MS, RETENTION_MS, SKEW_MS)
    # THEN it is past when it starts before what the stream holds (by a clock skew behind)
    assert horizon == (T0_MS - RETENTION_MS + SKEW_MS if past else None)
    assert past_trim_horizon([], T0_MS, RETENTION_MS, SKEW_MS) is None
