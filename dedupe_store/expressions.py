"""The ledger's UpdateItem expressions, written once, from named parts.

Built as constant strings (values travel as ``ExpressionAttributeValues``) because the
claim and the mark are the hot path: two per message. Building them per call through
pynamodb's expression objects cost about 0.6 ms of CPU each (see docs/performance.md).

The timeline the conditions guard::

    claim:     absent ── or RELEASED ── or DELIVERED at or past its TTL second ──> IN_FLIGHT #n+1
    mark:      IN_FLIGHT and attempt = mine ─────────────────────────────────────> DELIVERED
    take over / release / mark unverifiable: IN_FLIGHT and attempt = seen
"""

from __future__ import annotations

import functools
from typing import Any

NAMES: dict[str, str] = {
    "#pk": "pk",
    "#stream": "stream",
    "#key": "msg_key",
    "#state": "state",
    "#attempt": "attempt",
    "#owner": "owner",
    "#claimed": "claimed_at_ms",
    "#lease": "lease_expires_at_ms",
    "#bucket": "inflight_bucket",
    "#digest": "payload_digest",
    "#routing": "routing_hash_key",
    "#shard": "shard_id",
    "#seq": "sequence_number",
    "#subseq": "sub_sequence_number",
    "#delivered": "delivered_at_ms",
    "#expires": "expires_at",
    "#payload": "payload",
    "#token": "write_token",
}

# --- conditions, from named parts ------------------------------------------------------------

KEY_ABSENT = "attribute_not_exists(#pk)"
RELEASED = "#state = :released"
DEDUPE_EXPIRED = "#expires <= :now_s"
CLAIMABLE = f"{KEY_ABSENT} OR {RELEASED} OR {DEDUPE_EXPIRED}"
HELD_UNDER_ATTEMPT = "#state = :in_flight AND #attempt = :seen"

# --- updates ----------------------------------------------------------------------------------

_CLAIM_SET = (
    "#stream = :stream, #key = :key, #state = :in_flight, "
    "#attempt = if_not_exists(#attempt, :zero) + :one, #owner = :owner, #claimed = :now, "
    "#lease = :lease, #bucket = :bucket, #digest = :digest, #routing = :routing, "
    "#token = :token"
)
_CLAIM_REMOVE = "#shard, #seq, #subseq, #delivered, #expires"
CLAIM = f"SET {_CLAIM_SET} REMOVE {_CLAIM_REMOVE}, #payload"
CLAIM_WITH_PAYLOAD = f"SET {_CLAIM_SET}, #payload = :payload REMOVE {_CLAIM_REMOVE}"

_MARK_SET = (
    "#state = :delivered, #shard = :shard, #seq = :seq, #delivered = :now, "
    "#expires = :expires, #token = :token"
)
_LEAVE_INDEX = "#bucket, #lease"
MARK = f"SET {_MARK_SET} REMOVE {_LEAVE_INDEX}, #payload, #subseq"
MARK_AGGREGATED = f"SET {_MARK_SET}, #subseq = :subseq REMOVE {_LEAVE_INDEX}, #payload"

TAKE_OVER = (
    "SET #attempt = :next, #owner = :owner, #claimed = :now, #lease = :lease, "
    "#bucket = :bucket, #token = :token"
)
SETTLE = f"SET #state = :target, #token = :token REMOVE {_LEAVE_INDEX}"


def s(value: str) -> dict[str, str]:
    return {"S": value}


def n(value: int) -> dict[str, str]:
    return {"N": str(value)}


@functools.cache
def names_in(*expressions: str) -> dict[str, str]:
    """Only the names an expression uses: DynamoDB refuses unused ones."""
    text = " ".join(expressions)
    return {alias: name for alias, name in NAMES.items() if alias in _tokens(text)}


def _tokens(text: str) -> set[str]:
    out: set[str] = set()
    for raw in text.replace(",", " ").replace("(", " ").replace(")", " ").split():
        if raw.startswith("#"):
            out.add(raw)
    return out


def update_kwargs(
    table: str,
    pk: str,
    update: str,
    condition: str,
    values: dict[str, Any],
) -> dict[str, Any]:
    return {
        "TableName": table,
        "Key": {"pk": s(pk)},
        "UpdateExpression": update,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": names_in(update, condition),
        "ExpressionAttributeValues": values,
        "ReturnValues": "ALL_NEW",
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
