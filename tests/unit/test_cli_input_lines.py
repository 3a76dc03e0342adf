"""``keo send`` input: one JSON object per line becomes a Message, or the reason it is REJECTED.

A bad line must never stop the run: it is reported on its own line and the rest are sent.
"""

from __future__ import annotations

import base64
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.input_lines import BadLine, DataEncoding, numbered_lines, parse_line
from cli.stdout import json_line
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
    bad = parse_line(text, TEXT)
    # THEN the reason says so and where the parser stopped
    assert isinstance(bad, BadLine)
    assert bad.reason.startswith("line is not JSON")
    assert "column" in bad.reason


@pytest.mark.parametrize("text", ["[]", '["k", "d"]', "42", '"key"', "null", "true"])
def test_json_that_is_not_an_object_is_rejected(text: str) -> None:
    # GIVEN a JSON line that is not an object
    # WHEN parsed
    # THEN the reason says what a line must be
    assert parse_line(text, TEXT) == BadLine("line must be a JSON object with 'key' and 'data'")


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
    assert parse_line(line(**fields), TEXT) == BadLine("'key' is missing or not a string")


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
    bad = parse_line(line(**fields), encoding)
    # THEN it is rejected, with a hint for binary payloads, and the key it had is kept
    assert isinstance(bad, BadLine)
    assert bad.reason.startswith("'data' is missing or not a string")
    assert "--data-encoding base64" in bad.reason
    assert bad.key == "k"


@pytest.mark.parametrize(
    "routing_key", [7, True, ["r"], {"r": 1}], ids=["int", "bool", "list", "object"]
)
def test_non_string_routing_key_is_rejected(routing_key: object) -> None:
    # GIVEN a routing key that is not a string
    # WHEN parsed
    # THEN it is rejected rather than silently routing by the key
    assert parse_line(line(key="k", data="d", routing_key=routing_key), TEXT) == BadLine(
        "'routing_key' must be a string when given", "k"
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
    assert parse_line(line(key="k", data=data), BASE64) == BadLine(
        "'data' is not valid base64", "k"
    )


@pytest.mark.parametrize("data", ["é", "YWJj\N{GRINNING FACE}"], ids=["accent", "emoji"])
def test_non_ascii_base64_is_rejected_not_raised(data: str) -> None:
    # GIVEN base64 data with a non-ASCII character in it
    # WHEN parsed as base64
    # THEN the line is rejected like any other bad base64
    assert parse_line(line(key="k", data=data), BASE64) == BadLine(
        "'data' is not valid base64", "k"
    )


def test_text_data_with_unpaired_surrogate_is_rejected_with_advice() -> None:
    # GIVEN text data holding a lone surrogate (valid JSON, not encodable as UTF-8)
    # WHEN parsed as text
    bad = parse_line('{"key": "k", "data": "\\ud800"}', TEXT)
    # THEN it is rejected, advising base64
    assert bad == BadLine("'data' contains an unpaired surrogate; send it as base64", "k")


# --- lines that are not even JSON text ----------------------------------------------------------


def test_a_line_that_is_not_utf8_is_rejected_naming_the_byte_and_column() -> None:
    # GIVEN a line with a Latin-1 byte in it
    # WHEN parsed
    # THEN it is rejected with the byte and where it is, and nothing is raised
    assert parse_line(b'{"key": "caf\xe9", "data": "x"}\n', TEXT) == BadLine(
        "line is not valid UTF-8: byte 0xe9 at column 13"
    )


@pytest.mark.parametrize("opening", ["[", '{"a":'], ids=["arrays", "objects"])
def test_json_nested_deeper_than_the_parser_goes_is_rejected(opening: str) -> None:
    # GIVEN a line of 100,000 openings
    # WHEN parsed
    # THEN it is rejected as too deeply nested, not raised as a RecursionError
    assert parse_line(opening * 100_000, TEXT) == BadLine(
        "line is nested too deeply to be read as JSON"
    )


def test_a_number_too_long_for_int_does_not_reject_the_line() -> None:
    # GIVEN a valid line with an extra field holding a 5,000-digit number
    # WHEN parsed
    # THEN the number is ignored like any extra field (int() would refuse it)
    assert parse_line('{"key": "k", "data": "d", "n": ' + "9" * 5000 + "}", TEXT) == Message(
        "k", b"d"
    )


def test_a_key_with_a_lone_surrogate_is_read_as_it_is() -> None:
    # GIVEN a key holding an escaped lone surrogate
    # WHEN parsed
    # THEN it is a message with that key (the producer rejects it, naming the key)
    assert parse_line('{"key": "b\\ud800", "data": "x"}', TEXT) == Message("b\ud800", b"x")


# --- splitting the input into numbered lines ----------------------------------------------------


def lines_of(data: bytes, *, max_bytes: int = 1000) -> list[tuple[int, bytes | BadLine]]:
    return list(numbered_lines(io.BytesIO(data), max_bytes=max_bytes))


def test_blank_lines_are_skipped_but_counted() -> None:
    # GIVEN blank lines (spaces, tabs, CRLF) between two lines, and no newline at the end
    # WHEN split
    # THEN only the two lines come out, with the numbers an editor shows
    assert lines_of(b"a\n\n \t\r\n\nb") == [(1, b"a\n"), (5, b"b")]


def test_a_byte_order_mark_at_the_start_is_dropped() -> None:
    # GIVEN input saved with a UTF-8 byte order mark
    # WHEN split
    # THEN the first line reads as if it had none
    assert lines_of(b'\xef\xbb\xbf{"key": "k"}\n') == [(1, b'{"key": "k"}\n')]


def test_an_overlong_line_is_rejected_and_the_next_line_is_read() -> None:
    # GIVEN a line longer than the limit between two short ones
    # WHEN split
    # THEN it is one BadLine, and the lines around it keep their numbers
    assert lines_of(b"a\n" + b"x" * 5000 + b"\nb\n", max_bytes=100) == [
        (1, b"a\n"),
        (2, BadLine("line is longer than 100 bytes")),
        (3, b"b\n"),
    ]


def test_a_line_of_exactly_the_limit_is_read() -> None:
    # GIVEN a line of exactly the limit, newline included
    # WHEN split
    # THEN it is read
    assert lines_of(b"x" * 99 + b"\n", max_bytes=100) == [(1, b"x" * 99 + b"\n")]


# --- outcomes are always JSON the output can carry ----------------------------------------------


@pytest.mark.parametrize(
    ("key", "encoding", "shown"),
    [
        ("café", "utf-8", '"café"'),
        ("café", "ascii", '"caf\\u00e9"'),
        ("b\ud800", "utf-8", '"b\\ud800"'),
        ("\N{GRINNING FACE}", "latin-1", '"\\ud83d\\ude00"'),
    ],
    ids=["as-is", "ascii-stream", "lone-surrogate", "emoji-on-latin1"],
)
def test_an_outcome_line_is_json_the_stream_can_encode(key: str, encoding: str, shown: str) -> None:
    # GIVEN an outcome whose key the output stream may not be able to hold
    # WHEN written as a line for that stream
    text = json_line({"key": key, "status": "REJECTED"}, encoding)
    # THEN it encodes, reads back as the same key, and is escaped only where needed
    text.encode(encoding)
    assert json.loads(text)["key"] == key
    assert shown in text


# --- hostile input never stops the run ----------------------------------------------------------

_GOOD = st.builds(
    lambda n, data: json.dumps({"key": f"good-{n}", "data": data}).encode(),
    st.integers(0, 10**6),
    st.text(max_size=20),
)
_HOSTILE = st.one_of(
    st.binary(max_size=300),
    st.integers(1, 200_000).map(lambda n: b"[" * n),
    st.integers(1, 5_000).map(lambda n: b'{"key": "k", "data": "' + b"x" * n + b'"}'),
    st.text(st.characters(categories=["Cs", "Cc", "Co", "Cn", "Zl", "Zs"])).map(
        lambda text: json.dumps({"key": text, "data": text}).encode()
    ),
    st.text(st.characters(categories=["Cc"])).map(
        lambda text: b'{"key": "' + text.encode() + b'", "data": "d"}'
    ),
).map(lambda raw: raw.replace(b"\n", b""))


@settings(deadline=None, max_examples=150)
@given(st.lists(st.tuples(_GOOD, _HOSTILE, st.booleans()), max_size=8), st.booleans())
def test_every_line_is_a_message_or_a_bad_line_with_its_number(
    rows: list[tuple[bytes, bytes, bool]], final_newline: bool
) -> None:
    # GIVEN good lines with hostile lines (random bytes, deep nesting, long lines, surrogates,
    # control characters) before or after each
    lines: list[tuple[bytes, bool]] = []
    for good, hostile, hostile_first in rows:
        pair = [(good, True), (hostile, False)]
        lines.extend(reversed(pair) if hostile_first else pair)
    data = b"\n".join(line for line, _ in lines) + (b"\n" if final_newline else b"")
    # WHEN split and parsed
    parsed = {
        number: raw if isinstance(raw, BadLine) else parse_line(raw, TEXT)
        for number, raw in numbered_lines(io.BytesIO(data), max_bytes=4_096)
    }
    # THEN nothing raised; every non-blank line is there, in order, with its number
    blank = [not _without_bom(line, n).strip(b" \t\r\n") for n, (line, _) in enumerate(lines, 1)]
    assert list(parsed) == [n for n in range(1, len(lines) + 1) if not blank[n - 1]]
    # and every good line is its message
    for number, (line, good) in enumerate(lines, 1):
        if good:
            row = json.loads(line)
            assert parsed[number] == Message(row["key"], row["data"].encode())
    # and every outcome can be written as a JSON line that reads back with its key
    for number, result in parsed.items():
        text = json_line({"index": number - 1, "key": result.key}, "utf-8")
        assert json.loads(text)["key"] == result.key


def _without_bom(line: bytes, number: int) -> bytes:
    return line.removeprefix(b"\xef\xbb\xbf") if number == 1 else line
