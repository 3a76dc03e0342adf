"""``InMemoryClaimLedger``: the key claims of :class:`dedupe_store.contract.ClaimLedger` in a
dict, the part of :class:`fakes.ledger.InMemoryLedger` that keeps them.

Same conditional semantics as :class:`dedupe_store.claims.DynamoDBClaimLedger`::

    claim:          key absent, RELEASED or past its TTL        ──> CLAIMED #n+1 in group G
    take over key:  CLAIMED and attempt = seen and group = seen ──> CLAIMED #seen+1 in G2
    release / mark unverifiable: CLAIMED and attempt = seen and group = seen

It claims one key a request, as a backend without PartiQL batches does (none pending). It
shares the ledger's lock (reentrant), its fault knobs and its conditional write.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Sequence

from dedupe_store import batch_claims
from dedupe_store.errors import LedgerError
from dedupe_store.names import check_stream_name
from dedupe_store.records import (
    ClaimRequest,
    ClaimResult,
    Group,
    KeyClaim,
    KeyUpdate,
    PendingClaim,
)
from dedupe_store.states import KeyState, KeyTransition, next_key_state
from fakes.items import ConditionalWrite, require


class InMemoryClaimLedger:
    """Key claims. Thread-safe: the ledger's lock around every call."""

    def __init__(
        self,
        lock: threading.RLock,
        read_fault: Callable[..., None],
        write: ConditionalWrite,
        claim_one: Callable[[ClaimRequest, Group, int], ClaimResult],
        *,
        dedupe_ttl_s: int,
    ) -> None:
        """``read_fault``: raises the fault injected on the ledger for a call (on a key), if
        any; ``write``: the ledger's conditional write (its faults, its token);
        ``claim_one``: the whole ledger's :meth:`claim`, which :meth:`insert_claims` makes of
        each key (a test's ledger may wrap it)."""
        self._lock = lock
        self._read_fault = read_fault
        self._write = write
        self._claim_one = claim_one
        self.dedupe_ttl_s = dedupe_ttl_s
        # (stream, key) -> the key's claim: read by the ledger's joins, under its lock
        self.claims: dict[tuple[str, str], KeyClaim] = {}

    # --- reads ------------------------------------------------------------------------------

    def get_claim(self, stream: str, key: str) -> KeyClaim | None:
        with self._lock:
            self._read_fault("get_claim", key)
            return self.claims.get((check_stream_name(stream), key))

    def batch_get_claims(self, stream: str, keys: Iterable[str]) -> dict[str, KeyClaim]:
        with self._lock:
            self._read_fault("batch_get_claims")
            return {
                key: claim for key in keys if (claim := self.claims.get((stream, key))) is not None
            }

    # --- writes -----------------------------------------------------------------------------

    @property
    def claims_per_request(self) -> int:
        return 1

    def insert_claims(
        self, requests: Sequence[ClaimRequest], group: Group, *, now_ms: int
    ) -> list[ClaimResult | LedgerError | PendingClaim]:
        # a backend without PartiQL batches (dynalite's kind): one claim a key, none pending
        results: list[ClaimResult | LedgerError | PendingClaim] = []
        for request in requests:
            try:
                results.append(self._claim_one(request, group, now_ms))
            except LedgerError as exc:
                results.append(exc)
        return results

    @property
    def judged_per_request(self) -> int:
        return batch_claims.MAX_READS

    def judge_claims(
        self, pending: Sequence[PendingClaim], *, now_ms: int
    ) -> list[ClaimResult | LedgerError | ClaimRequest]:
        verdicts: list[ClaimResult | LedgerError | ClaimRequest] = []
        for start in range(0, len(pending), self.judged_per_request):
            read = pending[start : start + self.judged_per_request]
            with self._lock:
                try:
                    self._read_fault("judge_claims")
                except LedgerError as exc:
                    verdicts.extend([exc] * len(read))
                    continue
                verdicts.extend(
                    batch_claims.judged(
                        p, self.claims.get((p.request.stream, p.request.key)), now_ms=now_ms
                    )
                    for p in read
                )
        return verdicts

    def claim(self, request: ClaimRequest, group: Group, *, now_ms: int) -> ClaimResult:
        def claimable(current: KeyClaim | None) -> bool:
            # the DynamoDB condition, including its second granularity for the TTL
            return (
                current is None or current.state is KeyState.RELEASED or current.is_expired(now_ms)
            )

        def change(current: KeyClaim | None, token: str) -> KeyClaim:
            return KeyClaim(
                stream=request.stream,
                key=request.key,
                state=next_key_state(None, KeyTransition.CLAIM),
                attempt=(current.attempt if current is not None else 0) + 1,
                group_id=group.group_id,
                claimed_at_ms=now_ms,
                payload_digest=request.payload_digest,
                routing_hash_key=request.routing_hash_key,
                expires_at_s=now_ms // 1000 + self.dedupe_ttl_s,
                write_token=token,
                payload=request.payload or None,
            )

        applied, current = self._write_key("claim", request.stream, request.key, claimable, change)
        return ClaimResult.won(require(current)) if applied else ClaimResult.lost(current)

    def take_over_key(self, seen: KeyClaim, group: Group, *, now_ms: int) -> ClaimResult:
        next_key_state(seen.state, KeyTransition.TAKE_OVER)

        def change(current: KeyClaim | None, token: str) -> KeyClaim:
            return dataclasses.replace(
                require(current),
                attempt=seen.attempt + 1,
                group_id=group.group_id,
                claimed_at_ms=now_ms,
                expires_at_s=now_ms // 1000 + self.dedupe_ttl_s,
                write_token=token,
            )

        applied, current = self._write_key(
            "take_over_key", seen.stream, seen.key, _held(seen), change
        )
        return ClaimResult.won(require(current)) if applied else ClaimResult.lost(current)

    def release(self, seen: KeyClaim) -> KeyUpdate:
        return self._settle_key("release", seen, KeyTransition.RELEASE)

    def mark_unverifiable(self, seen: KeyClaim) -> KeyUpdate:
        return self._settle_key("mark_unverifiable", seen, KeyTransition.MARK_UNVERIFIABLE)

    def delete(self, stream: str, key: str) -> None:
        """Remove a key's item outright (tests only, like ``DynamoDBLedger.delete``)."""
        with self._lock:
            self.claims.pop((stream, key), None)

    def _settle_key(self, operation: str, seen: KeyClaim, transition: KeyTransition) -> KeyUpdate:
        target = next_key_state(seen.state, transition)

        def change(current: KeyClaim | None, token: str) -> KeyClaim:
            return dataclasses.replace(require(current), state=target, write_token=token)

        return KeyUpdate(*self._write_key(operation, seen.stream, seen.key, _held(seen), change))

    def _write_key(
        self,
        operation: str,
        stream: str,
        key: str,
        condition: Callable[[KeyClaim | None], bool],
        change: Callable[[KeyClaim | None, str], KeyClaim],
    ) -> tuple[bool, KeyClaim | None]:
        # a key is built here, as DynamoDBClaimLedger builds its item keys: the name is checked
        return self._write(
            operation, self.claims, (check_stream_name(stream), key), condition, change
        )


def _held(seen: KeyClaim) -> Callable[[KeyClaim | None], bool]:
    def condition(current: KeyClaim | None) -> bool:
        return (
            current is not None
            and current.state is KeyState.CLAIMED
            and current.attempt == seen.attempt
            and current.group_id == seen.group_id
        )

    return condition
