"""``DynamoDBLedger``: the ledger (schema v2, claim groups) on one DynamoDB table.

The kinds of item the table holds::

    key item    pk "<stream>#<key>"                  state, attempt, group, digest, routing,
                                                      TTL: :mod:`dedupe_store.claims` reads and
                                                      writes them, the ledger hands its calls on
    group item  pk "__keo__/group/<stream>/<id>"     state, epoch, owner, lease, members,
                                                      positions; in the in-flight index while
                                                      OPEN: :mod:`dedupe_store.groups` reads and
                                                      writes them, the ledger hands its calls on
    run item    pk "__keo__/run/<stream>/<run>"      a replay-mode run, and one item per task:
    task item   pk "__keo__/task/<stream>/..."       :mod:`dedupe_store.runs` reads and writes
                                                      them, the ledger hands its calls on
    batch item  pk "__keo__/spark-batch/..."         Spark's batch records, and the reconciler's
    run record  pk "__keo__/reconcile-run/<stream>"  last run: :mod:`dedupe_store.batches`
    and the schema stamp ("__keo__/schema")

A claim is one conditional write of a key item (no index attribute: 1 write unit under 1 KB).
The group item is written when the group opens, when its lease is renewed or taken over, and
when its positions are recorded. Every write is conditional on the state and attempt or epoch
the caller holds, so two producers, a producer and a reconciler, or two reconcilers can never
both win; the conditions are in :mod:`dedupe_store.expressions`.

A condition that fails still costs a write. When it fails the current item is returned
(``ReturnValuesOnConditionCheckFailure``; the project's dynalite is patched to do it too);
where it is not, it is read back with a consistent read. A retried request whose first try was
applied fails its own condition: each write recognises its own token in the current item and
reports it as applied.

Keys can never collide with other items: stream names have no "/" and no "#" (the rule of
:mod:`dedupe_store.names`, checked where each key is built), so nothing that starts with
"__keo__/" is "<stream>#<key>".

The table's client, its conditional update and its reads are those of
:class:`dedupe_store.table.DynamoDBTable`, where every DynamoDB error is translated in one place,
the vendor error kept as the cause.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Any

from pynamodb.connection.table import TableConnection
from pynamodb.exceptions import PynamoDBException

from dedupe_store import expressions as x
from dedupe_store.batches import BatchesHandedOn, DynamoDBBatchLedger
from dedupe_store.claims import ClaimsHandedOn, DynamoDBClaimLedger, claim_of, ledger_pk
from dedupe_store.errors import (
    LedgerSchemaError,
)
from dedupe_store.groups import (
    DynamoDBGroupLedger,
    GroupsHandedOn,
    group_of,
    group_pk,
    inflight_bucket,
)
from dedupe_store.model import (
    TTL_ATTRIBUTE,
    ConnectionOptions,
    LedgerItem,
    bind_ledger_model,
)
from dedupe_store.records import (
    Group,
    KeyClaim,
    LedgerRecord,
)
from dedupe_store.runs import DynamoDBRunLedger, RunsHandedOn, replay_run_pk, replay_task_pk
from dedupe_store.table import (
    CONDITION_FAILED,
    VENDOR_ERRORS,
    DynamoDBTable,
    code_of,
)

# the name tests/unit/test_ledger_translation.py imports from here
from dedupe_store.table import Translated as _Translated  # noqa: F401

__all__ = [
    "LEDGER_SCHEMA_VERSION",
    "SCHEMA_PK",
    "DynamoDBLedger",
    "TtlStatus",
    "group_pk",
    "inflight_bucket",
    "ledger_pk",
    "replay_run_pk",
    "replay_task_pk",
]

_TABLE_POLL_FIRST_S = 0.05  # a new table's status polled after 50 ms, doubling to 2 s
_TABLE_POLL_MAX_S = 2.0
SCHEMA_PK = "__keo__/schema"
# The layout of the items this code reads and writes. A table stamped with another version is
# refused, never misread; a table with items and no stamp predates stamps: version 1.
LEDGER_SCHEMA_VERSION = 2


class TtlStatus(StrEnum):
    """The ledger table's TTL after :meth:`DynamoDBLedger.enable_ttl`."""

    ENABLED = "on (expires_at)"  # turned on by this call
    ALREADY_ON = "on (expires_at), already"
    OTHER_ATTRIBUTE = "on another attribute than expires_at: ledger items never expire"
    UNSUPPORTED = "not supported by this backend"
    OFF = "off"


class DynamoDBLedger(RunsHandedOn, GroupsHandedOn, ClaimsHandedOn, BatchesHandedOn):
    """The ledger on one DynamoDB table. Thread-safe: share one per process."""

    # the pause before a batch's throttled part is sent again (a test records it instead)
    _pause = staticmethod(time.sleep)
    # the part's own type: its reads may be eventually consistent, and it deletes
    _claim_ledger: DynamoDBClaimLedger

    def __init__(
        self,
        options: ConnectionOptions,
        *,
        dedupe_ttl_s: int = 7 * 24 * 3600,
        inflight_buckets: int = 16,
        batch_claims: bool | None = None,
    ) -> None:
        """``batch_claims``: whether the backend runs PartiQL batches (new keys claimed 25 to
        a request: :meth:`insert_claims`); None learns it from the first batch's answer."""
        self._options = options
        self._model: type[LedgerItem] = bind_ledger_model(options)
        self._table = DynamoDBTable(options, pause=self._pause_between_rounds)
        self.dedupe_ttl_s = dedupe_ttl_s
        self.inflight_buckets = inflight_buckets
        self._run_ledger = DynamoDBRunLedger(
            self._table, dedupe_ttl_s=dedupe_ttl_s, inflight_buckets=inflight_buckets
        )
        self._group_ledger = DynamoDBGroupLedger(
            self._table, dedupe_ttl_s=dedupe_ttl_s, inflight_buckets=inflight_buckets
        )
        self._batch_ledger = DynamoDBBatchLedger(self._table, dedupe_ttl_s=dedupe_ttl_s)
        self._claim_ledger = DynamoDBClaimLedger(
            self._table,
            dedupe_ttl_s=dedupe_ttl_s,
            batch_claims=batch_claims,
            pause=self._pause_between_rounds,
        )

    def _pause_between_rounds(self, seconds: float) -> None:
        # looked up on the ledger at each use: a test records the ledger's pauses instead
        self._pause(seconds)

    @property
    def batch_claims(self) -> bool | None:
        """Whether the backend runs PartiQL batches: None until its first batch's answer."""
        return self._claim_ledger.batch_claims

    @batch_claims.setter
    def batch_claims(self, runs_partiql: bool | None) -> None:
        self._claim_ledger.batch_claims = runs_partiql

    @property
    def table_name(self) -> str:
        return self._options.table_name

    @property
    def model(self) -> type[LedgerItem]:
        return self._model

    @property
    def client(self) -> Any:
        """The botocore client of every read and write, made on first use; also for event
        hooks (metrics, injected faults, the cost meter)."""
        return self._table.client

    @property
    def _client(self) -> Any:
        """The seam a test without sockets sets its stub client through."""
        return self._table.client

    @_client.setter
    def _client(self, client: Any) -> None:
        self._table.client = client

    def _connection(self) -> TableConnection:
        return self._model._get_connection()

    # --- schema -----------------------------------------------------------------------------

    def create_table(self, *, wait: bool = True) -> bool:
        """Create the table with its in-flight index; True if created, False if it existed.

        With ``wait``, the table is also stamped with this code's schema version (an existing
        table keeps its stamp, and one of another version is refused).
        """
        with self._table.translated("create table"):
            created = not self._model.exists()
            if created:
                self._model.create_table(wait=False, billing_mode="PAY_PER_REQUEST")
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
            anything = self.client.scan(TableName=self.table_name, Limit=1).get("Items")
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
                self.client.put_item(
                    TableName=self.table_name,
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
            raise _another_version(self.table_name, found)

    def _check_schema(self) -> None:
        found = self.schema_version()
        if found is None:  # a new, empty table: it becomes this version's
            self._stamp_schema()
            return
        if found != LEDGER_SCHEMA_VERSION:
            raise _another_version(self.table_name, found)

    def enable_ttl(self) -> TtlStatus:
        """Turn on TTL deletion of expired items (on ``expires_at``), unless it is on already.

        DynamoDB refuses to turn on a TTL that is on (a ValidationException): it is read first,
        and read again after a refusal (another ``keo init`` may have turned it on meanwhile).
        """
        current = self._ttl_status()
        if current is not TtlStatus.OFF:
            return current
        with self._table.translated("enable TTL"):
            try:
                self._connection().connection.update_time_to_live(self.table_name, TTL_ATTRIBUTE)
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
                found = self.client.describe_time_to_live(TableName=self.table_name)
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
            exists = self._model.exists()
        if not exists:
            raise LedgerSchemaError(
                f"ledger table {self.table_name!r} does not exist: run 'keo init'",
                table=self.table_name,
            )
        if stamp_new:
            self._check_schema()
            return
        found = self._stamp()
        if found is None:
            raise LedgerSchemaError(
                f"ledger table {self.table_name!r} has no ledger schema stamp: it was never "
                "used by this keo (run 'keo init --table "
                f"{self.table_name}'), or it was written by ledger schema version 1 (see "
                "'Upgrading' in the README)",
                table=self.table_name,
            )
        if found != LEDGER_SCHEMA_VERSION:
            raise _another_version(self.table_name, found)

    # --- reads ------------------------------------------------------------------------------

    def get(self, stream: str, key: str, *, consistent: bool = True) -> LedgerRecord | None:
        claim = self._claim_ledger.get_claim(stream, key, consistent=consistent)
        if claim is None:
            return None
        return LedgerRecord.of(claim, self.get_group(stream, claim.group_id))

    def batch_get(self, stream: str, keys: Iterable[str]) -> dict[str, LedgerRecord]:
        """Consistent reads of many keys and their groups; absent keys are left out."""
        claims = self.batch_get_claims(stream, keys)
        groups = self.batch_get_groups(stream, {c.group_id for c in claims.values()})
        return {
            key: LedgerRecord.of(claim, groups.get(claim.group_id)) for key, claim in claims.items()
        }

    def scan(self, stream: str, *, page_size: int = 1000) -> Iterator[LedgerRecord]:
        """Every key of ``stream`` with its delivery (a full table scan: for audits only).

        Key items and group items come in table order; the join waits for the end.
        """
        claims: list[KeyClaim] = []
        groups: dict[str, Group] = {}
        for item in self.scan_items(stream, page_size=page_size):
            if isinstance(item, Group):
                groups[item.group_id] = item
            else:
                claims.append(item)
        for claim in claims:
            yield LedgerRecord.of(claim, groups.get(claim.group_id))

    def scan_items(
        self,
        stream: str,
        *,
        segment: int = 0,
        total_segments: int = 1,
        page_size: int = 1000,
    ) -> Iterator[KeyClaim | Group]:
        """The key items and group items of ``stream`` in one segment of a parallel scan
        (DynamoDB's ``Segment`` of ``TotalSegments``; the whole table by default), in table
        order, as they are read: what a distributed audit joins itself."""
        if not 0 <= segment < total_segments:
            raise ValueError(f"segment {segment} is not in [0, {total_segments})")
        segments = {"Segment": segment, "TotalSegments": total_segments}
        for item in self._table.scan(
            "begins_with(#pk, :keys) OR begins_with(#pk, :groups)",
            {":keys": x.s(ledger_pk(stream, "")), ":groups": x.s(group_pk(stream, ""))},
            page_size=page_size,
            **(segments if total_segments > 1 else {}),
        ):
            yield group_of(item) if "members" in item else claim_of(item)

    def delete(self, stream: str, key: str) -> None:
        """Remove a key's item outright (tests and operators only; the protocol never deletes)."""
        self._claim_ledger.delete(stream, key)


def _another_version(table: str, found: int | None) -> LedgerSchemaError:
    return LedgerSchemaError(
        f"ledger table {table!r} holds ledger schema version {found}; this keo "
        f"reads version {LEDGER_SCHEMA_VERSION} only: use the keo release that wrote it, "
        "or a new table ('Upgrading' in the README)",
        table=table,
    )
