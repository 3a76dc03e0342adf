"""``DynamoDBLedger``: the ledger (schema v2, claim groups) on one DynamoDB table.

The kinds of item the table holds::

    key item    pk "<stream>#<key>"                  state, attempt, group, digest, routing,
                                                      TTL: :mod:`dedupe_store.claims` reads and
                                                      writes them, the ledger hands its calls on
    group item  pk "__keo__/group/<stream>/<id>"     state, epoch, owner, lease, members,
                                                      positions; in the in-flight index while
                                                      OPEN: :mod:`dedupe_store.groups` reads and
                                                      writes them, the ledger hands its calls on
    run item    pk "__keo__/run/<stream>/<run>"      a replay-mode run, one item per task and
    task item   pk "__keo__/task/<stream>/..."       one per 256 tasks past the first 256 of an
    stripe item pk "__keo__/runpart/<stream>/..."    execution: :mod:`dedupe_store.runs` reads
                                                      and writes them, the ledger hands its
                                                      calls on
    batch item  pk "__keo__/spark-batch/..."         Spark's batch records, and the reconciler's
    run record  pk "__keo__/reconcile-run/<stream>"  last run: :mod:`dedupe_store.batches`
    and the schema stamp ("__keo__/schema"): :mod:`dedupe_store.admin`, with the table's
    creation, its TTL and the check that it is ready

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
from typing import TYPE_CHECKING, Any

from dedupe_store import expressions as x
from dedupe_store.admin import LEDGER_SCHEMA_VERSION, SCHEMA_PK, DynamoDBTableAdmin, TtlStatus
from dedupe_store.batches import BatchesHandedOn, DynamoDBBatchLedger
from dedupe_store.claims import ClaimsHandedOn, DynamoDBClaimLedger, claim_of, ledger_pk
from dedupe_store.connection import ConnectionOptions
from dedupe_store.groups import (
    DynamoDBGroupLedger,
    GroupsHandedOn,
    group_of,
    group_pk,
    inflight_bucket,
)
from dedupe_store.records import Group, KeyClaim, LedgerRecord
from dedupe_store.run_items import replay_run_pk, replay_task_pk
from dedupe_store.runs import DynamoDBRunLedger, RunsHandedOn
from dedupe_store.table import DynamoDBTable

# the name tests/unit/test_ledger_translation.py imports from here
from dedupe_store.table import Translated as _Translated  # noqa: F401

if TYPE_CHECKING:
    from dedupe_store.model import LedgerItem

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
        self._table = DynamoDBTable(options, pause=self._pause_between_rounds)
        self.dedupe_ttl_s = dedupe_ttl_s
        self.inflight_buckets = inflight_buckets
        # the parts, each reading and writing its own kind of item on the one table
        self._admin = DynamoDBTableAdmin(self._table, options)
        self._claim_ledger = DynamoDBClaimLedger(
            self._table,
            dedupe_ttl_s=dedupe_ttl_s,
            batch_claims=batch_claims,
            pause=self._pause_between_rounds,
        )
        self._group_ledger = DynamoDBGroupLedger(
            self._table, dedupe_ttl_s=dedupe_ttl_s, inflight_buckets=inflight_buckets
        )
        self._run_ledger = DynamoDBRunLedger(
            self._table, dedupe_ttl_s=dedupe_ttl_s, inflight_buckets=inflight_buckets
        )
        self._batch_ledger = DynamoDBBatchLedger(self._table, dedupe_ttl_s=dedupe_ttl_s)

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
        """The table's pynamodb model (its creation), bound on first use."""
        return self._admin.model

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

    # --- the table's administration (dedupe_store.admin) ----------------------------------

    def create_table(self, *, wait: bool = True) -> bool:
        """Create the table, stamped with ``wait`` (:meth:`DynamoDBTableAdmin.create_table`)."""
        return self._admin.create_table(wait=wait)

    def schema_version(self) -> int | None:
        """The table's stamp (:meth:`DynamoDBTableAdmin.schema_version`)."""
        return self._admin.schema_version()

    def enable_ttl(self) -> TtlStatus:
        """Turn TTL on (:meth:`DynamoDBTableAdmin.enable_ttl`)."""
        return self._admin.enable_ttl()

    def ensure_ready(self, *, stamp_new: bool = False) -> None:
        """Fail fast on a missing table, or one of another version: the admin's check."""
        self._admin.ensure_ready(stamp_new=stamp_new)

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
