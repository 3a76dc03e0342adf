"""What ``keo`` writes on stdout: results only (progress and logs go to stderr)."""

from __future__ import annotations

import json
import sys
from typing import Any


def write_json_line(body: dict[str, Any]) -> None:
    """``body`` as one JSON line on stdout, always valid JSON: see :func:`json_line`."""
    sys.stdout.write(json_line(body, sys.stdout.encoding))


def json_line(body: dict[str, Any], encoding: str | None) -> str:
    """``body`` as a JSON line that a stream in ``encoding`` can always carry.

    Text is shown as it is where the stream can hold it; where it cannot (a key with a lone
    surrogate, written as an escape in the input, or any non-ASCII text on an ASCII stream),
    the line is written with JSON escapes, which read back as the same text.
    """
    text = json.dumps(body, ensure_ascii=False)
    try:
        text.encode(encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        text = json.dumps(body)  # every non-ASCII character as a \u escape
    return text + "\n"
