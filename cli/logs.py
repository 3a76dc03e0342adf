"""Where ``keo``'s logs go: always stderr, never stdout (stdout carries results).

Three shapes, chosen once per run:

- ``text`` on a terminal: rich's handler on :func:`stderr_console`, the console progress bars
  use too, so a log line printed while a bar runs goes above it instead of through it;
- ``text`` otherwise: plain lines, ``time level logger message``;
- ``json``: one JSON object per line with the fields of :data:`JSON_FIELDS` (and
  ``exception`` when there is one), for log collectors.

The level is ``-v`` / ``-vv`` when given, else ``KEO_LOG_LEVEL``, else WARNING.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
JSON_FIELDS = ("time", "level", "logger", "message")
_PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class LogSettingError(ValueError):
    """A logging setting from the environment has a value keo does not know."""

    def __init__(self, setting: str, value: str, allowed: tuple[str, ...]) -> None:
        super().__init__(f"{value!r} is not one of {', '.join(allowed)}")
        self.setting = setting


def log_level(verbose: int, from_env: str | None) -> str:
    """``-v`` wins over ``KEO_LOG_LEVEL``, which wins over the default (WARNING)."""
    if verbose:
        return "DEBUG" if verbose >= 2 else "INFO"
    if not from_env:
        return "WARNING"
    if from_env.upper() not in LEVELS:
        raise LogSettingError("KEO_LOG_LEVEL", from_env, LEVELS)
    return from_env.upper()


def log_format(flag: LogFormat | None, from_env: str | None) -> LogFormat:
    """``--log-format`` wins over ``KEO_LOG_FORMAT``, which wins over text."""
    if flag is not None:
        return flag
    if not from_env:
        return LogFormat.TEXT
    try:
        return LogFormat(from_env.lower())
    except ValueError:
        raise LogSettingError(
            "KEO_LOG_FORMAT", from_env, tuple(f.value for f in LogFormat)
        ) from None


@functools.cache
def stderr_console() -> Console:
    """The one rich console on stderr, shared by the log handler and progress bars."""
    from rich.console import Console

    return Console(stderr=True)


def configure(level: str, fmt: LogFormat, *, terminal: bool) -> None:
    """Install the root handler (replacing any), on stderr."""
    handler: logging.Handler
    if fmt is LogFormat.JSON:
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
    elif terminal:
        from rich.logging import RichHandler

        handler = RichHandler(console=stderr_console(), show_path=False, rich_tracebacks=False)
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_PLAIN_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # botocore's own chatter is noise at info level
    logging.getLogger("botocore").setLevel(max(logging.getLogger().level, logging.WARNING))


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message"[, "exception"]}``: names that do not change."""

    def format(self, record: logging.LogRecord) -> str:
        body = {
            "time": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=True)
