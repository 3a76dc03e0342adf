"""Validation of messages before anything is claimed: what Kinesis would refuse is rejected first.

Kinesis: partition key 1..256 Unicode characters; record size = data + UTF-8 partition key.
"""

from __future__ import annotations

from typing import Any

import pytest

from dedupe_store.records import MAX_KEY_CHARS
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES, record_size
from producer.protocol import Message, explicit_hash_key, payload_digest, prepare, validate

MAX = DEFAULT_MAX_RECORD_BYTES


def reason_for(
    key: Any, data: Any = b"x", routing_key: Any = None, max_bytes: int = MAX
) -> str | None:
    return validate(Message(key, data, routing_key), max_bytes)


# --- the key ------------------------------------------------------------------------------------


def test_empty_key_is_rejected() -> None:
    # GIVEN a message with an empty key
    # WHEN validated
    reason = reason_for("")
    # THEN it is rejected, and the reason states the rule
    assert reason is not None
    assert "empty" in reason
    assert "1 to 256" in reason


@pytest.mark.parametrize("key", ["k", "k" * MAX_KEY_CHARS], ids=["1-char", "256-chars"])
def test_keys_of_1_and_256_characters_are_valid(key: str) -> None:
    # GIVEN a key at either end of the allowed length
    # WHEN validated
    # THEN it is accepted
    assert reason_for(key) is None


def test_key_of_257_characters_is_rejected_with_its_length() -> None:
    # GIVEN a key one character too long
    # WHEN validated
    reason = reason_for("k" * (MAX_KEY_CHARS + 1))
    # THEN the reason tells how long it is and what the limit is
    assert reason is not None
    assert "257" in reason
    assert "256" in reason


def test_emoji_count_as_one_character_each() -> None:
    # GIVEN keys of emoji, each outside the Basic Multilingual Plane (4 UTF-8 bytes each)
    emoji = "\N{GRINNING FACE}"
    # WHEN 256 of them and 257 of them are validated
    # THEN the length counts characters, not bytes or UTF-16 units: 256 pass, 257 do not
    assert reason_for(emoji * 256) is None
    reason = reason_for(emoji * 257)
    assert reason is not None
    assert "257 characters" in reason


@pytest.mark.parametrize(
    "key",
    ["\ud800", "order-\udfff", "\ud83d\ude00"],
    ids=["lone-high", "lone-low-after-text", "surrogate-pair-as-two-code-points"],
)
def test_key_with_unpaired_surrogates_is_rejected(key: str) -> None:
    # GIVEN a key that holds surrogate code points (it cannot be encoded as UTF-8;
    # a pair written as two code points is still two unpaired surrogates in a Python str)
    # WHEN validated
    reason = reason_for(key)
    # THEN it is rejected up front, rather than failing inside the SDK
    assert reason is not None
    assert "surrogate" in reason


@pytest.mark.parametrize("key", [None, 42, b"bytes-key"], ids=["none", "int", "bytes"])
def test_non_string_key_is_rejected_with_its_type(key: object) -> None:
    # GIVEN a key that is not a str
    # WHEN validated
    reason = reason_for(key)
    # THEN the reason names the type received
    assert reason is not None
    assert type(key).__name__ in reason


# --- the record size ----------------------------------------------------------------------------


def test_record_exactly_at_the_max_size_is_valid() -> None:
    # GIVEN a one-byte key and data that fill the record limit exactly
    data = b"\x00" * (MAX - 1)
    # WHEN validated
    # THEN it is accepted
    assert record_size("k", data) == MAX
    assert reason_for("k", data) is None


def test_record_one_byte_over_the_max_size_is_rejected_with_sizes() -> None:
    # GIVEN a record one byte over the limit
    data = b"\x00" * MAX
    # WHEN validated
    reason = reason_for("k", data)
    # THEN the reason gives the record's size and the limit
    assert reason is not None
    assert f"{MAX + 1} bytes" in reason
    assert str(MAX) in reason


def test_record_size_counts_the_key_in_utf8_bytes() -> None:
    # GIVEN a key of one character that takes 4 UTF-8 bytes
    key = "\N{GRINNING FACE}"
    # WHEN data fills the limit counting the key as 4 bytes, and then one byte more
    # THEN the first passes and the second is rejected: the key is counted as Kinesis counts it
    assert reason_for(key, b"\x00" * (MAX - 4)) is None
    assert reason_for(key, b"\x00" * (MAX - 3)) is not None


def test_smaller_stream_limit_is_honoured() -> None:
    # GIVEN a stream whose max record size is 100 bytes
    # WHEN a 101-byte record is validated
    # THEN it is rejected, although it would fit the 1 MiB default
    assert reason_for("k", b"\x00" * 99, max_bytes=100) is None
    assert reason_for("k", b"\x00" * 100, max_bytes=100) is not None


def test_empty_data_is_valid() -> None:
    # GIVEN a message with empty data (the key alone is a record)
    # WHEN validated
    # THEN it is accepted
    assert reason_for("k", b"") is None


# --- the data -----------------------------------------------------------------------------------


@pytest.mark.parametrize("data", ["text", None, 7, ["b"]], ids=["str", "none", "int", "list"])
def test_non_bytes_data_is_rejected_with_its_type(data: object) -> None:
    # GIVEN data that is not bytes
    # WHEN validated
    reason = reason_for("k", data)
    # THEN the reason names the type received
    assert reason is not None
    assert "data must be bytes" in reason
    assert type(data).__name__ in reason


@pytest.mark.parametrize(
    "data", [bytearray(b"abc"), memoryview(b"abc")], ids=["bytearray", "memoryview"]
)
def test_bytes_like_data_is_valid(data: bytes) -> None:
    # GIVEN data that is bytes-like
    # WHEN validated
    # THEN it is accepted
    assert reason_for("k", data) is None


# --- the routing key ----------------------------------------------------------------------------


@pytest.mark.parametrize("routing_key", ["", 5, b"shard-a"], ids=["empty", "int", "bytes"])
def test_empty_or_non_string_routing_key_is_rejected(routing_key: object) -> None:
    # GIVEN a routing key that is given but empty or not a str
    # WHEN validated
    reason = reason_for("k", routing_key=routing_key)
    # THEN it is rejected
    assert reason == "routing_key, when given, must be a non-empty string"


def test_routing_key_with_unpaired_surrogate_is_rejected() -> None:
    # GIVEN a routing key that cannot be encoded as UTF-8
    # WHEN validated
    reason = reason_for("k", routing_key="tenant-\ud800")
    # THEN it is rejected and the reason names the routing key
    assert reason is not None
    assert "routing_key" in reason
    assert "surrogate" in reason


def test_long_routing_key_is_valid() -> None:
    # GIVEN a routing key longer than a partition key may be (it is hashed, never sent)
    # WHEN validated
    # THEN it is accepted
    assert reason_for("k", routing_key="r" * 1000) is None


# --- prepare ------------------------------------------------------------------------------------


def test_prepare_keeps_input_indexes_and_rejects_with_reasons() -> None:
    # GIVEN a mix of valid and invalid messages
    messages = [
        Message("a", b"1"),
        Message("", b"2"),
        Message("c", b"3", routing_key="tenant-7"),
        Message(42, b"4"),  # type: ignore[arg-type]
        Message("e", "not-bytes"),  # type: ignore[arg-type]
        Message("f", b"6"),
    ]
    # WHEN they are prepared
    prepared, rejected = prepare(messages, MAX)
    # THEN each valid one keeps its position in the input, so outcomes line up with it
    assert [(p.index, p.key) for p in prepared] == [(0, "a"), (2, "c"), (5, "f")]
    # AND each invalid one is rejected at its position, with its key when it has one, and why
    assert [(r.index, r.key) for r in rejected] == [(1, ""), (3, None), (4, "e")]
    assert all(r.reason for r in rejected)
    assert "empty" in rejected[0].reason
    assert "int" in rejected[1].reason
    assert "data must be bytes" in rejected[2].reason


def test_prepare_computes_routing_and_digest_once() -> None:
    # GIVEN a message with a routing key
    message = Message("order-1", b"payload", routing_key="customer-9")
    # WHEN prepared
    [item], rejected = prepare([message], MAX)
    # THEN it carries the routing key's hash key and the digest over that routing and the data
    assert rejected == []
    assert item.explicit_hash_key == explicit_hash_key(message)
    assert item.payload_digest == payload_digest(b"payload", item.explicit_hash_key)
    assert item.record_bytes == len("order-1") + len(b"payload")


@pytest.mark.parametrize(
    "data", [bytearray(b"abc"), memoryview(b"abc")], ids=["bytearray", "memoryview"]
)
def test_prepare_turns_bytes_like_data_into_bytes(data: bytes) -> None:
    # GIVEN a message whose data is bytes-like but not bytes
    # WHEN prepared
    [item], _ = prepare([Message("k", data)], MAX)
    # THEN the prepared message holds plain bytes with the same content and digest as bytes would
    assert type(item.message.data) is bytes
    assert item.message.data == b"abc"
    [same], _ = prepare([Message("k", b"abc")], MAX)
    assert item.payload_digest == same.payload_digest


def test_prepare_of_nothing_is_nothing() -> None:
    # GIVEN no messages
    # WHEN prepared
    # THEN there is nothing to send and nothing rejected
    assert prepare([], MAX) == ([], [])
