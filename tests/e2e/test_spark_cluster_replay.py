"""Replay mode (``dedupe=replay``) on ``local-cluster[2,1,1024]`` under faults: drivers killed
with SIGKILL, a Python worker killed mid-task, a task frozen past its lease while its retry
runs; then every input row is in the stream exactly once, as a multiset of ``(key, data)``,
read back with plain boto3 (streamcheck).

One scenario for the module (a driver start launches a cluster: seconds each), three drivers
(cluster_job.py) on one streaming query, five event files, one micro-batch each, two
partitions of 520 rows: a task puts its rows in two requests (500 rows, then 20), so a
failpoint at its second request finds it in the middle of its puts. Every Kinesis call of the
drivers and executors goes through the quota mode's proxy (AWS's quotas: a shard's 1,000
records and 5 GetRecords a second), with faults in front of the quotas (lost responses, 500s
after the write, records throttled, and AWS's signature window), every ledger call through
DynamoDB's (a key's write units; throttled ``UpdateItem``: registrations, renewals,
supersessions, commits); the signature fence is on, with a short window and lease.

1. driver A puts batch 0; ``batch_before_complete=stop`` freezes its commit; the test kills
   it (its Python process, its JVM, the frozen commit worker);
2. driver B replays batch 0 (every row found: nothing sent, no wait), then runs batch 1, whose
   two tasks a task failpoint stops at their second request; the test kills the driver, its
   JVM and the two stopped tasks;
3. driver C replays batch 1 (what was put is found, the rest sent), runs batch 2, where the
   first attempt of one task kills its Python worker after its first request (Spark retries
   the task), and batch 3, where the first attempt of one task stops at its second request.
   The test kills both executors (the stopped task's machine is lost, and the shuffle output
   the task reads with it: Spark runs the stage before again, then the task in a new stage
   attempt, whose attempt numbers start at 0 again) and waits for the batch to commit;
4. driver C runs batch 4, where the first attempt of one task stops before it registers
   (``replay_before_register``). The test kills both executors again: the task's retry, a
   higher task attempt id, registers first and puts the partition; a driver failpoint of batch
   4 only freezes its commit, the run OPEN. Then, while nothing else puts, the test resumes the
   task stopped in batch 3 (its lease is superseded, and the fence refuses the request it
   held), then the one of batch 4 (it registers after a higher attempt of its task: outranked,
   it puts nothing), then the driver, which commits batch 4 and ends.

Spark launches a task again only once it has failed or its executor is lost (speculation
never runs a copy on the host of the original, and a local cluster has one host), so the task
stopped in batches 3 and 4 is made to outlive its executor: it leaves the executor's session
before it stops (cluster_job.OnTasks), as a process of a frozen machine would resume whatever
the cluster did meanwhile.

Nothing here waits on the wall clock: each step waits for a state (a process stopped, a file, a
log line, a run COMPLETE) under a deadline that only says how long it may take.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cluster_driver
import pytest
from cluster_driver import DRIVER_TIMEOUT_S, EXIT_TIMEOUT_S, POLL_S
from spark_support import FAST_LEASES, streamcheck, write_event_files

from dedupe_store.records import ReplayRun, RunAttempt
from dedupe_store.states import RunState
from devstack.dynamodb_quota_proxy import DynamoDbQuotaProxy
from devstack.fault_proxy import FaultProxy, FaultRule, FaultSchedule
from devstack.quota_proxy import KinesisQuotaProxy
from producer.wiring import Stack, build_stack
from spark_jobs.writer import producer_settings

pytest.importorskip("pyspark.sql")
pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
    # the module's scenario runs in its first test's setup: three drivers, three clusters
    pytest.mark.timeout(1500),  # beyond the deadlines below, which say what they waited for
]

QUERY = "replay-cluster"
FILES, PER_FILE = 5, 1040  # two partitions of 520 rows: requests of 500 and 20 rows
TASKS = ("0", "1")
WINDOW_S = 2  # the signature window, at the proxy and in the fence
TIMING = {
    **FAST_LEASES,
    "KEO_DEDUPE": "replay",
    "KEO_SIGNATURE_WINDOW_S": str(WINDOW_S),
    # the fence's minimum: window + connect and read timeouts (1 + 1) + 2 x skew (0.5)
    "KEO_LEASE_S": "5",
    # throttled writes are retried by the SDK: enough retries that a run of throttles cannot
    # fail the driver's commit (a task would only be retried)
    "KEO_LEDGER_MAX_RETRY_ATTEMPTS": "8",
}


def kinesis_faults() -> FaultSchedule:
    """The first three PutRecords meet one fault each, then about one in four does."""
    once = [
        FaultRule("PutRecords", fault, probability=1.0, limit=1)
        for fault in ("drop_response", "error_after", "partial")
    ]
    then = [
        FaultRule("PutRecords", "drop_response", probability=0.08),
        FaultRule("PutRecords", "error_after", probability=0.08),
        FaultRule("PutRecords", "partial", probability=0.1, fraction=0.3),
    ]
    return FaultSchedule([*once, *then], seed=23)


# --- what the scenario saw ---------------------------------------------------------------------


@dataclass
class Scenario:
    work_dir: Path
    stack: Stack  # on the emulators, not the proxies: the test's own reads
    kinesis: Any
    kinesis_proxy: FaultProxy
    ledger_proxy: FaultProxy
    rows: list[Counter[tuple[str, bytes]]]  # each batch's rows, as a multiset
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    frozen_commit: list[str] = field(default_factory=list)
    in_stream_at_first_kill: int = -1
    run_at_first_kill: ReplayRun | None = None
    stopped_at_second_kill: list[str] = field(default_factory=list)
    in_stream_at_second_kill: int = -1
    stalled_pid: int = 0
    executors_killed: dict[int, set[int]] = field(default_factory=dict)  # by batch
    stage_run_again: list[str] = field(default_factory=list)  # executors' lines saying so
    resumed_ms: int = 0
    puts_at_resume: int = -1
    puts_after_resume: int = -1
    held_pid: int = 0  # batch 4's first attempt of task 0, held before it registered
    frozen_commit_of_held: str = ""
    run_at_held_resume: ReplayRun | None = None
    found_at_held_resume: int = -1
    held_resumed_ms: int = 0
    puts_at_held_resume: int = -1
    puts_after_held_resume: int = -1
    orphans: list[str] = field(default_factory=list)

    def run(self, batch: int) -> ReplayRun:
        found = self.stack.ledger.get_run(self.stack.settings.stream, f"{QUERY}/{batch}")
        assert found is not None, f"no run item for batch {batch}"
        return found

    def in_stream(self) -> Counter[tuple[str, bytes]]:
        return cluster_driver.in_stream(self.kinesis, self.stack.settings.stream)

    def found_of(self, batch: int) -> int:
        """How many of ``batch``'s rows the stream holds now."""
        return sum((self.in_stream() & self.rows[batch]).values())

    def marks(self, prefix: str) -> list[str]:
        return sorted(p.name for p in (self.work_dir / "marks").glob(f"{prefix}-pid*"))

    def log_lines(self, pid: int | None = None, *, since_ms: int = 0) -> list[str]:
        """The product's INFO lines of every Python process (or of ``pid``) that reached a
        hook, in each process's order; with ``since_ms``, those logged from then on."""
        lines = []
        for path in sorted((self.work_dir / "logs").glob(f"{pid if pid else '*'}.log")):
            logged_ms = 0.0
            for line in path.read_text(encoding="utf-8").splitlines():
                stamp = line.split(" ", 1)[0]
                if stamp.replace(".", "", 1).isdigit():
                    logged_ms = float(stamp) * 1000
                if logged_ms >= since_ms:  # a traceback's lines go with the line above
                    lines.append(line)
        return lines


def _executions(scenario: Scenario, run: ReplayRun) -> list[list[RunAttempt]]:
    """The run's attempts grouped by driver execution, in the order the executions started
    (each task's attempts are on an item of their own: read for both partitions)."""
    stream = scenario.stack.settings.stream
    return [
        sorted(
            (
                attempt
                for task in TASKS
                for attempt in scenario.stack.ledger.task_attempts(
                    stream, run.run, execution.execution_id, task
                )
            ),
            key=lambda a: a.started_at_ms,
        )
        for execution in run.executions
    ]


def _wait_for(what: str, done: Callable[[], bool], driver: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while not done():
        assert driver.poll() is None or done(), f"the driver ended before {what}"
        assert time.monotonic() < deadline, f"waited {DRIVER_TIMEOUT_S} s for {what}"
        time.sleep(POLL_S)


def _stopped_task(scenario: Scenario, prefix: str) -> int | None:
    """The pid of the task that the failpoint ``prefix`` stopped, once it is stopped."""
    for name in scenario.marks(prefix):
        pid = int(name.rsplit("-pid", 1)[1])
        found = cluster_driver.stat(pid)
        if found is not None and found[1] == "T":
            return pid
    return None


def _task_failpoint(batch: int, step: str, action: str, nth: int = 1) -> dict[str, Any]:
    return {
        "batch": batch,
        "partition": 0,
        "attempt": 0,
        "step": step,
        "action": action,
        "nth": nth,
    }


# --- the scenario -----------------------------------------------------------------------------


def _kill_after_the_puts(scenario: Scenario, job: dict[str, Any]) -> None:
    """Driver A: batch 0 put, its commit frozen, the driver killed."""
    logs = scenario.work_dir / "first"
    with cluster_driver.running(job, logs, KEO_FAILPOINTS="batch_before_complete=stop") as driver:
        frozen = cluster_driver.wait_frozen(driver, logs)
        scenario.frozen_commit = frozen.commands(frozen.frozen)
        scenario.in_stream_at_first_kill = scenario.found_of(0)
        scenario.run_at_first_kill = scenario.run(0)
        cluster_driver.kill_driver(driver, frozen)
    scenario.steps["first"] = cluster_driver.steps(logs.with_suffix(".out"))


def _kill_in_the_middle_of_the_puts(scenario: Scenario, job: dict[str, Any]) -> None:
    """Driver B: batch 0 replayed; both tasks of batch 1 stopped at their second request; the
    driver, its JVM and the stopped tasks killed."""
    logs = scenario.work_dir / "second"
    stops = [
        {**_task_failpoint(1, "before_put", "stop", nth=2), "partition": partition}
        for partition in (0, 1)
    ]
    with cluster_driver.running({**job, "run": "second", "task_failpoints": stops}, logs) as driver:
        frozen = cluster_driver.wait_frozen(driver, logs, count=2)
        scenario.stopped_at_second_kill = scenario.marks("stop-b1-p*-a0")
        scenario.in_stream_at_second_kill = scenario.found_of(1)
        cluster_driver.kill_driver(driver, frozen)
    scenario.steps["second"] = cluster_driver.steps(logs.with_suffix(".out"))


def _lose_the_machine_of_a_stopped_task(
    scenario: Scenario, batch: int, driver: subprocess.Popen[bytes]
) -> int:
    """Once the first attempt of task 0 of ``batch`` is stopped (by its failpoint) and task 1
    has put its rows, both executors killed: the stopped task's machine is lost, and the
    shuffle output the task reads with it (Spark runs the stage before again, then the task in
    a new stage attempt). The stopped task's pid."""
    prefix = f"stop-b{batch}-p0-a0"
    _wait_for(
        f"a task of batch {batch} stopped",
        lambda: _stopped_task(scenario, prefix) is not None,
        driver,
    )
    pid = _stopped_task(scenario, prefix)
    assert pid is not None
    # the other task's puts first: then only the stopped task has rows left to put
    other = f"partition written run={QUERY}/{batch} partition=1 "
    _wait_for(
        f"the other task of batch {batch}",
        lambda: any(other in line for line in scenario.log_lines()),
        driver,
    )
    scenario.executors_killed[batch] = cluster_driver.executors(scenario.work_dir)
    cluster_driver.kill(scenario.executors_killed[batch])
    return pid


def _resume(pid: int, scenario: Scenario) -> tuple[int, int, int]:
    """SIGCONT to a stopped task, waited for until it ends: when, and the PutRecords the
    Kinesis proxy had received then and once it ended."""
    resumed_ms = scenario.stack.clock.now_ms()
    puts_at = scenario.kinesis_proxy.received["PutRecords"]
    os.kill(pid, signal.SIGCONT)
    assert cluster_driver.wait_gone({pid}, EXIT_TIMEOUT_S) == set(), "the resumed task lives"
    return resumed_ms, puts_at, scenario.kinesis_proxy.received["PutRecords"]


def _retries_under_a_killed_worker_and_a_stalled_task(
    scenario: Scenario, job: dict[str, Any]
) -> None:
    """Driver C: batch 1 replayed; batch 2 with a Python worker killed after its first request;
    batch 3 with a task stopped at its second request and both executors killed; batch 4 with
    a task stopped before it registered, both executors killed, and the driver's commit of the
    batch frozen. Then, while nothing else puts, batch 3's task resumed (its batch committed),
    batch 4's (its run OPEN: its retry put the partition), and the driver."""
    logs = scenario.work_dir / "third"
    failpoints = [
        _task_failpoint(2, "after_put", "kill"),
        _task_failpoint(3, "before_put", "stop", nth=2),
        _task_failpoint(4, "replay_before_register", "stop"),
    ]
    frozen_commit = {"batch": 4, "step": "batch_before_complete", "action": "stop"}
    third = {
        **job,
        "run": "third",
        "task_failpoints": failpoints,
        "driver_failpoints": [frozen_commit],
    }
    with cluster_driver.running(third, logs) as driver:
        scenario.stalled_pid = _lose_the_machine_of_a_stopped_task(scenario, 3, driver)
        _wait_for(
            "batch 3 committed while its first attempt is stopped",
            lambda: scenario.run(3).state is RunState.COMPLETE,
            driver,
        )
        scenario.held_pid = _lose_the_machine_of_a_stopped_task(scenario, 4, driver)
        # every task of batch 4 reported (the retry of the held one put its rows): the commit
        _wait_for(
            "the driver's commit of batch 4 frozen",
            lambda: _stopped_task(scenario, "stop-b4-driver") is not None,
            driver,
        )
        commit = _stopped_task(scenario, "stop-b4-driver")
        assert commit is not None
        assert commit in cluster_driver.tree(driver.pid), "not the driver's"
        scenario.frozen_commit_of_held = cluster_driver.cmdline(commit)
        scenario.run_at_held_resume = scenario.run(4)
        scenario.found_at_held_resume = scenario.found_of(4)
        resumed = _resume(scenario.stalled_pid, scenario)
        scenario.resumed_ms, scenario.puts_at_resume, scenario.puts_after_resume = resumed
        held = _resume(scenario.held_pid, scenario)
        scenario.held_resumed_ms, scenario.puts_at_held_resume, scenario.puts_after_held_resume = (
            held
        )
        os.kill(commit, signal.SIGCONT)
        assert driver.wait(DRIVER_TIMEOUT_S) == 0, cluster_driver.tail(logs.with_suffix(".err"))
    scenario.steps["third"] = cluster_driver.steps(logs.with_suffix(".out"))
    # Spark's own log of driver C's executors: task 0.0 of a Python (writing) stage in a
    # second attempt of that stage
    (app, *_) = sorted((scenario.work_dir / "spark-home" / "work").glob("app-*"), reverse=True)
    lines = [
        line
        for stderr in app.glob("*/stderr")
        for line in stderr.read_text(encoding="utf-8", errors="replace").splitlines()
    ]
    writing = {
        found.group(1)
        for line in lines
        if (found := re.search(r"Starting Python task execution - task \S+ in stage (\d+)", line))
    }
    scenario.stage_run_again = [
        line
        for line in lines
        if (found := re.search(r"Running task 0\.0 in stage (\d+)\.[1-9]", line))
        and found.group(1) in writing
    ]


@pytest.fixture(scope="module")
def scenario(
    emulators: Any, spark_table: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scenario]:
    work_dir = tmp_path_factory.mktemp("keo-replay-cluster")
    write_event_files(work_dir / "in", files=FILES, per_file=PER_FILE)
    rows = [cluster_driver.rows_of(work_dir / "in" / f"events-{f}.json") for f in range(FILES)]
    direct = cluster_driver.new_stream(emulators, spark_table, "replay-cluster", TIMING)
    with (
        KinesisQuotaProxy(
            emulators.kinesis, schedule=kinesis_faults(), signature_window_s=WINDOW_S
        ) as kinesis,
        DynamoDbQuotaProxy(
            emulators.dynamodb, schedule=cluster_driver.throttled_ledger_writes(seed=23)
        ) as ledger,
    ):
        run = Scenario(
            work_dir=work_dir,
            stack=build_stack(producer_settings(direct)),
            kinesis=streamcheck.kinesis_client(emulators.kinesis),
            kinesis_proxy=kinesis,
            ledger_proxy=ledger,
            rows=rows,
        )
        through_proxies = {
            **direct,
            "KEO_KINESIS_ENDPOINT_URL": kinesis.endpoint,
            "KEO_DYNAMODB_ENDPOINT_URL": ledger.endpoint,
        }
        job = cluster_driver.stream_job(work_dir, through_proxies, QUERY)
        try:
            _kill_after_the_puts(run, job)
            _kill_in_the_middle_of_the_puts(run, job)
            _retries_under_a_killed_worker_and_a_stalled_task(run, job)
            left = cluster_driver.wait_gone(cluster_driver.under(work_dir), EXIT_TIMEOUT_S)
            run.orphans = [f"{pid} {cluster_driver.cmdline(pid)}" for pid in left]
            yield run
        finally:
            # whatever a failed run left, stopped tasks included
            cluster_driver.kill(cluster_driver.under(work_dir))


# --- what it left -----------------------------------------------------------------------------


def _waits(scenario: Scenario, batch: int) -> list[str]:
    return [
        line
        for line in scenario.log_lines()
        if "replay attempt waiting" in line and f" run={QUERY}/{batch} " in line
    ]


def test_a_driver_killed_after_its_puts_replays_its_batch_without_a_wait(
    scenario: Scenario,
) -> None:
    # GIVEN driver A frozen in the commit of batch 0, after its tasks put every row, and killed
    (frozen,) = scenario.frozen_commit
    assert "python_streaming_sink_runner" in frozen
    assert "stream" not in scenario.steps["first"]
    assert scenario.in_stream_at_first_kill == PER_FILE
    at_kill = scenario.run_at_first_kill
    assert at_kill is not None
    assert at_kill.state is RunState.OPEN
    (first,) = _executions(scenario, at_kill)
    assert {a.task for a in first} == set(TASKS)
    # each of A's attempts said it finished as its task did: a replay waits for none of them
    assert [e.finished for e in at_kill.executions] == [True]

    # WHEN driver B replayed batch 0
    run = scenario.run(0)
    _, replayed = _executions(scenario, run)

    # THEN every row was found, none sent again, and the run is COMPLETE
    assert run.state is RunState.COMPLETE
    assert (run.counts["duplicates"], run.counts["sent"]) == (PER_FILE, 0)
    # AND no attempt of the replay waited for a lease: each one's recovery was logged, no wait
    logged = [line for line in scenario.log_lines() if f" run={QUERY}/0 " in line]
    for attempt in replayed:
        mine = [line for line in logged if f"attempt={attempt.attempt_id} " in line]
        assert any("step=RECOVER" in line or "step=WAIT" in line for line in mine), mine
    assert _waits(scenario, 0) == []


def test_a_driver_killed_in_the_middle_of_its_puts_replays_only_what_was_missing(
    scenario: Scenario,
) -> None:
    # GIVEN driver B killed while both tasks of batch 1 were stopped at their second request
    assert [name.rsplit("-pid", 1)[0] for name in scenario.stopped_at_second_kill] == [
        "stop-b1-p0-a0",
        "stop-b1-p1-a0",
    ]
    # ... when part of the batch was in the stream, and part not
    put_before = scenario.in_stream_at_second_kill
    assert 0 < put_before < PER_FILE

    # WHEN driver C replayed batch 1
    run = scenario.run(1)

    # THEN what B's tasks had put was found, only the rest was sent
    assert run.state is RunState.COMPLETE
    assert run.counts["duplicates"] == put_before
    assert run.counts["sent"] == PER_FILE - put_before
    assert len(run.executions) == 2


def test_a_python_worker_killed_mid_task_is_retried_and_the_retry_sends_only_the_rest(
    scenario: Scenario,
) -> None:
    # GIVEN the first attempt of a task of batch 2, whose Python worker killed itself after
    # the task's first request
    assert [name.rsplit("-pid", 1)[0] for name in scenario.marks("kill-b2-p0-a0")] == [
        "kill-b2-p0-a0"
    ]
    run = scenario.run(2)
    (execution,) = _executions(scenario, run)
    killed, *retries = [a for a in execution if a.task == "0"]

    # WHEN Spark retried the task (a later attempt of the same task, same driver execution)
    assert retries
    assert all(retry.task_attempt > killed.task_attempt for retry in retries)

    # THEN the retry superseded the killed attempt, found what it had put and sent the rest
    assert killed.superseded
    assert run.state is RunState.COMPLETE
    assert run.counts["duplicates"] > 0
    assert run.counts["duplicates"] + run.counts["sent"] == PER_FILE


def test_a_task_stopped_past_its_lease_while_its_retry_ran_cannot_put_once_resumed(
    scenario: Scenario,
) -> None:
    # GIVEN the first attempt of a task of batch 3 stopped at its second request, and both
    # executors killed: Spark ran the task again (in a new stage attempt), and committed the
    # batch
    assert len(scenario.executors_killed[3]) == 2
    assert scenario.stage_run_again, "no task 0.0 of a stage run again"
    run = scenario.run(3)
    (execution,) = _executions(scenario, run)
    stalled, *retries = [a for a in execution if a.task == "0"]
    assert retries
    assert all(stalled.started_at_ms < r.started_at_ms < scenario.resumed_ms for r in retries)
    assert run.state is RunState.COMPLETE
    # the retry found the stalled attempt's first request in the stream
    assert run.counts["duplicates"] > 0
    assert run.counts["duplicates"] + run.counts["sent"] == PER_FILE

    # WHEN the stalled attempt was resumed, its lease over and superseded
    assert stalled.superseded
    skew_ms = int(float(TIMING["KEO_CLOCK_SKEW_S"]) * 1000)
    assert stalled.lease_expires_at_ms + skew_ms < scenario.resumed_ms

    # THEN the fence refused the request it held, its lease could not be renewed, and its
    # rows failed: no request of it reached Kinesis
    resumed = scenario.log_lines(scenario.stalled_pid, since_ms=scenario.resumed_ms)
    assert any("put not sent" in line and "code=SignatureFence" in line for line in resumed)
    # (the batch committed while it was stopped: the run is COMPLETE, and it superseded)
    assert any(
        "replay attempt lease lost" in line
        and ("refused=run_not_open" in line or "refused=superseded" in line)
        for line in resumed
    )
    assert any("keys left unresolved" in line for line in resumed)
    assert scenario.puts_after_resume == scenario.puts_at_resume


def test_a_task_held_before_it_registered_is_outranked_by_its_retry_and_puts_nothing(
    scenario: Scenario,
) -> None:
    # GIVEN the first attempt of task 0 of batch 4 held before it registered, and both
    # executors killed: Spark ran the task again, and the retry (a higher task attempt id)
    # registered first, took the fast path and put the partition
    assert len(scenario.executors_killed[4]) == 2
    at_resume = scenario.run_at_held_resume
    assert at_resume is not None
    (execution,) = _executions(scenario, at_resume)
    retry, *later = [a for a in execution if a.task == "0"]
    assert retry.started_at_ms < scenario.held_resumed_ms
    retried = f" run={QUERY}/4 attempt={retry.attempt_id} "
    assert any(retried in line and " step=FAST_PATH " in line for line in scenario.log_lines())
    assert scenario.found_at_held_resume == PER_FILE
    # AND the driver's commit of the batch frozen: the run still OPEN
    assert "python_streaming_sink_runner" in scenario.frozen_commit_of_held
    assert at_resume.state is RunState.OPEN

    # WHEN the held attempt is released, with the run still OPEN
    resumed = scenario.log_lines(scenario.held_pid, since_ms=scenario.held_resumed_ms)

    # THEN it registers after a higher attempt of its task: outranked, it puts nothing
    (registered,) = [line for line in resumed if "replay attempt stream=" in line]
    found = re.search(rf" run={QUERY}/4 .* task=0 task_attempt=(\d+) step=(\w+) ", registered)
    assert found is not None, registered
    assert found.group(2) == "SUPERSEDED", registered
    assert all(int(found.group(1)) < a.task_attempt for a in (retry, *later))
    assert scenario.puts_after_held_resume == scenario.puts_at_held_resume
    # AND the driver committed the batch: its rows are in the stream exactly once
    assert scenario.run(4).state is RunState.COMPLETE
    in_stream = scenario.in_stream()
    assert Counter({row: in_stream[row] for row in scenario.rows[4]}) == scenario.rows[4]


def test_every_row_is_in_the_stream_exactly_once_under_the_faults(scenario: Scenario) -> None:
    # GIVEN the five batches, through lost responses, 500s, throttled records and throttled
    # ledger writes
    injected = scenario.kinesis_proxy.schedule.injected
    for fault in ("drop_response", "error_after", "partial"):
        assert injected[f"PutRecords:{fault}"] > 0, injected
    assert scenario.ledger_proxy.schedule.injected["UpdateItem:throttle"] > 0
    # AND driver C ran the batches left after B's kill, the replayed one first
    assert scenario.steps["third"]["stream"]["batches"] == [1, 2, 3, 4]
    # WHEN the stream is read back with plain boto3
    found = scenario.in_stream()
    # THEN it holds every row of every batch, each once, and nothing else
    expected = sum(scenario.rows, Counter())
    cluster_driver.assert_each_row_once(found, expected)
    for batch in range(FILES):
        assert scenario.run(batch).state is RunState.COMPLETE


def test_no_process_outlives_the_scenario(scenario: Scenario) -> None:
    # GIVEN drivers and executors killed with SIGKILL, and a task left stopped past them
    # THEN every executor, Python worker and the resumed task ended on their own
    assert scenario.orphans == []
