"""``keo send --dedupe replay --run-id R`` on the emulators: a run killed (-9), interrupted
(Ctrl-C) and re-run ends with every input line in the stream exactly once, as a multiset of
``(key, data)``, read back independently (``streamcheck``, plain boto3).

The kills happen at moments drawn from a seeded random generator, measured in outcome lines
the process has printed (its progress, not the wall clock): each lands while a later chunk is
being put. A killed process leaves its lease running: the next run finds what it put, and
waits (one short lease) only for the lines it did not find.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import stacks
import streamcheck

from dedupe_store.states import RunState
from devstack import emulators as local_stack
from producer.protocol import Message
from producer.wiring import ledger_from

if TYPE_CHECKING:
    from conftest import Names

KEO = str(Path(sys.executable).with_name("keo"))
FAST_ENV = {**stacks.FAST_ENV, "KEO_DEDUPE": "replay"}
RUN = "nightly-2026-11-24"


@pytest.fixture
def cli_env(env: dict[str, str], names: Names, emulators: local_stack.Endpoints) -> dict[str, str]:
    settings = stacks.settings_for(emulators, names, stacks.FAST)
    stacks.create_stream_and_table(settings, 2)
    return {**env, **FAST_ENV, "KEO_STREAM": names.stream, "KEO_TABLE": names.table}


@pytest.fixture
def kinesis(emulators: local_stack.Endpoints) -> Any:
    return streamcheck.kinesis_client(emulators.kinesis)


def lines(count: int) -> list[Message]:
    """``count`` rows, with two copies of some (two records each) and a key reused with other
    data (a row of its own): identity is the row, counted."""
    rows = [Message(f"order-{i}", f"payload {i}".encode()) for i in range(count - 6)]
    rows += rows[:3]  # the same rows again: each is two records
    rows += [Message(f"order-{i}", f"amended {i}".encode()) for i in range(3)]
    return rows


def write_jsonl(path: Path, rows: list[Message]) -> Path:
    path.write_text(
        "".join(json.dumps({"key": m.key, "data": m.data.decode()}) + "\n" for m in rows),
        encoding="utf-8",
    )
    return path


def in_stream(kinesis: Any, stream: str) -> Counter[tuple[str, bytes]]:
    contents = streamcheck.read_stream(kinesis, stream)
    return Counter((r.partition_key, r.data) for r in contents.records)


def keo_send(
    source: Path, env: dict[str, str], *extra: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SEND, "--input", str(source), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


SEND = [KEO, "send", "--no-progress", "--chunk-size", "40"]


def send_until(
    source: Path, env: dict[str, str], after_lines: int, sig: signal.Signals
) -> tuple[int, list[dict[str, Any]]]:
    """Start ``keo send --run-id RUN``, send it ``sig`` once it has printed ``after_lines``
    outcomes (or when it ends first); its exit code and the outcomes it printed."""
    process = subprocess.Popen(
        [*SEND, "--input", str(source), "--run-id", RUN],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    printed: list[dict[str, Any]] = []
    for line in process.stdout:
        printed.append(json.loads(line))
        if len(printed) >= after_lines:
            process.send_signal(sig)
            break
    printed.extend(json.loads(line) for line in process.stdout)
    return process.wait(timeout=120), printed


def test_replay_without_a_run_id_is_a_usage_error(cli_env: dict[str, str], tmp_path: Path) -> None:
    """GIVEN replay mode WHEN keo send has no --run-id THEN it exits 2 and says what to add,
    having sent nothing."""
    source = write_jsonl(tmp_path / "rows.jsonl", lines(10))
    result = keo_send(source, cli_env)
    assert result.returncode == 2
    assert "--run-id" in result.stderr
    assert result.stdout == ""


def test_a_run_killed_three_times_and_interrupted_then_re_run_delivers_every_line_once(
    cli_env: dict[str, str], names: Names, kinesis: Any, tmp_path: Path
) -> None:
    """GIVEN 400 lines sent as run R WHEN the send is killed -9 three times at random moments
    (the first right after its first PutRecords), then interrupted with Ctrl-C, then re-run with
    the lines in another order THEN the last run exits 0 with the run COMPLETE, and the stream
    holds every line exactly once (identical lines twice, as the input has them twice)."""
    rows = lines(400)
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    draw = random.Random(23)

    killed = keo_send(source, {**cli_env, "KEO_FAILPOINTS": "after_put=kill"}, "--run-id", RUN)
    assert killed.returncode == -9, killed.stderr[-3000:]
    for _ in range(2):
        code, _ = send_until(source, cli_env, draw.randrange(40, 360), signal.SIGKILL)
        assert code in {-9, 0}
    code, _ = send_until(source, cli_env, draw.randrange(40, 360), signal.SIGINT)
    assert code in {130, 0}
    assert in_stream(kinesis, names.stream) <= Counter((m.key, m.data) for m in rows)

    shuffled = rows[:]
    draw.shuffle(shuffled)
    final = keo_send(write_jsonl(tmp_path / "shuffled.jsonl", shuffled), cli_env, "--run-id", RUN)

    assert final.returncode == 0, final.stderr[-3000:]
    outcomes = Counter(json.loads(line)["status"] for line in final.stdout.splitlines())
    assert set(outcomes) <= {"SENT", "DUPLICATE"}
    assert sum(outcomes.values()) == len(rows)
    assert f"run '{RUN}' COMPLETE" in final.stderr
    assert in_stream(kinesis, names.stream) == Counter((m.key, m.data) for m in rows)


def test_a_complete_run_re_run_sends_nothing_and_a_new_run_sends_everything(
    cli_env: dict[str, str], names: Names, kinesis: Any, tmp_path: Path, emulators: Any
) -> None:
    """GIVEN run R delivered and COMPLETE WHEN it is re-run THEN every line is DUPLICATE and
    nothing is written; WHEN the same lines are sent as run R2 THEN they are written again
    (replay mode does not compare keys across runs: docs/guarantees.md)."""
    rows = lines(30)
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    first = keo_send(source, cli_env, "--run-id", RUN)
    assert first.returncode == 0, first.stderr[-3000:]

    again = keo_send(source, cli_env, "--run-id", RUN)
    assert again.returncode == 0
    assert {json.loads(line)["status"] for line in again.stdout.splitlines()} == {"DUPLICATE"}
    assert in_stream(kinesis, names.stream) == Counter((m.key, m.data) for m in rows)

    other = keo_send(source, cli_env, "--run-id", f"{RUN}-again")
    assert other.returncode == 0
    assert in_stream(kinesis, names.stream) == Counter((m.key, m.data) for m in rows * 2)
    ledger = ledger_from(stacks.settings_for(emulators, names, stacks.FAST))
    run = ledger.get_run(names.stream, RUN)
    assert run is not None
    assert run.state is RunState.COMPLETE
    assert run.attempts == 1  # a COMPLETE run registers no attempt: nothing to put
