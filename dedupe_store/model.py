"""The pynamodb model of the ledger's table: its key and its sparse in-flight index, bound to
a table at run time. What creates and administers the table imports it
(:mod:`dedupe_store.admin`), and only then: every item is read and written through the ledger's
own botocore client (:func:`dedupe_store.connection.data_client`), so a producer's start does
not import pynamodb.

Table names and endpoints come from settings, so :func:`bind_ledger_model` makes a subclass
whose ``Meta`` names them. Only OPEN group items and OPEN replay-run items have
``inflight_bucket``, which keeps the in-flight index sparse: a key item never enters it.
"""

from __future__ import annotations

from typing import Any

from pynamodb.attributes import NumberAttribute, UnicodeAttribute
from pynamodb.indexes import GlobalSecondaryIndex, KeysOnlyProjection
from pynamodb.models import Model

from dedupe_store.connection import ConnectionOptions
from dedupe_store.table import INFLIGHT_INDEX_NAME

__all__ = ["InFlightIndex", "LedgerItem", "bind_ledger_model"]


class InFlightIndex(GlobalSecondaryIndex["LedgerItem"]):  # type: ignore[no-untyped-call]
    """Sparse, bucketed: only OPEN groups ("<stream>#<n>") and OPEN replay runs
    ("<stream>#run#<n>") have ``inflight_bucket`` (:mod:`dedupe_store.inflight`)."""

    class Meta:
        index_name = INFLIGHT_INDEX_NAME
        projection = KeysOnlyProjection()
        read_capacity_units = 1
        write_capacity_units = 1

    inflight_bucket = UnicodeAttribute(hash_key=True)
    lease_expires_at_ms = NumberAttribute(range_key=True)


class LedgerItem(Model):
    """The table's key and its in-flight index: all pynamodb needs to create the table.

    Items are read and written as DynamoDB's wire format by :mod:`dedupe_store.ledger` (key
    items and group items share the table); only group and run items carry the index
    attributes.
    """

    class Meta:
        table_name = "keo-ledger"

    pk = UnicodeAttribute(hash_key=True)
    inflight_bucket = UnicodeAttribute(null=True)
    lease_expires_at_ms = NumberAttribute(null=True)

    inflight_index = InFlightIndex()


def bind_ledger_model(options: ConnectionOptions) -> type[LedgerItem]:
    """A subclass of :class:`LedgerItem` bound to one table and endpoint."""
    meta_attrs: dict[str, Any] = {
        "table_name": options.table_name,
        "region": options.region,
        "host": options.host,
        "connect_timeout_seconds": options.connect_timeout_s,
        "read_timeout_seconds": options.read_timeout_s,
        "max_retry_attempts": options.max_retry_attempts,
        "max_pool_connections": options.max_pool_connections,
        "aws_access_key_id": options.aws_access_key_id,
        "aws_secret_access_key": options.aws_secret_access_key,
        "aws_session_token": options.aws_session_token,
        "billing_mode": "PAY_PER_REQUEST",
    }
    meta = type("Meta", (), meta_attrs)
    index_meta = type(
        "Meta",
        (),
        {
            "index_name": INFLIGHT_INDEX_NAME,
            "projection": KeysOnlyProjection(),
        },
    )
    index_cls = type("BoundInFlightIndex", (InFlightIndex,), {"Meta": index_meta})
    return type(
        f"LedgerItem_{options.table_name}",
        (LedgerItem,),
        {"Meta": meta, "inflight_index": index_cls()},
    )
