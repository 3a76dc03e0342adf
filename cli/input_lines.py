"""The input of ``keo send`` (and of ``keo audit --expected``): JSON lines, read as bytes.

No line can stop a run. Input is read as bytes and split on ``\\n`` before anything is
decoded, so a line that is not UTF-8, not JSON, nested too deeply for the parser, or too long
to hold becomes a :class:`BadLine` (REJECTED with its reason) and the lines around it are read
as usual. Lines are numbered from 1, as editors count them; blank lines (JSON whitespace only)
are skipped but still counted.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import IO

from producer.protocol import Message

# Far above any record Kinesis takes (data up to 10 MiB, written as JSON-escaped text or base64)
# and small enough that one runaway line without a newline cannot exhaust memory.
MAX_LINE_BYTES = 64 * 1024 * 1024
_READ_BYTES = 1024 * 1024  # how much of an overlong line is read at once while skipping it
_JSON_WHITESPACE = b" \t\r\n"
_UTF8_BOM = b"\xef\xbb\xbf"


class DataEncoding(StrEnum):
    TEXT = "text"
    BASE64 = "base64"


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that is not a message: why, and its key when that much could be read."""

    reason: str
    key: str | None = None


def numbered_lines(
    source: IO[bytes], *, max_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, bytes | BadLine]]:
    """Every non-blank line with its number (from 1); a line over ``max_bytes`` is a BadLine.

    A UTF-8 byte order mark at the start of the input is dropped.
    """
    number = 0
    while True:
        raw = source.readline(max_bytes + 1)
        if not raw:
            return
        number += 1
        if number == 1:
            raw = raw.removeprefix(_UTF8_BOM)
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            _skip_rest_of_line(source)
            yield number, BadLine(f"line is longer than {max_bytes} bytes")
        elif raw.strip(_JSON_WHITESPACE):
            yield number, raw


def _skip_rest_of_line(source: IO[bytes]) -> None:
    while True:
        rest = source.readline(_READ_BYTES)
        if not rest or rest.endswith(b"\n"):
            return


def decode_line(raw: bytes) -> str | BadLine:
    """The line as text, or why it is not UTF-8 (and where, counting bytes from 1)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadLine(
            f"line is not valid UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
        )


def parse_line(line: str | bytes, encoding: DataEncoding) -> Message | BadLine:
    """``{"key", "data", "routing_key"?}`` as a Message, or the reason it is not one."""
    text = decode_line(line) if isinstance(line, bytes) else line
    if isinstance(text, BadLine):
        return text
    try:
        # numbers are never used (key, data and routing_key are strings): float takes any
        # length, where int refuses more than 4,300 digits
        row = json.loads(text, parse_int=float)
    except json.JSONDecodeError as exc:
        return BadLine(f"line is not JSON: {exc.msg} at column {exc.colno}")
    except RecursionError:
        return BadLine("line is nested too deeply to be read as JSON")
    if not isinstance(row, dict):
        return BadLine("line must be a JSON object with 'key' and 'data'")
    key, data, routing = row.get("key"), row.get("data"), row.get("routing_key")
    if not isinstance(key, str):
        return BadLine("'key' is missing or not a string")
    if not isinstance(data, str):
        return BadLine(
            "'data' is missing or not a string (use --data-encoding base64 for bytes)", key
        )
    if routing is not None and not isinstance(routing, str):
        return BadLine("'routing_key' must be a string when given", key)
    if encoding is DataEncoding.BASE64:
        try:
            payload = base64.b64decode(data, validate=True)
        except ValueError:  # binascii.Error, or non-ASCII text
            return BadLine("'data' is not valid base64", key)
    else:
        try:
            payload = data.encode("utf-8")
        except UnicodeEncodeError:
            return BadLine("'data' contains an unpaired surrogate; send it as base64", key)
    return Message(key, payload, routing)
