"""``DynamoDBClaimLedger``: key claims, one by one or in batches, on the ledger's table.

Its kind of item::

    key item    pk "<stream>#<key>"                  state, attempt, group, digest, routing, TTL

A claim is one conditional write of a key item (no index attribute: 1 write unit under 1 KB);
so are a take-over, a release and a mark of UNVERIFIABLE, each conditional on the attempt and
group the caller holds (:class:`dedupe_store.table.DynamoDBTable`'s update, whose token
recognises an SDK retry of an applied write). Where the backend runs PartiQL batches, new keys
are claimed 25 to a request (:mod:`dedupe_store.batch_claims`) and the keys a batch left
pending judged from their items, 100 to a read. The conditions are in
:mod:`dedupe_store.expressions`, the transitions in :mod:`dedupe_store.states`.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dedupe_store import batch_claims
from dedupe_store import expressions as x
from dedupe_store.batch_claims import StatementResult
from dedupe_store.errors import (
    DYNAMODB_THROTTLING_CODES,
    LedgerError,
    LedgerThrottledError,
    LedgerUnavailableError,
)
from dedupe_store.expressions import TTL_ATTRIBUTE
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
from dedupe_store.table import (
    BATCH_PAUSE_S,
    VENDOR_ERRORS,
    DynamoDBTable,
    binary_of,
    code_of,
    text_of,
)

if TYPE_CHECKING:
    from dedupe_store.contract import ClaimLedger

__all__ = ["ClaimsHandedOn", "DynamoDBClaimLedger", "claim_of", "ledger_pk"]

log = logging.getLogger(__name__)

# what a backend without PartiQL batches answers BatchExecuteStatement (dynalite: the first)
_NO_PARTIQL = frozenset({"UnknownOperationException", "ValidationException"})
# rounds of a batch's throttled statements (the pause before the second: BATCH_PAUSE_S)
_INSERT_ROUNDS = 4


def ledger_pk(stream: str, key: str) -> str:
    # built from a stream name that passed the rule (no "/", no "#"): never another kind's key
    return f"{check_stream_name(stream)}#{key}"


class DynamoDBClaimLedger:
    """The key claims of :class:`dedupe_store.contract.ClaimLedger` on the ledger's table.
    Thread-safe: :class:`dedupe_store.ledger.DynamoDBLedger` holds one and hands its calls on."""

    def __init__(
        self,
        table: DynamoDBTable,
        *,
        dedupe_ttl_s: int,
        batch_claims: bool | None,
        pause: Callable[[float], None] = time.sleep,
    ) -> None:
        """``batch_claims``: whether the backend runs PartiQL batches (new keys claimed 25 to
        a request: :meth:`insert_claims`); None learns it from the first batch's answer.
        ``pause``: what waits before a batch's throttled statements are sent again."""
        self._table = table
        self.dedupe_ttl_s = dedupe_ttl_s
        self.batch_claims = batch_claims
        self._pause = pause

    # --- reads ------------------------------------------------------------------------------

    def get_claim(self, stream: str, key: str, *, consistent: bool = True) -> KeyClaim | None:
        """The key's claim, None if it has no item; ``consistent``: a strongly consistent
        read (an eventually consistent one costs half)."""
        item = self._table.get_item(ledger_pk(stream, key), key, "get a key", consistent=consistent)
        return None if item is None else claim_of(item)

    def batch_get_claims(self, stream: str, keys: Iterable[str]) -> dict[str, KeyClaim]:
        items = self._table.batch_get_items([ledger_pk(stream, key) for key in keys], "get keys")
        claims = (claim_of(item) for item in items)
        return {claim.key: claim for claim in claims}

    # --- keys -------------------------------------------------------------------------------

    def claim(self, request: ClaimRequest, group: Group, *, now_ms: int) -> ClaimResult:
        """Claim a key for ``group``, if it is absent, RELEASED, or past its dedupe TTL."""
        state = next_key_state(None, KeyTransition.CLAIM)
        values: dict[str, Any] = {
            ":claimed": x.s(state.value),
            ":released": x.s(KeyState.RELEASED.value),
            ":zero": x.n(0),
            ":one": x.n(1),
            ":group": x.s(group.group_id),
            ":now": x.n(now_ms),
            ":now_s": x.n(now_ms // 1000),
            ":expires": x.n(now_ms // 1000 + self.dedupe_ttl_s),
            ":digest": x.s(request.payload_digest),
            ":routing": x.s(request.routing_hash_key),
        }
        update = x.CLAIM
        if request.payload:
            update = x.CLAIM_WITH_PAYLOAD
            values[":payload"] = x.b(request.payload)
        # A won claim wrote every attribute of the item but its attempt, so DynamoDB is asked
        # for the old values only (none for a new key) rather than the whole new item: the
        # response every message waits for stays empty, and botocore parses nothing.
        applied, item = self._table.update(
            ledger_pk(request.stream, request.key),
            request.key,
            update,
            x.CLAIMABLE,
            values,
            returns="UPDATED_OLD",
        )
        if not applied:
            return ClaimResult.lost(None if item is None else claim_of(item))
        if item is not None and "pk" in item:
            return ClaimResult.won(claim_of(item))  # a retry of ours: the item as it is
        before = item or {}
        return ClaimResult.won(
            KeyClaim(
                stream=request.stream,
                key=request.key,
                state=state,
                attempt=int(before["attempt"]["N"]) + 1 if "attempt" in before else 1,
                group_id=group.group_id,
                claimed_at_ms=now_ms,
                payload_digest=request.payload_digest,
                routing_hash_key=request.routing_hash_key,
                expires_at_s=now_ms // 1000 + self.dedupe_ttl_s,
                write_token=values[":token"]["S"],
                payload=request.payload or None,
            )
        )

    def take_over_key(self, seen: KeyClaim, group: Group, *, now_ms: int) -> ClaimResult:
        """CLAIMED(n, G) -> CLAIMED(n + 1, ``group``), conditional on the attempt and group seen."""
        next_key_state(seen.state, KeyTransition.TAKE_OVER)
        values = {
            **_key_held(seen),
            ":next": x.n(seen.attempt + 1),
            ":group": x.s(group.group_id),
            ":now": x.n(now_ms),
            ":expires": x.n(now_ms // 1000 + self.dedupe_ttl_s),
        }
        applied, item = self._table.update(
            ledger_pk(seen.stream, seen.key), seen.key, x.TAKE_OVER_KEY, x.KEY_HELD, values
        )
        current = None if item is None else claim_of(item)
        return ClaimResult.won(_require(current)) if applied else ClaimResult.lost(current)

    def release(self, seen: KeyClaim) -> KeyUpdate:
        """CLAIMED -> RELEASED: not in the stream and no data to resend."""
        return self._settle_key(seen, KeyTransition.RELEASE)

    def mark_unverifiable(self, seen: KeyClaim) -> KeyUpdate:
        """CLAIMED -> UNVERIFIABLE: the read-back window reaches past the stream's retention."""
        return self._settle_key(seen, KeyTransition.MARK_UNVERIFIABLE)

    def _settle_key(self, seen: KeyClaim, transition: KeyTransition) -> KeyUpdate:
        target = next_key_state(seen.state, transition)
        values = {":target": x.s(target.value), **_key_held(seen)}
        applied, item = self._table.update(
            ledger_pk(seen.stream, seen.key), seen.key, x.SETTLE_KEY, x.KEY_HELD, values
        )
        return KeyUpdate(applied, None if item is None else claim_of(item))

    def delete(self, stream: str, key: str) -> None:
        """Remove a key's item outright (tests and operators only; the protocol never deletes)."""
        with self._table.translated("delete", key):
            self._table.client.delete_item(
                TableName=self._table.table_name, Key={"pk": x.s(ledger_pk(stream, key))}
            )

    # --- claims in batches (dedupe_store.batch_claims) ----------------------------------------

    @property
    def claims_per_request(self) -> int:
        """How many claims :meth:`insert_claims` puts in one request: 25 where the backend runs
        PartiQL batches (or it is not known yet), 1 where it does not."""
        return 1 if self.batch_claims is False else batch_claims.MAX_STATEMENTS

    @property
    def judged_per_request(self) -> int:
        """How many pending claims :meth:`judge_claims` reads in one request (BatchGetItem's
        limit)."""
        return batch_claims.MAX_READS

    def insert_claims(
        self, requests: Sequence[ClaimRequest], group: Group, *, now_ms: int
    ) -> list[ClaimResult | LedgerError | PendingClaim]:
        """New keys INSERTed 25 to a request (statements throttled are sent again, up to
        ``_INSERT_ROUNDS`` rounds); a key whose INSERT failed (it exists) or may have applied
        is left pending, for :meth:`judge_claims`. Without PartiQL (dynalite), one claim each:
        none pending."""
        if self.batch_claims is False:
            return [self._claim_or_error(r, group, now_ms=now_ms) for r in requests]
        results: dict[int, ClaimResult | LedgerError | PendingClaim] = {}
        tokens = {index: secrets.token_hex(8) for index in range(len(requests))}
        pending = list(range(len(requests)))
        for round_number in range(_INSERT_ROUNDS):
            if not pending:
                break
            if round_number:
                self._pause(BATCH_PAUSE_S * 2 ** (round_number - 1))  # statements throttled
            throttled: list[int] = []
            for batch in batch_claims.split(pending):
                answers = self._insert(batch, requests, tokens, group, now_ms)
                if answers is None:  # no PartiQL here: one claim each, from now on
                    return [
                        results.get(i) or self._claim_or_error(r, group, now_ms=now_ms)
                        for i, r in enumerate(requests)
                    ]
                for index, answer in zip(batch, answers, strict=True):
                    if answer is StatementResult.WON:
                        results[index] = ClaimResult.won(
                            self._inserted(requests[index], group, now_ms, tokens[index])
                        )
                    elif answer is StatementResult.RETRY:
                        throttled.append(index)
                    else:
                        results[index] = PendingClaim(requests[index], tokens[index])
            pending = throttled
        for index in pending:
            results[index] = LedgerThrottledError(
                "DynamoDB throttled a batched claim",
                table=self._table.table_name,
                key=requests[index].key,
            )
        return [results[index] for index in range(len(requests))]

    def judge_claims(
        self, pending: Sequence[PendingClaim], *, now_ms: int
    ) -> list[ClaimResult | LedgerError | ClaimRequest]:
        """Each pending claim judged from its key item (:func:`batch_claims.judged`), the
        items read consistently 100 to a BatchGetItem; a read that fails gives each of its
        keys its error."""
        verdicts: list[ClaimResult | LedgerError | ClaimRequest] = []
        for start in range(0, len(pending), batch_claims.MAX_READS):
            verdicts.extend(self._judge(pending[start : start + batch_claims.MAX_READS], now_ms))
        return verdicts

    def _insert(
        self,
        batch: Sequence[int],
        requests: Sequence[ClaimRequest],
        tokens: Mapping[int, str],
        group: Group,
        now_ms: int,
    ) -> list[StatementResult] | None:
        """One BatchExecuteStatement; each statement's result, or None when the backend runs
        no PartiQL (learned: :attr:`batch_claims` is then False)."""
        statements = [
            batch_claims.insert_statement(
                self._table.table_name,
                ledger_pk(requests[i].stream, requests[i].key),
                requests[i],
                group_id=group.group_id,
                now_ms=now_ms,
                expires_at_s=now_ms // 1000 + self.dedupe_ttl_s,
                token=tokens[i],
            )
            for i in batch
        ]
        try:
            answer = self._table.client.batch_execute_statement(Statements=statements)
        except VENDOR_ERRORS as exc:
            code = code_of(exc)
            if code in _NO_PARTIQL and self.batch_claims is None:
                log.info("ledger backend runs no PartiQL batches: claims one by one (%s)", code)
                self.batch_claims = False
                return None
            if code in DYNAMODB_THROTTLING_CODES:
                return [StatementResult.RETRY] * len(batch)
            # in transport, or a 5xx: each statement may have applied; its item says
            return [StatementResult.UNKNOWN] * len(batch)
        self.batch_claims = True
        return [batch_claims.result_of(response) for response in answer["Responses"]]

    def _inserted(self, request: ClaimRequest, group: Group, now_ms: int, token: str) -> KeyClaim:
        """The key item an applied INSERT wrote."""
        return KeyClaim(
            stream=request.stream,
            key=request.key,
            state=KeyState.CLAIMED,
            attempt=1,
            group_id=group.group_id,
            claimed_at_ms=now_ms,
            payload_digest=request.payload_digest,
            routing_hash_key=request.routing_hash_key,
            expires_at_s=now_ms // 1000 + self.dedupe_ttl_s,
            write_token=token,
            payload=request.payload or None,
        )

    def _judge(
        self, pending: Sequence[PendingClaim], now_ms: int
    ) -> list[ClaimResult | LedgerError | ClaimRequest]:
        """One read's worth of pending claims (at most 100 keys: one BatchGetItem, its
        unprocessed keys asked again), judged."""
        pks = [ledger_pk(p.request.stream, p.request.key) for p in pending]
        try:
            items = self._table.batch_get_items(pks, "read keys a batch did not claim")
        except LedgerError as exc:
            return [exc] * len(pending)
        by_pk = {str(item["pk"]["S"]): claim_of(item) for item in items}
        return [
            batch_claims.judged(p, by_pk.get(pk), now_ms=now_ms)
            for p, pk in zip(pending, pks, strict=True)
        ]

    def _claim_or_error(
        self, request: ClaimRequest, group: Group, *, now_ms: int
    ) -> ClaimResult | LedgerError:
        try:
            return self.claim(request, group, now_ms=now_ms)
        except LedgerError as exc:
            return exc


def _key_held(seen: KeyClaim) -> dict[str, dict[str, str]]:
    return {
        ":claimed": x.s(KeyState.CLAIMED.value),
        ":seen": x.n(seen.attempt),
        ":seen_group": x.s(seen.group_id),
    }


def _require(claim: KeyClaim | None) -> KeyClaim:
    if claim is None:
        raise LedgerUnavailableError("DynamoDB returned no item for an applied update")
    return claim


def claim_of(item: Mapping[str, Any]) -> KeyClaim:
    """The claim a key item holds, from DynamoDB's wire format."""
    stream, _, key = str(item["pk"]["S"]).partition("#")
    payload = item.get("payload")
    return KeyClaim(
        stream=stream,
        key=key,
        state=KeyState(item["state"]["S"]),
        attempt=int(item["attempt"]["N"]),
        group_id=str(item["group"]["S"]),
        claimed_at_ms=int(item["claimed_at_ms"]["N"]),
        payload_digest=str(item["payload_digest"]["S"]),
        routing_hash_key=str(item["routing_hash_key"]["S"]),
        expires_at_s=int(item[TTL_ATTRIBUTE]["N"]),
        write_token=text_of(item, "write_token"),
        payload=binary_of(payload["B"]) if payload is not None else None,
    )


class ClaimsHandedOn:
    """The :class:`dedupe_store.contract.ClaimLedger` methods of a whole ledger, each handed
    on to its claims part (``_claim_ledger``): :class:`dedupe_store.ledger.DynamoDBLedger` and
    the tests' in-memory ledger both hold one."""

    _claim_ledger: ClaimLedger

    @property
    def claims_per_request(self) -> int:
        return self._claim_ledger.claims_per_request

    @property
    def judged_per_request(self) -> int:
        return self._claim_ledger.judged_per_request

    def claim(self, request: ClaimRequest, group: Group, *, now_ms: int) -> ClaimResult:
        return self._claim_ledger.claim(request, group, now_ms=now_ms)

    def insert_claims(
        self, requests: Sequence[ClaimRequest], group: Group, *, now_ms: int
    ) -> list[ClaimResult | LedgerError | PendingClaim]:
        return self._claim_ledger.insert_claims(requests, group, now_ms=now_ms)

    def judge_claims(
        self, pending: Sequence[PendingClaim], *, now_ms: int
    ) -> list[ClaimResult | LedgerError | ClaimRequest]:
        return self._claim_ledger.judge_claims(pending, now_ms=now_ms)

    def get_claim(self, stream: str, key: str) -> KeyClaim | None:
        return self._claim_ledger.get_claim(stream, key)

    def batch_get_claims(self, stream: str, keys: Iterable[str]) -> dict[str, KeyClaim]:
        return self._claim_ledger.batch_get_claims(stream, keys)

    def take_over_key(self, seen: KeyClaim, group: Group, *, now_ms: int) -> ClaimResult:
        return self._claim_ledger.take_over_key(seen, group, now_ms=now_ms)

    def release(self, seen: KeyClaim) -> KeyUpdate:
        return self._claim_ledger.release(seen)

    def mark_unverifiable(self, seen: KeyClaim) -> KeyUpdate:
        return self._claim_ledger.mark_unverifiable(seen)
