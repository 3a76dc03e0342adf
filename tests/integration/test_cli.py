"""``keo`` as a user runs it, in a subprocess against the emulators: hostile input, what goes to
stdout and what to stderr, exit codes.

Every ``keo send`` here is checked the same way: stdout is valid UTF-8 JSON lines, one per
non-blank input line in order, and the stream holds every good line exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import stacks
import streamcheck

from devstack import emulators as local_stack
from producer.settings import ProducerSettings
from producer.wiring import ledger_from

if TYPE_CHECKING:
    from conftest import Names

KEO = str(Path(sys.executable).with_name("keo"))


@pytest.fixture
def settings(emulators: local_stack.Endpoints, names: Names) -> ProducerSettings:
    created = stacks.settings_for(emulators, names, {})
    stacks.create_stream_and_table(created, shards=2)
    return created


@pytest.fixture
def kinesis(emulators: local_stack.Endpoints) -> Any:
    return streamcheck.kinesis_client(emulators.kinesis)


def keo(
    *args: str, env: dict[str, str], stdin: bytes | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [KEO, *args], env=env, input=stdin, capture_output=True, check=False, timeout=timeout_s
    )


def where(settings: ProducerSettings) -> list[str]:
    return ["--stream", settings.stream, "--table", settings.table]


def outcomes_of(stdout: bytes) -> list[dict[str, Any]]:
    """stdout as JSON lines; fails unless every line is UTF-8 and JSON."""
    return [json.loads(line) for line in stdout.decode("utf-8").splitlines()]


def good(n: int) -> bytes:
    return json.dumps({"key": f"good-{n}", "data": f"payload {n}"}).encode()


# line number (from 1) -> (the line, what its REJECTED reason says after "line N: ", its key)
BAD_LINES: dict[int, tuple[bytes, str, str | None]] = {
    2: (b'{"key": "caf\xe9", "data": "x"}', "line is not valid UTF-8", None),
    4: (b"[" * 100_000, "line is nested too deeply", None),
    6: (b'{"key": "b\\ud800", "data": "x"}', "key contains an unpaired surrogate", "b\ud800"),
    7: (b"not json at all", "line is not JSON", None),
    9: (b'{"key": "no-data"}', "'data' is missing", "no-data"),
}
BLANK_LINES = (3, 10)
GOOD_LINES = (1, 5, 8, 11)


def hostile_input() -> bytes:
    lines = []
    for number in range(1, 12):
        if number in BAD_LINES:
            lines.append(BAD_LINES[number][0])
        elif number in BLANK_LINES:
            lines.append(b"  \r")
        else:
            lines.append(good(number))
    return b"\n".join(lines) + b"\n"


@pytest.mark.parametrize("via", ["file", "stdin"])
def test_bad_lines_are_rejected_by_number_and_every_good_line_is_delivered(
    via: str,
    settings: ProducerSettings,
    env: dict[str, str],
    kinesis: Any,
    tmp_path: Path,
) -> None:
    # GIVEN input with bad lines between good ones: not UTF-8, 100,000 '[', a key with a
    # lone surrogate, not JSON, no data; and blank lines
    data = hostile_input()
    source = tmp_path / "input.jsonl"
    source.write_bytes(data)
    # WHEN `keo send` reads it from a file, or from stdin
    result = keo(
        "send",
        "--input",
        str(source) if via == "file" else "-",
        *where(settings),
        "--no-progress",
        env=env,
        stdin=data if via == "stdin" else None,
    )
    # THEN it exits 1 (something was rejected) without a traceback
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert "REJECTED 5" in stderr
    assert "SENT 4" in stderr
    # and stdout has one JSON outcome per non-blank line, in order
    outcomes = outcomes_of(result.stdout)
    assert [o["index"] + 1 for o in outcomes] == sorted([*BAD_LINES, *GOOD_LINES])
    by_line = {o["index"] + 1: o for o in outcomes}
    # and every bad line is REJECTED naming its line, with its key where it could be read
    for number, (_, reason, key) in BAD_LINES.items():
        outcome = by_line[number]
        assert outcome["status"] == "REJECTED", outcome
        assert outcome["reason"].startswith(f"line {number}: {reason}"), outcome
        assert outcome["key"] == key, outcome
    # and every good line was SENT, and is in the stream exactly once
    for number in GOOD_LINES:
        assert by_line[number]["status"] == "SENT", by_line[number]
    assert_stream_holds_exactly(kinesis, settings, [f"good-{n}" for n in GOOD_LINES])


def test_blank_lines_change_nothing(
    settings: ProducerSettings, env: dict[str, str], kinesis: Any, tmp_path: Path
) -> None:
    # GIVEN good lines with blank ones around them, and no newline at the end
    source = tmp_path / "input.jsonl"
    source.write_bytes(b"\n" + good(1) + b"\n\n\t\n" + good(2))
    # WHEN sent
    result = keo("send", "--input", str(source), *where(settings), "--no-progress", env=env)
    # THEN it exits 0 with one outcome per message
    assert result.returncode == 0, result.stderr.decode()
    outcomes = outcomes_of(result.stdout)
    assert [(o["index"], o["status"]) for o in outcomes] == [(1, "SENT"), (4, "SENT")]
    assert_stream_holds_exactly(kinesis, settings, ["good-1", "good-2"])


def test_audit_skips_an_expected_line_that_is_not_utf8_with_a_warning(
    settings: ProducerSettings, env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN two keys delivered, and an --expected file of JSON lines with a Latin-1 line
    source = tmp_path / "input.jsonl"
    source.write_bytes(good(1) + b"\n" + good(2) + b"\n")
    sent = keo("send", "--input", str(source), *where(settings), "--no-progress", env=env)
    assert sent.returncode == 0, sent.stderr.decode()
    expected = tmp_path / "expected.jsonl"
    expected.write_bytes(good(1) + b'\n{"key": "caf\xe9", "data": "x"}\n' + good(2) + b"\n")
    # WHEN audited against it
    result = keo("audit", *where(settings), "--expected", str(expected), "--json", env=env)
    # THEN the line is skipped with a warning naming it, and the rest is audited: clean
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert f"--expected {expected} line 2 skipped: line is not valid UTF-8" in stderr
    assert json.loads(result.stdout)["expected"] == 2


def assert_stream_holds_exactly(
    kinesis: Any, settings: ProducerSettings, keys: Sequence[str]
) -> None:
    contents = streamcheck.read_stream(kinesis, settings.stream)
    streamcheck.assert_exactly_once(contents, keys, ledger_from(settings))
    streamcheck.assert_only(contents, keys)
