"""Claims of new keys in batches: 25 PartiQL ``INSERT`` statements per ``BatchExecuteStatement``.

A claim (:meth:`dedupe_store.ledger.DynamoDBLedger.claim`) is one conditional ``UpdateItem``:
absent, RELEASED or past its TTL -> CLAIMED(attempt + 1, G). Most keys a producer sends are new,
and for a new key that write is an ``INSERT`` of the item an ``UpdateItem`` would have written
(attempt 1): an ``INSERT`` of a key that exists fails on its own (``DuplicateItem``), leaving the
item as it was. So a batch of ``INSERT`` s claims the new keys, one statement each, with each
statement's own result, at one request per 25 keys; every key that was not new is left pending
(:class:`PendingClaim`) and judged from its item, read 100 to a request (the pending keys of
several batches together: a resend of 500 delivered keys costs 20 batches and 5 reads), and
only those an ``UpdateItem`` could still claim (RELEASED, expired) take today's path, one write
each. The items written are the same, in the same states: a producer that claims one key at a
time and one that claims in batches share a table.

Pure: the statements, what each statement's result means, and what a pending claim's item
says (:func:`judged`). The ledger does the I/O.

::

    statement result ── none ────────────────────── WON: the item is the one it inserted
                     ├─ DuplicateItem ───────────── EXISTS: read it, judge it as a lost claim
                     ├─ throttled ───────────────── RETRY: that statement again, later
                     └─ anything else ───────────── UNKNOWN: it may have applied; read it
    a whole request ── throttled: RETRY every statement; failed in transport or a 5xx:
                       UNKNOWN every statement (read back, as a lost claim is)

    EXISTS or UNKNOWN: pending ── its item holds our token ───────── won (the INSERT applied)
                                ├─ absent, RELEASED, past its TTL ── claim it singly
                                └─ any other ─────────────────────── lost to its holder
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, TypeVar

from dedupe_store.records import ClaimRequest, ClaimResult, KeyClaim, PendingClaim
from dedupe_store.states import KeyState

__all__ = [
    "MAX_READS",
    "MAX_STATEMENTS",
    "StatementResult",
    "insert_statement",
    "judged",
    "result_of",
    "split",
]

_T = TypeVar("_T")

# BatchExecuteStatement's limit
MAX_STATEMENTS = 25
# BatchGetItem's limit: the pending claims judged from one read
MAX_READS = 100

# the attributes an UpdateItem claim of an absent key writes (dedupe_store.expressions CLAIM)
_FIELDS = (
    "pk",
    "state",
    "attempt",
    "group",
    "claimed_at_ms",
    "payload_digest",
    "routing_hash_key",
    "expires_at",
    "write_token",
)
_THROTTLED = frozenset(
    {"ProvisionedThroughputExceeded", "ThrottlingError", "RequestLimitExceeded", "Throttling"}
)
_DUPLICATE = frozenset({"DuplicateItem", "ConditionalCheckFailed"})


class StatementResult(StrEnum):
    WON = "won"
    EXISTS = "exists"
    RETRY = "retry"
    UNKNOWN = "unknown"


def _quoted(table: str) -> str:
    return json.dumps(table)  # a double-quoted identifier; table names have no quotes


def insert_statement(
    table: str,
    pk: str,
    request: ClaimRequest,
    *,
    group_id: str,
    now_ms: int,
    expires_at_s: int,
    token: str,
) -> dict[str, Any]:
    """One ``BatchStatementRequest``: the INSERT of the key item a won claim of an absent key
    writes (CLAIMED, attempt 1, the group, the digest, the routing key, the TTL, the token;
    and the payload when the request carries one)."""
    values: list[dict[str, Any]] = [
        {"S": pk},
        {"S": KeyState.CLAIMED.value},
        {"N": "1"},
        {"S": group_id},
        {"N": str(now_ms)},
        {"S": request.payload_digest},
        {"S": request.routing_hash_key},
        {"N": str(expires_at_s)},
        {"S": token},
    ]
    fields = list(_FIELDS)
    if request.payload:
        fields.append("payload")
        values.append({"B": request.payload})
    tuple_text = ", ".join(f"'{name}': ?" for name in fields)
    return {
        "Statement": f"INSERT INTO {_quoted(table)} VALUE {{{tuple_text}}}",
        "Parameters": values,
    }


def result_of(response: Mapping[str, Any]) -> StatementResult:
    """What one statement's response (``BatchStatementResponse``) means for its claim."""
    error = response.get("Error")
    if not error:
        return StatementResult.WON
    code = str(error.get("Code", ""))
    if code in _DUPLICATE:
        return StatementResult.EXISTS
    if code in _THROTTLED:
        return StatementResult.RETRY
    return StatementResult.UNKNOWN


def judged(
    pending: PendingClaim, current: KeyClaim | None, *, now_ms: int
) -> ClaimResult | ClaimRequest:
    """What a pending claim's key item (``current``, read consistently; None when absent)
    says: ours (it holds the INSERT's token: the statement applied though its answer was lost)
    is won; one a claim can take (absent, RELEASED, past its TTL, as ``x.CLAIMABLE`` says) is
    the request back, to claim singly; any other is lost to its holder."""
    if current is not None and current.write_token == pending.token:
        return ClaimResult.won(current)
    if current is None or current.state is KeyState.RELEASED or current.is_expired(now_ms):
        return pending.request
    return ClaimResult.lost(current)


def split(items: Sequence[_T]) -> list[Sequence[_T]]:
    """``items`` in batches of at most 25 (a batch's statements), in order."""
    return [items[i : i + MAX_STATEMENTS] for i in range(0, len(items), MAX_STATEMENTS)]
