"""The in-flight listing's cursor and its walk over the index buckets: pure, no sockets."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.cursor import InFlightCursor, InvalidCursorError, decode_cursor
from api.routes.in_flight import read_in_flight_keys
from dedupe_store.records import LedgerRecord

STREAM = "orders"


def _token(body: dict[str, Any]) -> str:
    raw = json.dumps(body).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@given(
    bucket=st.integers(0, 15),
    before_ms=st.one_of(st.none(), st.integers(1, 2**62)),
    key=st.text(min_size=1, max_size=256),
    data=st.data(),
)
def test_a_cursor_decodes_to_what_was_encoded(
    bucket: int, before_ms: int | None, key: str, data: st.DataObject
) -> None:
    after_lease_ms = None
    after_pk = None
    if data.draw(st.booleans()):
        upper = before_ms - 1 if before_ms is not None else 2**62
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
