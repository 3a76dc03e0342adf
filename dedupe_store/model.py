"""The pynamodb model of a ledger item, bound to a table at run time.

Table names and endpoints come from settings, so :func:`bind_ledger_model` makes a subclass
whose ``Meta`` names them. Attributes ``inflight_bucket`` and ``lease_expires_at_ms`` exist
only while a claim is IN_FLIGHT, which keeps the in-flight index sparse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pynamodb.attributes import BinaryAttribute, NumberAttribute, UnicodeAttribute
from pynamodb.indexes import GlobalSecondaryIndex, KeysOnlyProjection
from pynamodb.models import Model

INFLIGHT_INDEX_NAME = "inflight-index"
TTL_ATTRIBUTE = "expires_at"


class InFlightIndex(GlobalSecondaryIndex["LedgerItem"]):  # type: ignore[no-untyped-call]
    """Sparse, bucketed: only IN_FLIGHT items have ``inflight_bucket`` ("<stream>#<n>")."""

    class Meta:
        index_name = INFLIGHT_INDEX_NAME
        projection = KeysOnlyProjection()
        read_capacity_units = 1
        write_capacity_units = 1

    inflight_bucket = UnicodeAttribute(hash_key=True)
    lease_expires_at_ms = NumberAttribute(range_key=True)


class LedgerItem(Model):
    class Meta:
        table_name = "keo-ledger"

    pk = UnicodeAttribute(hash_key=True)
    stream = UnicodeAttribute()
    msg_key = UnicodeAttribute()
    state = UnicodeAttribute()
    attempt = NumberAttribute()
    owner = UnicodeAttribute()
    write_token = UnicodeAttribute(null=True)
    claimed_at_ms = NumberAttribute()
    payload_digest = UnicodeAttribute()
    routing_hash_key = UnicodeAttribute()
    inflight_bucket = UnicodeAttribute(null=True)
    lease_expires_at_ms = NumberAttribute(null=True)
    shard_id = UnicodeAttribute(null=True)
    sequence_number = UnicodeAttribute(null=True)
    sub_sequence_number = NumberAttribute(null=True)
    delivered_at_ms = NumberAttribute(null=True)
    expires_at = NumberAttribute(null=True)  # epoch seconds; the table's TTL attribute
    payload = BinaryAttribute(null=True, legacy_encoding=False)

    inflight_index = InFlightIndex()


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """How the ledger reaches DynamoDB. ``host`` None means the AWS default endpoint."""

    table_name: str
    region: str
    host: str | None = None
    connect_timeout_s: int = 2
    read_timeout_s: int = 5
    max_retry_attempts: int = 3
    max_pool_connections: int = 32
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None


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
