"""The run and task items of replay mode: their keys, their attributes' names, and how
:class:`dedupe_store.records.ReplayRun`, its executions and a task's attempts are written to
them and read back (pure; :mod:`dedupe_store.runs` does the reads and writes).

An execution's fields live on the run item as attributes of their own
(``exec:<execution>:<field>``), so that one update expression can touch one execution; a
task's attempts live on its task item as a map each (``attempt:<attempt>``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dedupe_store import expressions as x
from dedupe_store.expressions import TTL_ATTRIBUTE
from dedupe_store.names import check_stream_name
from dedupe_store.records import ReplayRun, RunAttempt, RunExecution
from dedupe_store.states import RunState

__all__ = [
    "attempt_name",
    "attempt_value",
    "attempts_of",
    "execution_names",
    "executions_of",
    "replay_run_pk",
    "replay_task_pk",
    "run_of",
]


# Built from a stream name that passed the rule (no "/", no "#"): never another kind's key.


def replay_run_pk(stream: str, run: str) -> str:
    """The item of a run (its state, counts and executions)."""
    return f"__keo__/run/{check_stream_name(stream)}/{run}"


def replay_task_pk(stream: str, run: str, execution_id: str, task: str) -> str:
    """The item of one task's attempts in one execution (the run last: it may hold "/")."""
    return f"__keo__/task/{check_stream_name(stream)}/{execution_id}/{task}/{run}"


_ATTEMPT_PREFIX = "attempt:"
_EXECUTION_PREFIX = "exec:"
_EXECUTION_FIELDS = ("started", "lease", "superseded", "attempts", "open", "late")


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
