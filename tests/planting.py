"""Ledger states planted directly, the way a crashed or finished producer leaves them.

For tests that need a ledger in a given state without going through a producer: claims of a
producer that died before its put or before settling, deliveries at chosen positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dedupe_store.contract import Ledger
from dedupe_store.records import ClaimRequest, ClaimStatus, Group, KeyClaim, Position
from producer.protocol import Message, explicit_hash_key, payload_digest


def request_of(stream: str, message: Message, *, store_payload: bool = False) -> ClaimRequest:
    hash_key = explicit_hash_key(message)
    return ClaimRequest(
        stream,
        message.key,
        payload_digest(message.data, hash_key),
        hash_key,
        message.data if store_payload else None,
    )


def plant_claims(
    ledger: Ledger,
    stream: str,
    messages: Sequence[Message],
    *,
    owner: str,
    now_ms: int,
    lease_ms: int,
    store_payload: bool = False,
) -> tuple[Group, dict[str, KeyClaim]]:
    """A group opened and every message claimed for it, as a producer that then died leaves it."""
    group = ledger.open_group(
        stream, [m.key for m in messages], owner=owner, now_ms=now_ms, lease_ms=lease_ms
    )
    claims: dict[str, KeyClaim] = {}
    for message in messages:
        result = ledger.claim(
            request_of(stream, message, store_payload=store_payload), group, now_ms=now_ms
        )
        assert result.status is ClaimStatus.WON, result
        assert result.claim is not None
        claims[message.key] = result.claim
    return group, claims


def plant_delivery(
    ledger: Ledger, group: Group, positions: Mapping[str, Position], *, now_ms: int
) -> Group:
    """The group settled with ``positions``, as its producer would after its puts."""
    settled = ledger.record_positions(group, positions, settle=True, now_ms=now_ms)
    assert settled.applied, settled
    assert settled.current is not None
    return settled.current


def plant_requests(
    ledger: Ledger,
    requests: Sequence[ClaimRequest],
    *,
    owner: str,
    now_ms: int,
    lease_ms: int,
) -> tuple[Group, dict[str, KeyClaim]]:
    """A group opened and each request claimed for it, like ``plant_claims``, for tests that
    choose the digests and routing themselves. The requests are of one stream."""
    (stream,) = {request.stream for request in requests}
    keys = [request.key for request in requests]
    group = ledger.open_group(stream, keys, owner=owner, now_ms=now_ms, lease_ms=lease_ms)
    claims: dict[str, KeyClaim] = {}
    for request in requests:
        result = ledger.claim(request, group, now_ms=now_ms)
        assert result.status is ClaimStatus.WON, result
        assert result.claim is not None
        claims[request.key] = result.claim
    return group, claims
