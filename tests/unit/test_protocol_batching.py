"""Batching of prepared messages into PutRecords requests: 500 records and 5 MiB per request."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from kinesis_store.entries import (
    DEFAULT_MAX_RECORD_BYTES,
    MAX_PUT_REQUEST_BYTES,
    MAX_RECORDS_PER_PUT,
)
from producer.protocol import Message, PreparedMessage, batches


def item(index: int, data: bytes, key: str | None = None) -> PreparedMessage:
    # routing and digest do not matter to batching; only the size does
    return PreparedMessage(index, Message(key or f"k{index}", data), "0", "digest")


def sized(index: int, record_bytes: int) -> PreparedMessage:
    """A message whose record (key + data) is exactly ``record_bytes`` long."""
    key = f"k{index}"
    return item(index, b"\x00" * (record_bytes - len(key)), key)


def test_limits_are_those_of_putrecords() -> None:
    # GIVEN the protocol's constants
    # THEN they are the documented PutRecords limits
    assert MAX_RECORDS_PER_PUT == 500
    assert MAX_PUT_REQUEST_BYTES == 5 * 1024 * 1024
    assert DEFAULT_MAX_RECORD_BYTES == 1024 * 1024


def test_no_messages_make_no_requests() -> None:
    # GIVEN nothing to send
    # WHEN batched
    # THEN no request is made
    assert list(batches([])) == []


def test_501_small_records_make_a_request_of_500_and_one_of_1() -> None:
    # GIVEN 501 small records
    items = [item(i, b"x") for i in range(501)]
    # WHEN batched with the default limits
    sizes = [len(batch) for batch in batches(items)]
    # THEN no request exceeds 500 records
    assert sizes == [500, 1]


def test_exactly_500_records_make_one_request() -> None:
    # GIVEN exactly 500 small records
    # WHEN batched
    # THEN one request carries them all
    assert [len(b) for b in batches([item(i, b"x") for i in range(500)])] == [500]


def test_records_of_1_mib_make_requests_of_at_most_5_mib() -> None:
    # GIVEN six records of 1 MiB each (key + data), the largest a stream accepts by default
    payload = b"\x00" * (DEFAULT_MAX_RECORD_BYTES - 1)
    items = [item(i, payload, key="k") for i in range(6)]
    # WHEN batched
    result = list(batches(items))
    # THEN five fill a request to exactly 5 MiB, and the sixth goes in the next request
    assert [len(b) for b in result] == [5, 1]
    assert sum(i.record_bytes for i in result[0]) == MAX_PUT_REQUEST_BYTES


def test_a_record_that_would_cross_5_mib_starts_the_next_request() -> None:
    # GIVEN records that reach 5 MiB minus one byte, then a two-byte record
    first = sized(0, MAX_PUT_REQUEST_BYTES - 1)
    second = sized(1, 3)
    # WHEN batched
    result = list(batches([first, second]))
    # THEN the small record is not squeezed over the limit
    assert [[i.index for i in b] for b in result] == [[0], [1]]


@st.composite
def batching_case(draw: st.DrawFn) -> tuple[list[PreparedMessage], int, int]:
    max_records = draw(st.integers(1, 12))
    max_request_bytes = draw(st.integers(8, 400))
    # every record fits a request on its own, as validation guarantees (1 MiB <= 5 MiB)
    record_sizes = draw(st.lists(st.integers(3, max_request_bytes), max_size=60))
    return [sized(i, n) for i, n in enumerate(record_sizes)], max_records, max_request_bytes


@given(batching_case())
def test_every_batch_is_within_limits_in_order_and_nothing_is_lost(
    case: tuple[list[PreparedMessage], int, int],
) -> None:
    # GIVEN any records and any limits (scaled down: the rule is the same at 500 / 5 MiB)
    items, max_records, max_request_bytes = case
    # WHEN batched
    result = list(batches(items, max_records=max_records, max_request_bytes=max_request_bytes))
    # THEN no request is empty or over either limit
    for batch in result:
        assert 1 <= len(batch) <= max_records
        assert sum(i.record_bytes for i in batch) <= max_request_bytes
    # AND every record is sent once, in the order given
    assert [i.index for batch in result for i in batch] == [i.index for i in items]
    # AND a request is closed only when the next record would not fit (no needless requests)
    for batch, following in itertools.pairwise(result):
        size_with_next = sum(i.record_bytes for i in batch) + following[0].record_bytes
        assert len(batch) == max_records or size_with_next > max_request_bytes


@given(st.lists(st.binary(max_size=8), max_size=1200))
def test_default_limits_keep_order_and_cap_records(datas: list[bytes]) -> None:
    # GIVEN any number of small records
    items = [item(i, data) for i, data in enumerate(datas)]
    # WHEN batched with the default limits
    result = list(batches(items))
    # THEN each request holds at most 500 records and together they hold all, in order
    assert all(1 <= len(b) <= MAX_RECORDS_PER_PUT for b in result)
    assert [i.index for b in result for i in b] == list(range(len(datas)))


def test_batches_accepts_a_one_shot_iterator() -> None:
    # GIVEN records that arrive from a generator (read once)
    # WHEN batched
    result = list(batches(item(i, b"x") for i in range(3)))
    # THEN they are all batched
    assert [[i.index for i in b] for b in result] == [[0, 1, 2]]
