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
from api.routes.in_flight import ListedGroup, read_in_flight_groups
from dedupe_store.ledger import group_pk
from dedupe_store.records import LedgerRecord

STREAM = "orders"
G1 = group_pk(STREAM, "g1")
OTHER_GROUP = group_pk("other", "g1")
NO_GROUP = group_pk(STREAM, "")


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
    group_id=st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True),
    data=st.data(),
)
def test_a_cursor_decodes_to_what_was_encoded(
    bucket: int, before_ms: int | None, group_id: str, data: st.DataObject
) -> None:
    after_lease_ms = None
    after_pk = None
    if data.draw(st.booleans()):
        upper = before_ms - 1 if before_ms is not None else MAX_EPOCH_MS
        after_lease_ms = data.draw(st.integers(0, upper))
        after_pk = group_pk(STREAM, group_id)  # the index holds groups (ledger schema v2)
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
        (_token({"v": 1, "s": STREAM, "b": 0, "t": None, "l": "5", "k": G1}), "not one"),
        # a key item's pk (the v1 index held keys) is not a place in the index of groups
        (_token({"v": 1, "s": STREAM, "b": 0, "t": None, "l": 5, "k": "orders#k"}), "not one"),
        (_token({"v": 1, "s": STREAM, "b": 0, "t": None, "l": 5, "k": OTHER_GROUP}), "not one"),
        (_token({"v": 1, "s": STREAM, "b": 0, "t": None, "l": 5, "k": NO_GROUP}), "not one"),
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
    token = _token({"v": 1, "s": STREAM, "b": 0, "t": 100, "l": 100, "k": G1})
    valid = _token({"v": 1, "s": STREAM, "b": 0, "t": 100, "l": 99, "k": G1})

    with pytest.raises(InvalidCursorError):
        decode_cursor(token, stream=STREAM, buckets=16, stale=True)
    assert decode_cursor(valid, stream=STREAM, buckets=16, stale=True).after_pk == G1


class ScriptedIndex:
    """Answers in_flight_page from fixed bucket contents: each bucket a list of OPEN groups
    (the keys each lists), at most ``page_cap`` groups per call.

    Not a ledger: only the index walk's inputs and outputs, to test the walk itself.
    """

    def __init__(
        self, buckets: dict[int, list[list[str]]], count: int, page_cap: int = 1000
    ) -> None:
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

    def last_run(self, stream: str) -> None:  # noqa: ARG002
        return None

    def in_flight_page(
        self,
        stream: str,
        bucket: int,
        *,
        before_ms: int | None,  # noqa: ARG002 - the script holds one listing
        limit: int,
        after_lease_ms: int | None = None,  # noqa: ARG002 - the group alone finds the place
        after_pk: str | None = None,
    ) -> tuple[list[str], tuple[int, str] | None]:
        self.calls.append((bucket, limit))
        groups = self.buckets.get(bucket, [])
        ids = [group_pk(stream, group_id_at(bucket, i)) for i in range(len(groups))]
        start = 0 if after_pk is None else ids.index(after_pk) + 1
        page = groups[start : start + min(limit, self.page_cap)]
        if not page:
            return [], None
        # like DynamoDB: a full page has a last key, even when nothing follows
        full = len(page) == limit or start + len(page) < len(groups)
        last = (start + len(page), ids[start + len(page) - 1]) if full else None
        return [key for group in page for key in group], last


def group_id_at(bucket: int, index: int) -> str:
    return f"g{bucket}-{index}"


def _walk(index: ScriptedIndex, limit: int) -> list[list[ListedGroup]]:
    pages: list[list[ListedGroup]] = []
    cursor: InFlightCursor | None = InFlightCursor(STREAM, 0, None)
    while cursor is not None:
        groups, cursor = read_in_flight_groups(index, cursor, limit=limit)
        pages.append(groups)
        assert len(pages) < 200
    return pages


@given(
    sizes=st.lists(st.lists(st.integers(1, 9), max_size=5), min_size=1, max_size=6),
    limit=st.integers(1, 10),
)
def test_the_walk_returns_every_group_once_in_bucket_order_and_pages_hold_whole_groups(
    sizes: list[list[int]], limit: int
) -> None:
    # GIVEN buckets of OPEN groups of 1 to 9 keys each
    buckets = {
        b: [[f"b{b}-g{g}-k{k}" for k in range(size)] for g, size in enumerate(groups)]
        for b, groups in enumerate(sizes)
    }
    index = ScriptedIndex(buckets, len(sizes))

    # WHEN the whole listing is walked
    pages = _walk(index, limit)

    # THEN every group comes once, whole, named, in bucket order
    listed = [group for page in pages for group in page]
    assert [group.keys for group in listed] == [g for b in range(len(sizes)) for g in buckets[b]]
    assert [group.group_id for group in listed] == [
        group_id_at(b, g) for b in range(len(sizes)) for g in range(len(buckets[b]))
    ]
    # a page stops at the first group that reaches the limit: at most limit + largest - 1 keys
    largest = max((len(g) for groups in buckets.values() for g in groups), default=1)
    for page in pages:
        counts = [len(group.keys) for group in page]
        assert sum(counts) <= limit + largest - 1
        assert sum(counts[:-1]) < limit
    # one group per index query: the page's size is decided group by group
    assert {asked for _, asked in index.calls} <= {1}


def test_the_walk_stops_after_the_group_that_reaches_the_limit_and_resumes_after_it() -> None:
    # GIVEN an empty bucket, a bucket with groups of 2, 3 and 1 keys, and one with 1 group
    index = ScriptedIndex({0: [], 1: [["a", "b"], ["c", "d", "e"], ["f"]], 2: [["g"]]}, 3)

    # WHEN pages of 3 are asked for
    first, cursor = read_in_flight_groups(index, InFlightCursor(STREAM, 0, None), limit=3)

    # THEN the first page holds the two groups it took to list 3 keys: 5 keys, cut at a group
    assert first == [ListedGroup("g1-0", ["a", "b"]), ListedGroup("g1-1", ["c", "d", "e"])]
    assert cursor == InFlightCursor(STREAM, 1, None, 2, group_pk(STREAM, "g1-1"))
    # AND the rest, short of the limit, is the last page
    second, cursor = read_in_flight_groups(index, cursor, limit=3)
    assert second == [ListedGroup("g1-2", ["f"]), ListedGroup("g2-0", ["g"])]
    assert cursor is None


def test_a_page_that_fills_on_the_last_group_may_be_followed_by_an_empty_one() -> None:
    # GIVEN one bucket with one group (DynamoDB names the last item of a full page even when
    # nothing follows)
    index = ScriptedIndex({0: [["a"]]}, 1)

    first, cursor = read_in_flight_groups(index, InFlightCursor(STREAM, 0, None), limit=1)
    assert first == [ListedGroup("g0-0", ["a"])]
    assert cursor is not None
    second, cursor = read_in_flight_groups(index, cursor, limit=1)
    assert (second, cursor) == ([], None)


def test_a_group_that_settled_since_the_index_was_read_lists_nothing_and_the_walk_goes_on() -> None:
    # GIVEN a group the index still holds but that lists no key when re-read (it settled)
    index = ScriptedIndex({0: [[], ["a"], []], 1: [["b"]]}, 2)

    # WHEN a page of 1 is asked for
    page, cursor = read_in_flight_groups(index, InFlightCursor(STREAM, 0, None), limit=1)

    # THEN the walk passed the empty group and stopped at the first key
    assert page == [ListedGroup("g0-0", []), ListedGroup("g0-1", ["a"])]
    assert cursor == InFlightCursor(STREAM, 0, None, 2, group_pk(STREAM, "g0-1"))
