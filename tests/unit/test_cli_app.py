"""``keo`` itself, without a backend: logging settings, help, version, exit codes."""

from __future__ import annotations

import json
import logging

import pytest
from typer.testing import CliRunner

from cli.app import app
from cli.logs import JsonFormatter, LogFormat, LogSettingError, log_format, log_level

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
