"""The run, stripe and task items of replay mode: their keys, their attributes' names, and how
:class:`dedupe_store.records.ReplayRun`, its executions and a task's attempts are written to
them and read back (pure; :mod:`dedupe_store.runs` and :mod:`dedupe_store.run_stripes` do the
reads and writes).

An execution's fields live on the run item as attributes of their own
(``exec:<execution>:<field>``), so that one update expression can touch one execution; a
task's attempts live on its task item as a map each (``attempt:<attempt>``). An execution's
tasks past the first :data:`TASKS_PER_STRIPE` count their attempts on stripe items
(:func:`stripe_of`), which the run item lists (``exec:<execution>:stripes``) and readers add
to the execution's counts (:func:`with_stripes`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from dedupe_store import expressions as x
from dedupe_store.expressions import TTL_ATTRIBUTE
from dedupe_store.names import check_stream_name
from dedupe_store.records import RenewalRefused, ReplayRun, RunAttempt, RunExecution
from dedupe_store.states import RunState

__all__ = [
    "TASKS_PER_STRIPE",
    "announced_stripes",
    "attempt_name",
    "attempt_value",
    "attempts_of",
    "execution_names",
    "execution_standing",
    "executions_of",
    "replay_run_pk",
    "replay_stripe_pk",
    "replay_task_pk",
    "run_of",
    "stripe_of",
    "stripe_set",
    "with_stripes",
]


# Built from a stream name that passed the rule (no "/", no "#"): never another kind's key.


def replay_run_pk(stream: str, run: str) -> str:
    """The item of a run (its state, counts and executions)."""
    return f"__keo__/run/{check_stream_name(stream)}/{run}"


def replay_task_pk(stream: str, run: str, execution_id: str, task: str) -> str:
    """The item of one task's attempts in one execution (the run last: it may hold "/")."""
    return f"__keo__/task/{check_stream_name(stream)}/{execution_id}/{task}/{run}"


def replay_stripe_pk(stream: str, run: str, execution_id: str, stripe: int) -> str:
    """The item of stripe ``stripe`` (> 0) of an execution: its attempts' counts. Not
    "__keo__/run/...": a scan of a stream's runs never reads one as a run."""
    return f"__keo__/runpart/{check_stream_name(stream)}/{execution_id}/{stripe}/{run}"


# DynamoDB takes about 1,000 write units a second on one partition key (AWS's per-partition
# limit: "1,000 WCUs per partition"). A task attempt writes its stripe's item about twice
# (registers, finishes), so 256 tasks registering in the same second stay under it, each
# stripe on its own key. Stripe 0 is the run item itself: a run of up to 256 tasks a batch
# costs what it did before stripes, with no item more.
TASKS_PER_STRIPE: Final = 256


def stripe_of(task: str) -> int:
    """The stripe a task counts its attempts on: a Spark task (its partition index, a decimal
    number) ``task // TASKS_PER_STRIPE``; any other task ("cli", "api") stripe 0."""
    if task.isascii() and task.isdecimal():
        return int(task) // TASKS_PER_STRIPE
    return 0


def stripe_set(stripe: int) -> dict[str, list[str]]:
    """``stripe`` as the number set the run item ADDs it to."""
    return {"NS": [str(stripe)]}


_ATTEMPT_PREFIX = "attempt:"
_EXECUTION_PREFIX = "exec:"
_EXECUTION_FIELDS = ("started", "lease", "superseded", "attempts", "open", "late", "stripes")


def attempt_name(attempt_id: str) -> str:
    """The name of an attempt's map on its task item."""
    return f"{_ATTEMPT_PREFIX}{attempt_id}"


def execution_names(execution_id: str) -> dict[str, str]:
    """The placeholders of an execution's attributes on the run item: ``#xstarted`` and so on."""
    return {f"#x{f}": f"{_EXECUTION_PREFIX}{execution_id}:{f}" for f in _EXECUTION_FIELDS}


def attempt_value(attempt: RunAttempt) -> dict[str, Any]:
    """An attempt as the map its task item holds."""
    return {
        "M": {
            "execution_id": x.s(attempt.execution_id),
            "task": x.s(attempt.task),
            "task_attempt": x.n(attempt.task_attempt),
            "started_at_ms": x.n(attempt.started_at_ms),
            "lease_expires_at_ms": x.n(attempt.lease_expires_at_ms),
            "superseded": {"BOOL": attempt.superseded},
        }
    }


def attempts_of(item: Mapping[str, Any]) -> tuple[RunAttempt, ...]:
    """The attempts of a task item, the lowest task attempt first."""
    attempts = []
    for name, value in item.items():
        if not name.startswith(_ATTEMPT_PREFIX):
            continue
        fields = value["M"]
        attempts.append(
            RunAttempt(
                attempt_id=name.removeprefix(_ATTEMPT_PREFIX),
                execution_id=fields["execution_id"]["S"],
                task=fields["task"]["S"],
                task_attempt=int(fields["task_attempt"]["N"]),
                started_at_ms=int(fields["started_at_ms"]["N"]),
                lease_expires_at_ms=int(fields["lease_expires_at_ms"]["N"]),
                superseded=bool(fields["superseded"]["BOOL"]),
            )
        )
    return tuple(sorted(attempts, key=lambda a: (a.task_attempt, a.started_at_ms, a.attempt_id)))


def executions_of(item: Mapping[str, Any]) -> tuple[RunExecution, ...]:
    """The executions of a run item, the first started first."""
    fields: dict[str, dict[str, Any]] = {}
    for name, value in item.items():
        if name.startswith(_EXECUTION_PREFIX):
            execution_id, _, field_name = name.removeprefix(_EXECUTION_PREFIX).rpartition(":")
            fields.setdefault(execution_id, {})[field_name] = value
    executions = [
        RunExecution(
            execution_id=execution_id,
            started_at_ms=int(f["started"]["N"]),
            lease_expires_at_ms=int(f["lease"]["N"]),
            superseded=bool(f.get("superseded", {}).get("BOOL", False)),
            attempts=int(f["attempts"]["N"]),
            open_tags=int(f["open"]["N"]),
            late_rows=frozenset(f.get("late", {}).get("SS", ())),
        )
        for execution_id, f in fields.items()
    ]
    return tuple(sorted(executions, key=lambda e: (e.started_at_ms, e.execution_id)))


def announced_stripes(item: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The stripes (> 0) each execution of a run item announced; none on an item written
    before stripes, or by a run of up to :data:`TASKS_PER_STRIPE` tasks."""
    announced: dict[str, tuple[int, ...]] = {}
    for name, value in item.items():
        if name.startswith(_EXECUTION_PREFIX) and name.endswith(":stripes"):
            execution_id = name.removeprefix(_EXECUTION_PREFIX).removesuffix(":stripes")
            announced[execution_id] = tuple(sorted(int(k) for k in value["NS"]))
    return announced


def with_stripes(run: ReplayRun, stripes: Mapping[str, Iterable[Mapping[str, Any]]]) -> ReplayRun:
    """``run`` with each execution's stripe items (``stripes``: by execution) added to its
    counts: attempts and open tags summed, late rows joined. A stripe item a seal created
    before any attempt wrote it counts nothing."""
    executions = []
    for execution in run.executions:
        attempts, open_tags, late = execution.attempts, execution.open_tags, execution.late_rows
        for item in stripes.get(execution.execution_id, ()):
            attempts += int(item.get(x.NAMES["#sattempts"], {}).get("N", 0))
            open_tags += int(item.get(x.NAMES["#sopen"], {}).get("N", 0))
            late = late | frozenset(item.get(x.NAMES["#slate"], {}).get("SS", ()))
        executions.append(
            dataclasses.replace(execution, attempts=attempts, open_tags=open_tags, late_rows=late)
        )
    return dataclasses.replace(run, executions=tuple(executions))


def run_of(stream: str, run: str, item: Mapping[str, Any]) -> ReplayRun:
    """The run a run item holds."""
    completed = item.get("completed_at_ms", {}).get("N")
    counts = item.get("counts", {}).get("S")
    return ReplayRun(
        stream=stream,
        run=run,
        state=RunState(item["state"]["S"]),
        executions=executions_of(item),
        completed_at_ms=int(completed) if completed is not None else None,
        counts={k: int(v) for k, v in json.loads(counts).items()} if counts else {},
        expires_at_s=int(expires) if (expires := item.get(TTL_ATTRIBUTE, {}).get("N")) else None,
    )


def execution_standing(
    stream: str, run: str, item: Mapping[str, Any] | None, execution_id: str
) -> int | RenewalRefused:
    """The lease of ``execution_id`` on the run item ``item``, or why it can no longer grow:
    the run is not OPEN (or gone), or the execution superseded."""
    current = None if item is None else run_of(stream, run, item)
    execution = None if current is None else current.execution(execution_id)
    if current is None or execution is None or current.state is not RunState.OPEN:
        return RenewalRefused.RUN_NOT_OPEN
    if execution.superseded:
        return RenewalRefused.EXECUTION_SUPERSEDED
    return execution.lease_expires_at_ms
