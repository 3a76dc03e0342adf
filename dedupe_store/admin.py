"""``DynamoDBTableAdmin``: the ledger table's administration: its creation, its schema stamp,
its TTL, and the check that it is ready.

Its item::

    schema stamp  pk "__keo__/schema"                the ledger schema version of the table's
                                                      items

A table stamped with another version is refused, never misread; a table with items and no
stamp predates stamps: version 1.

The check that the table is ready (every producer's and reader's start) reads through the
ledger's own client; only the table's creation and its TTL's switch use pynamodb, imported then
(its model bound on first use): a producer's start does without it.
"""

from __future__ import annotations

import functools
import time
from enum import StrEnum
from typing import TYPE_CHECKING

from dedupe_store.connection import ConnectionOptions
from dedupe_store.errors import LedgerSchemaError
from dedupe_store.expressions import TTL_ATTRIBUTE
from dedupe_store.table import CONDITION_FAILED, VENDOR_ERRORS, DynamoDBTable, code_of

if TYPE_CHECKING:
    from pynamodb.connection.table import TableConnection

    from dedupe_store.model import LedgerItem

__all__ = ["LEDGER_SCHEMA_VERSION", "SCHEMA_PK", "DynamoDBTableAdmin", "TtlStatus"]

_TABLE_POLL_FIRST_S = 0.05  # a new table's status polled after 50 ms, doubling to 2 s
_TABLE_POLL_MAX_S = 2.0
SCHEMA_PK = "__keo__/schema"
# The layout of the items this code reads and writes. A table stamped with another version is
# refused, never misread; a table with items and no stamp predates stamps: version 1.
LEDGER_SCHEMA_VERSION = 2


class TtlStatus(StrEnum):
    """The ledger table's TTL after :meth:`DynamoDBTableAdmin.enable_ttl`."""

    ENABLED = "on (expires_at)"  # turned on by this call
    ALREADY_ON = "on (expires_at), already"
    OTHER_ATTRIBUTE = "on another attribute than expires_at: ledger items never expire"
    UNSUPPORTED = "not supported by this backend"
    OFF = "off"


class DynamoDBTableAdmin:
    """The administration of the ledger's table (``keo init``, a reader's or writer's check at
    start). :class:`dedupe_store.ledger.DynamoDBLedger` holds one and hands its calls on."""

    def __init__(self, table: DynamoDBTable, options: ConnectionOptions) -> None:
        """``options``: where the table is, for its pynamodb :attr:`model`."""
        self._table = table
        self._options = options

    @functools.cached_property
    def model(self) -> type[LedgerItem]:
        """The table's pynamodb model, which creates it with its in-flight index: bound on
        first use."""
        from dedupe_store.model import bind_ledger_model

        return bind_ledger_model(self._options)

    def _connection(self) -> TableConnection:
        return self.model._get_connection()

    def _exists(self) -> bool:
        """Whether the table exists: a ``DescribeTable`` through the ledger's client."""
        try:
            self._table.client.describe_table(TableName=self._table.table_name)
        except VENDOR_ERRORS as exc:
            if code_of(exc) == "ResourceNotFoundException":
                return False
            raise  # translated on its way out
        return True

    def create_table(self, *, wait: bool = True) -> bool:
        """Create the table with its in-flight index; True if created, False if it existed.

        With ``wait``, the table is also stamped with this code's schema version (an existing
        table keeps its stamp, and one of another version is refused).
        """
        with self._table.translated("create table"):
            created = not self._exists()
            if created:
                self.model.create_table(wait=False, billing_mode="PAY_PER_REQUEST")
                if wait:
                    self._wait_active()
        if wait and created:
            self._stamp_schema()
        elif wait:
            # a table that existed may hold another version's items: stamped only if empty
            self._check_schema()
        return created

    def schema_version(self) -> int | None:
        """The ledger schema version the table is stamped with: None for an empty table
        without a stamp, 1 for a table with items but no stamp (stamps came with version 2)."""
        stamp = self._stamp()
        if stamp is not None:
            return stamp
        with self._table.translated("read the schema version"):
            anything = self._table.client.scan(TableName=self._table.table_name, Limit=1).get(
                "Items"
            )
        return 1 if anything else None

    def _stamp(self) -> int | None:
        """The schema version the table is stamped with, None without a stamp."""
        item = self._table.get_item(SCHEMA_PK, None, "read the schema version", consistent=True)
        return None if item is None else int(item["schema_version"]["N"])

    def _wait_active(self) -> None:
        """Until the new table is ACTIVE, as pynamodb's own wait, but first polled after 50 ms
        (doubling to its 2 s): the emulators take 50 ms, a test suite creates tables by the
        dozen, and pynamodb would sleep 2 s before its second look at each."""
        pause_s = _TABLE_POLL_FIRST_S
        while self._connection().describe_table().get("TableStatus") != "ACTIVE":
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, _TABLE_POLL_MAX_S)

    def _stamp_schema(self) -> None:
        with self._table.translated("stamp the schema version"):
            try:
                self._table.client.put_item(
                    TableName=self._table.table_name,
                    Item={
                        "pk": {"S": SCHEMA_PK},
                        "schema_version": {"N": str(LEDGER_SCHEMA_VERSION)},
                    },
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except VENDOR_ERRORS as exc:
                if code_of(exc) != CONDITION_FAILED:
                    raise  # translated on its way out
        found = self.schema_version()
        if found != LEDGER_SCHEMA_VERSION:
            raise _another_version(self._table.table_name, found)

    def _check_schema(self) -> None:
        found = self.schema_version()
        if found is None:  # a new, empty table: it becomes this version's
            self._stamp_schema()
            return
        if found != LEDGER_SCHEMA_VERSION:
            raise _another_version(self._table.table_name, found)

    def enable_ttl(self) -> TtlStatus:
        """Turn on TTL deletion of expired items (on ``expires_at``), unless it is on already.

        DynamoDB refuses to turn on a TTL that is on (a ValidationException): it is read first,
        and read again after a refusal (another ``keo init`` may have turned it on meanwhile).
        """
        from pynamodb.exceptions import PynamoDBException

        current = self._ttl_status()
        if current is not TtlStatus.OFF:
            return current
        with self._table.translated("enable TTL"):
            try:
                self._connection().connection.update_time_to_live(
                    self._table.table_name, TTL_ATTRIBUTE
                )
            except PynamoDBException as exc:
                if code_of(exc) == "UnknownOperationException" or (
                    code_of(exc) is None and "UnknownOperation" in str(exc)
                ):
                    return TtlStatus.UNSUPPORTED
                after = self._ttl_status() if code_of(exc) == "ValidationException" else None
                if after in {TtlStatus.ALREADY_ON, TtlStatus.OTHER_ATTRIBUTE}:
                    return after
                raise  # translated on its way out
        return TtlStatus.ENABLED

    def _ttl_status(self) -> TtlStatus:
        """The table's TTL as DescribeTimeToLive tells it; OFF when it is off (or going off)."""
        with self._table.translated("read the TTL"):
            try:
                found = self._table.client.describe_time_to_live(TableName=self._table.table_name)
            except VENDOR_ERRORS as exc:
                if code_of(exc) == "UnknownOperationException":
                    return TtlStatus.UNSUPPORTED
                raise  # translated on its way out
        description = found.get("TimeToLiveDescription", {})
        if description.get("TimeToLiveStatus") not in {"ENABLED", "ENABLING"}:
            return TtlStatus.OFF
        if description.get("AttributeName") != TTL_ATTRIBUTE:
            return TtlStatus.OTHER_ATTRIBUTE
        return TtlStatus.ALREADY_ON

    def ensure_ready(self, *, stamp_new: bool = False) -> None:
        """Fail fast with a schema error when the table is missing or of another version.

        Readers (the API, the audit) call it as it is: it only reads (DescribeTable, and
        GetItem of the stamp), and a table without a stamp is refused, since reading alone
        cannot tell a new table from one written by version 1. Writers pass ``stamp_new``: an
        empty table without a stamp (made by other tools than 'keo init') becomes this
        version's, which costs one Scan of one item to make sure it is empty.
        """
        with self._table.translated("describe table"):
            exists = self._exists()
        if not exists:
            raise LedgerSchemaError(
                f"ledger table {self._table.table_name!r} does not exist: run 'keo init'",
                table=self._table.table_name,
            )
        if stamp_new:
            self._check_schema()
            return
        found = self._stamp()
        if found is None:
            raise LedgerSchemaError(
                f"ledger table {self._table.table_name!r} has no ledger schema stamp: it was never "
                "used by this keo (run 'keo init --table "
                f"{self._table.table_name}'), or it was written by ledger schema version 1 (see "
                "'Upgrading' in the README)",
                table=self._table.table_name,
            )
        if found != LEDGER_SCHEMA_VERSION:
            raise _another_version(self._table.table_name, found)


def _another_version(table: str, found: int | None) -> LedgerSchemaError:
    return LedgerSchemaError(
        f"ledger table {table!r} holds ledger schema version {found}; this keo "
        f"reads version {LEDGER_SCHEMA_VERSION} only: use the keo release that wrote it, "
        "or a new table ('Upgrading' in the README)",
        table=table,
    )
