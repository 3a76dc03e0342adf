"""``/v1/streams/{stream}/messages``: the delivery state of keys, one or many at a time.

Keys are path segments that may themselves contain ``/`` (a key is any 1..256 Unicode
characters), so the route captures the rest of the path: ``{key:path}``. Clients percent-encode
the key (``%2F`` and a raw ``/`` both work; ``?``, ``#`` and ``%`` must be encoded). The server
decodes the path once, so ``a%2Fb`` and ``a/b`` name the same key. A key whose segments are
``.`` or ``..`` is normalised away by most HTTP clients: look such keys up with
``messages:lookup``, whose keys travel in the JSON body.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from api.deps import ClockDep, LedgerDep
from api.errors import UnknownKeyError
from api.problems import problem_responses
from api.routes.params import StreamName
from api.schemas import (
    LookupRequest,
    LookupResponse,
    LookupResult,
    MessageState,
)
from dedupe_store.records import MAX_KEY_CHARS

router = APIRouter(prefix="/v1/streams/{stream}", tags=["messages"])

KeyPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_KEY_CHARS,
        description=(
            f"the message key, 1..{MAX_KEY_CHARS} Unicode characters, percent-encoded; "
            "it may contain '/'"
        ),
        examples=["order-2024-000123"],
    ),
]


@router.post(
    "/messages:lookup",
    operation_id="lookupMessages",
    summary="Delivery state of up to 100 keys",
    response_description="one result per requested key, in request order",
    responses=problem_responses(422, 503),
)
def lookup_messages(
    *, stream: StreamName, request: LookupRequest, ledger: LedgerDep, clock: ClockDep
) -> LookupResponse:
    """Consistent reads of every key (batched); a key the ledger does not hold has `found: false`."""
    records = ledger.batch_get(stream, request.keys)
    now_ms = clock.now_ms()
    results = []
    for key in request.keys:
        record = records.get(key)
        message = MessageState.from_record(record, now_ms=now_ms) if record else None
        results.append(LookupResult(key=key, found=record is not None, message=message))
    return LookupResponse(stream=stream, results=results)


@router.get(
    "/messages/{key:path}",
    operation_id="getMessage",
    summary="Delivery state of one key",
    response_description="where and when the key was delivered, or how far its delivery got",
    responses=problem_responses(404, 422, 503),
)
def get_message(
    *, stream: StreamName, key: KeyPath, ledger: LedgerDep, clock: ClockDep
) -> MessageState:
    """A consistent read of the key's ledger item: state, attempt, position, times, digest.

    Never the payload. A DELIVERED key past its dedupe TTL is still reported until DynamoDB's
    TTL deletes it (`dedupe_expires_at` is then in the past: the key may be sent again).
    """
    record = ledger.get(stream, key, consistent=True)
    if record is None:
        raise UnknownKeyError(stream, key)
    return MessageState.from_record(record, now_ms=clock.now_ms())
