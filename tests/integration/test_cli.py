"""``keo`` as a user runs it, in a subprocess against the emulators: hostile input, what goes to
stdout and what to stderr, exit codes.

Every ``keo send`` here is checked the same way: stdout is valid UTF-8 JSON lines, one per
non-blank input line in order, and the stream holds every good line exactly once.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import stacks
import streamcheck
from planting import plant_claims

from dedupe_store.clock import SystemClock
from dedupe_store.records import RunAttempt
from dedupe_store.states import RunState
from devstack import emulators as local_stack
from producer.protocol import Message
from producer.settings import ProducerSettings
from producer.wiring import ledger_from

if TYPE_CHECKING:
    from conftest import Names

KEO = str(Path(sys.executable).with_name("keo"))


@pytest.fixture
def settings(emulators: local_stack.Endpoints, names: Names) -> ProducerSettings:
    return stacks.fresh(emulators, names, shards=2)


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
    return json.dumps({"key": f"good-{n}", "data": good_data(n).decode()}).encode()


def good_data(n: int) -> bytes:
    return f"payload {n}".encode()


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


# --- stdout carries results; progress and logs go to stderr -------------------------------------


def keo_on_a_terminal(
    *args: str, env: dict[str, str], stdout: Path, timeout_s: float = 120
) -> tuple[int, str]:
    """Run ``keo`` with stdout redirected to a file and stderr on a pseudo-terminal, as in
    ``keo send ... > out.jsonl`` typed at a terminal. Returns the exit code and the terminal's
    output."""
    master, slave = pty.openpty()
    with stdout.open("wb") as out:
        process = subprocess.Popen(
            [KEO, *args], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=slave
        )
    os.close(slave)
    seen = bytearray()
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every end of the terminal is closed, the process is done
                break
            if not data:
                break
            seen += data
    finally:
        os.close(master)
    return process.wait(timeout=timeout_s), seen.decode("utf-8", "replace")


def test_send_to_a_file_from_a_terminal_writes_every_outcome_to_the_file(
    settings: ProducerSettings, env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN 30 messages, and stderr on a terminal (so the progress display is on)
    source = tmp_path / "input.jsonl"
    source.write_bytes(b"".join(good(n) + b"\n" for n in range(30)))
    out = tmp_path / "out.jsonl"
    # WHEN `keo send ... > out.jsonl` runs
    code, terminal = keo_on_a_terminal(
        "send", "--input", str(source), *where(settings), env=env, stdout=out
    )
    # THEN the progress and the summary went to the terminal, every outcome to the file
    assert code == 0, terminal
    assert "sending" in terminal
    assert "keo send: 30 messages: SENT 30" in terminal
    outcomes = outcomes_of(out.read_bytes())
    assert [(o["index"], o["status"]) for o in outcomes] == [(n, "SENT") for n in range(30)]
    assert '"status"' not in terminal


def test_audit_to_a_file_without_json_writes_the_report_to_the_file(
    settings: ProducerSettings, env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a stream with 3 messages delivered
    source = tmp_path / "input.jsonl"
    source.write_bytes(b"".join(good(n) + b"\n" for n in range(3)))
    sent = keo("send", "--input", str(source), *where(settings), env=env)
    assert sent.returncode == 0, sent.stderr.decode()
    report = tmp_path / "report.txt"
    # WHEN `keo audit > report.txt` runs on a terminal
    code, terminal = keo_on_a_terminal("audit", *where(settings), env=env, stdout=report)
    # THEN the human report is in the file, with its verdict; the progress was on the terminal
    assert code == 0, terminal
    text = report.read_text()
    assert f"keo audit: stream {settings.stream}: 2 shards, 3 records, 3 keys" in text
    assert "verdict: CLEAN" in text
    assert "auditing" in terminal
    assert "verdict" not in terminal


def test_logs_as_json_lines_keep_their_field_names(
    settings: ProducerSettings, env: dict[str, str]
) -> None:
    # GIVEN KEO_LOG_FORMAT=json and -v (the reconciler logs its pass at info level)
    # WHEN `keo reconcile --once --json` runs
    result = keo(
        "-v",
        "reconcile",
        "--once",
        "--json",
        *where(settings),
        env={**env, "KEO_LOG_FORMAT": "json"},
    )
    # THEN stdout is the JSON summary alone, and every line on stderr is a JSON object with
    # the documented fields, its summary too
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert json.loads(result.stdout)["stream"] == settings.stream
    logged = [json.loads(line) for line in stderr.splitlines()]
    for entry in logged:
        assert {"time", "level", "logger", "message"} <= set(entry), entry
        assert entry["level"] in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
    # AND each pass is logged with stable fields: stream, table, counts
    passes = [entry for entry in logged if entry.get("event") == "reconcile_pass"]
    assert {entry["logger"] for entry in passes} == {"producer.reconcile.reconciler", "keo"}, stderr
    for entry in passes:
        assert (entry["stream"], entry["table"]) == (settings.stream, settings.table)
        assert entry["counts"]["scanned"] == 0
    summary = next(entry for entry in passes if entry["logger"] == "keo")
    assert summary["message"].startswith("keo reconcile: stream ")


def test_reconcile_without_json_prints_its_summary_on_stdout(
    settings: ProducerSettings, env: dict[str, str]
) -> None:
    # GIVEN nothing in flight
    # WHEN `keo reconcile --once` runs without --json
    result = keo("reconcile", "--once", *where(settings), env=env)
    # THEN its summary is on stdout
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().startswith(f"keo reconcile: stream {settings.stream}: 0 stale")


def test_reconcile_reports_a_replay_run_left_open_and_leaves_it_open(
    settings: ProducerSettings, env: dict[str, str]
) -> None:
    # GIVEN a replay-mode run whose only attempt started 10 minutes ago under a 1 minute lease,
    # never committed (its driver died), and a run still putting
    ledger = ledger_from(settings)
    ledger.ensure_ready(stamp_new=True)  # as the replay writer found the table: stamped
    now_ms = SystemClock().now_ms()
    for run, started_at_ms in (("query-a/7", now_ms - 600_000), ("query-a/8", now_ms)):
        ledger.register_attempt(
            settings.stream,
            run,
            RunAttempt(
                attempt_id=f"attempt-{run}",
                execution_id="exec-1",
                task="0",
                task_attempt=0,
                started_at_ms=started_at_ms,
                lease_expires_at_ms=started_at_ms + 60_000,
            ),
        )
    # WHEN `keo reconcile --once --json` runs
    result = keo("reconcile", "--once", "--json", *where(settings), env=env)
    # THEN the JSON report names the run left open, and only it; a warning says so on stderr,
    # and the summary counts it; nothing is unresolved (exit 0)
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    report = json.loads(result.stdout)
    assert report["open_runs"] == ["query-a/7"]
    assert report["unresolved"] == 0
    assert f"replay run left open stream={settings.stream} run=query-a/7 attempts=1" in stderr
    assert "WARNING" in stderr
    assert "1 replay runs left open" in stderr
    # AND the run is left OPEN: there is nothing to resend, a replay of it commits it
    left = ledger.get_run(settings.stream, "query-a/7")
    assert left is not None
    assert left.state is RunState.OPEN


def test_audit_of_a_stream_written_in_both_modes_names_the_replay_rows_and_passes(
    settings: ProducerSettings, env: dict[str, str]
) -> None:
    # GIVEN a stream written by keo send in key mode, then by a named replay-mode run
    key_lines = b"".join(good(n) + b"\n" for n in range(1, 4))
    sent = keo("send", *where(settings), "--input", "-", env=env, stdin=key_lines)
    assert sent.returncode == 0, sent.stderr.decode()
    replay_lines = b"".join(
        json.dumps({"key": f"replay-{n}", "data": "r"}).encode() + b"\n" for n in range(3)
    )
    replayed = keo(
        "send",
        *where(settings),
        *("--input", "-", "--dedupe", "replay", "--run-id", "nightly-1"),
        env=env,
        stdin=replay_lines,
    )
    assert replayed.returncode == 0, replayed.stderr.decode()
    # WHEN the key audit reads it
    audited = keo("audit", *where(settings), "--json", env=env)
    summary = keo("audit", *where(settings), env=env)
    # THEN it passes: the replay run's rows are counted as replay mode's and the run named,
    # with how to audit them; no key is unknown to the ledger
    assert audited.returncode == 0, audited.stderr.decode()
    report = json.loads(audited.stdout)
    assert report["replay_rows"] == 3
    assert [run for run in report["replay_runs"] if "nightly-1" in run] == report["replay_runs"]
    assert len(report["replay_runs"]) == 1
    assert report["unknown_keys"] == []
    assert summary.returncode == 0, summary.stderr.decode()
    assert "replay-mode keys:     3" in summary.stdout.decode()
    assert "keo audit --dedupe replay --expected FILE" in summary.stdout.decode()


UNFENCED_WARNING = "signature fence off (KEO_PUT_FENCE=off): a put the network holds"


def test_send_and_reconcile_with_the_fence_off_say_so_once_on_stderr(
    settings: ProducerSettings, env: dict[str, str], kinesis: Any, tmp_path: Path
) -> None:
    # GIVEN four messages sent one per chunk, and KEO_PUT_FENCE=off
    source = tmp_path / "input.jsonl"
    source.write_bytes(b"\n".join(good(n) for n in range(1, 5)) + b"\n")
    unfenced = {**env, "KEO_PUT_FENCE": "off"}
    # WHEN `keo send` and `keo reconcile --once` run
    sent = keo(
        "send",
        "--input",
        str(source),
        "--chunk-size",
        "1",
        "--no-progress",
        *where(settings),
        env=unfenced,
    )
    reconciled = keo("reconcile", "--once", *where(settings), env=unfenced)
    # THEN each says once on stderr (not once per chunk) what fence-off mode cannot bound,
    # with its lease and where that is documented; stdout carries only its results
    for result in (sent, reconciled):
        stderr = result.stderr.decode()
        assert result.returncode == 0, stderr
        assert stderr.count(UNFENCED_WARNING) == 1, stderr
        assert "WARNING" in stderr
        assert "longer than its lease (60 s)" in stderr
        assert "see docs/guarantees.md" in stderr
        assert UNFENCED_WARNING not in result.stdout.decode()
    assert [o["status"] for o in outcomes_of(sent.stdout)] == ["SENT"] * 4
    streamcheck.assert_exactly_once(
        streamcheck.read_stream(kinesis, settings.stream),
        [f"good-{n}" for n in range(1, 5)],
        ledger_from(settings),
    )


def test_send_and_reconcile_with_the_fence_on_say_nothing_of_it(
    settings: ProducerSettings, env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN the signature fence on (the default)
    source = tmp_path / "input.jsonl"
    source.write_bytes(good(1) + b"\n")
    # WHEN `keo send` and `keo reconcile --once` run
    sent = keo("send", "--input", str(source), "--no-progress", *where(settings), env=env)
    reconciled = keo("reconcile", "--once", *where(settings), env=env)
    # THEN neither says anything about fence-off mode
    for result in (sent, reconciled):
        assert result.returncode == 0, result.stderr.decode()
        assert "KEO_PUT_FENCE=off" not in result.stderr.decode()


# --- configuration errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["init"], ["send", "--input", "-", "--no-progress"], ["audit"], ["reconcile", "--once"]],
    ids=lambda command: command[0],
)
def test_missing_credentials_are_one_clear_configuration_error_everywhere(
    command: list[str], tmp_path: Path
) -> None:
    # GIVEN real AWS (no endpoint overrides) and no credentials anywhere; botocore refuses
    # to sign, so no request leaves the machine
    nowhere = str(tmp_path / "absent")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": nowhere,
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": nowhere,
        "AWS_SHARED_CREDENTIALS_FILE": nowhere,
        "AWS_EC2_METADATA_DISABLED": "true",
        **{key: value for key, value in os.environ.items() if key == "PYTHONPATH"},
    }
    # WHEN the command runs
    result = keo(*command, env=env, stdin=good(1) + b"\n")
    # THEN it exits 3 (configuration) with the same line, saying what to do
    assert result.returncode == 3, result.stderr.decode()
    assert result.stderr.decode().startswith(
        "keo: no AWS credentials found: configure them the standard way"
    )
    assert "keo emulators up" in result.stderr.decode()


# --- Ctrl-C and SIGTERM -------------------------------------------------------------------------

CHUNK = 5


def start_send(
    settings: ProducerSettings, env: dict[str, str], failpoints: str = ""
) -> subprocess.Popen[bytes]:
    """``keo send --input -`` in chunks of 5, stdin left open for the test to feed."""
    return subprocess.Popen(
        [
            KEO,
            "send",
            "--input",
            "-",
            *where(settings),
            "--no-progress",
            "--chunk-size",
            str(CHUNK),
        ],
        env={**env, "KEO_FAILPOINTS": failpoints},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def feed(process: subprocess.Popen[bytes], numbers: range) -> None:
    assert process.stdin is not None
    process.stdin.write(b"".join(good(n) + b"\n" for n in numbers))
    process.stdin.flush()


def read_outcomes(process: subprocess.Popen[bytes], count: int) -> list[dict[str, Any]]:
    """The next ``count`` outcome lines, waiting for each."""
    assert process.stdout is not None
    return [json.loads(process.stdout.readline()) for _ in range(count)]


def wait_for_line(process: subprocess.Popen[bytes], text: str) -> None:
    """Read stderr up to the line that contains ``text``."""
    assert process.stderr is not None
    seen = []
    while text not in (line := process.stderr.readline().decode()):
        assert line, f"stderr ended before {text!r}: {''.join(seen)}"
        seen.append(line)


def wait_until_claimed(settings: ProducerSettings, keys: list[str]) -> None:
    ledger = ledger_from(settings)
    while not all(ledger.get(settings.stream, key) is not None for key in keys):
        time.sleep(0.05)


def finish(process: subprocess.Popen[bytes]) -> tuple[int, bytes, str]:
    """Exit code, the rest of stdout, all of the rest of stderr (stdin is never closed: a
    process that reads it again hangs, and the test fails on its timeout)."""
    stdout, stderr = process.communicate(timeout=120)
    return process.returncode, stdout, stderr.decode()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_waiting_for_input_stops_reading_and_exits_130(
    signum: signal.Signals,
    settings: ProducerSettings,
    env: dict[str, str],
    kinesis: Any,
) -> None:
    # GIVEN keo send reading stdin: one chunk sent, and two lines of the next one read
    process = start_send(settings, env)
    feed(process, range(CHUNK + 2))
    assert [o["status"] for o in read_outcomes(process, CHUNK)] == ["SENT"] * CHUNK
    # WHEN it is signalled while it waits for the rest of the chunk
    process.send_signal(signum)
    # THEN it stops reading, prints the summary naming where to resume, and exits 130
    code, stdout, stderr = finish(process)
    assert code == 130, stderr
    assert stdout == b""
    assert "Traceback" not in stderr
    assert (
        f"keo send: interrupted: {CHUNK} messages: SENT {CHUNK}; input after line {CHUNK} "
        f"was not sent (send it again from line {CHUNK + 1})"
    ) in stderr
    assert_stream_holds_exactly(kinesis, settings, [f"good-{n}" for n in range(CHUNK)])


def test_ctrl_c_during_a_chunk_finishes_it_prints_its_outcomes_and_exits_130(
    settings: ProducerSettings, env: dict[str, str], kinesis: Any
) -> None:
    # GIVEN keo send pausing before each put (until SIGCONT), with a second chunk claimed and
    # not yet put
    process = start_send(settings, env, failpoints="before_put=pause")
    feed(process, range(CHUNK))
    wait_for_line(process, "failpoint hit")
    process.send_signal(signal.SIGCONT)
    read_outcomes(process, CHUNK)
    feed(process, range(CHUNK, 2 * CHUNK))
    wait_until_claimed(settings, [f"good-{n}" for n in range(CHUNK, 2 * CHUNK)])
    wait_for_line(process, "failpoint hit")
    # WHEN Ctrl-C comes (and its put goes on once it is acknowledged)
    process.send_signal(signal.SIGINT)
    wait_for_line(process, "SIGINT: stopped reading input")
    process.send_signal(signal.SIGCONT)
    # THEN the chunk is finished and its outcomes printed; nothing more is read; exit 130
    code, stdout, stderr = finish(process)
    assert code == 130, stderr
    outcomes = outcomes_of(stdout)
    assert [(o["index"], o["status"]) for o in outcomes] == [
        (n, "SENT") for n in range(CHUNK, 2 * CHUNK)
    ]
    assert f"interrupted: {2 * CHUNK} messages: SENT {2 * CHUNK}" in stderr
    assert_stream_holds_exactly(kinesis, settings, [f"good-{n}" for n in range(2 * CHUNK)])


def test_a_second_ctrl_c_exits_at_once_leaving_the_claims_to_the_reconciler(
    settings: ProducerSettings, env: dict[str, str]
) -> None:
    # GIVEN keo send holding a claimed chunk for a long time before its put
    process = start_send(settings, env, failpoints="before_put=sleep:600")
    feed(process, range(CHUNK))
    keys = [f"good-{n}" for n in range(CHUNK)]
    wait_until_claimed(settings, keys)
    # WHEN Ctrl-C comes, is acknowledged, and comes again
    process.send_signal(signal.SIGINT)
    wait_for_line(process, "(again to exit at once)")
    process.send_signal(signal.SIGINT)
    # THEN it exits 130 at once, saying the claims are left for 'keo reconcile'
    code, stdout, stderr = finish(process)
    assert code == 130, stderr
    assert stdout == b""
    assert "SIGINT again: exiting now; claims of the chunk in flight are left" in stderr
    ledger = ledger_from(settings)
    assert all(ledger.get(settings.stream, key) is not None for key in keys)


def test_ctrl_c_before_the_put_releases_the_claims_not_sent(
    settings: ProducerSettings, env: dict[str, str], kinesis: Any
) -> None:
    # GIVEN keo send pausing after it claimed a chunk, before anything is put
    process = start_send(settings, env, failpoints="after_claim=pause")
    feed(process, range(CHUNK))
    keys = [f"good-{n}" for n in range(CHUNK)]
    wait_until_claimed(settings, keys)
    wait_for_line(process, "failpoint hit")
    # WHEN Ctrl-C comes while it claims (its sending thread goes on once it is acknowledged)
    process.send_signal(signal.SIGINT)
    wait_for_line(process, "SIGINT: stopped reading input")
    process.send_signal(signal.SIGCONT)
    # THEN nothing is put: every claim is released and reported FAILED, to be sent again
    code, stdout, stderr = finish(process)
    assert code == 130, stderr
    outcomes = outcomes_of(stdout)
    assert [o["status"] for o in outcomes] == ["FAILED"] * CHUNK, outcomes
    assert all("interrupted before it was sent" in o["reason"] for o in outcomes)
    ledger = ledger_from(settings)
    released = ledger.batch_get(settings.stream, keys)
    assert {r.state.value for r in released.values()} == {"RELEASED"}, released
    assert_stream_holds_exactly(kinesis, settings, [])
    # AND sending them again delivers them, once
    again = subprocess.run(
        [KEO, "send", "--input", "-", *where(settings), "--no-progress"],
        input=b"".join(good(n) + b"\n" for n in range(CHUNK)),
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert [o["status"] for o in outcomes_of(again.stdout)] == ["SENT"] * CHUNK, again.stderr
    assert_stream_holds_exactly(kinesis, settings, keys)


def test_ctrl_c_while_waiting_on_another_producers_claim_stops_waiting(
    settings: ProducerSettings, env: dict[str, str], kinesis: Any
) -> None:
    # GIVEN the keys claimed by another producer whose lease runs for ten minutes
    keys = [f"good-{n}" for n in range(CHUNK)]
    messages = [Message(key, good_data(n)) for n, key in enumerate(keys)]
    ledger = ledger_from(settings)
    ledger.ensure_ready(stamp_new=True)  # as the other producer found the table: stamped
    plant_claims(
        ledger,
        settings.stream,
        messages,
        owner="another-producer",
        now_ms=SystemClock().now_ms(),
        lease_ms=600_000,
    )
    # WHEN keo send is given those keys, says it waits, and Ctrl-C comes
    process = start_send(settings, env)
    feed(process, range(CHUNK))
    wait_for_line(process, "waiting on claims held by other producers")
    process.send_signal(signal.SIGINT)
    # THEN it stops waiting at once (not after the lease): those keys are IN_FLIGHT, exit 130
    code, stdout, stderr = finish(process)
    assert code == 130, stderr
    outcomes = outcomes_of(stdout)
    assert [o["status"] for o in outcomes] == ["IN_FLIGHT"] * CHUNK, outcomes
    assert all("interrupted while waiting" in o["reason"] for o in outcomes)
    assert_stream_holds_exactly(kinesis, settings, [])


# --- keo init -------------------------------------------------------------------------------------


def test_init_creates_an_on_demand_stream_with_retention_and_kms_and_says_so_once_again(
    kinesis_local_endpoint: str, env: dict[str, str], names: Names
) -> None:
    # GIVEN kinesis-local (kinesalite has no on-demand streams) and dynalite
    local = {**env, "KEO_KINESIS_ENDPOINT_URL": kinesis_local_endpoint}
    stream, table = ["--stream", names.stream], ["--table", names.table]
    asked = ["--on-demand", "--retention-hours", "48", "--kms-key", "alias/aws/kinesis"]
    # WHEN keo init asks for an on-demand stream kept 48 h and encrypted with KMS
    first = keo("init", *stream, *table, *asked, env=local)
    # THEN the stream is created as asked, and the table with it
    assert first.returncode == 0, first.stderr.decode()
    summary = streamcheck.kinesis_client(kinesis_local_endpoint).describe_stream_summary(
        StreamName=names.stream
    )["StreamDescriptionSummary"]
    assert summary["StreamModeDetails"]["StreamMode"] == "ON_DEMAND"
    assert summary["RetentionPeriodHours"] == 48
    assert (summary["EncryptionType"], summary["KeyId"]) == ("KMS", "alias/aws/kinesis")
    assert first.stdout.decode().startswith(
        f"stream {names.stream}: created, ACTIVE, on demand, retention 48 h, "
        "KMS alias/aws/kinesis\n"
    )
    # WHEN it runs again asking for something else
    again = keo("init", *stream, *table, "--shards", "2", "--retention-hours", "24", env=local)
    # THEN the stream is left as it is, each difference said on stderr, and it succeeds
    assert again.returncode == 0, again.stderr.decode()
    stderr = again.stderr.decode()
    assert "it is on demand, not provisioned" in stderr
    assert "its retention is 48 h, not 24 h" in stderr
    assert f"stream {names.stream}: exists, ACTIVE" in again.stdout.decode()


def test_init_on_demand_on_kinesalite_is_a_clear_configuration_error(
    env: dict[str, str], names: Names
) -> None:
    result = keo("init", "--stream", names.stream, "--table", names.table, "--on-demand", env=env)
    stderr = result.stderr.decode()
    assert result.returncode == 3, stderr
    assert "Kinesis refused the stream as asked" in stderr
    assert "kinesalite has no on-demand streams" in stderr
    assert "Traceback" not in stderr


def test_init_takes_shards_or_on_demand_not_both(env: dict[str, str], names: Names) -> None:
    result = keo("init", "--stream", names.stream, "--shards", "2", "--on-demand", env=env)
    assert result.returncode == 2
    assert result.stderr.decode() == "keo init: give --shards or --on-demand, not both\n"
