"""``keo send`` input: one JSON object per line becomes a Message, or the reason it is REJECTED.

A bad line must never stop the run: it is reported on its own line and the rest are sent.
"""

from __future__ import annotations

import base64
import json

import pytest

from cli.send import DataEncoding, parse_line
from producer.protocol import Message

TEXT = DataEncoding.TEXT
BASE64 = DataEncoding.BASE64


def line(**fields: object) -> str:
    return json.dumps(fields) + "\n"


# --- valid lines --------------------------------------------------------------------------------


def test_text_line_becomes_a_message_with_utf8_data() -> None:
    # GIVEN a line with a key and text data
    # WHEN parsed as text
    # THEN the data is its UTF-8 bytes, and there is no routing key
    assert parse_line(line(key="order-1", data="héllo"), TEXT) == Message(
        "order-1", "héllo".encode()
    )


def test_routing_key_is_kept() -> None:
    # GIVEN a line with a routing key
    # WHEN parsed
    # THEN the message routes by it
    assert parse_line(line(key="k", data="d", routing_key="customer-9"), TEXT) == Message(
        "k", b"d", "customer-9"
    )


def test_null_routing_key_means_none() -> None:
    # GIVEN a line whose routing key is JSON null
    # WHEN parsed
    # THEN the message routes by its key
    assert parse_line(line(key="k", data="d", routing_key=None), TEXT) == Message("k", b"d")


def test_base64_line_becomes_the_decoded_bytes() -> None:
    # GIVEN binary data written as base64
    payload = b"\x00\xff\xfe binary"
    # WHEN parsed as base64
    # THEN the message carries the original bytes
    result = parse_line(line(key="k", data=base64.b64encode(payload).decode()), BASE64)
    assert result == Message("k", payload)


def test_base64_text_is_not_decoded_in_text_mode() -> None:
    # GIVEN base64-looking data
    # WHEN parsed as text
    # THEN it is sent as the text it is
    assert parse_line(line(key="k", data="YWJj"), TEXT) == Message("k", b"YWJj")


def test_extra_fields_are_ignored() -> None:
    # GIVEN a line with fields keo does not use
    # WHEN parsed
    # THEN the message is built from key, data and routing key only
    assert parse_line(line(key="k", data="d", note="x", n=1), TEXT) == Message("k", b"d")


def test_line_without_trailing_newline_and_with_spaces_is_read() -> None:
    # GIVEN the last line of a file (no newline) with spaces around it
    # WHEN parsed
    # THEN it is read like any other
    assert parse_line('  {"key": "k", "data": ""}  ', TEXT) == Message("k", b"")


def test_non_ascii_and_escaped_characters_in_key_are_kept() -> None:
    # GIVEN a key with an emoji written as a JSON escape pair
    # WHEN parsed
    # THEN the key holds the one character it stands for
    result = parse_line('{"key": "\\ud83d\\ude00-1", "data": "x"}', TEXT)
    assert isinstance(result, Message)
    assert result.key == "\N{GRINNING FACE}-1"


# --- rejected lines -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n", "not json", '{"key": "k", "data": "d"', "{'key': 'k'}"])
def test_line_that_is_not_json_is_rejected_with_where(text: str) -> None:
    # GIVEN a line that is not JSON
    # WHEN parsed
    reason = parse_line(text, TEXT)
    # THEN the reason says so and where the parser stopped
    assert isinstance(reason, str)
    assert reason.startswith("line is not JSON")
    assert "column" in reason


@pytest.mark.parametrize("text", ["[]", '["k", "d"]', "42", '"key"', "null", "true"])
def test_json_that_is_not_an_object_is_rejected(text: str) -> None:
    # GIVEN a JSON line that is not an object
    # WHEN parsed
    # THEN the reason says what a line must be
    assert parse_line(text, TEXT) == "line must be a JSON object with 'key' and 'data'"


@pytest.mark.parametrize(
    "fields",
    [
        {"data": "d"},
        {"key": None, "data": "d"},
        {"key": 1, "data": "d"},
        {"key": ["k"], "data": "d"},
    ],
    ids=["missing", "null", "number", "list"],
)
def test_missing_or_non_string_key_is_rejected(fields: dict[str, object]) -> None:
    # GIVEN a line without a string key
    # WHEN parsed
    # THEN it is rejected with the field named
    assert parse_line(line(**fields), TEXT) == "'key' is missing or not a string"


@pytest.mark.parametrize(
    "fields",
    [
        {"key": "k"},
        {"key": "k", "data": None},
        {"key": "k", "data": 5},
        {"key": "k", "data": {"a": 1}},
    ],
    ids=["missing", "null", "number", "object"],
)
@pytest.mark.parametrize("encoding", [TEXT, BASE64])
def test_missing_or_non_string_data_is_rejected(
    fields: dict[str, object], encoding: DataEncoding
) -> None:
    # GIVEN a line without string data
    # WHEN parsed
    reason = parse_line(line(**fields), encoding)
    # THEN it is rejected, with a hint for binary payloads
    assert isinstance(reason, str)
    assert reason.startswith("'data' is missing or not a string")
    assert "--data-encoding base64" in reason


@pytest.mark.parametrize(
    "routing_key", [7, True, ["r"], {"r": 1}], ids=["int", "bool", "list", "object"]
)
def test_non_string_routing_key_is_rejected(routing_key: object) -> None:
    # GIVEN a routing key that is not a string
    # WHEN parsed
    # THEN it is rejected rather than silently routing by the key
    assert (
        parse_line(line(key="k", data="d", routing_key=routing_key), TEXT)
        == "'routing_key' must be a string when given"
    )


@pytest.mark.parametrize(
    "data",
    ["YWJ", "not base64!", "YW Jj", "YWJj\n", "YQ=a"],
    ids=["short", "symbols", "space", "newline", "data-after-padding"],
)
def test_bad_base64_is_rejected(data: str) -> None:
    # GIVEN data that is not valid base64
    # WHEN parsed as base64
    # THEN the line is rejected instead of sending garbage
    assert parse_line(line(key="k", data=data), BASE64) == "'data' is not valid base64"


@pytest.mark.parametrize("data", ["é", "YWJj\N{GRINNING FACE}"], ids=["accent", "emoji"])
def test_non_ascii_base64_is_rejected_not_raised(data: str) -> None:
    # GIVEN base64 data with a non-ASCII character in it
    # WHEN parsed as base64
    # THEN the line is rejected like any other bad base64
    assert parse_line(line(key="k", data=data), BASE64) == "'data' is not valid base64"


def test_text_data_with_unpaired_surrogate_is_rejected_with_advice() -> None:
    # GIVEN text data holding a lone surrogate (valid JSON, not encodable as UTF-8)
    # WHEN parsed as text
    reason = parse_line('{"key": "k", "data": "\\ud800"}', TEXT)
    # THEN it is rejected, advising base64
    assert reason == "'data' contains an unpaired surrogate; send it as base64"
