"""Where ``keo``'s logs go: always stderr, never stdout (stdout carries results).

Three shapes, chosen once per run:

- ``text`` on a terminal: rich's handler on :func:`stderr_console`, the console progress bars
  use too, so a log line printed while a bar runs goes above it instead of through it;
- ``text`` otherwise: plain lines, ``time level logger message``;
- ``json``: one JSON object per line with the fields of :data:`JSON_FIELDS` (and
  ``exception`` when there is one), for log collectors; a record that carries any of
  :data:`CONTEXT_FIELDS` (``log.info(..., extra={"stream": s})``) has them too, and nothing
  else: a payload can never reach a JSON line by way of an extra field.

A command's own lines on stderr (``keo serve``'s address, a pass of ``keo reconcile --loop``
with ``--json``, an error before exiting) go through :func:`report`: as they are in text, one
JSON object with their fields in JSON, so a daemon's stderr is JSON lines throughout.

The level is ``-v`` / ``-vv`` when given, else ``KEO_LOG_LEVEL``, else WARNING.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import typer

from dedupe_store.errors import ConfigurationError

if TYPE_CHECKING:
    from rich.console import Console

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
JSON_FIELDS = ("time", "level", "logger", "message")
# what a record may add to its JSON line: where it happened and how many, never what was sent
CONTEXT_FIELDS = ("event", "stream", "table", "group", "run", "counts", "url")
REPORT_LOGGER = "keo"
_PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class LogSettingError(ConfigurationError):
    """A logging setting from the environment has a value keo does not know."""

    def __init__(self, setting: str, value: str, allowed: tuple[str, ...]) -> None:
        super().__init__(f"{value!r} is not one of {', '.join(allowed)}", setting=setting)
        self.setting: str = setting


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


_chosen = {"format": LogFormat.TEXT}


def configure(level: str, fmt: LogFormat, *, terminal: bool) -> None:
    """Install the root handler (replacing any), on stderr."""
    _chosen["format"] = fmt
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
        for name in CONTEXT_FIELDS:
            if name in record.__dict__:
                body[name] = record.__dict__[name]
        return json.dumps(body, ensure_ascii=True, default=str)


def report(
    text: str,
    *,
    event: str,
    level: int = logging.INFO,
    style: dict[str, Any] | None = None,
    **fields: Any,
) -> None:
    """A command's own line on stderr, whatever the log level: ``text`` as it is (with typer's
    ``style``: fg, bold), or in JSON one object with ``event`` and ``fields`` (of
    :data:`CONTEXT_FIELDS`)."""
    if _chosen["format"] is not LogFormat.JSON:
        typer.secho(text, err=True, **(style or {}))
        return
    unknown = set(fields) - set(CONTEXT_FIELDS)
    if unknown:
        raise ValueError(f"not a context field: {sorted(unknown)}")
    record = logging.getLogger(REPORT_LOGGER).makeRecord(
        REPORT_LOGGER, level, "(report)", 0, text, (), None, extra={"event": event, **fields}
    )
    sys.stderr.write(JsonFormatter().format(record) + "\n")
    sys.stderr.flush()
