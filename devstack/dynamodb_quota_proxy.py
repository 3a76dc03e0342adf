"""``DynamoDbQuotaProxy``: DynamoDB Local or dynalite on 127.0.0.1 behind a proxy that keeps
AWS's throughput quotas (:mod:`devstack.dynamodb_quotas`), answering as DynamoDB does past
one, with nothing written::

    any process ──POST──> DynamoDbQuotaProxy ──forward (what the quotas admit)──> emulator
                             ├─ PutItem, UpdateItem, DeleteItem: the item's partition key
                             │    (400 ProvisionedThroughputExceededException or
                             │    ThrottlingException, with AWS's ThrottlingReasons)
                             ├─ BatchWriteItem: each request on its own; the refused ones
                             │    answered as UnprocessedItems (all refused: the 400)
                             ├─ BatchExecuteStatement: each INSERT on its own; a refused one
                             │    answered in its place with Error.Code
                             │    ProvisionedThroughputExceeded (or ThrottlingError); on an
                             │    emulator without PartiQL (dynalite), passed on as it is
                             ├─ GetItem, BatchGetItem (refused keys: UnprocessedKeys): per key,
                             │    and billed on the items answered
                             └─ Query, Scan: at the table, billed on the items answered

A write is priced from what its request carries (:mod:`dedupe_store.billing`): a put's item, an
INSERT's, an update's key and values (a lower bound of the item it leaves), a delete's key. The
table's partition key is read once per table with DescribeTable (the proxy's own call).

It is a :class:`devstack.fault_proxy.FaultProxy`: a fault schedule works in front of the
quotas. ``GET /__keo/report`` answers the counters as JSON.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from dedupe_store.billing import (
    Consistency,
    Item,
    attribute_value_size_bytes,
    get_item_read_cost,
    item_size_bytes,
    query_read_cost,
    read_units,
    write_units,
)
from devstack.cost_meter import inserted_item
from devstack.dynamodb_quotas import (
    KEY_THROTTLED,
    DynamoDbQuotas,
    DynamoDbQuotaState,
)
from devstack.fault_proxy import FaultProxy, FaultSchedule
from devstack.quota_proxy import serve_main
from devstack.quotas import Admission

__all__ = ["DynamoDbQuotaProxy"]

_TARGET_PREFIX: Final = "DynamoDB_20120810."
_JSON: Final = "application/x-amz-json-1.0"
_ERROR_TYPE_PREFIX: Final = "com.amazonaws.dynamodb.v20120810#"
_ACCOUNT: Final = "000000000000"
_REGION: Final = "us-east-1"
# a refused statement of a BatchExecuteStatement: BatchStatementErrorCodeEnum's names
_STATEMENT_CODES: Final = {KEY_THROTTLED: "ProvisionedThroughputExceeded"}
_STATEMENT_TABLE_CODE: Final = "ThrottlingError"

Answer = tuple[int, dict[str, str], bytes]


def _consistency(request: Mapping[str, Any]) -> Consistency:
    return Consistency.STRONG if request.get("ConsistentRead") else Consistency.EVENTUAL


def _message(decided: Admission) -> str:
    if decided.code == KEY_THROTTLED:
        return (
            "Throughput exceeds the current capacity for one or more partitions of your table. "
            "Spread the traffic over more partition keys."
        )
    return "Throughput exceeds the current throughput quota for your table."


def _throttled(decided: Admission, table: str) -> Answer:
    reasons = [
        {
            "reason": decided.message,
            "resource": f"arn:aws:dynamodb:{_REGION}:{_ACCOUNT}:table/{table}",
        }
    ]
    # the service model spells the field so: ThrottlingReasons, but throttlingReasons here
    field = "ThrottlingReasons" if decided.code == KEY_THROTTLED else "throttlingReasons"
    body = {
        "__type": _ERROR_TYPE_PREFIX + decided.code,
        "message": _message(decided),
        field: reasons,
    }
    return 400, {"Content-Type": _JSON}, json.dumps(body).encode()


def _ok(body: Mapping[str, Any]) -> Answer:
    return 200, {"Content-Type": _JSON}, json.dumps(body).encode()


class DynamoDbQuotaProxy(FaultProxy):
    """``with DynamoDbQuotaProxy(dynamodb_url) as proxy: use proxy.endpoint``; ``proxy.state``
    holds the buckets and the counters."""

    def __init__(
        self,
        upstream: str,
        quotas: DynamoDbQuotas | None = None,
        *,
        schedule: FaultSchedule | None = None,
        port: int = 0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(upstream, schedule, port=port)
        self.state = DynamoDbQuotaState(quotas or DynamoDbQuotas())
        self._monotonic = monotonic
        self._quota_lock = threading.Lock()
        self._hash_keys: dict[str, str] = {}  # table -> its partition key's attribute
        self._runs_partiql: bool | None = None  # the emulator's, learned at the first batch

    def __enter__(self) -> DynamoDbQuotaProxy:
        self.start()
        return self

    def report(self) -> dict[str, Any]:
        with self._quota_lock:
            return {**super().report(), "quotas": self.state.snapshot()}

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        target = next((v for k, v in headers.items() if k.lower() == "x-amz-target"), "")
        if not target.startswith(_TARGET_PREFIX) or not body:
            return super().forward(method, path, headers, body)
        operation = target.removeprefix(_TARGET_PREFIX)
        request: dict[str, Any] = json.loads(body)
        with self._quota_lock:
            self.state.call(operation)
        handler = self._handlers().get(operation)
        if handler is None:
            if operation in {"CreateTable", "DeleteTable"}:
                with self._quota_lock:
                    self._hash_keys.pop(str(request.get("TableName", "")), None)
            return super().forward(method, path, headers, body)
        return handler(operation, path, headers, request)

    def _handlers(self) -> dict[str, Callable[[str, str, dict[str, str], dict[str, Any]], Answer]]:
        return {
            "PutItem": self._single_write,
            "UpdateItem": self._single_write,
            "DeleteItem": self._single_write,
            "BatchWriteItem": self._batch_write,
            "BatchExecuteStatement": self._statements,
            "GetItem": self._get_item,
            "BatchGetItem": self._batch_get,
            "Query": self._query,
            "Scan": self._query,
        }

    def _send(self, path: str, headers: dict[str, str], request: Mapping[str, Any]) -> Answer:
        return super().forward("POST", path, headers, json.dumps(request).encode())

    # --- keys and units -----------------------------------------------------------------

    def _key_of(
        self, table: str, item: Mapping[str, Any], path: str, headers: dict[str, str]
    ) -> str:
        """The text of ``item``'s partition key value (``item`` may be a whole item)."""
        with self._quota_lock:
            name = self._hash_keys.get(table)
        if name is None:
            name = self._describe_hash_key(table, path, headers)
        return json.dumps(item.get(name), sort_keys=True)

    def _describe_hash_key(self, table: str, path: str, headers: dict[str, str]) -> str:
        asked = {k: v for k, v in headers.items() if k.lower() != "x-amz-target"}
        asked["X-Amz-Target"] = _TARGET_PREFIX + "DescribeTable"
        status, _, answer = self._send(path, asked, {"TableName": table})
        if status != 200:
            return ""  # no such table: the emulator answers the call itself
        schema = json.loads(answer)["Table"]["KeySchema"]
        name = next(str(k["AttributeName"]) for k in schema if k["KeyType"] == "HASH")
        with self._quota_lock:
            self._hash_keys[table] = name
        return name

    @staticmethod
    def _write_units(operation: str, request: Mapping[str, Any]) -> int:
        if operation == "PutItem":
            return write_units(item_size_bytes(request["Item"]))
        size = item_size_bytes(request["Key"])
        if operation == "UpdateItem":
            values = request.get("ExpressionAttributeValues") or {}
            size += sum(attribute_value_size_bytes(v) for v in values.values())
        return write_units(size)

    def _admit_write(self, operation: str, table: str, key: str, units: int) -> Admission:
        with self._quota_lock:
            return self.state.admit_write(operation, table, key, units, self._monotonic())

    # --- writes -------------------------------------------------------------------------

    def _single_write(
        self, operation: str, path: str, headers: dict[str, str], request: dict[str, Any]
    ) -> Answer:
        table = str(request.get("TableName", ""))
        item = request["Item"] if operation == "PutItem" else request["Key"]
        key = self._key_of(table, item, path, headers)
        decided = self._admit_write(operation, table, key, self._write_units(operation, request))
        if not decided.admitted:
            return _throttled(decided, table)
        return self._send(path, headers, request)

    def _batch_write(
        self, operation: str, path: str, headers: dict[str, str], request: dict[str, Any]
    ) -> Answer:
        admitted: dict[str, list[Any]] = {}
        refused: dict[str, list[Any]] = {}
        first_refusal: tuple[Admission, str] | None = None
        for table, writes in request.get("RequestItems", {}).items():
            for write in writes:
                put = write.get("PutRequest")
                item = put["Item"] if put else write["DeleteRequest"]["Key"]
                key = self._key_of(table, item, path, headers)
                decided = self._admit_write(
                    operation, table, key, write_units(item_size_bytes(item))
                )
                if decided.admitted:
                    admitted.setdefault(table, []).append(write)
                    continue
                refused.setdefault(table, []).append(write)
                first_refusal = first_refusal or (decided, table)
        if first_refusal is not None and not admitted:
            return _throttled(*first_refusal)
        status, answer_headers, answer = self._send(
            path, headers, {**request, "RequestItems": admitted}
        )
        if status != 200 or not refused:
            return status, answer_headers, answer
        page = json.loads(answer)
        unprocessed: dict[str, list[Any]] = page.get("UnprocessedItems") or {}
        for table, writes in refused.items():
            unprocessed.setdefault(table, []).extend(writes)
        return _ok({**page, "UnprocessedItems": unprocessed})

    def _statements(
        self, operation: str, path: str, headers: dict[str, str], request: dict[str, Any]
    ) -> Answer:
        if not self._upstream_runs_partiql(path, headers):
            # the emulator refuses the operation itself, as AWS never does: throttling its
            # statements would hide that from the caller, which falls back to a claim a key
            return self._send(path, headers, request)
        statements: list[dict[str, Any]] = request.get("Statements", [])
        decisions: list[tuple[Admission, str]] = []
        for statement in statements:
            inserted = inserted_item(statement)
            if inserted is None:  # not the ledger's INSERT: not metered
                decisions.append((Admission(admitted=True), ""))
                continue
            table, item = inserted
            key = self._key_of(table, item, path, headers)
            units = write_units(item_size_bytes(item))
            decisions.append((self._admit_write(operation, table, key, units), table))
        sent = [s for s, (d, _) in zip(statements, decisions, strict=True) if d.admitted]
        answered: list[Any] = []
        if sent:
            status, answer_headers, answer = self._send(
                path, headers, {**request, "Statements": sent}
            )
            if status != 200:
                return status, answer_headers, answer
            answered = json.loads(answer).get("Responses", [])
        results = iter(answered)
        responses = [
            next(results) if decided.admitted else _refused_statement(decided, table)
            for decided, table in decisions
        ]
        return _ok({"Responses": responses})

    def _upstream_runs_partiql(self, path: str, headers: dict[str, str]) -> bool:
        """Whether the emulator runs BatchExecuteStatement, asked once with an empty batch
        (which writes nothing: dynalite answers UnknownOperationException, DynamoDB Local a
        ValidationException)."""
        if self._runs_partiql is None:
            status, _, answer = self._send(path, headers, {"Statements": []})
            unknown = status == 400 and b"UnknownOperationException" in answer
            self._runs_partiql = not unknown
        return self._runs_partiql

    # --- reads --------------------------------------------------------------------------

    def _get_item(
        self, operation: str, path: str, headers: dict[str, str], request: dict[str, Any]
    ) -> Answer:
        table = str(request.get("TableName", ""))
        key = self._key_of(table, request["Key"], path, headers)
        consistency = _consistency(request)
        return self._metered_read(
            operation,
            path,
            headers,
            request,
            key=key,
            units_of=lambda page: get_item_read_cost(page.get("Item"), consistency).units,
        )

    def _metered_read(
        self,
        operation: str,
        path: str,
        headers: dict[str, str],
        request: dict[str, Any],
        *,
        key: str | None,
        units_of: Callable[[dict[str, Any]], float],
    ) -> Answer:
        """One read of ``key`` (None: at the table): admitted or refused, then billed
        ``units_of`` its answer."""
        table = str(request.get("TableName", ""))
        with self._quota_lock:
            decided = self.state.admit_read(operation, table, key, self._monotonic())
        if not decided.admitted:
            return _throttled(decided, table)
        status, answer_headers, answer = self._send(path, headers, request)
        if status == 200:
            units = units_of(json.loads(answer))
            with self._quota_lock:
                self.state.charge_read(table, key, units, self._monotonic())
        return status, answer_headers, answer

    def _batch_get(
        self, operation: str, path: str, headers: dict[str, str], request: dict[str, Any]
    ) -> Answer:
        admitted: dict[str, Any] = {}
        refused: dict[str, Any] = {}
        first_refusal: tuple[Admission, str] | None = None
        for table, asked in request.get("RequestItems", {}).items():
            for wanted in asked.get("Keys", []):
                key = self._key_of(table, wanted, path, headers)
                with self._quota_lock:
                    decided = self.state.admit_read(operation, table, key, self._monotonic())
                into = admitted if decided.admitted else refused
                into.setdefault(table, {**asked, "Keys": []})["Keys"].append(wanted)
                if not decided.admitted:
                    first_refusal = first_refusal or (decided, table)
        if first_refusal is not None and not admitted:
            return _throttled(*first_refusal)
        status, answer_headers, answer = self._send(
            path, headers, {**request, "RequestItems": admitted}
        )
        if status != 200:
            return status, answer_headers, answer
        page = json.loads(answer)
        self._charge_batch_get(admitted, page.get("Responses") or {}, path, headers)
        if not refused:
            return status, answer_headers, answer
        unprocessed: dict[str, Any] = page.get("UnprocessedKeys") or {}
        for table, asked in refused.items():
            unprocessed.setdefault(table, {**asked, "Keys": []})["Keys"].extend(asked["Keys"])
        return _ok({**page, "UnprocessedKeys": unprocessed})

    def _charge_batch_get(
        self,
        admitted: Mapping[str, Any],
        responses: Mapping[str, list[Item]],
        path: str,
        headers: dict[str, str],
    ) -> None:
        """Each key read, as its own GetItem: its item's size, the minimum if absent."""
        for table, asked in admitted.items():
            sizes = {
                self._key_of(table, item, path, headers): item_size_bytes(item)
                for item in responses.get(table, [])
            }
            consistency = _consistency(asked)
            for wanted in asked["Keys"]:
                key = self._key_of(table, wanted, path, headers)
                units = read_units(sizes.get(key, 0), consistency)
                with self._quota_lock:
                    self.state.charge_read(table, key, units, self._monotonic())

    def _query(
        self, operation: str, path: str, headers: dict[str, str], request: dict[str, Any]
    ) -> Answer:
        consistency = _consistency(request)
        return self._metered_read(
            operation,
            path,
            headers,
            request,
            key=None,
            units_of=lambda page: query_read_cost(page.get("Items") or [], consistency).units,
        )


def _refused_statement(decided: Admission, table: str) -> dict[str, Any]:
    code = _STATEMENT_CODES.get(decided.code, _STATEMENT_TABLE_CODE)
    return {"TableName": table, "Error": {"Code": code, "Message": _message(decided)}}


def main(argv: list[str] | None = None) -> int:
    """``python -m devstack.dynamodb_quota_proxy --upstream URL --port P``: until SIGTERM."""
    return serve_main(
        argv,
        prog="python -m devstack.dynamodb_quota_proxy",
        description="DynamoDB on 127.0.0.1 behind AWS's quotas (devstack.dynamodb_quotas).",
        defaults=DynamoDbQuotas(),
        make_proxy=lambda upstream, quotas, port: DynamoDbQuotaProxy(upstream, quotas, port=port),
    )


if __name__ == "__main__":
    raise SystemExit(main())
