"""Routing (MD5 hash keys, as Kinesis computes them) and the payload digest that detects reuse."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from kinesis_store.entries import MAX_HASH_KEY, hash_key_of, put_entry
from producer.protocol import Message, explicit_hash_key, payload_digest, prepare

# Text Kinesis can carry: no surrogate code points (they cannot be encoded as UTF-8).
utf8_text = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=64)


def md5_int(text: str) -> int:
    return int(hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest(), 16)


def test_hash_key_is_the_md5_hex_read_as_a_big_endian_integer() -> None:
    # GIVEN the well-known MD5 of "abc": 900150983cd24fb0d6963f7d28e17f72
    # WHEN its hash key is computed
    # THEN it is that hex read as one 128-bit integer, as Kinesis routes partition keys
    assert hash_key_of("abc") == 0x900150983CD24FB0D6963F7D28E17F72


@given(utf8_text)
def test_hash_key_equals_int_of_md5_hex_and_is_within_the_hash_range(key: str) -> None:
    # GIVEN any key Kinesis accepts
    # WHEN its hash key is computed
    value = hash_key_of(key)
    # THEN it is the integer of its MD5 hex, inside [0, 2**128 - 1]
    assert value == md5_int(key)
    assert 0 <= value <= MAX_HASH_KEY


def test_hash_key_of_non_ascii_key_hashes_its_utf8_bytes() -> None:
    # GIVEN a key with characters outside ASCII and outside the BMP
    key = "café-\N{GRINNING FACE}"
    # WHEN its hash key is computed
    # THEN it is the MD5 of its UTF-8 bytes, the bytes Kinesis receives
    assert hash_key_of(key) == md5_int(key)


def test_explicit_hash_key_routes_by_the_routing_key_when_given() -> None:
    # GIVEN a message with a routing key
    message = Message("order-1", b"x", routing_key="customer-9")
    # WHEN its explicit hash key is computed
    # THEN it is the routing key's MD5, so it lands where the routing key would have
    assert explicit_hash_key(message) == str(md5_int("customer-9"))


def test_explicit_hash_key_routes_by_the_key_without_routing_key() -> None:
    # GIVEN a message without a routing key
    message = Message("order-1", b"x")
    # WHEN its explicit hash key is computed
    # THEN it is the key's MD5: the same shard as a plain partition-key put
    assert explicit_hash_key(message) == str(md5_int("order-1"))


@given(key=utf8_text, routing=st.none() | utf8_text)
def test_explicit_hash_key_is_a_decimal_within_the_hash_range(
    key: str, routing: str | None
) -> None:
    # GIVEN any valid key and optional routing key
    # WHEN its explicit hash key is computed
    value = explicit_hash_key(Message(key, b"", routing))
    # THEN it is a plain decimal string (the PutRecords format) within [0, 2**128 - 1]
    assert value.isdigit()
    assert 0 <= int(value) <= MAX_HASH_KEY


# --- payload digest -----------------------------------------------------------------------------


def test_same_data_and_routing_give_the_same_digest() -> None:
    # GIVEN the same payload sent twice (a replayed Spark batch)
    # WHEN both digests are computed
    # THEN they are equal: the second is a DUPLICATE, not a CONFLICT
    assert payload_digest(b"data", "123") == payload_digest(b"data", "123")


def test_digest_differs_when_data_differs() -> None:
    # GIVEN a key reused for other data
    # WHEN digests are computed
    # THEN they differ: the reuse is reported as a CONFLICT
    assert payload_digest(b"data-1", "123") != payload_digest(b"data-2", "123")


def test_digest_differs_when_routing_differs() -> None:
    # GIVEN the same data sent under two routing keys
    first = Message("k", b"data", routing_key="tenant-a")
    second = Message("k", b"data", routing_key="tenant-b")
    # WHEN digests are computed
    # THEN they differ: it would land on another shard, so it is not the same message
    assert payload_digest(b"data", explicit_hash_key(first)) != payload_digest(
        b"data", explicit_hash_key(second)
    )


def test_digest_does_not_confuse_routing_digits_with_data() -> None:
    # GIVEN two payloads whose routing + data concatenate to the same bytes
    # WHEN digests are computed
    # THEN they differ: the two parts are framed apart
    assert payload_digest(b"23", "1") != payload_digest(b"3", "12")


def test_digest_is_sha256_hex() -> None:
    # GIVEN any payload
    # WHEN its digest is computed
    digest = payload_digest(b"data", "123")
    # THEN it is 64 lowercase hex characters, fit for a ledger attribute and for comparison
    assert len(digest) == 64
    assert set(digest) <= set("0123456789abcdef")


@given(
    data_a=st.binary(max_size=32),
    data_b=st.binary(max_size=32),
    hash_a=st.integers(0, MAX_HASH_KEY),
    hash_b=st.integers(0, MAX_HASH_KEY),
)
def test_digest_is_equal_only_for_equal_data_and_routing(
    data_a: bytes, data_b: bytes, hash_a: int, hash_b: int
) -> None:
    # GIVEN any two (data, routing hash key) pairs
    # WHEN their digests are computed
    # THEN they are equal exactly when both parts are equal
    same = (data_a, hash_a) == (data_b, hash_b)
    assert (payload_digest(data_a, str(hash_a)) == payload_digest(data_b, str(hash_b))) is same


def test_a_prepared_message_is_put_under_its_key_routed_by_its_routing_key() -> None:
    # GIVEN a message with a routing key, prepared for sending
    (item,), _ = prepare([Message("order-1", b"{}", routing_key="customer-7")], 1024)
    # WHEN its PutRecords entry is built
    entry = item.entry()
    # THEN the message key is the partition key and the routing key's MD5 routes it
    assert entry == {
        "Data": b"{}",
        "PartitionKey": "order-1",
        "ExplicitHashKey": str(hash_key_of("customer-7")),
    }


def test_an_entry_without_an_explicit_hash_key_is_routed_by_its_partition_key() -> None:
    # GIVEN no explicit hash key
    # WHEN an entry is built
    # THEN it carries none: Kinesis routes it by the MD5 of its partition key
    assert put_entry("k", b"x") == {"Data": b"x", "PartitionKey": "k"}
