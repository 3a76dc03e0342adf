"""``/v1/streams/{stream}/in-flight``: the claims in flight, from the sparse in-flight index.

The index holds keys only (KEYS_ONLY projection) and is eventually consistent, so each page's
keys are re-read with one batched consistent read: a claim delivered, released or taken over
since the index was read is left out (or, with ``stale=true``, kept only if its lease is still
expired). A page can therefore be shorter than ``limit``; the listing is complete when
``next_cursor`` is null.
"""

from __future__ import annotations

import dataclasses
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
        description="at most this many items per page",
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
    keys, next_cursor = read_in_flight_keys(ledger, start, limit=limit)
    records = ledger.batch_get(stream, keys) if keys else {}
    cut_off_ms = start.before_ms
    items = []
    for key in keys:
        record = records.get(key)
        if record is None or record.state is not LedgerState.IN_FLIGHT:
            continue  # settled since the index was read
        if cut_off_ms is not None and not record.lease_expired(cut_off_ms):
            continue  # taken over since: its new lease has not expired
        items.append(MessageState.from_record(record, now_ms=now_ms))
    as_of_ms = cut_off_ms if cut_off_ms is not None else now_ms
    return InFlightPage(
        stream=stream,
        stale_only=stale,
        as_of=from_epoch_ms(as_of_ms),
        items=items,
        next_cursor=next_cursor.encode() if next_cursor is not None else None,
    )


def read_in_flight_keys(
    ledger: LedgerReader, start: InFlightCursor, *, limit: int
) -> tuple[list[str], InFlightCursor | None]:
    """Up to ``limit`` keys from the index, walking buckets in order from ``start``."""
    keys: list[str] = []
    after = (
        (start.after_lease_ms, start.after_pk)
        if start.after_lease_ms is not None and start.after_pk is not None
        else None
    )
    for page, position in walk_in_flight(
        ledger,
        start.stream,
        before_ms=start.before_ms,
        page_limit=lambda: limit - len(keys),
        start=IndexPosition(start.bucket, after),
    ):
        keys.extend(page)
        if position is None:
            return keys, None
        if len(keys) >= limit:
            after_lease_ms, after_pk = position.after or (None, None)
            return keys, dataclasses.replace(
                start, bucket=position.bucket, after_lease_ms=after_lease_ms, after_pk=after_pk
            )
    return keys, None  # the index has no bucket at all
