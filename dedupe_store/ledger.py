"""``DynamoDBLedger``: the ledger's conditional transitions on DynamoDB, through pynamodb.

Every write is conditional on the state and attempt the caller expects, so two producers,
a producer and a reconciler, or two reconcilers can never both win. Conditions are built
from named parts; the timeline they guard::

    claim:     absent ──── or RELEASED ──── or DELIVERED past its dedupe TTL   ──> IN_FLIGHT #n+1
    mark:      IN_FLIGHT and attempt = mine                                     ──> DELIVERED
    take over: IN_FLIGHT and attempt = seen (the lease expired; read-back: not found) ──> #seen+1
    release / mark unverifiable: IN_FLIGHT and attempt = seen

A condition that fails still costs a write. When it fails the current item is returned where
DynamoDB supports ``ReturnValuesOnConditionCheckFailure``; otherwise (dynalite) it is read back
with a consistent read. A retried request whose first try was applied fails its own condition:
each write recognises its own effect in the current item and reports it as applied.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import botocore.exceptions
from pynamodb.connection.table import TableConnection
from pynamodb.constants import UPDATE_ITEM
from pynamodb.exceptions import (
    DoesNotExist,
    GetError,
    PynamoDBException,
    QueryError,
    TableDoesNotExist,
    TableError,
    UpdateError,
)

from dedupe_store import expressions as x
from dedupe_store.errors import (
    LedgerError,
    LedgerSchemaError,
    LedgerThrottledError,
    LedgerUnavailableError,
)
from dedupe_store.inflight import bucket_of, bucket_partition, walk_in_flight
from dedupe_store.model import TTL_ATTRIBUTE, ConnectionOptions, LedgerItem, bind_ledger_model
from dedupe_store.records import (
    BatchRecord,
    ClaimRequest,
    ClaimResult,
    LedgerRecord,
    Position,
    RunRecord,
    UpdateResult,
)
from dedupe_store.states import LedgerState, Transition, next_state

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_CONDITION_FAILED = "ConditionalCheckFailedException"
_THROTTLED = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)
_BATCH_GET_MAX = 100
BATCH_COMPLETE = "COMPLETE"


# Items that are not keys start with "__keo__/": stream names cannot contain "/", so no
# "<stream>#<key>" is one of them. They have no ``stream`` attribute: scans skip them.
def _run_pk(stream: str) -> str:
    return f"__keo__/reconcile-run/{stream}"


SCHEMA_PK = "__keo__/schema"
# The layout of the items this code reads and writes. A table stamped with another version is
# refused, never misread; a table without a stamp predates stamps and is version 1.
LEDGER_SCHEMA_VERSION = 1


def _batch_pk(stream: str, query: str, batch_id: int) -> str:
    return f"__keo__/spark-batch/{stream}/{query}/{batch_id}"


def ledger_pk(stream: str, key: str) -> str:
    return f"{stream}#{key}"


class DynamoDBLedger:
    """The ledger on one DynamoDB table. Thread-safe: share one per process."""

    def __init__(
        self,
        options: ConnectionOptions,
        *,
        dedupe_ttl_s: int = 7 * 24 * 3600,
        inflight_buckets: int = 16,
    ) -> None:
        self._options = options
        self._model: type[LedgerItem] = bind_ledger_model(options)
        self.dedupe_ttl_s = dedupe_ttl_s
        self.inflight_buckets = inflight_buckets

    @property
    def table_name(self) -> str:
        return self._options.table_name

    @property
    def model(self) -> type[LedgerItem]:
        return self._model

    @property
    def client(self) -> Any:
        """The botocore client underneath, for event hooks (metrics, injected faults)."""
        return self._connection().connection.client

    def _connection(self) -> TableConnection:
        return self._model._get_connection()

    # --- schema -----------------------------------------------------------------------------

    def create_table(self, *, wait: bool = True) -> bool:
        """Create the table with its in-flight index; True if created, False if it existed.

        With ``wait``, the table is also stamped with this code's schema version (an existing
        table keeps its stamp, and one of another version is refused).
        """
        try:
            created = not self._model.exists()
            if created:
                self._model.create_table(wait=wait, billing_mode="PAY_PER_REQUEST")
        except (TableError, PynamoDBException) as exc:
            raise _translate(exc, self.table_name, None, "create table") from exc
        if wait:
            self._stamp_schema()
        return created

    def schema_version(self) -> int:
        """The ledger schema version the table is stamped with (1 when it has no stamp)."""
        try:
            item = self.client.get_item(
                TableName=self.table_name, Key={"pk": {"S": SCHEMA_PK}}, ConsistentRead=True
            ).get("Item")
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _translate(exc, self.table_name, None, "read the schema version") from exc
        return int(item["schema_version"]["N"]) if item else 1

    def _stamp_schema(self) -> None:
        try:
            self.client.put_item(
                TableName=self.table_name,
                Item={
                    "pk": {"S": SCHEMA_PK},
                    "schema_version": {"N": str(LEDGER_SCHEMA_VERSION)},
                },
                ConditionExpression="attribute_not_exists(pk)",
            )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            if _code_of(exc) != _CONDITION_FAILED:
                raise _translate(exc, self.table_name, None, "stamp the schema version") from exc
        self._check_schema()

    def _check_schema(self) -> None:
        found = self.schema_version()
        if found != LEDGER_SCHEMA_VERSION:
            raise LedgerSchemaError(
                f"ledger table {self.table_name!r} holds ledger schema version {found}; this keo "
                f"reads version {LEDGER_SCHEMA_VERSION} only: use the keo release that wrote it, "
                "or a new table",
                table=self.table_name,
            )

    def enable_ttl(self) -> bool:
        """Turn on TTL deletion of expired DELIVERED items. False where the backend lacks the API."""
        try:
            self._connection().connection.update_time_to_live(self.table_name, TTL_ATTRIBUTE)
        except (TableError, PynamoDBException) as exc:
            code = _code_of(exc)
            if code in {"UnknownOperationException", "ValidationException"} or (
                code is None and "UnknownOperation" in str(exc)
            ):
                return False
            raise _translate(exc, self.table_name, None, "enable TTL") from exc
        return True

    def ensure_ready(self) -> None:
        """Fail fast with a schema error when the table is missing or of another version."""
        try:
            exists = self._model.exists()
        except PynamoDBException as exc:
            raise _translate(exc, self.table_name, None, "describe table") from exc
        if not exists:
            raise LedgerSchemaError(
                f"ledger table {self.table_name!r} does not exist: run 'keo init'",
                table=self.table_name,
            )
        self._check_schema()

    # --- reads ------------------------------------------------------------------------------

    def get(self, stream: str, key: str, *, consistent: bool = True) -> LedgerRecord | None:
        try:
            item = self._model.get(ledger_pk(stream, key), consistent_read=consistent)
        except DoesNotExist:
            return None
        except (GetError, PynamoDBException) as exc:
            raise _translate(exc, self.table_name, key, "get") from exc
        return _to_record(item)

    def batch_get(self, stream: str, keys: Iterable[str]) -> dict[str, LedgerRecord]:
        """Consistent reads of many keys, 100 per request; absent keys are left out."""
        pks = list(dict.fromkeys(ledger_pk(stream, key) for key in keys))
        found: dict[str, LedgerRecord] = {}
        for start in range(0, len(pks), _BATCH_GET_MAX):
            chunk = pks[start : start + _BATCH_GET_MAX]
            try:
                for item in self._model.batch_get(chunk, consistent_read=True):
                    record = _to_record(item)
                    found[record.key] = record
            except PynamoDBException as exc:
                raise _translate(exc, self.table_name, None, "batch get") from exc
        return found

    def scan(self, stream: str, *, page_size: int = 1000) -> Iterator[LedgerRecord]:
        """Every ledger item of ``stream`` (a full table scan, filtered: for audits only)."""
        try:
            for item in self._model.scan(self._model.stream == stream, page_size=page_size):
                yield _to_record(item)
        except PynamoDBException as exc:
            raise _translate(exc, self.table_name, None, "scan") from exc

    def stale_in_flight(
        self,
        stream: str,
        *,
        now_ms: int,
        buckets: Sequence[int] | None = None,
        page_size: int = 500,
    ) -> Iterator[str]:
        """Keys whose claim's lease has expired by ``now_ms``, from the sparse in-flight index.

        The index is eventually consistent: re-read each key consistently before acting on it.
        """
        for keys, _ in walk_in_flight(
            self, stream, before_ms=now_ms, page_limit=lambda: page_size, buckets=buckets
        ):
            yield from keys

    def in_flight_page(
        self,
        stream: str,
        bucket: int,
        *,
        before_ms: int | None,
        limit: int,
        after_lease_ms: int | None = None,
        after_pk: str | None = None,
    ) -> tuple[list[str], tuple[int, str] | None]:
        """One page of in-flight keys of a bucket, ordered by lease expiry, with a cursor."""
        last_key: dict[str, Any] | None = None
        if after_lease_ms is not None and after_pk is not None:
            last_key = {
                "pk": {"S": after_pk},
                "inflight_bucket": {"S": bucket_partition(stream, bucket)},
                "lease_expires_at_ms": {"N": str(after_lease_ms)},
            }
        condition = None if before_ms is None else self._model.lease_expires_at_ms < before_ms
        try:
            result = self._model.inflight_index.query(
                bucket_partition(stream, bucket),
                condition,
                limit=limit,
                last_evaluated_key=last_key,
                page_size=limit,
            )
            keys = [_key_of(stream, item.pk) for item in result]
            cursor = result.last_evaluated_key
        except (QueryError, PynamoDBException) as exc:
            raise _translate(exc, self.table_name, None, "query in-flight index") from exc
        if cursor is None:
            return keys, None
        return keys, (int(cursor["lease_expires_at_ms"]["N"]), str(cursor["pk"]["S"]))

    # --- run records (not keys: their pk cannot collide with "<stream>#<key>") ---------------

    def record_run(
        self, stream: str, *, started_ms: int, finished_ms: int, outcomes: dict[str, int]
    ) -> None:
        """Remember the reconciler's last run over ``stream`` (read by the API's summary)."""
        try:
            self.client.put_item(
                TableName=self.table_name,
                Item={
                    "pk": {"S": _run_pk(stream)},
                    "started_at_ms": {"N": str(started_ms)},
                    "finished_at_ms": {"N": str(finished_ms)},
                    "outcomes": {"S": json.dumps(outcomes, sort_keys=True)},
                },
            )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _translate(exc, self.table_name, None, "record a run") from exc

    def last_run(self, stream: str) -> RunRecord | None:
        try:
            item = self.client.get_item(
                TableName=self.table_name, Key={"pk": {"S": _run_pk(stream)}}, ConsistentRead=True
            ).get("Item")
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _translate(exc, self.table_name, None, "read the last run") from exc
        if not item:
            return None
        return RunRecord(
            stream=stream,
            started_ms=int(item["started_at_ms"]["N"]),
            finished_ms=int(item["finished_at_ms"]["N"]),
            outcomes={k: int(v) for k, v in json.loads(item["outcomes"]["S"]).items()},
        )

    # --- Spark batch records: (stream, query, batch_id) -> COMPLETE -------------------------

    def completed_batch(
        self, stream: str, query: str, batch_id: int, *, now_ms: int
    ) -> BatchRecord | None:
        """The record of a streaming query's batch that settled every row, if there is one."""
        pk = _batch_pk(stream, query, batch_id)
        try:
            item = self.client.get_item(
                TableName=self.table_name, Key={"pk": {"S": pk}}, ConsistentRead=True
            ).get("Item")
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _translate(exc, self.table_name, pk, "read a batch record") from exc
        if not item or item.get("batch_state", {}).get("S") != BATCH_COMPLETE:
            return None
        expires_at = item.get(TTL_ATTRIBUTE, {}).get("N")
        if expires_at is not None and int(expires_at) <= now_ms // 1000:
            return None  # TTL deletion lags: an item past its expiry counts as absent
        return BatchRecord(
            stream=stream,
            query=query,
            batch_id=batch_id,
            completed_ms=int(item["completed_at_ms"]["N"]),
            counts={k: int(v) for k, v in json.loads(item["counts"]["S"]).items()},
        )

    def mark_batch_complete(
        self, stream: str, query: str, batch_id: int, *, counts: dict[str, int], now_ms: int
    ) -> None:
        """Record a settled batch; it expires with the dedupe window, like the keys it sent.

        Unconditional: every writer of this item writes the same fact (COMPLETE).
        """
        pk = _batch_pk(stream, query, batch_id)
        item: dict[str, Any] = {
            "pk": {"S": pk},
            "batch_state": {"S": BATCH_COMPLETE},
            "query_id": {"S": query},
            "batch_id": {"N": str(batch_id)},
            "completed_at_ms": {"N": str(now_ms)},
            TTL_ATTRIBUTE: {"N": str(now_ms // 1000 + self.dedupe_ttl_s)},
            "counts": {"S": json.dumps(counts, sort_keys=True)},
        }
        try:
            self.client.put_item(TableName=self.table_name, Item=item)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _translate(exc, self.table_name, pk, "record a batch") from exc

    # --- conditional transitions -----------------------------------------------------------

    def claim(
        self, request: ClaimRequest, *, owner: str, now_ms: int, lease_ms: int
    ) -> ClaimResult:
        """Claim a key for a new attempt, if it is absent, RELEASED, or DELIVERED and expired."""
        next_state(None, Transition.CLAIM)
        values: dict[str, Any] = {
            ":stream": x.s(request.stream),
            ":key": x.s(request.key),
            ":in_flight": x.s(LedgerState.IN_FLIGHT.value),
            ":released": x.s(LedgerState.RELEASED.value),
            ":zero": x.n(0),
            ":one": x.n(1),
            ":owner": x.s(owner),
            ":now": x.n(now_ms),
            ":now_s": x.n(now_ms // 1000),
            ":lease": x.n(now_ms + lease_ms),
            ":bucket": x.s(self._bucket_partition(request.stream, request.key)),
            ":digest": x.s(request.payload_digest),
            ":routing": x.s(request.routing_hash_key),
        }
        update = x.CLAIM
        if request.payload:
            update = x.CLAIM_WITH_PAYLOAD
            values[":payload"] = {"B": request.payload}
        applied, current = self._update(request.stream, request.key, update, x.CLAIMABLE, values)
        return ClaimResult.won(_require(current)) if applied else ClaimResult.lost(current)

    def mark_delivered(
        self, record: LedgerRecord, position: Position, *, now_ms: int
    ) -> UpdateResult:
        """IN_FLIGHT under ``record.attempt`` -> DELIVERED at ``position``."""
        next_state(LedgerState.IN_FLIGHT, Transition.MARK_DELIVERED)
        values: dict[str, Any] = {
            ":delivered": x.s(LedgerState.DELIVERED.value),
            ":shard": x.s(position.shard_id),
            ":seq": x.s(position.sequence_number),
            ":now": x.n(now_ms),
            ":expires": x.n(now_ms // 1000 + self.dedupe_ttl_s),
            **self._held_values(record.attempt),
        }
        update = x.MARK
        if position.sub_sequence_number is not None:
            update = x.MARK_AGGREGATED
            values[":subseq"] = x.n(position.sub_sequence_number)
        applied, current = self._update(
            record.stream, record.key, update, x.HELD_UNDER_ATTEMPT, values
        )
        return UpdateResult(applied, current)

    def take_over(
        self, seen: LedgerRecord, *, owner: str, now_ms: int, lease_ms: int
    ) -> ClaimResult:
        """A new attempt on a claim whose put can no longer land (conditional on the attempt seen)."""
        next_state(seen.state, Transition.TAKE_OVER)
        values = {
            ":next": x.n(seen.attempt + 1),
            ":owner": x.s(owner),
            ":now": x.n(now_ms),
            ":lease": x.n(now_ms + lease_ms),
            ":bucket": x.s(self._bucket_partition(seen.stream, seen.key)),
            **self._held_values(seen.attempt),
        }
        applied, current = self._update(
            seen.stream, seen.key, x.TAKE_OVER, x.HELD_UNDER_ATTEMPT, values
        )
        return ClaimResult.won(_require(current)) if applied else ClaimResult.lost(current)

    def release(self, seen: LedgerRecord) -> UpdateResult:
        """IN_FLIGHT -> RELEASED: not in the stream and no data to resend; the next producer sends."""
        return self._settle(seen, Transition.RELEASE)

    def mark_unverifiable(self, seen: LedgerRecord) -> UpdateResult:
        """IN_FLIGHT -> UNVERIFIABLE: the read-back window reaches past the stream's retention."""
        return self._settle(seen, Transition.MARK_UNVERIFIABLE)

    def _settle(self, seen: LedgerRecord, transition: Transition) -> UpdateResult:
        target = next_state(seen.state, transition)
        values = {":target": x.s(target.value), **self._held_values(seen.attempt)}
        applied, current = self._update(
            seen.stream, seen.key, x.SETTLE, x.HELD_UNDER_ATTEMPT, values
        )
        return UpdateResult(applied, current)

    def delete(self, stream: str, key: str) -> None:
        """Remove a key's item outright (tests and operators only; the protocol never deletes)."""
        try:
            self._connection().delete_item(ledger_pk(stream, key))
        except PynamoDBException as exc:
            raise _translate(exc, self.table_name, key, "delete") from exc

    def _bucket_partition(self, stream: str, key: str) -> str:
        return bucket_partition(stream, bucket_of(key, self.inflight_buckets))

    @staticmethod
    def _held_values(attempt: int) -> dict[str, dict[str, str]]:
        return {":in_flight": x.s(LedgerState.IN_FLIGHT.value), ":seen": x.n(attempt)}

    def _update(
        self, stream: str, key: str, update: str, condition: str, values: dict[str, Any]
    ) -> tuple[bool, LedgerRecord | None]:
        """One conditional UpdateItem: (True, new item) or (False, the item that won instead).

        Each write carries a token of its own. When the SDK retried a request whose first try
        was applied, the retry fails its condition and finds the token: the write is ours.
        Another party's identical write has another token: that one is a lost race.
        """
        token = uuid.uuid4().hex
        values[":token"] = x.s(token)
        kwargs = x.update_kwargs(self.table_name, ledger_pk(stream, key), update, condition, values)
        try:
            data = self._connection().connection.dispatch(UPDATE_ITEM, kwargs)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            if _code_of(exc) != _CONDITION_FAILED:
                raise _translate(
                    UpdateError("update failed", exc), self.table_name, key, "update"
                ) from exc
            old_item = _old_item_of(exc)
            current = _from_raw(old_item) if old_item is not None else self.get(stream, key)
            return current is not None and current.write_token == token, current
        return True, _from_raw(data["Attributes"])


# --- translation at the edge ----------------------------------------------------------------


def _code_of(exc: BaseException) -> str | None:
    code = getattr(exc, "cause_response_code", None)
    if isinstance(code, str):
        return code
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        found = response.get("Error", {}).get("Code")
        return found if isinstance(found, str) else None
    cause = getattr(exc, "cause", None) or exc.__cause__
    return _code_of(cause) if cause is not None and cause is not exc else None


def _old_item_of(exc: BaseException) -> dict[str, Any] | None:
    """The item a failed condition saw, where DynamoDB returned it (not dynalite)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Item"), dict):
            return response["Item"]  # type: ignore[no-any-return]
        current = current.__cause__
    return None


def _translate(exc: BaseException, table: str, key: str | None, doing: str) -> LedgerError:
    code = _code_of(exc)
    if isinstance(exc, TableDoesNotExist) or code == "ResourceNotFoundException":
        return LedgerSchemaError(
            f"ledger table {table!r} does not exist: run 'keo init' ({doing})", table=table, key=key
        )
    if code in _THROTTLED:
        return LedgerThrottledError(f"DynamoDB throttled {doing} ({code})", table=table, key=key)
    return LedgerUnavailableError(
        f"DynamoDB failed to {doing}: {code or type(exc).__name__}", table=table, key=key
    )


def _require(record: LedgerRecord | None) -> LedgerRecord:
    if record is None:
        raise LedgerUnavailableError("DynamoDB returned no item for an applied update")
    return record


def _key_of(stream: str, pk: str) -> str:
    return pk[len(stream) + 1 :]


def _from_raw(item: dict[str, Any]) -> LedgerRecord:
    """A ledger record straight from DynamoDB's wire format (the hot path skips pynamodb's
    deserialization; reads that are not hot go through the model)."""

    def text(name: str) -> str | None:
        value = item.get(name)
        return None if value is None else str(value["S"])

    def number(name: str) -> int | None:
        value = item.get(name)
        return None if value is None else int(value["N"])

    shard_id, sequence_number = text("shard_id"), text("sequence_number")
    position = (
        Position(shard_id, sequence_number, number("sub_sequence_number"))
        if shard_id is not None and sequence_number is not None
        else None
    )
    payload = item.get("payload")
    return LedgerRecord(
        stream=str(item["stream"]["S"]),
        key=str(item["msg_key"]["S"]),
        state=LedgerState(item["state"]["S"]),
        attempt=int(item["attempt"]["N"]),
        owner=str(item["owner"]["S"]),
        claimed_at_ms=int(item["claimed_at_ms"]["N"]),
        payload_digest=str(item["payload_digest"]["S"]),
        routing_hash_key=str(item["routing_hash_key"]["S"]),
        lease_expires_at_ms=number("lease_expires_at_ms"),
        write_token=text("write_token"),
        position=position,
        delivered_at_ms=number("delivered_at_ms"),
        expires_at_s=number("expires_at"),
        payload=_binary(payload["B"]) if payload is not None else None,
    )


def _binary(value: Any) -> bytes:
    # botocore returns bytes; a raw item from an error response may carry base64 text
    return value if isinstance(value, bytes) else base64.b64decode(value)


def _to_record(item: LedgerItem) -> LedgerRecord:
    position = None
    if item.shard_id is not None and item.sequence_number is not None:
        position = Position(
            item.shard_id,
            item.sequence_number,
            int(item.sub_sequence_number) if item.sub_sequence_number is not None else None,
        )
    return LedgerRecord(
        stream=item.stream,
        key=item.msg_key,
        state=LedgerState(item.state),
        attempt=int(item.attempt),
        owner=item.owner,
        claimed_at_ms=int(item.claimed_at_ms),
        write_token=item.write_token,
        payload_digest=item.payload_digest,
        routing_hash_key=item.routing_hash_key,
        lease_expires_at_ms=int(item.lease_expires_at_ms)
        if item.lease_expires_at_ms is not None
        else None,
        position=position,
        delivered_at_ms=int(item.delivered_at_ms) if item.delivered_at_ms is not None else None,
        expires_at_s=int(item.expires_at) if item.expires_at is not None else None,
        payload=bytes(item.payload) if item.payload is not None else None,
    )
