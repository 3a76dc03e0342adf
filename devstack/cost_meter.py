"""``BillingMeter``: what AWS would bill for the DynamoDB requests a botocore client makes.

The bench used to count requests and the emulator's ``ConsumedCapacity``, which understates the
bill: dynalite counts no index writes and does not follow AWS's size rules. The meter watches
a client's calls through botocore's event hooks and prices each one with
:mod:`dedupe_store.billing`::

    before-parameter-build.dynamodb.*   keep the request's parameters in the call's context
    after-call.dynamodb.*               price the parsed response (success, or a failed
                                        condition: botocore emits this before it raises)
    after-call-error.dynamodb.*         no response at all (connection error, timeout)

What a write costs depends on the item *before* it, which no response carries unless asked
(``ReturnValues``). The meter keeps a shadow of the last full image it saw per primary key:
PutItem's item, UpdateItem's ``ALL_NEW`` attributes (or, for an UpdateItem that asked for
less, as the producer's claims do, the image ``read_item`` reads when the meter is given one),
``ALL_OLD`` attributes, the ``Item`` a
failed condition returns with ``ReturnValuesOnConditionCheckFailure=ALL_OLD`` (AWS does; dynalite
ignores the flag), and strongly consistent GetItem / BatchGetItem / Query / Scan results. A key
it has never seen is taken as absent.

So the meter is exact when it sees every write to the items it prices, from the table's
creation on, and writes to one key are not concurrent (as in a benchmark run). Where it has to
guess, it prices a lower bound and counts the call in ``MeterReading.inexact_calls``:
an UpdateItem without ``ReturnValues=ALL_NEW`` and no ``read_item`` (the new image is
unknown), a read with a
projection or a filter (AWS bills the whole items evaluated, the response holds less), a call
that got no response (it may have been applied), a table without a ``TableSpec``, and
operations the model does not price (transactions, PartiQL). Errors other than a failed
condition (throttling, validation) are counted, not priced: no item was read or written. SDK
retries are counted from ``RetryAttempts``; only the attempt that answered is priced.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Context, Decimal
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from dedupe_store.billing import (
    Consistency,
    IndexSpec,
    Item,
    Projection,
    ReadCost,
    TableSpec,
    WriteCost,
    batch_get_read_cost,
    get_item_read_cost,
    query_read_cost,
    write_cost,
)
from dedupe_store.errors import aws_error_code
from dedupe_store.model import LedgerItem
from dedupe_store.table import INFLIGHT_INDEX_NAME

if TYPE_CHECKING:
    from botocore.client import BaseClient
    from botocore.model import OperationModel

log = logging.getLogger(__name__)

_PARAMS: Final = "keo_cost_meter_params"  # where a call's parameters wait in its context
_CONDITION_FAILED: Final = "ConditionalCheckFailedException"
_EXACT: Final = Context(prec=40)  # DynamoDB numbers have up to 38 digits; the default rounds at 28
_PRICED: Final = frozenset(
    {
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "BatchWriteItem",
        "GetItem",
        "BatchGetItem",
        "Query",
        "Scan",
        "BatchExecuteStatement",
    }
)
# data-plane calls AWS bills that this meter does not price
_UNPRICED: Final = frozenset(
    {"TransactWriteItems", "TransactGetItems", "ExecuteStatement", "ExecuteTransaction"}
)
# the one PartiQL statement the ledger sends (dedupe_store.batch_claims): an INSERT of an item
_INSERT: Final = re.compile(r"^INSERT INTO \"(?P<table>[^\"]+)\" VALUE \{(?P<fields>.*)\}$", re.S)
_INSERT_FIELD: Final = re.compile(r"'([^']+)': \?")
_DUPLICATE: Final = frozenset({"DuplicateItem", "ConditionalCheckFailed"})


def ledger_table_spec() -> TableSpec:
    """The ledger table's billing schema (dedupe_store/model.py): hash key ``pk`` and the
    sparse KEYS_ONLY in-flight index on (``inflight_bucket``, ``lease_expires_at_ms``)."""
    return TableSpec(
        hash_key=LedgerItem.pk.attr_name,
        indexes=(
            IndexSpec(
                name=INFLIGHT_INDEX_NAME,
                hash_key=LedgerItem.inflight_bucket.attr_name,
                range_key=LedgerItem.lease_expires_at_ms.attr_name,
                projection=Projection.KEYS_ONLY,
            ),
        ),
    )


@dataclass(frozen=True)
class MeterReading:
    """The bill so far. Units are AWS's: write units of 1 KB, read units of 4 KB.

    ``write_requests`` and ``read_requests`` count item-level requests (a BatchWriteItem of 25
    puts is 25), failed conditions included: on-demand tables bill per item request.
    """

    requests_by_operation: Mapping[str, int] = field(default_factory=dict)
    write_requests: int = 0
    conditional_check_failures: int = 0
    billed_write_units: int = 0
    billed_index_write_units: int = 0
    index_writes: int = 0
    read_requests: int = 0
    billed_read_units: float = 0.0
    retried_attempts: int = 0
    failed_calls: int = 0
    inexact_calls: int = 0

    @property
    def requests(self) -> int:
        return sum(self.requests_by_operation.values())

    @property
    def total_write_units(self) -> int:
        """Table and index write units: what the bill's write line adds up to."""
        return self.billed_write_units + self.billed_index_write_units


class BillingMeter:
    """Prices every DynamoDB call of the clients it is attached to. Thread-safe.

    ``tables`` maps table names to their billing schema; calls on other tables are counted,
    and counted inexact, but not priced.
    """

    def __init__(
        self,
        tables: Mapping[str, TableSpec],
        *,
        read_item: Callable[[str, Mapping[str, Any]], Item | None] | None = None,
    ) -> None:
        """``read_item(table, key)``, when given, reads an item's image after an UpdateItem
        that did not return it (a consistent GetItem on a client the meter does not watch):
        the producer's claims ask only for the old values. Without it such a call is priced
        as a lower bound and counted inexact. The read is the meter's, not the workload's;
        it assumes no other writer changes the item in between, as in the benchmark."""
        self._tables = dict(tables)
        self._read_item = read_item
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._write = WriteCost(0, 0)
        self._read = ReadCost(0.0)
        self._write_requests = 0
        self._read_requests = 0
        self._condition_failures = 0
        self._retried_attempts = 0
        self._failed_calls = 0
        self._inexact_calls = 0
        # shadow images: last full item seen per (table, primary key)
        self._images: dict[str, Item] = {}
        # keys whose image is a guess since a write the meter could not follow
        self._uncertain: set[str] = set()
        # why the call being priced is inexact (reset per call, under the lock)
        self._reasons: list[str] = []

    # --- wiring -------------------------------------------------------------------------------

    def attach(self, client: BaseClient) -> None:
        """Start pricing ``client``'s DynamoDB calls (attaching twice has no further effect)."""
        for event, handler in self._handlers():
            client.meta.events.register(event, handler, unique_id=self._unique_id(event))

    def detach(self, client: BaseClient) -> None:
        for event, _handler in self._handlers():
            client.meta.events.unregister(event, unique_id=self._unique_id(event))

    def _handlers(self) -> tuple[tuple[str, Callable[..., None]], ...]:
        return (
            ("before-parameter-build.dynamodb", self._on_parameters),
            ("after-call.dynamodb", self._on_response),
            ("after-call-error.dynamodb", self._on_no_response),
        )

    def _unique_id(self, event: str) -> str:
        return f"keo-billing-meter-{id(self)}-{event}"

    def snapshot(self) -> MeterReading:
        with self._lock:
            return MeterReading(
                requests_by_operation=MappingProxyType(dict(self._requests)),
                write_requests=self._write_requests,
                conditional_check_failures=self._condition_failures,
                billed_write_units=self._write.table_units,
                billed_index_write_units=self._write.index_units,
                index_writes=self._write.index_writes,
                read_requests=self._read_requests,
                billed_read_units=self._read.units,
                retried_attempts=self._retried_attempts,
                failed_calls=self._failed_calls,
                inexact_calls=self._inexact_calls,
            )

    # --- event handlers (botocore passes keyword arguments) -------------------------------------

    def _on_parameters(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        # the parameters as sent: after any provide-client-params handler replaced them
        context[_PARAMS] = params

    def _on_no_response(self, event_name: str, **_: Any) -> None:
        # after-call-error.dynamodb.<Operation>: botocore passes no operation model with it
        operation = event_name.rsplit(".", 1)[-1]
        with self._lock:
            self._requests[operation] += 1
            self._failed_calls += 1
            if operation in _PRICED or operation in _UNPRICED:
                self._inexact_calls += 1  # a write may have been applied, a read billed
        log.debug("billing meter: no response operation=%s", operation)

    def _on_response(
        self,
        parsed: Mapping[str, Any],
        model: OperationModel,
        context: dict[str, Any],
        **_: Any,
    ) -> None:
        operation = model.name
        params: Mapping[str, Any] = context.get(_PARAMS) or {}
        error_code = aws_error_code(parsed)
        if (
            operation == "UpdateItem"
            and error_code is None
            and params.get("ReturnValues") != "ALL_NEW"
            and self._read_item is not None
            and params.get("TableName") in self._tables
        ):
            # read outside the lock; priced below as if the new image had been returned
            image = self._read_item(params["TableName"], params["Key"])
            if image is not None:
                params = {**params, "ReturnValues": "ALL_NEW"}
                parsed = {**parsed, "Attributes": image}
        with self._lock:
            self._requests[operation] += 1
            self._retried_attempts += int(
                parsed.get("ResponseMetadata", {}).get("RetryAttempts", 0)
            )
            self._reasons = []
            if operation in _UNPRICED:
                self._inexact("operation not priced")
            elif error_code is not None and error_code != _CONDITION_FAILED:
                pass  # throttled, invalid, missing table: nothing read or written
            elif operation in _PRICED:
                self._price_safely(operation, params, parsed, error_code is not None)
            if self._reasons:
                self._inexact_calls += 1
                log.debug(
                    "billing meter: inexact operation=%s reasons=%s",
                    operation,
                    "; ".join(self._reasons),
                )

    # --- pricing (under the lock) ----------------------------------------------------------------

    def _price_safely(
        self,
        operation: str,
        params: Mapping[str, Any],
        parsed: Mapping[str, Any],
        condition_failed: bool,
    ) -> None:
        # the meter observes a workload: a shape it cannot price must not fail the caller's call
        try:
            self._price(operation, params, parsed, condition_failed=condition_failed)
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("billing meter: cannot price operation=%s error=%r", operation, exc)
            self._inexact("cannot price the call")

    def _price(
        self,
        operation: str,
        params: Mapping[str, Any],
        parsed: Mapping[str, Any],
        *,
        condition_failed: bool,
    ) -> None:
        if operation == "BatchWriteItem":
            self._price_batch_write(params, parsed)
            return
        if operation == "BatchGetItem":
            self._price_batch_get(params, parsed)
            return
        if operation == "BatchExecuteStatement":
            self._price_statements(params, parsed)
            return
        spec = self._tables.get(params.get("TableName", ""))
        if spec is None:
            self._inexact("no TableSpec for the table")
            return
        table: str = params["TableName"]
        match operation:
            case "PutItem" | "UpdateItem" | "DeleteItem" if condition_failed:
                self._price_failed_condition(table, spec, params, parsed)
            case "PutItem":
                self._price_put(table, spec, params, parsed)
            case "UpdateItem":
                self._price_update(table, spec, params, parsed)
            case "DeleteItem":
                self._price_delete(table, spec, params, parsed)
            case "GetItem":
                self._price_get(table, params, parsed)
            case "Query" | "Scan":
                self._price_query(table, spec, params, parsed)

    def _price_put(
        self, table: str, spec: TableSpec, params: Mapping[str, Any], parsed: Mapping[str, Any]
    ) -> None:
        item: Item = params["Item"]
        key = self._key(table, spec.key_of(item))
        self._add_write(write_cost(spec, self._old_image(key, params, parsed), item))
        self._remember(key, item)

    def _price_update(
        self, table: str, spec: TableSpec, params: Mapping[str, Any], parsed: Mapping[str, Any]
    ) -> None:
        key = self._key(table, params["Key"])
        before = self._old_image(key, params, parsed)
        returned = params.get("ReturnValues", "NONE")
        if returned == "ALL_NEW":
            after: Item = parsed["Attributes"]
            self._add_write(write_cost(spec, before, after))
            self._remember(key, after)
            return
        # the new image is unknown: bill the old one (a lower bound), and stop trusting it
        self._inexact(f"UpdateItem with ReturnValues={returned}")
        self._add_write(write_cost(spec, before, before))
        if before is not None:
            self._images[key] = before
        self._uncertain.add(key)

    def _price_delete(
        self, table: str, spec: TableSpec, params: Mapping[str, Any], parsed: Mapping[str, Any]
    ) -> None:
        key = self._key(table, params["Key"])
        self._add_write(write_cost(spec, self._old_image(key, params, parsed), None))
        self._forget(key)

    def _price_failed_condition(
        self, table: str, spec: TableSpec, params: Mapping[str, Any], parsed: Mapping[str, Any]
    ) -> None:
        key = self._key(table, params["Key"] if "Key" in params else spec.key_of(params["Item"]))
        self._condition_failures += 1
        existing: Item | None = parsed.get("Item")
        if existing is not None:  # AWS, asked with ReturnValuesOnConditionCheckFailure=ALL_OLD
            self._remember(key, existing)
        else:  # not asked, no item, or dynalite (it ignores the flag)
            existing = self._before(key)
        self._add_write(write_cost(spec, existing, None, condition_failed=True))

    def _price_statements(self, params: Mapping[str, Any], parsed: Mapping[str, Any]) -> None:
        """Each statement of a BatchExecuteStatement as its item's write: an INSERT that applied
        as a put of a new item, one refused (the key exists) as a failed condition on it; a
        throttled or failed statement costs nothing. Other statements are not priced."""
        for statement, answer in zip(
            params.get("Statements", []), parsed.get("Responses", []), strict=False
        ):
            inserted = inserted_item(statement)
            spec = self._tables.get(inserted[0]) if inserted else None
            if inserted is None or spec is None:
                self._inexact("a PartiQL statement other than the ledger's INSERT")
                continue
            table, item = inserted
            code = aws_error_code(answer)
            if code in _DUPLICATE:
                self._price_failed_condition(table, spec, {"Item": item}, {})
            elif code is None:
                key = self._key(table, spec.key_of(item))
                self._add_write(write_cost(spec, self._before(key), item))
                self._remember(key, item)

    def _price_batch_write(self, params: Mapping[str, Any], parsed: Mapping[str, Any]) -> None:
        unprocessed: Mapping[str, Any] = parsed.get("UnprocessedItems") or {}
        for table, requests in params.get("RequestItems", {}).items():
            spec = self._tables.get(table)
            if spec is None:
                self._inexact("no TableSpec for the table")
                continue
            skipped = {
                self._key(table, spec.key_of(_request_key(r))) for r in unprocessed.get(table, ())
            }
            for request in requests:
                key = self._key(table, spec.key_of(_request_key(request)))
                if key in skipped:
                    continue  # returned unprocessed: not written, not billed
                if "PutRequest" in request:
                    item: Item = request["PutRequest"]["Item"]
                    self._add_write(write_cost(spec, self._before(key), item))
                    self._remember(key, item)
                else:
                    self._add_write(write_cost(spec, self._before(key), None))
                    self._forget(key)

    def _price_get(self, table: str, params: Mapping[str, Any], parsed: Mapping[str, Any]) -> None:
        key = self._key(table, params["Key"])
        consistency = _consistency(params)
        item: Item | None = parsed.get("Item")
        self._read_requests += 1
        if _projected(params):
            # AWS bills the whole item; the response holds only the projection
            self._read += get_item_read_cost(self._before(key), consistency)
            return
        self._read += get_item_read_cost(item, consistency)
        if consistency is Consistency.STRONG:
            self._refresh(key, item)

    def _price_batch_get(self, params: Mapping[str, Any], parsed: Mapping[str, Any]) -> None:
        responses: Mapping[str, Any] = parsed.get("Responses") or {}
        unprocessed: Mapping[str, Any] = parsed.get("UnprocessedKeys") or {}
        for table, request in params.get("RequestItems", {}).items():
            spec = self._tables.get(table)
            if spec is None:
                self._inexact("no TableSpec for the table")
                continue
            consistency = _consistency(request)
            projected = _projected(request)
            skipped = {self._key(table, k) for k in unprocessed.get(table, {}).get("Keys", ())}
            found: dict[str, Item] = {}
            if not projected:
                found = {self._key(table, spec.key_of(i)): i for i in responses.get(table, ())}
            images: list[Item | None] = []
            for requested in request.get("Keys", ()):
                key = self._key(table, requested)
                if key in skipped:
                    continue
                self._read_requests += 1
                if projected:
                    images.append(self._before(key))
                    continue
                images.append(found.get(key))
                if consistency is Consistency.STRONG:
                    self._refresh(key, found.get(key))
            self._read += batch_get_read_cost(images, consistency)

    def _price_query(
        self,
        table: str,
        spec: TableSpec,
        params: Mapping[str, Any],
        parsed: Mapping[str, Any],
    ) -> None:
        consistency = _consistency(params)
        items: list[Item] = list(parsed.get("Items") or ())
        self._read_requests += 1
        self._read += query_read_cost(items, consistency)
        filtered = parsed.get("ScannedCount", len(items)) != len(items)
        if filtered or _projected(params) or params.get("Select") not in {None, "ALL_ATTRIBUTES"}:
            self._inexact("items evaluated are not all returned in full")
        elif "IndexName" not in params and consistency is Consistency.STRONG:
            for item in items:
                self._remember(self._key(table, spec.key_of(item)), item)

    # --- shadow images ---------------------------------------------------------------------------

    def _old_image(
        self, key: str, params: Mapping[str, Any], parsed: Mapping[str, Any]
    ) -> Item | None:
        """The item before a write: its ``ALL_OLD`` attributes if asked (none: there was no
        item), else the shadow image."""
        if params.get("ReturnValues") == "ALL_OLD":
            old: Item | None = parsed.get("Attributes")
            return old
        return self._before(key)

    def _before(self, key: str) -> Item | None:
        if key in self._uncertain:
            self._inexact("image unknown since an unfollowed write")
        return self._images.get(key)

    def _remember(self, key: str, item: Item) -> None:
        self._images[key] = item
        self._uncertain.discard(key)

    def _forget(self, key: str) -> None:
        self._images.pop(key, None)
        self._uncertain.discard(key)

    def _refresh(self, key: str, item: Item | None) -> None:
        if item is None:
            self._forget(key)
        else:
            self._remember(key, item)

    def _add_write(self, cost: WriteCost) -> None:
        self._write += cost
        self._write_requests += 1

    def _inexact(self, reason: str) -> None:
        self._reasons.append(reason)

    @staticmethod
    def _key(table: str, key: Mapping[str, Any]) -> str:
        """A stable text form of (table, primary key): equal keys, equal text."""
        return json.dumps(
            [table, {name: _key_value(value) for name, value in key.items()}], sort_keys=True
        )


def _key_value(value: Mapping[str, Any]) -> list[str]:
    # key attributes are S, N or B; "1.0" and "1" are one key, as are bytes and their base64
    ((kind, payload),) = value.items()
    if kind == "N":
        return [kind, str(Decimal(payload).normalize(_EXACT))]
    if kind == "B":
        raw = base64.b64decode(payload) if isinstance(payload, str) else bytes(payload)
        return [kind, base64.b64encode(raw).decode("ascii")]
    return [kind, str(payload)]


def inserted_item(statement: Mapping[str, Any]) -> tuple[str, Item] | None:
    """The table and item of a ``BatchStatementRequest`` that is the ledger's INSERT (the one
    statement it sends: :mod:`dedupe_store.batch_claims`); None for any other statement."""
    found = _INSERT.match(statement.get("Statement", ""))
    if found is None:
        return None
    names = _INSERT_FIELD.findall(found["fields"])
    item: Item = dict(zip(names, statement.get("Parameters", []), strict=True))
    return found["table"], item


def _request_key(request: Mapping[str, Any]) -> Item:
    if "PutRequest" in request:
        item: Item = request["PutRequest"]["Item"]
        return item
    key: Item = request["DeleteRequest"]["Key"]
    return key


def _consistency(params: Mapping[str, Any]) -> Consistency:
    return Consistency.STRONG if params.get("ConsistentRead") else Consistency.EVENTUAL


def _projected(params: Mapping[str, Any]) -> bool:
    return "ProjectionExpression" in params or "AttributesToGet" in params
