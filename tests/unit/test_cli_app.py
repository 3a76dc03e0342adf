"""``keo`` itself, without a backend: logging settings, help, version, exit codes."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest
import typer
import typer.main
from pydantic import ValidationError
from typer.testing import CliRunner

from api.errors import ApiConfigError
from cli.app import COMMANDS, app
from cli.exit_codes import ExitCode
from cli.logs import (
    JsonFormatter,
    LogFormat,
    LogSettingError,
    configure,
    log_format,
    log_level,
    report,
)
from cli.options import explain
from dedupe_store.errors import (
    ConfigurationError,
    InvalidStreamNameError,
    InvalidTransitionError,
    LedgerSchemaError,
    LedgerThrottledError,
    LedgerUnavailableError,
)
from dedupe_store.packing import PackingError
from producer.errors import (
    AuditTooLargeError,
    StreamNotFoundError,
    StreamUnavailableError,
    UnresolvedKeysError,
)
from producer.settings import ProducerSettings
from spark_jobs.errors import OptionsError

runner = CliRunner()


# --- logging settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verbose", "env", "level"),
    [(0, None, "WARNING"), (0, "error", "ERROR"), (1, "ERROR", "INFO"), (2, "bogus", "DEBUG")],
)
def test_v_wins_over_the_environment_which_wins_over_warning(
    verbose: int, env: str | None, level: str
) -> None:
    assert log_level(verbose, env) == level


def test_an_unknown_level_names_the_setting() -> None:
    with pytest.raises(LogSettingError, match="'bogus' is not one of DEBUG") as caught:
        log_level(0, "bogus")
    assert caught.value.setting == "KEO_LOG_LEVEL"


def test_the_log_format_flag_wins_over_the_environment() -> None:
    assert log_format(None, None) is LogFormat.TEXT
    assert log_format(None, "JSON") is LogFormat.JSON
    assert log_format(LogFormat.TEXT, "json") is LogFormat.TEXT
    with pytest.raises(LogSettingError) as caught:
        log_format(None, "xml")
    assert caught.value.setting == "KEO_LOG_FORMAT"


@pytest.mark.parametrize("setting", ["KEO_LOG_LEVEL", "KEO_LOG_FORMAT"])
def test_a_bad_logging_setting_exits_3_naming_it_without_a_traceback(setting: str) -> None:
    # GIVEN a logging setting keo does not know
    # WHEN any command runs
    result = runner.invoke(app, ["send", "--input", "-"], env={setting: "bogus"})
    # THEN it exits 3 (configuration) with one line naming the setting
    assert result.exit_code == 3, result.output
    assert result.stderr == f"keo: invalid setting {setting}: 'bogus' is not one of " + (
        "DEBUG, INFO, WARNING, ERROR, CRITICAL\n" if setting == "KEO_LOG_LEVEL" else "text, json\n"
    )
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_json_log_line_has_stable_field_names() -> None:
    # GIVEN a log record with arguments and an exception
    error = ValueError("boom")
    exc_info = (ValueError, error, None)
    record = logging.LogRecord(
        "producer.x", logging.WARNING, __file__, 1, "put failed n=%d", (3,), exc_info
    )
    record.created = 1_700_000_000.123
    # WHEN formatted as JSON
    body = json.loads(JsonFormatter().format(record))
    # THEN the fields are the documented ones, the message formatted
    assert body.pop("exception").endswith("ValueError: boom")
    assert body == {
        "time": "2023-11-14T22:13:20.123+00:00",
        "level": "WARNING",
        "logger": "producer.x",
        "message": "put failed n=3",
    }


def test_a_json_log_line_has_the_context_fields_a_record_carries_and_no_others() -> None:
    # GIVEN a record with context fields, and an extra field that is not one (a payload)
    record = logging.LogRecord(
        "producer.reconcile.reconciler", logging.INFO, __file__, 1, "pass", (), None
    )
    for name, value in {
        "stream": "orders",
        "table": "orders-ledger",
        "group": "g1",
        "counts": {"delivered": 2},
        "data": "secret payload",
    }.items():
        setattr(record, name, value)
    # WHEN formatted as JSON
    body = json.loads(JsonFormatter().format(record))
    # THEN the context fields are fields of the line, and the payload is not
    assert body["stream"] == "orders"
    assert body["table"] == "orders-ledger"
    assert body["group"] == "g1"
    assert body["counts"] == {"delivered": 2}
    assert "data" not in body
    assert "secret payload" not in json.dumps(body)


def test_a_commands_own_line_is_a_json_object_in_json_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN JSON logs
    saved = logging.getLogger().handlers[:], logging.getLogger().level
    try:
        configure("WARNING", LogFormat.JSON, terminal=False)
        # WHEN a command reports a line, below the log level
        report("keo serve: listening", event="serve_listening", url="http://127.0.0.1:1")
        configure("WARNING", LogFormat.TEXT, terminal=False)
        report("keo serve: listening", event="serve_listening", url="http://127.0.0.1:1")
    finally:
        logging.getLogger().handlers[:], level = saved
        logging.getLogger().setLevel(level)
    # THEN it is shown anyway: one JSON object with its fields, or the text as it is
    json_line, text_line = capsys.readouterr().err.splitlines()
    body = json.loads(json_line)
    assert body["message"] == "keo serve: listening"
    assert (body["event"], body["url"], body["level"]) == (
        "serve_listening",
        "http://127.0.0.1:1",
        "INFO",
    )
    assert text_line == "keo serve: listening"


# --- help and version ---------------------------------------------------------------------------


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under ``group`` (groups have ``commands``; keo's load on first
    use, so each is asked for by name), the group first."""
    found = [path]
    for name in group.list_commands(None):
        command = group.get_command(None, name)
        if hasattr(command, "commands"):
            found += _commands(command, (*path, name))
        else:
            found.append((*path, name))
    return found


def _command_at(path: tuple[str, ...]) -> Any:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.get_command(None, name)
    return command


ALL_COMMANDS = _commands(typer.main.get_command(app))


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda path: " ".join(("keo", *path)))
def test_help_shows_every_option_help_whole_and_no_type_for_flags(path: tuple[str, ...]) -> None:
    # GIVEN a command of keo
    # WHEN its --help is drawn on a wide terminal
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    # THEN each option's help text is shown whole: '[env KEO_...]' hints are not eaten
    for param in _command_at(path).params:
        help_text = getattr(param, "help", None)
        if help_text:
            assert help_text.replace("\\[", "[") in result.output, param.name
    # and flags, which take no value, show no value type
    assert "<bool>" not in result.output


def test_stream_and_table_help_show_their_env_and_default() -> None:
    result = runner.invoke(app, ["send", "--help"], env={"COLUMNS": "400"})
    assert "Kinesis stream [env KEO_STREAM; default keo-stream]" in result.output
    assert "DynamoDB ledger table [env KEO_TABLE; default keo-ledger]" in result.output
    assert "[env KEO_AGGREGATE]" in result.output


def test_a_flag_refuses_a_value_as_its_help_says() -> None:
    # GIVEN a flag shown without a value type
    # WHEN given a value
    result = runner.invoke(app, ["audit", "--json", "true"])
    # THEN it is a usage error
    assert result.exit_code == 2


def test_the_relay_demo_runs_on_spark_only() -> None:
    # GIVEN the relay demo asked for without Spark
    # WHEN keo demo parses it
    result = runner.invoke(app, ["demo", "--relay", "--no-spark"])
    # THEN it is a usage error that says why, before anything starts
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "the relay runs on Spark" in result.output


def test_version_prints_the_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"keo {importlib.metadata.version('kinesis-exactly-once')}\n"


_IMPORTED_BY = """
import sys
from cli.app import COMMANDS, app
try:
    app(sys.argv[1:])
except SystemExit:
    pass
print(",".join(sorted(name for name in sys.modules if name.split(".")[0] in {
    "boto3", "botocore", "pydantic", "pydantic_settings", "producer", "kinesis_store",
    "spark_jobs", "api", "devstack"} or name in {"cli.send", "cli.options", "cli.audit"})))
"""


@pytest.mark.parametrize("args", [["--version"], ["--help"]], ids=" ".join)
def test_version_and_help_import_no_command(args: list[str]) -> None:
    # GIVEN keo in a fresh interpreter
    # WHEN it answers --version or --help
    answer = subprocess.run(
        [sys.executable, "-c", _IMPORTED_BY, *args],
        capture_output=True,
        text=True,
        check=True,
    )
    # THEN no command's module, no AWS SDK, no settings were imported: it answers at once
    assert answer.stdout.splitlines()[-1] == ""


_SEND_PATH_IMPORTS = """
import sys
from botocore.stub import Stubber
from cli.send import send
from producer.guarantees import guarantee_of
from producer.settings import ProducerSettings
from producer.wiring import build_stack, ledger_from
settings = ProducerSettings(
    stream="orders", table="orders-ledger", region="us-east-1",
    dynamodb_endpoint_url="http://127.0.0.1:9", kinesis_endpoint_url="http://127.0.0.1:9",
)
ledger = ledger_from(settings)
with Stubber(ledger.client) as dynamodb:
    dynamodb.add_response("describe_table", {"Table": {"TableName": "orders-ledger"}})
    schema = {"pk": {"S": "__keo__/schema"}, "schema_version": {"N": "2"}}
    dynamodb.add_response("get_item", {"Item": schema})
    ledger.ensure_ready(stamp_new=True)
print(",".join(sorted(name for name in sys.modules if name.split(".")[0] in {
    "pynamodb", "boto3", "rich"} or name.startswith(("producer.key", "producer.replay",
    "producer.reconcile")))))
"""


def test_the_send_path_imports_no_pynamodb_nor_rich_nor_a_wing() -> None:
    # GIVEN a fresh interpreter
    # WHEN it imports what keo send runs, and checks its ledger table is ready (described,
    # its schema stamp read) as keo send does before its first message
    answer = subprocess.run(
        [sys.executable, "-c", _SEND_PATH_IMPORTS], capture_output=True, text=True, check=True
    )
    # THEN neither pynamodb (the table's creation alone uses it) nor boto3 nor rich (the
    # progress bar, on a terminal) was imported, nor any mode's wing (its sender loads it):
    # each is a part of a start keo send need not pay
    assert answer.stdout.splitlines()[-1] == ""


_COLLECTOR_AFTER = """
import atexit, gc, sys
from cli import main
atexit.register(lambda: print(gc.isenabled()))
sys.argv = ["keo", *sys.argv[1:]]
main()
"""


def test_keo_collects_garbage_again_once_its_command_is_loaded() -> None:
    # GIVEN keo in a process of its own, which pauses the garbage collector through its start
    # WHEN a command is loaded (its help shown)
    answer = subprocess.run(
        [sys.executable, "-c", _COLLECTOR_AFTER, "init", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    # THEN the collector runs again: a long command is collected as any process
    assert answer.stdout.splitlines()[-1] == "True"


def test_each_command_is_listed_on_one_line_and_loads_by_its_name() -> None:
    root: Any = typer.main.get_command(app)
    for name, command in COMMANDS.items():
        assert len(command.summary) <= 90, name
        assert root.get_command(None, name).name == name


UNREACHABLE = {
    "KEO_KINESIS_ENDPOINT_URL": "http://127.0.0.1:9",
    "KEO_DYNAMODB_ENDPOINT_URL": "http://127.0.0.1:9",
    "KEO_REGION": "us-east-1",
}


def test_keo_audit_says_when_the_expected_keys_are_too_many_for_it_and_names_the_spark_audit(
    tmp_path: Path,
) -> None:
    # GIVEN an expected-keys file of 3 keys, and endpoints nothing listens on
    expected = tmp_path / "keys.txt"
    expected.write_text("a\nb\nc\n", encoding="utf-8")
    # WHEN keo audit may hold 2 keys
    argv = ["audit", "--stream", "orders", "--table", "orders-ledger", "--max-keys", "2"]
    result = runner.invoke(app, [*argv, "--expected", str(expected)], env=UNREACHABLE)
    # THEN it stops before reading the stream, exit 2, and says which audit to run instead
    assert result.exit_code == 2, result.output
    assert "holds more than 2 keys: too many to audit in one process" in result.stderr
    assert (
        "python -m spark_jobs.audit --stream orders --table orders-ledger "
        f"--expected {expected}" in result.stderr
    )


def test_keo_audit_in_replay_mode_needs_the_rows_the_run_sent(tmp_path: Path) -> None:
    # GIVEN endpoints nothing listens on, and a file of plain keys
    keys = tmp_path / "keys.txt"
    keys.write_text("a\nb\n", encoding="utf-8")
    # WHEN keo audit --dedupe replay runs without --expected, or with plain keys
    alone = runner.invoke(app, ["audit", "--dedupe", "replay"], env=UNREACHABLE)
    with_keys = runner.invoke(
        app, ["audit", "--dedupe", "replay", "--expected", str(keys)], env=UNREACHABLE
    )
    # THEN both are usage errors (exit 2) that say what replay mode compares, before any read
    assert alone.exit_code == 2, alone.output
    assert "--dedupe replay needs --expected FILE" in alone.stderr
    assert with_keys.exit_code == 2, with_keys.output
    assert f"--expected {keys} line 1 is not a JSON row" in with_keys.stderr


def test_keo_audit_in_replay_mode_names_the_spark_audit_when_the_rows_are_too_many(
    tmp_path: Path,
) -> None:
    # GIVEN 3 distinct rows the run sent, in base64, and endpoints nothing listens on
    rows = tmp_path / "run.jsonl"
    rows.write_text(
        "".join(json.dumps({"key": k, "data": "eA=="}) + "\n" for k in "abc"), encoding="utf-8"
    )
    # WHEN keo audit --dedupe replay --strict may hold 2 rows
    argv = ["audit", "--stream", "orders", "--table", "orders-ledger", "--max-keys", "2"]
    replay = ["--dedupe", "replay", "--data-encoding", "base64", "--strict"]
    result = runner.invoke(app, [*argv, "--expected", str(rows), *replay], env=UNREACHABLE)
    # THEN it stops before reading the stream, exit 2, and names the same audit on Spark
    assert result.exit_code == 2, result.output
    assert "the expected rows holds more than 2 rows: too many to audit" in result.stderr
    assert (
        "python -m spark_jobs.audit --stream orders --table orders-ledger "
        f"--expected {rows} --dedupe replay --data-encoding base64 --strict" in result.stderr
    )


# --- errors to exit codes -----------------------------------------------------------------------


def _validation_error() -> ValidationError:
    try:
        ProducerSettings(lease_s=-1)
    except ValidationError as exc:
        return exc
    raise AssertionError("lease_s=-1 was accepted")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigurationError("no AWS region", setting="KEO_REGION"), ExitCode.CONFIG),
        (OptionsError("format('keo'): unknown option", options=["x"]), ExitCode.CONFIG),
        (ApiConfigError("KEO_API_TOKEN is not set"), ExitCode.CONFIG),
        (InvalidStreamNameError("a/b", "may hold only ..."), ExitCode.CONFIG),
        (StreamNotFoundError("no stream", stream="orders"), ExitCode.CONFIG),
        (LedgerSchemaError("no table", table="t"), ExitCode.CONFIG),
        (_validation_error(), ExitCode.CONFIG),
        (LedgerUnavailableError("DynamoDB failed", table="t"), ExitCode.UNAVAILABLE),
        (LedgerThrottledError("DynamoDB throttled", table="t"), ExitCode.UNAVAILABLE),
        (StreamUnavailableError("Kinesis failed", stream="orders"), ExitCode.UNAVAILABLE),
        (UnresolvedKeysError("orders", ["k-1"]), ExitCode.UNAVAILABLE),
        (
            botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"),
            ExitCode.UNAVAILABLE,
        ),
        (InvalidTransitionError("SETTLED", "RENEW"), ExitCode.FAILED),
        (PackingError("members blob: truncated"), ExitCode.FAILED),
        (AuditTooLargeError("the stream", max_keys=2), ExitCode.FAILED),
        (ValueError("not enough values to unpack"), ExitCode.INTERNAL),
        (KeyError("attempt"), ExitCode.INTERNAL),
        (TypeError("unsupported operand"), ExitCode.INTERNAL),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else value.name,
)
def test_every_error_has_the_exit_code_of_its_class(error: Exception, code: ExitCode) -> None:
    # GIVEN an error a command met
    # WHEN it is explained
    # THEN its exit code is its class's: configuration 3, retriable 4, other keo errors 1, a
    # bug 70 (a ValueError included: a corrupt item or a mistake is no setting to check)
    assert explain(error)[0] is code


def test_the_internal_exit_code_is_distinct_from_every_other() -> None:
    assert [code for code in ExitCode if code == ExitCode.INTERNAL] == [ExitCode.INTERNAL]


def test_a_bug_exits_70_as_an_internal_error_with_its_traceback_in_the_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a command that meets a plain ValueError (a bug, a corrupt item), not a setting
    def broken(*_args: object, **_kwargs: object) -> object:
        raise ValueError("not enough values to unpack (expected 3, got 2)")

    monkeypatch.setattr("cli.init.kinesis_client", broken)
    env = {
        "KEO_KINESIS_ENDPOINT_URL": "http://127.0.0.1:9",
        "KEO_DYNAMODB_ENDPOINT_URL": "http://127.0.0.1:9",
        "KEO_REGION": "us-east-1",
    }
    # WHEN it runs
    result = runner.invoke(app, ["init", "--stream", "orders", "--table", "orders-ledger"], env=env)
    # THEN it exits 70, says it is an internal error, and logs the traceback; it does not
    # send the user to their settings
    assert result.exit_code == ExitCode.INTERNAL, result.output
    *log, last = result.stderr.splitlines()
    assert last.startswith("keo: internal error, a bug in keo (ValueError: not enough values")
    assert "Traceback" in "\n".join(log)
    assert "in broken" in "\n".join(log)
    assert "invalid setting" not in result.stderr


def test_a_configuration_error_met_by_a_command_exits_3_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a command that meets a configuration error once its settings were read
    def no_region(*_args: object, **_kwargs: object) -> object:
        raise ConfigurationError("no AWS region: set KEO_REGION", setting="KEO_REGION")

    monkeypatch.setattr("cli.init.kinesis_client", no_region)
    env = {"KEO_KINESIS_ENDPOINT_URL": "http://127.0.0.1:9", "KEO_REGION": "us-east-1"}
    # WHEN it runs
    result = runner.invoke(app, ["init"], env=env)
    # THEN it exits 3 with the error's line, and no traceback
    assert result.exit_code == ExitCode.CONFIG, result.output
    assert result.stderr == "keo: no AWS region: set KEO_REGION\n"
