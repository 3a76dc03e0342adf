"""``/v1/streams/{stream}/in-flight``: the claims in flight, from the sparse in-flight index.

Ledger schema v2: the index holds the OPEN claim groups (KEYS_ONLY projection, by lease expiry
within each bucket), and a group lists the keys its producer sent together, up to 500. The
listing walks the index one group at a time and stops once ``limit`` keys are listed, so a
page ends at a group boundary: **a page holds whole groups, and may hold up to limit + 499
items** (one more group than fits). The cursor is the index position of the page's last group.

The index is eventually consistent and a group lists keys it may not hold (a claim lost to
another producer, a key taken over into another group), so each page's keys are re-read with
one batched consistent read: a key is listed only while it is IN_FLIGHT *and* held by the
group that listed it, so a key listed by two open groups appears once. A claim delivered,
released or taken over since the index was read is left out (with ``stale=true``, a claim is
kept only if its lease is still expired). A page can therefore be shorter than ``limit``, even
empty; the listing is complete when ``next_cursor`` is null.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from api.cursor import (
    CURSOR_PATTERN,
    MAX_CURSOR_CHARS,
    InFlightCursor,
    InvalidCursorError,
    decode_cursor,
)
from api.deps import ClockDep, LedgerDep
from api.problems import problem_responses
from api.routes.params import StreamName
from api.schemas import InFlightPage, MessageState, from_epoch_ms
from dedupe_store.contract import LedgerReader
from dedupe_store.inflight import IndexPosition, walk_in_flight
from dedupe_store.ledger import group_pk
from dedupe_store.states import LedgerState

MAX_PAGE_LIMIT = 500
DEFAULT_PAGE_LIMIT = 100

router = APIRouter(prefix="/v1/streams/{stream}", tags=["in-flight"])


class InFlightQuery(BaseModel):
    """The listing's query parameters.

    Unknown ones are refused: a typo such as ``stal=true`` would otherwise list every claim
    instead of the stale ones.
    """

    model_config = ConfigDict(extra="forbid")

    stale: bool = Field(
        default=False,
        description=(
            "true: only claims whose lease has expired (the put can no longer land; "
            "read-back will resolve them)"
        ),
    )
    limit: int = Field(
        default=DEFAULT_PAGE_LIMIT,
        ge=1,
        le=MAX_PAGE_LIMIT,
        description=(
            "list claim groups until this many keys are listed: a page holds whole groups "
            "(up to 500 keys each), so it may hold up to limit + 499 items"
        ),
    )
    cursor: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CURSOR_CHARS,
        pattern=CURSOR_PATTERN,
        description=(
            "next_cursor of the previous page; omit for the first page. Opaque: URL-safe "
            "base64 without padding, as the API returned it; a cursor it did not issue for "
            "this listing (another stream, another stale value, altered) is refused with 422"
        ),
    )


@router.get(
    "/in-flight",
    operation_id="listInFlight",
    summary="Claims in flight, paginated",
    response_description="one page of in-flight claims and the cursor of the next",
    responses=problem_responses(422, 503),
)
def list_in_flight(
    *,
    stream: StreamName,
    query: Annotated[InFlightQuery, Query()],
    ledger: LedgerDep,
    clock: ClockDep,
) -> InFlightPage:
    """Claims in flight in lease-expiry order within each index bucket."""
    stale, limit, cursor = query.stale, query.limit, query.cursor
    now_ms = clock.now_ms()
    if cursor is None:
        start = InFlightCursor(stream=stream, bucket=0, before_ms=now_ms if stale else None)
    else:
        try:
            start = decode_cursor(
                cursor, stream=stream, buckets=ledger.inflight_buckets, stale=stale
            )
        except InvalidCursorError as exc:
            raise RequestValidationError(
                [{"loc": ("query", "cursor"), "msg": str(exc), "type": "invalid_cursor"}]
            ) from exc
    groups, next_cursor = read_in_flight_groups(ledger, start, limit=limit)
    keys = list(dict.fromkeys(key for group in groups for key in group.keys))
    records = ledger.batch_get(stream, keys) if keys else {}
    cut_off_ms = start.before_ms
    items = []
    listed: set[str] = set()
    for group in groups:
        for key in group.keys:
            record = records.get(key)
            if key in listed or record is None or record.state is not LedgerState.IN_FLIGHT:
                continue  # listed already, or settled since the index was read
            if group.group_id is not None and record.group_id != group.group_id:
                continue  # another group holds the key: it is listed under that one
            if cut_off_ms is not None and not record.lease_expired(cut_off_ms):
                continue  # renewed or taken over since: its new lease has not expired
            listed.add(key)
            items.append(MessageState.from_record(record, now_ms=now_ms))
    as_of_ms = cut_off_ms if cut_off_ms is not None else now_ms
    return InFlightPage(
        stream=stream,
        stale_only=stale,
        as_of=from_epoch_ms(as_of_ms),
        items=items,
        next_cursor=next_cursor.encode() if next_cursor is not None else None,
    )


@dataclass(frozen=True, slots=True)
class ListedGroup:
    """One OPEN group of the index and the keys it lists (none when it settled since the
    index was read). ``group_id`` is None only if the ledger did not say where its page ended."""

    group_id: str | None
    keys: list[str]


def read_in_flight_groups(
    ledger: LedgerReader, start: InFlightCursor, *, limit: int
) -> tuple[list[ListedGroup], InFlightCursor | None]:
    """Groups from the index, one at a time, walking buckets in order from ``start``, until
    ``limit`` keys are listed: whole groups, at most ``limit`` + 499 keys, and the cursor after
    the last group. One group per index query keeps the page bounded (a query's page is
    returned as one list of keys) and names the group each key was listed by."""
    groups: list[ListedGroup] = []
    listed = 0
    after = (
        (start.after_lease_ms, start.after_pk)
        if start.after_lease_ms is not None and start.after_pk is not None
        else None
    )
    for keys, position in walk_in_flight(
        ledger,
        start.stream,
        before_ms=start.before_ms,
        page_limit=lambda: 1,
        start=IndexPosition(start.bucket, after),
    ):
        listed += len(keys)
        # a page that ends a bucket does not say which group it read: its keys are listed
        # under no group (each is shown only while a group holds it)
        last = position.after if position is not None else None
        if keys or last is not None:
            groups.append(ListedGroup(_group_id(start.stream, last[1]) if last else None, keys))
        if position is None:
            return groups, None
        if listed >= limit:
            after_lease_ms, after_pk = position.after or (None, None)
            return groups, dataclasses.replace(
                start, bucket=position.bucket, after_lease_ms=after_lease_ms, after_pk=after_pk
            )
    return groups, None  # the index has no bucket at all


def _group_id(stream: str, pk: str) -> str | None:
    prefix = group_pk(stream, "")
    return pk[len(prefix) :] if pk.startswith(prefix) and len(pk) > len(prefix) else None
