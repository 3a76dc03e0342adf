"""The in-flight listing's cursor and its walk over the index buckets: pure, no sockets."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.cursor import (
    CURSOR_PATTERN,
    MAX_EPOCH_MS,
    InFlightCursor,
    InvalidCursorError,
    decode_cursor,
)
from api.routes.in_flight import read_in_flight_keys
from dedupe_store.records import LedgerRecord

STREAM = "orders"


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**60), 10**60)
    | st.floats(allow_nan=False)
    | st.text(max_size=300)
    | st.sampled_from([f"{STREAM}#", f"{STREAM}#k", 0, 1, 15, 16, MAX_EPOCH_MS]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=5,
)


def _token(body: dict[str, Any]) -> str:
    raw = json.dumps(body).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@given(
    bucket=st.integers(0, 15),
    before_ms=st.one_of(st.none(), st.integers(1, MAX_EPOCH_MS)),
    key=st.text(min_size=1, max_size=256),
    data=st.data(),
)
def test_a_cursor_decodes_to_what_was_encoded(
    bucket: int, before_ms: int | None, key: str, data: st.DataObject
) -> None:
    after_lease_ms = None
    after_pk = None
    if data.draw(st.booleans()):
        upper = before_ms - 1 if before_ms is not None else MAX_EPOCH_MS
        after_lease_ms = data.draw(st.integers(0, upper))
        after_pk = f"{STREAM}#{key}"
    cursor = InFlightCursor(STREAM, bucket, before_ms, after_lease_ms, after_pk)

    token = cursor.encode()

    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert decode_cursor(token, stream=STREAM, buckets=16, stale=before_ms is not None) == cursor


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("", "empty"),
        ("x" * 3000, "too long"),
        ("%%%", "not one this API issued"),
        (_token({"v": 2, "s": STREAM, "b": 0, "t": None, "l": None, "k": None}), "not one"),
        (_token({"v": 1, "s": "other", "b": 0, "t": None, "l": None, "k": None}), "another stream"),
        (_token({"v": 1, "s": STREAM, "b": 16, "t": None, "l": None, "k": None}), "bucket"),
        (_token({"v": 1, "s": STREAM, "b": -1, "t": None, "l": None, "k": None}), "bucket"),
        (_token({"v": 1, "s": STREAM, "b": True, "t": None, "l": None, "k": None}), "bucket"),
        (_token({"v": 1, "s": STREAM, "b": 0, "t": 5, "l": None, "k": None}), "stale=true"),
        (_token({"v": 1, "s": STREAM, "b": 0, "t": None, "l": 5, "k": None}), "not one"),
        (_token({"v": 1, "s": STREAM, "b": 0, "t": None, "l": 5, "k": "other#k"}), "not one"),
        (_token({"v": 1, "s": STREAM, "b": 0, "t": None, "l": "5", "k": "orders#k"}), "not one"),
        (_token([1, 2, 3]), "not one"),  # type: ignore[arg-type]
    ],
)
def test_a_cursor_not_issued_for_this_listing_is_refused_with_a_reason(
    token: str, reason: str
) -> None:
    with pytest.raises(InvalidCursorError, match=reason):
        decode_cursor(token, stream=STREAM, buckets=16, stale=False)


def _body(**fields: object) -> dict[str, object]:
    return {"v": 1, "s": STREAM, "b": 0, "t": None, "l": None, "k": None, **fields}


@pytest.mark.parametrize(
    ("body", "stale"),
    [
        (_body(t=10**15), True),
        (_body(t=10**50), True),
        (_body(t=-(10**50)), True),
        (_body(t=-1), True),
        (_body(t=MAX_EPOCH_MS + 1), True),
        (_body(t=1.5), True),
        (_body(l=10**50, k="orders#k"), False),
        (_body(l=-1, k="orders#k"), False),
        (_body(l=True, k="orders#k"), False),
        (_body(l=5, k="orders#"), False),
        (_body(l=5, k="orders#" + "k" * 257), False),
        (_body(l=5, k="orders#b\ud800"), False),
        (_body(l=5), False),
        (_body(k="orders#k"), False),
        (_body(b=10**50), False),
        (_body(v=True), False),
        (_body(v=1.0), False),
    ],
    ids=repr,
)
def test_a_forged_cursor_with_a_field_out_of_range_is_refused(
    body: dict[str, object], stale: bool
) -> None:
    # GIVEN a cursor with one field of the right name but outside what the API issues
    token = _token(body)
    # WHEN decoded, THEN it is refused as a cursor (a 422), never passed on
    with pytest.raises(InvalidCursorError):
        decode_cursor(token, stream=STREAM, buckets=16, stale=stale)


def test_a_cursor_nested_deeper_than_the_parser_goes_is_refused() -> None:
    with pytest.raises(InvalidCursorError):
        decode_cursor(_raw_token("[" * 1500), stream=STREAM, buckets=16, stale=False)


@given(body=st.dictionaries(st.sampled_from("vsbtlkx"), _JSON_VALUES))
def test_any_cursor_body_decodes_in_range_or_is_refused(body: dict[str, object]) -> None:
    # GIVEN any JSON object with the cursor's field names and any values
    token = _token({"v": 1, "s": STREAM, **body})
    # WHEN decoded
    try:
        cursor = decode_cursor(token, stream=STREAM, buckets=16, stale=body.get("t") is not None)
    except InvalidCursorError:
        return
    # THEN what is accepted is in range: a time a datetime holds, a key Kinesis could take
    for ms in (cursor.before_ms, cursor.after_lease_ms):
        assert ms is None or 0 <= ms <= MAX_EPOCH_MS
    if cursor.after_pk is not None:
        assert 1 <= len(cursor.after_pk.removeprefix(f"{STREAM}#")) <= 256


def test_every_issued_cursor_matches_the_published_pattern() -> None:
    cursor = InFlightCursor(STREAM, 3, MAX_EPOCH_MS, 0, f"{STREAM}#\N{GRINNING FACE}")
    assert re.fullmatch(CURSOR_PATTERN, cursor.encode())
    assert not re.fullmatch(CURSOR_PATTERN, "0")


def _raw_token(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def test_a_stale_cursor_past_its_own_cut_off_is_refused() -> None:
    # DynamoDB would reject the start key; the API refuses it before asking
    token = _token({"v": 1, "s": STREAM, "b": 0, "t": 100, "l": 100, "k": "orders#k"})

    with pytest.raises(InvalidCursorError):
        decode_cursor(token, stream=STREAM, buckets=16, stale=True)


class ScriptedIndex:
    """Answers in_flight_page from fixed bucket contents, ``page_cap`` keys per call at most.

    Not a ledger: only the index walk's inputs and outputs, to test the walk itself.
    """

    def __init__(self, buckets: dict[int, list[str]], count: int, page_cap: int = 1000) -> None:
        self.buckets = buckets
        self.inflight_buckets = count
        self.dedupe_ttl_s = 1
        self.page_cap = page_cap
        self.calls: list[tuple[int, int]] = []

    @property
    def table_name(self) -> str:
        return "scripted"

    def ensure_ready(self) -> None:
        return None

    # the reader's full signature, so this stands in for a ledger where the walk needs one
    def get(self, stream: str, key: str, *, consistent: bool = True) -> LedgerRecord | None:  # noqa: ARG002
        return None

    def batch_get(self, stream: str, keys: Iterable[str]) -> dict[str, LedgerRecord]:  # noqa: ARG002
        return {}

    def in_flight_page(
        self,
        stream: str,
        bucket: int,
        *,
        before_ms: int | None,  # noqa: ARG002 - the script holds one listing
        limit: int,
        after_lease_ms: int | None = None,  # noqa: ARG002 - the key alone finds the place
        after_pk: str | None = None,
    ) -> tuple[list[str], tuple[int, str] | None]:
        self.calls.append((bucket, limit))
        keys = self.buckets.get(bucket, [])
        start = 0 if after_pk is None else keys.index(after_pk.split("#", 1)[1]) + 1
        page = keys[start : start + min(limit, self.page_cap)]
        if not page:
            return [], None
        # like DynamoDB: a full page has a last key, even when nothing follows
        full = len(page) == limit or start + len(page) < len(keys)
        last = (start + len(page), f"{stream}#{page[-1]}") if full else None
        return page, last


def _walk(index: ScriptedIndex, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: InFlightCursor | None = InFlightCursor(STREAM, 0, None)
    while cursor is not None:
        keys, cursor = read_in_flight_keys(index, cursor, limit=limit)
        assert len(keys) <= limit
        pages.append(keys)
        assert len(pages) < 100
    return pages


@given(
    sizes=st.lists(st.integers(0, 7), min_size=1, max_size=6),
    limit=st.integers(1, 10),
    page_cap=st.integers(1, 10),
)
def test_the_walk_returns_every_key_once_in_bucket_order(
    sizes: list[int], limit: int, page_cap: int
) -> None:
    buckets = {b: [f"b{b}-{i}" for i in range(size)] for b, size in enumerate(sizes)}
    index = ScriptedIndex(buckets, len(sizes), page_cap)

    pages = _walk(index, limit)

    assert [key for page in pages for key in page] == [
        key for b in range(len(sizes)) for key in buckets[b]
    ]


def test_the_walk_stops_at_the_limit_inside_a_bucket_and_resumes_there() -> None:
    index = ScriptedIndex({0: [], 1: ["a", "b", "c"], 2: ["d"]}, 3)

    first, cursor = read_in_flight_keys(index, InFlightCursor(STREAM, 0, None), limit=2)

    assert first == ["a", "b"]
    assert cursor == InFlightCursor(STREAM, 1, None, 2, f"{STREAM}#b")
    second, cursor = read_in_flight_keys(index, cursor, limit=2)
    assert second == ["c", "d"]
    # a full page, as in DynamoDB, may be followed by an empty last one
    assert cursor is not None
    third, cursor = read_in_flight_keys(index, cursor, limit=2)
    assert (third, cursor) == ([], None)
    # never asks a bucket for more than the page still has room for
    assert all(asked <= 2 for _, asked in index.calls)
