"""How the ledger reaches its table: the pynamodb model of a ledger item, bound to a table at
run time, and the botocore client of its reads and writes.

Table names and endpoints come from settings, so :func:`bind_ledger_model` makes a subclass
whose ``Meta`` names them. Only OPEN group items and OPEN replay-run items have
``inflight_bucket``, which keeps the in-flight index sparse: a key item never enters it. pynamodb creates the table; every item is
read and written through :func:`data_client`.
"""

from __future__ import annotations

import importlib.metadata
import platform
from dataclasses import dataclass
from typing import Any

import botocore
import botocore.session
from botocore.config import Config
from pynamodb.attributes import NumberAttribute, UnicodeAttribute
from pynamodb.indexes import GlobalSecondaryIndex, KeysOnlyProjection
from pynamodb.models import Model

INFLIGHT_INDEX_NAME = "inflight-index"
TTL_ATTRIBUTE = "expires_at"


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


def user_agent() -> str:
    """The product first, then what botocore's own legacy string names: fixed for a process.

    botocore rebuilds its default user agent twice per request (about 0.1 ms of CPU, a tenth
    of what a claim costs the client); a fixed one is built once."""
    try:
        version = importlib.metadata.version("kinesis-exactly-once")
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    return (
        f"kinesis-exactly-once/{version} Botocore/{botocore.__version__} "
        f"Python/{platform.python_version()} {platform.system()}/{platform.release()}"
    )


def data_client(options: ConnectionOptions) -> Any:
    """The botocore client of every ledger read and write: SDK retries as pynamodb would set
    them (standard mode), no parameter validation (requests are built by code, not users),
    and a fixed user agent. pynamodb keeps a client of its own for the table's schema."""
    config = Config(
        user_agent=user_agent(),
        parameter_validation=False,
        connect_timeout=options.connect_timeout_s,
        read_timeout=options.read_timeout_s,
        max_pool_connections=options.max_pool_connections,
        retries={"total_max_attempts": 1 + options.max_retry_attempts, "mode": "standard"},
    )
    return botocore.session.get_session().create_client(
        "dynamodb",
        region_name=options.region,
        endpoint_url=options.host,
        aws_access_key_id=options.aws_access_key_id,
        aws_secret_access_key=options.aws_secret_access_key,
        aws_session_token=options.aws_session_token,
        config=config,
    )


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
