"""The contract's replay runs of many tasks (``dedupe_store.run_stripes``): an execution's tasks
past its first 256 count their attempts apart from the run item (stripes of 256 tasks), and
every reader sees the run as one item would hold it; a supersede and a COMPLETE fence every
stripe, announced or not.

Tasks "0", "300", "600" and "700" are in stripes 0 (the run item), 1, 2 and 2; "1000" in 3.
"""

from __future__ import annotations

import dataclasses

from dedupe_store.contract import Ledger
from dedupe_store.records import ReplayRun, RunAttempt
from dedupe_store.states import RunState
from ledger_contract.staging import RUN, STREAM, T0_MS, attempt, execution, execution_of


def _registered(ledger: Ledger, *attempts: RunAttempt) -> None:
    for one in attempts:
        registration = ledger.register_attempt(STREAM, RUN, one)
        assert registration.registered, one
        assert registration.task_attempts == (one,)


def test_attempts_of_tasks_in_every_stripe_count_on_their_execution(ledger: Ledger) -> None:
    # GIVEN attempts of tasks in three stripes of one execution
    task0, task300, task700 = attempt("a1"), attempt("a2", task="300"), attempt("a3", task="700")
    # WHEN they register
    _registered(ledger, task0, task300, task700)
    # THEN the run holds one execution counting the three, with the first one's bounds, and
    # each task's item its attempt
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert run.executions == (execution("exec-1", task0, task300, task700),)
    assert run.attempts == 3
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "700") == (task700,)
    # WHEN two finish, the one in stripe 2 with late rows
    ledger.finish_attempt(STREAM, RUN, task0)
    ledger.finish_attempt(STREAM, RUN, task700, late_rows=frozenset({"r1"}))
    half = execution_of(ledger.get_run(STREAM, RUN), "exec-1")
    # THEN the execution is not finished until the third has, and shows the late rows
    assert (half.finished, half.open_tags, half.late_rows) == (False, task300.tag, {"r1"})
    ledger.finish_attempt(STREAM, RUN, task300, late_rows=frozenset({"r2"}))
    done = execution_of(ledger.get_run(STREAM, RUN), "exec-1")
    assert (done.finished, done.late_rows, done.attempts) == (True, {"r1", "r2"}, 3)


def test_a_task_of_a_later_stripe_may_open_the_run_and_its_execution(ledger: Ledger) -> None:
    # GIVEN no run yet
    # WHEN a task of stripe 1 registers first, then one of stripe 0 a second later
    first = attempt("a1", task="300")
    registration = ledger.register_attempt(STREAM, RUN, first)
    later = attempt("a2", started_at_ms=T0_MS + 1_000)
    then = ledger.register_attempt(STREAM, RUN, later)
    # THEN the first opened the run and its execution, with its own bounds, and the later
    # one's lease is bounded by them
    assert registration.registered
    assert registration.run.state is RunState.OPEN
    assert registration.lease_expires_at_ms == first.lease_expires_at_ms
    assert then.lease_expires_at_ms == first.lease_expires_at_ms
    assert ledger.get_run(STREAM, RUN) == ReplayRun(
        STREAM, RUN, RunState.OPEN, (execution("exec-1", first, later),)
    )
    assert [run.run for run in ledger.open_runs(STREAM, now_ms=None)] == [RUN]


def test_a_supersede_fences_every_stripe_of_the_execution(ledger: Ledger) -> None:
    # GIVEN an execution's attempts in three stripes, and a replay's first task
    task0, task300, task700 = attempt("a1"), attempt("a2", task="300"), attempt("a3", task="700")
    _registered(ledger, task0, task300, task700)
    replay = attempt("b1", execution="exec-2", started_at_ms=T0_MS + 2_000)
    found = ledger.register_attempt(STREAM, RUN, replay)
    # THEN the replay's registration shows the earlier execution's every attempt
    assert found.registered
    assert execution_of(found.run, "exec-1") == execution("exec-1", task0, task300, task700)
    # WHEN the replay supersedes it
    superseded = ledger.supersede_executions(STREAM, RUN, ["exec-1"])
    # THEN the run it gets back counts the earlier attempts of every stripe, none finished
    earlier = execution("exec-1", task0, task300, task700, superseded=True)
    assert execution_of(superseded, "exec-1") == earlier
    # WHEN a retry of task 300 (its stripe sealed) and task 1000 (a stripe never announced)
    # of the superseded execution register
    retry = attempt("a4", task="300", task_attempt=1, started_at_ms=T0_MS + 3_000)
    late = attempt("a5", task="1000", started_at_ms=T0_MS + 3_000)
    refused = [ledger.register_attempt(STREAM, RUN, one) for one in (retry, late)]
    # THEN both are refused, their tasks hold no attempt of them, and the run is as the
    # supersede left it: the bounds and counts the replay read are final
    assert [(r.registered, r.superseded) for r in refused] == [(False, True), (False, True)]
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "300") == (task300,)
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "1000") == ()
    assert ledger.get_run(STREAM, RUN) == superseded
    # AND the replay's later tasks, in other stripes, register and see every earlier attempt
    replay300 = ledger.register_attempt(
        STREAM, RUN, attempt("b2", execution="exec-2", task="300", started_at_ms=T0_MS + 3_000)
    )
    assert replay300.registered
    assert execution_of(replay300.run, "exec-1") == earlier
    # AND once the earlier attempts finish (after the supersede), the execution is finished
    for one in (task0, task300, task700):
        ledger.finish_attempt(STREAM, RUN, one)
    assert execution_of(ledger.get_run(STREAM, RUN), "exec-1").finished


def test_a_complete_run_refuses_a_later_registration_in_every_stripe(ledger: Ledger) -> None:
    # GIVEN a run whose execution's tasks in two stripes registered, and its commit
    task0, task300 = attempt("a1"), attempt("a2", task="300")
    _registered(ledger, task0, task300)
    completed = ledger.complete_run(STREAM, RUN, counts={"sent": 2}, now_ms=T0_MS + 5_000)
    assert completed.state is RunState.COMPLETE
    assert completed.executions == (execution("exec-1", task0, task300),)
    # WHEN late attempts of that execution register: a retry of task 300 (a stripe it
    # sealed) and task 600 (a stripe never announced), and a replay's task 600
    zombies = [
        attempt("a3", task="300", task_attempt=1, started_at_ms=T0_MS + 6_000),
        attempt("a4", task="600", started_at_ms=T0_MS + 6_000),
        attempt("b1", execution="exec-2", task="600", started_at_ms=T0_MS + 6_000),
    ]
    refused = [ledger.register_attempt(STREAM, RUN, zombie) for zombie in zombies]
    # THEN every one is refused (the run is COMPLETE: nothing is sent), none is on its task
    assert [(r.registered, r.run.state) for r in refused] == [(False, RunState.COMPLETE)] * 3
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "600") == ()
    assert ledger.task_attempts(STREAM, RUN, "exec-2", "600") == ()
    # AND the run is as the commit left it
    assert ledger.get_run(STREAM, RUN) == completed


def test_the_runs_listed_come_with_every_stripe_counted(ledger: Ledger) -> None:
    # GIVEN a run whose task 0 finished and whose task 300 did not
    task0, task300 = attempt("a1"), attempt("a2", task="300")
    _registered(ledger, task0, task300)
    ledger.finish_attempt(STREAM, RUN, task0)
    # WHEN the OPEN runs and the stream's runs are listed
    listed = [*ledger.open_runs(STREAM, now_ms=None), *ledger.replay_runs(STREAM)]
    # THEN both show the execution as a consistent read does: not finished, two attempts
    expected = dataclasses.replace(execution("exec-1", task0, task300), open_tags=task300.tag)
    assert [run.executions for run in listed] == [(expected,), (expected,)]
    assert listed[0] == ledger.get_run(STREAM, RUN)
    # AND its lease running, the reconciler is not told of it
    assert list(ledger.open_runs(STREAM, now_ms=T0_MS)) == []
