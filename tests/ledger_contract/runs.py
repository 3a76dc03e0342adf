"""The contract's replay runs (``dedupe_store.runs``): task attempts registering with their
execution and their task, outranked, superseded, renewing and finishing; a run completed once;
the OPEN runs in the in-flight index.
"""

from __future__ import annotations

import dataclasses
import functools

from dedupe_store.contract import Ledger
from dedupe_store.inflight import bucket_share
from dedupe_store.records import ANY_ROW, LATE_ROWS_MAX
from dedupe_store.runs import RENEWALS_SHARE_EXTENSION
from dedupe_store.states import RunState
from ledger_contract.staging import (
    LEASE_MS,
    RUN,
    SKEW_MS,
    STREAM,
    T0_MS,
    attempt,
    claimed,
    execution,
)


def test_attempts_register_with_their_execution_and_their_task(ledger: Ledger) -> None:
    # GIVEN a task attempt registered on a run
    first = attempt("a1")
    registered = ledger.register_attempt(STREAM, RUN, first)
    assert registered.registered
    assert registered.run.state is RunState.OPEN
    assert registered.run.executions == (execution("exec-1", first),)
    assert (registered.task_attempts, registered.lease_expires_at_ms) == (
        (first,),
        first.lease_expires_at_ms,
    )
    # WHEN its retry registers a second later, and a sibling task
    retry = attempt("a2", task_attempt=1, started_at_ms=T0_MS + 1_000)
    again = ledger.register_attempt(STREAM, RUN, retry)
    sibling = ledger.register_attempt(STREAM, RUN, attempt("s1", task="1"))
    # THEN the retry sees its task's first attempt (what it recovers), and a lease bounded by
    # its execution's; the sibling sees only itself
    bounded = dataclasses.replace(retry, lease_expires_at_ms=first.lease_expires_at_ms)
    assert again.registered
    assert again.task_attempts == (first, bounded)
    assert again.lease_expires_at_ms == first.lease_expires_at_ms
    assert [a.attempt_id for a in sibling.task_attempts] == ["s1"]
    # AND the run counts three attempts in one execution: the run item holds no attempt
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert run.executions == (execution("exec-1", first, retry, attempt("s1", task="1")),)
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "0") == (first, bounded)


def test_a_lower_attempt_registering_after_a_higher_one_is_outranked(ledger: Ledger) -> None:
    # GIVEN attempt 11 of a task registered first (attempt 10's worker stalled)
    later = attempt("a11", task_attempt=11)
    assert ledger.register_attempt(STREAM, RUN, later).registered
    # WHEN attempt 10 registers after it
    stalled = attempt("a10", task_attempt=10, started_at_ms=T0_MS + 1_000)
    refused = ledger.register_attempt(STREAM, RUN, stalled)
    # THEN it is outranked, not registered on its task (11 owns the rows), and not left open
    # on its execution: only 11 is, and 11 sees no attempt before it
    assert (refused.registered, refused.outranked, refused.superseded) == (False, True, True)
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "0") == (later,)
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    [counted] = run.executions
    assert (counted.attempts, counted.open_tags) == (2, later.tag)
    # AND an attempt with the same number as the highest registers, after it (a later one)
    same = ledger.register_attempt(STREAM, RUN, attempt("b11", task_attempt=11))
    assert same.registered
    assert {a.attempt_id for a in same.task_attempts} == {"a11", "b11"}


def test_registering_the_same_attempt_twice_keeps_one_attempt(ledger: Ledger) -> None:
    ledger.register_attempt(STREAM, RUN, attempt("a1"))
    # an SDK retry of an applied registration, or the same process asking again
    again = ledger.register_attempt(STREAM, RUN, attempt("a1"))
    assert again.registered
    assert len(again.task_attempts) == 1
    # AND its execution never reads as finished: the tag was added twice
    [counted] = again.run.executions
    assert not counted.finished


def test_a_complete_run_takes_no_attempt_and_stays_complete(ledger: Ledger) -> None:
    # GIVEN a run its driver committed
    first = attempt("a1")
    ledger.register_attempt(STREAM, RUN, first)
    completed = ledger.complete_run(STREAM, RUN, counts={"sent": 3}, now_ms=T0_MS + 5_000)
    assert (completed.state, completed.completed_at_ms, completed.counts) == (
        RunState.COMPLETE,
        T0_MS + 5_000,
        {"sent": 3},
    )
    # WHEN a replay of it registers an attempt
    replay = ledger.register_attempt(STREAM, RUN, attempt("b1", execution="exec-2"))
    # THEN it is refused: the replay sends nothing
    assert not replay.registered
    assert replay.run.state is RunState.COMPLETE
    assert replay.run.executions == (execution("exec-1", first),)
    assert ledger.task_attempts(STREAM, RUN, "exec-2", "0") == ()
    # AND completing it again keeps the first commit's time and counts
    assert ledger.complete_run(STREAM, RUN, counts={}, now_ms=T0_MS + 9_000) == completed


def test_a_run_lives_the_streams_retention_when_it_outlasts_the_dedupe_ttl(
    ledger: Ledger,
) -> None:
    # GIVEN a stream kept longer than the ledger's dedupe TTL
    keep_s = ledger.dedupe_ttl_s + 30 * 24 * 3600
    # WHEN a run registers its first attempt
    first = attempt("a1")
    registered = ledger.register_attempt(STREAM, RUN, first, keep_s=keep_s)
    # THEN its item lives the retention past that attempt's lease (its last possible put),
    # not the TTL
    assert registered.run.expires_at_s == first.lease_expires_at_ms // 1000 + keep_s
    # AND a later execution (a replay, a day later) and its renewal move it on: the item
    # outlives the records of the run's latest execution
    later_ms = T0_MS + 24 * 3600 * 1000
    replay = attempt("b1", execution="exec-2", started_at_ms=later_ms)
    moved = ledger.register_attempt(STREAM, RUN, replay, keep_s=keep_s)
    assert moved.run.expires_at_s == replay.lease_expires_at_ms // 1000 + keep_s
    renewal = ledger.renew_attempt(
        STREAM,
        RUN,
        replay,
        now_ms=later_ms + 10_000,
        lease_ms=LEASE_MS,
        skew_ms=1_000,
        keep_s=keep_s,
    )
    assert renewal.applied
    renewed = ledger.get_run(STREAM, RUN)
    assert renewed is not None
    ahead_ms = LEASE_MS // RENEWALS_SHARE_EXTENSION  # the execution's lease, past the attempt's
    assert renewed.expires_at_s == (later_ms + 10_000 + LEASE_MS + ahead_ms) // 1000 + keep_s
    # AND once completed, the retention from its completion: a re-run finds it COMPLETE while
    # the rows it put are in the stream
    done_ms = later_ms + 60_000
    completed = ledger.complete_run(STREAM, RUN, counts={}, now_ms=done_ms, keep_s=keep_s)
    assert completed.expires_at_s == done_ms // 1000 + keep_s
    found = ledger.get_run(STREAM, RUN)
    assert found is not None
    assert found.expires_at_s == completed.expires_at_s
    # AND a run of a stream kept less than the TTL lives the TTL
    short = ledger.register_attempt(STREAM, "other", attempt("c1"), keep_s=3600)
    assert short.run.expires_at_s == (T0_MS + LEASE_MS) // 1000 + ledger.dedupe_ttl_s


def test_an_attempt_renews_its_lease_and_its_executions_while_valid(ledger: Ledger) -> None:
    first = attempt("a1")
    ledger.register_attempt(STREAM, RUN, first)
    # WHEN it renews with more than the skew left
    now_ms = T0_MS + LEASE_MS - SKEW_MS - 1
    renewed = ledger.renew_attempt(
        STREAM, RUN, first, now_ms=now_ms, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    # THEN its lease runs from now, and its execution's with it (a twentieth of a lease
    # further: its siblings' renewals of that while need not write it)
    assert (renewed.applied, renewed.lease_expires_at_ms) == (True, now_ms + LEASE_MS)
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "0") == (
        dataclasses.replace(first, lease_expires_at_ms=now_ms + LEASE_MS),
    )
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    ahead_ms = LEASE_MS // RENEWALS_SHARE_EXTENSION
    assert run.executions[0].lease_expires_at_ms == now_ms + LEASE_MS + ahead_ms
    # AND once its lease is within the skew of its end, it cannot
    late_ms = now_ms + LEASE_MS - SKEW_MS
    late = ledger.renew_attempt(
        STREAM, RUN, first, now_ms=late_ms, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    assert not late.applied


def test_renewals_a_moment_after_a_siblings_take_the_lease_it_extended_without_a_write(
    ledger: Ledger,
) -> None:
    # GIVEN two tasks of an execution, the first renewing 10 s in: its execution's lease
    # extended a twentieth of a lease (1.5 s of 30 s) past its own
    first, second = attempt("a1"), attempt("a2", task="1")
    ledger.register_attempt(STREAM, RUN, first)
    ledger.register_attempt(STREAM, RUN, second)
    now_ms = T0_MS + 10_000
    ahead_ms = LEASE_MS // RENEWALS_SHARE_EXTENSION
    renew = functools.partial(ledger.renew_attempt, STREAM, RUN, lease_ms=LEASE_MS, skew_ms=SKEW_MS)

    def execution_lease_ms() -> int:
        run = ledger.get_run(STREAM, RUN)
        assert run is not None
        return run.executions[0].lease_expires_at_ms

    assert renew(first, now_ms=now_ms).lease_expires_at_ms == now_ms + LEASE_MS
    assert execution_lease_ms() == now_ms + LEASE_MS + ahead_ms
    # WHEN the second renews within that twentieth after it
    moment_ms = now_ms + ahead_ms
    shared = renew(second, now_ms=moment_ms)
    # THEN its lease runs a whole lease from now, and the run item kept the execution's lease
    assert (shared.applied, shared.lease_expires_at_ms) == (True, moment_ms + LEASE_MS)
    assert execution_lease_ms() == now_ms + LEASE_MS + ahead_ms
    # AND a renewal later than that extends the execution's lease again, as far past its own
    later_ms = moment_ms + 1
    assert renew(second, now_ms=later_ms).lease_expires_at_ms == later_ms + LEASE_MS
    assert execution_lease_ms() == later_ms + LEASE_MS + ahead_ms


def test_a_renewal_that_takes_a_siblings_extension_keeps_the_run_as_long_as_its_lease(
    ledger: Ledger,
) -> None:
    # GIVEN an execution whose lease a renewal extended, then a task registering at that
    # moment (a registration sets the run's expiry from its own lease: back, here)
    keep_s = 7_200  # the stream's retention, longer than the TTL
    first = attempt("a1")
    ledger.register_attempt(STREAM, RUN, first, keep_s=keep_s)
    now_ms = T0_MS + 10_000
    ledger.renew_attempt(
        STREAM, RUN, first, now_ms=now_ms, lease_ms=LEASE_MS, skew_ms=SKEW_MS, keep_s=keep_s
    )
    late = attempt("a2", task="1", started_at_ms=now_ms)
    ledger.register_attempt(STREAM, RUN, late, keep_s=keep_s)
    # WHEN a task renews a moment later, its lease within the execution's (no extension)
    moment_ms = now_ms + LEASE_MS // RENEWALS_SHARE_EXTENSION
    renewed = ledger.renew_attempt(
        STREAM, RUN, late, now_ms=moment_ms, lease_ms=LEASE_MS, skew_ms=SKEW_MS, keep_s=keep_s
    )
    # THEN the run lives the retention past that lease: its records' read-back needs it
    assert renewed.lease_expires_at_ms == moment_ms + LEASE_MS
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert run.expires_at_s is not None
    assert run.expires_at_s >= (moment_ms + LEASE_MS) // 1000 + keep_s


def test_a_late_task_extends_its_executions_lease_even_once_it_ran_out(ledger: Ledger) -> None:
    # GIVEN an execution whose first task registered, and whose lease ran out since (its
    # executors were lost; Spark is running its tasks again on new ones)
    ledger.register_attempt(STREAM, RUN, attempt("a1"))
    later_ms = T0_MS + 2 * LEASE_MS
    # WHEN a retry of that task registers, and a sibling half a lease before that one's end
    retry = attempt("a2", task_attempt=1, started_at_ms=later_ms)
    registered = ledger.register_attempt(STREAM, RUN, retry)
    sibling = attempt("s1", task="1", started_at_ms=later_ms + LEASE_MS // 2 - 1)
    beside = ledger.register_attempt(STREAM, RUN, sibling)
    # THEN the retry extended the execution's lease and holds a whole one; the sibling, with
    # more than half a lease left of it, takes it as it is (no write to extend it)
    assert registered.lease_expires_at_ms == later_ms + LEASE_MS
    assert beside.lease_expires_at_ms == later_ms + LEASE_MS
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert run.executions[0].lease_expires_at_ms == later_ms + LEASE_MS


def test_a_superseded_attempt_can_no_longer_renew(ledger: Ledger) -> None:
    # GIVEN a task attempt, and its retry that supersedes it
    first, retry = attempt("a1"), attempt("a2", task_attempt=1, started_at_ms=T0_MS + 1)
    ledger.register_attempt(STREAM, RUN, first)
    ledger.register_attempt(STREAM, RUN, retry)
    superseded = ledger.supersede_attempts(STREAM, RUN, retry, ["a1"])
    assert [(a.attempt_id, a.superseded) for a in superseded] == [("a1", True), ("a2", False)]
    # WHEN the first (a stalled process, waking) tries to renew
    renewal = ledger.renew_attempt(
        STREAM, RUN, first, now_ms=T0_MS + 1_000, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    # THEN it is refused: the lease the retry read is final
    assert not renewal.applied
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "0") == superseded
    # AND the retry itself still renews
    assert ledger.renew_attempt(
        STREAM, RUN, retry, now_ms=T0_MS + 1_000, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    ).applied


def test_a_superseded_execution_can_neither_grow_nor_register(ledger: Ledger) -> None:
    # GIVEN an execution's attempt, and a replay (another execution) that supersedes it
    first = attempt("a1")
    ledger.register_attempt(STREAM, RUN, first)
    replay = attempt("b1", execution="exec-2", started_at_ms=T0_MS + 2_000)
    assert ledger.register_attempt(STREAM, RUN, replay).registered
    superseded = ledger.supersede_executions(STREAM, RUN, ["exec-1"])
    assert superseded is not None
    assert superseded.executions == (
        execution("exec-1", first, superseded=True),
        execution("exec-2", replay),
    )
    # WHEN its attempt renews, and another task of it registers
    renewal = ledger.renew_attempt(
        STREAM, RUN, first, now_ms=T0_MS + 1_000, lease_ms=LEASE_MS, skew_ms=SKEW_MS
    )
    late = ledger.register_attempt(STREAM, RUN, attempt("a3", task="1"))
    # THEN both are refused: the bounds the replay read are final
    assert not renewal.applied
    assert (late.registered, late.superseded) == (False, True)
    assert ledger.get_run(STREAM, RUN) == superseded


def test_an_execution_is_finished_once_every_attempt_of_it_is(ledger: Ledger) -> None:
    # GIVEN two tasks of one execution
    task0, task1 = attempt("a1"), attempt("a2", task="1")
    ledger.register_attempt(STREAM, RUN, task0)
    ledger.register_attempt(STREAM, RUN, task1)
    # WHEN one finishes, then the other
    ledger.finish_attempt(STREAM, RUN, task0)
    half = ledger.get_run(STREAM, RUN)
    ledger.finish_attempt(STREAM, RUN, task1)
    done = ledger.get_run(STREAM, RUN)
    # THEN it is finished only after both: a replay waits for none of its leases then
    assert half is not None
    assert done is not None
    assert half.executions == (execution("exec-1", task0, task1, finished=1),)
    assert not half.executions[0].finished
    assert done.executions[0].finished
    assert done.leases_ended_before(T0_MS)


def test_a_finished_attempts_late_rows_are_added_to_its_execution(ledger: Ledger) -> None:
    # GIVEN two tasks of one execution, each with a row settled by a record found early
    task0, task1 = attempt("a1"), attempt("a2", task="1")
    ledger.register_attempt(STREAM, RUN, task0)
    ledger.register_attempt(STREAM, RUN, task1)
    # WHEN both finish, task0 with two late rows, task1 with more than an item should list
    ledger.finish_attempt(STREAM, RUN, task0, late_rows=frozenset({"r1", "r2"}))
    half = ledger.get_run(STREAM, RUN)
    many = frozenset(f"r{i}" for i in range(LATE_ROWS_MAX + 1))
    ledger.finish_attempt(STREAM, RUN, task1, late_rows=many)
    done = ledger.get_run(STREAM, RUN)
    # THEN the execution lists them, then every row: it is finished, but its puts have not
    # ended until its lease has
    assert half is not None
    assert done is not None
    assert half.executions[0].late_rows == {"r1", "r2"}
    assert done.executions[0].late_rows == {"r1", "r2", ANY_ROW}
    assert done.executions[0].finished
    assert not done.leases_ended_before(T0_MS)
    assert done.leases_ended_before(task0.lease_expires_at_ms + 1)


def test_runs_are_per_stream_and_never_read_as_keys(ledger: Ledger) -> None:
    ledger.register_attempt(STREAM, RUN, attempt("a1"))
    assert ledger.get_run("other-stream", RUN) is None
    assert ledger.get_run(STREAM, "query-a/8") is None
    assert list(ledger.scan(STREAM)) == []


# --- OPEN runs in the in-flight index ------------------------------------------------------------


def test_open_runs_lists_the_runs_left_open_once_every_execution_ended(
    ledger: Ledger,
) -> None:
    # GIVEN five runs: "q/1" one attempt (lease ends T0+30s); "q/2" a first execution (ends
    # T0+30s) and a replay (ends T0+50s); "q/3" whose attempt renewed twice, to T0+75s; "q/4"
    # committed; "q/5" whose one attempt finished (lease running to T0+30s)
    ledger.register_attempt(STREAM, "q/1", attempt("a1"))
    ledger.register_attempt(STREAM, "q/2", attempt("b1"))
    ledger.register_attempt(
        STREAM, "q/2", attempt("b2", execution="exec-2", started_at_ms=T0_MS + 20_000)
    )
    c1 = attempt("c1")
    ledger.register_attempt(STREAM, "q/3", c1)
    for renewed_at_ms in (T0_MS + 20_000, T0_MS + 45_000):
        assert ledger.renew_attempt(
            STREAM, "q/3", c1, now_ms=renewed_at_ms, lease_ms=LEASE_MS, skew_ms=SKEW_MS
        ).applied
    ledger.register_attempt(STREAM, "q/4", attempt("d1"))
    ledger.complete_run(STREAM, "q/4", counts={"sent": 1}, now_ms=T0_MS + 1_000)
    e1 = attempt("e1")
    ledger.register_attempt(STREAM, "q/5", e1)
    ledger.finish_attempt(STREAM, "q/5", e1)
    # WHEN the index is asked at T0+29s, T0+45s, T0+55s and T0+85s
    at_29s = ledger.open_runs(STREAM, now_ms=T0_MS + 29_000)
    at_45s = ledger.open_runs(STREAM, now_ms=T0_MS + 45_000)
    at_55s = ledger.open_runs(STREAM, now_ms=T0_MS + 55_000)
    at_85s = ledger.open_runs(STREAM, now_ms=T0_MS + 85_000)
    # THEN a run is listed once every execution of it ended (its lease, or every attempt
    # finished) and its first lease is past (the index's sort), never a committed one
    assert list(at_29s) == []
    assert sorted(run.run for run in at_45s) == ["q/1", "q/5"]
    assert sorted(run.run for run in at_55s) == ["q/1", "q/2", "q/5"]
    left_open = {run.run: run for run in at_85s}
    assert sorted(left_open) == ["q/1", "q/2", "q/3", "q/5"]
    # AND each comes back as a consistent read shows it: OPEN, with every execution's lease
    assert left_open["q/2"] == ledger.get_run(STREAM, "q/2")
    assert left_open["q/2"].state is RunState.OPEN
    assert [e.lease_expires_at_ms for e in left_open["q/2"].executions] == [
        T0_MS + LEASE_MS,
        T0_MS + 20_000 + LEASE_MS,
    ]
    # AND without a time, every OPEN run is listed, leases running or not
    assert sorted(run.run for run in ledger.open_runs(STREAM, now_ms=None)) == [
        "q/1",
        "q/2",
        "q/3",
        "q/5",
    ]


def test_replay_runs_lists_every_run_of_the_stream_open_or_complete(ledger: Ledger) -> None:
    # GIVEN two runs of the stream, one committed, and a run of another stream
    ledger.register_attempt(STREAM, "q/1", attempt("a1"))
    ledger.register_attempt(STREAM, "q/2", attempt("b1"))
    ledger.complete_run(STREAM, "q/2", counts={"sent": 1}, now_ms=T0_MS + 1_000)
    ledger.register_attempt(f"{STREAM}-other", "q/1", attempt("c1"))
    # WHEN the stream's runs are listed (a scan, small pages)
    runs = {run.run: run for run in ledger.replay_runs(STREAM, page_size=1)}
    # THEN both are there, each as a consistent read shows it, the other stream's not
    assert sorted(runs) == ["q/1", "q/2"]
    assert runs["q/1"] == ledger.get_run(STREAM, "q/1")
    assert runs["q/2"].state is RunState.COMPLETE


def test_a_run_leaves_the_index_when_it_completes(ledger: Ledger) -> None:
    # GIVEN a run left open past its lease
    ledger.register_attempt(STREAM, RUN, attempt("a1"))
    later_ms = T0_MS + 2 * LEASE_MS
    assert [run.run for run in ledger.open_runs(STREAM, now_ms=later_ms)] == [RUN]
    # WHEN a replay of it commits it
    ledger.complete_run(STREAM, RUN, counts={"sent": 2}, now_ms=later_ms)
    # THEN it is no longer listed, with or without a time
    assert list(ledger.open_runs(STREAM, now_ms=later_ms)) == []
    assert list(ledger.open_runs(STREAM, now_ms=None)) == []


def test_open_runs_are_split_by_bucket_share_and_kept_per_stream(ledger: Ledger) -> None:
    # GIVEN twelve runs left open, and one on another stream
    names = [f"query-a/{batch}" for batch in range(12)]
    for name in names:
        ledger.register_attempt(STREAM, name, attempt(f"a-{name}"))
    ledger.register_attempt("payments", "query-a/0", attempt("p1"))
    later_ms = T0_MS + 2 * LEASE_MS
    # WHEN two reconcilers each read their share of the index
    shares = [
        [run.run for run in ledger.open_runs(STREAM, now_ms=later_ms, buckets=share)]
        for share in (bucket_share(index, 2, ledger.inflight_buckets) for index in (0, 1))
    ]
    # THEN each run is in exactly one share, and the other stream's run in neither
    assert sorted(shares[0] + shares[1]) == sorted(names)
    assert not set(shares[0]) & set(shares[1])
    assert [run.run for run in ledger.open_runs("payments", now_ms=later_ms)] == ["query-a/0"]


def test_runs_in_the_in_flight_index_are_never_read_as_claim_groups(ledger: Ledger) -> None:
    # GIVEN a stale claim group, and runs left open past their leases in every bucket
    group = claimed(ledger, "k-stale")
    for batch in range(8):
        ledger.register_attempt(STREAM, f"query-a/{batch}", attempt(f"a{batch}"))
    later_ms = T0_MS + 2 * LEASE_MS
    # WHEN the reconciler's walk and the API's pages read the groups of every bucket
    stale = list(ledger.stale_groups(STREAM, now_ms=later_ms))
    keys = [
        key
        for bucket in range(ledger.inflight_buckets)
        for key in ledger.in_flight_page(STREAM, bucket, before_ms=None, limit=100)[0]
    ]
    # THEN they see the group and its key, and no run
    assert stale == [group.group_id]
    assert keys == ["k-stale"]
