"""``DynamoDBTable``: what every part of the ledger does to its one DynamoDB table.

The ledger's parts (key claims, claim groups, replay runs, Spark batch records, the table's
administration) each read and write their own kind of item; they share this: the botocore
client and the table's name, the conditional update that carries a token, consistent reads one
item or a hundred at a time, a page of the in-flight index, a filtered scan, and the reading
of an attribute from DynamoDB's wire format (:func:`text_of`, :func:`number_of`,
:func:`binary_of`).

Every DynamoDB error is translated in one place (:class:`Translated`, its mapping in
:func:`translate`): throttled -> ``LedgerThrottledError``, a missing table ->
``LedgerSchemaError``, anything else (unreachable, 5xx) -> ``LedgerUnavailableError``; the
vendor error is kept as the cause.
"""

from __future__ import annotations

import base64
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import botocore.exceptions

from dedupe_store import expressions as x
from dedupe_store.connection import ConnectionOptions, data_client
from dedupe_store.errors import (
    DYNAMODB_THROTTLING_CODES,
    LedgerError,
    LedgerSchemaError,
    LedgerThrottledError,
    LedgerUnavailableError,
    aws_error_code,
)

__all__ = [
    "BATCH_PAUSE_S",
    "CONDITION_FAILED",
    "INFLIGHT_INDEX_NAME",
    "VENDOR_ERRORS",
    "DynamoDBTable",
    "Translated",
    "binary_of",
    "code_of",
    "is_vendor_error",
    "number_of",
    "text_of",
    "translate",
]

CONDITION_FAILED = "ConditionalCheckFailedException"
# the table's sparse index of open groups and OPEN runs (:mod:`dedupe_store.inflight`)
INFLIGHT_INDEX_NAME = "inflight-index"
# what a call through the ledger's client raises: botocore's own errors (pynamodb's wrapping of
# them, from the table's creation, by :func:`is_vendor_error`)
VENDOR_ERRORS = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)
_BATCH_GET_MAX = 100
# the part of a batch DynamoDB throttled (statements, or keys a BatchGetItem left unprocessed)
# is sent again after a pause, doubling, as AWS asks of batch callers; for keys, up to a
# second, and this many rounds in a row that leave as many keys unprocessed as before give up
BATCH_PAUSE_S = 0.05
_UNPROCESSED_PAUSE_MAX_S = 1.0
_UNPROCESSED_STALLED_ROUNDS = 8


class DynamoDBTable:
    """The ledger's table: its client, made on first use, and the calls every part makes.
    Thread-safe: shared by the parts of one ledger."""

    def __init__(
        self, options: ConnectionOptions, *, pause: Callable[[float], None] = time.sleep
    ) -> None:
        """``pause``: what waits before a batch's throttled part is sent again."""
        self._options = options
        self._pause = pause
        self._client: Any = None
        self._client_lock = threading.Lock()

    @property
    def table_name(self) -> str:
        return self._options.table_name

    @property
    def client(self) -> Any:
        """The botocore client of every read and write, made on first use; also for event
        hooks (metrics, injected faults, the cost meter)."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = data_client(self._options)
        return self._client

    @client.setter
    def client(self, client: Any) -> None:
        """Another client in its place (a stub, in tests without sockets)."""
        self._client = client

    def translated(self, doing: str, key: str | None = None) -> Translated:
        """``with table.translated("update", key):`` the one place a vendor error becomes a
        ledger error (:func:`translate`), its cause kept."""
        return Translated(self._options.table_name, doing, key)

    def get_item(
        self, pk: str, key: str | None, doing: str, *, consistent: bool
    ) -> dict[str, Any] | None:
        with self.translated(doing, key):
            item = self.client.get_item(
                TableName=self.table_name, Key={"pk": x.s(pk)}, ConsistentRead=consistent
            ).get("Item")
        return item or None

    def update(
        self,
        pk: str,
        key: str | None,
        update: str,
        condition: str,
        values: dict[str, Any],
        *,
        returns: str = "ALL_NEW",
        names: dict[str, str] | None = None,
    ) -> tuple[bool, dict[str, Any] | None]:
        """One conditional UpdateItem: (True, the item ``returns`` asks for: the new one, or
        with ``UPDATED_OLD`` the old values of the attributes written, None for a new item),
        or (False, the item that won instead).

        Each write carries a token of its own. When the SDK retried a request whose first try
        was applied, the retry fails its condition and finds the token: the write is ours.
        Another party's identical write has another token: that one is a lost race.
        """
        token = secrets.token_hex(8)
        values[":token"] = x.s(token)
        kwargs = x.update_kwargs(
            self.table_name, pk, update, condition, values, returns=returns, names=names
        )
        with self.translated("update", key):
            try:
                # botocore itself, not pynamodb's dispatch: it would add ReturnConsumedCapacity,
                # a uuid and its signals to the call every message makes (about 0.1 ms of CPU)
                data = self.client.update_item(**kwargs)
            except VENDOR_ERRORS as exc:
                if code_of(exc) != CONDITION_FAILED:
                    raise  # translated on its way out
                current = _old_item_of(exc)
                if current is None:  # the backend did not return it: read it
                    current = self.get_item(pk, key, "read after a lost condition", consistent=True)
                mine = current is not None and current.get("write_token", {}).get("S") == token
                return mine, current
        returned: dict[str, Any] | None = data.get("Attributes")
        return True, returned

    def batch_get_items(self, pks: Sequence[str], doing: str) -> list[dict[str, Any]]:
        """Consistent reads, 100 keys per request. Keys DynamoDB leaves unprocessed are asked
        again after a pause that doubles (``BATCH_PAUSE_S``, up to a second); rounds
        that process none of them ``_UNPROCESSED_STALLED_ROUNDS`` times in a row raise
        :class:`LedgerThrottledError`, as a throttled call does once the SDK gave up."""
        wanted = list(dict.fromkeys(pks))
        found: list[dict[str, Any]] = []
        for start in range(0, len(wanted), _BATCH_GET_MAX):
            keys = [{"pk": x.s(pk)} for pk in wanted[start : start + _BATCH_GET_MAX]]
            request: dict[str, Any] = {self.table_name: {"Keys": keys, "ConsistentRead": True}}
            left, rounds, stalled = len(keys), 0, 0
            while request:
                with self.translated(doing):
                    page = self.client.batch_get_item(RequestItems=request)
                found.extend(page.get("Responses", {}).get(self.table_name, []))
                request = page.get("UnprocessedKeys") or {}
                if not request:
                    break
                unprocessed = len(request[self.table_name]["Keys"])
                stalled = stalled + 1 if unprocessed >= left else 0
                if stalled == _UNPROCESSED_STALLED_ROUNDS:
                    raise LedgerThrottledError(
                        f"DynamoDB left {unprocessed} keys unprocessed {stalled} times in a row "
                        f"({doing})",
                        table=self.table_name,
                    )
                left = unprocessed
                self._pause(min(BATCH_PAUSE_S * 2**rounds, _UNPROCESSED_PAUSE_MAX_S))
                rounds += 1
        return found

    def query_index(
        self,
        partition: str,
        *,
        before_ms: int | None,
        limit: int,
        after: tuple[int, str] | None,
    ) -> tuple[list[tuple[int, str]], tuple[int, str] | None]:
        """One page of an index partition: ``[(sort value, pk)]`` and the cursor after it."""
        condition = "#bucket = :bucket"
        names = {"#bucket": "inflight_bucket"}
        values: dict[str, Any] = {":bucket": x.s(partition)}
        if before_ms is not None:
            # DynamoDB refuses a name the expressions do not use: #lease only with the cut-off
            condition += " AND #lease < :before"
            names["#lease"] = "lease_expires_at_ms"
            values[":before"] = x.n(before_ms)
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": INFLIGHT_INDEX_NAME,
            "KeyConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "Limit": limit,
        }
        if after is not None:
            kwargs["ExclusiveStartKey"] = {
                "pk": x.s(after[1]),
                "inflight_bucket": x.s(partition),
                "lease_expires_at_ms": x.n(after[0]),
            }
        with self.translated("query the in-flight index"):
            page = self.client.query(**kwargs)
        found = [
            (int(item["lease_expires_at_ms"]["N"]), str(item["pk"]["S"]))
            for item in page.get("Items", [])
        ]
        last = page.get("LastEvaluatedKey")
        cursor = (int(last["lease_expires_at_ms"]["N"]), str(last["pk"]["S"])) if last else None
        return found, cursor

    def scan(
        self, filter_expression: str, values: dict[str, Any], *, page_size: int, **extra: Any
    ) -> Iterator[dict[str, Any]]:
        """The table's items that ``filter_expression`` (on ``#pk``) keeps, page by page."""
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "Limit": page_size,
            "FilterExpression": filter_expression,
            "ExpressionAttributeNames": {"#pk": "pk"},
            "ExpressionAttributeValues": values,
            **extra,
        }
        while True:
            with self.translated("scan"):
                page = self.client.scan(**kwargs)
            yield from page.get("Items", [])
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            kwargs["ExclusiveStartKey"] = last


# --- translation at the edge ----------------------------------------------------------------


class Translated:
    """A vendor error raised in the ``with`` block leaves it as the ledger error
    :func:`translate` maps it to, raised from it; anything else passes as it is. A block that
    handles some vendor errors itself (a failed condition) catches them inside, and re-raises
    the others to be translated here.

    A class rather than ``@contextmanager``: every claim enters one, and this costs an object
    of three slots and two calls (no generator).
    """

    __slots__ = ("_doing", "_key", "_table")

    def __init__(self, table: str, doing: str, key: str | None) -> None:
        self._table = table
        self._doing = doing
        self._key = key

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None and is_vendor_error(exc):
            raise translate(exc, self._table, self._key, self._doing) from exc


def is_vendor_error(exc: BaseException) -> bool:
    """Whether a DynamoDB call raised ``exc``: botocore's errors, or pynamodb's wrapping of them.
    pynamodb is looked up, not imported: only the table's creation and its TTL call it
    (:mod:`dedupe_store.admin`), and no error of a module never imported can have been raised;
    a producer's start does without it."""
    return isinstance(exc, VENDOR_ERRORS) or _is_pynamodb_error(exc, "PynamoDBException")


def _is_pynamodb_error(exc: BaseException, name: str) -> bool:
    exceptions = sys.modules.get("pynamodb.exceptions")
    return exceptions is not None and isinstance(exc, getattr(exceptions, name))


def code_of(exc: BaseException) -> str | None:
    """The AWS error code of a vendor error, or of the vendor error pynamodb wrapped."""
    code = getattr(exc, "cause_response_code", None)
    if isinstance(code, str):
        return code
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return aws_error_code(response)
    cause = getattr(exc, "cause", None) or exc.__cause__
    return code_of(cause) if cause is not None and cause is not exc else None


def _old_item_of(exc: BaseException) -> dict[str, Any] | None:
    """The item a failed condition saw, where DynamoDB returned it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Item"), dict):
            return response["Item"]  # type: ignore[no-any-return]
        current = current.__cause__
    return None


def translate(exc: BaseException, table: str, key: str | None, doing: str) -> LedgerError:
    code = code_of(exc)
    if code == "ResourceNotFoundException" or _is_pynamodb_error(exc, "TableDoesNotExist"):
        return LedgerSchemaError(
            f"ledger table {table!r} does not exist: run 'keo init' ({doing})", table=table, key=key
        )
    if code in DYNAMODB_THROTTLING_CODES:
        return LedgerThrottledError(f"DynamoDB throttled {doing} ({code})", table=table, key=key)
    return LedgerUnavailableError(
        f"DynamoDB failed to {doing}: {code or type(exc).__name__}", table=table, key=key
    )


# --- attributes from DynamoDB's wire format (the hot path skips pynamodb's deserialization) ---


def text_of(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    return None if value is None else str(value["S"])


def number_of(item: Mapping[str, Any], name: str) -> int | None:
    value = item.get(name)
    return None if value is None else int(value["N"])


def binary_of(value: Any) -> bytes:
    # botocore returns bytes; a raw item from an error response may carry base64 text
    return value if isinstance(value, bytes) else base64.b64decode(value)
