"""How the ledger reaches its table: where it is (:class:`ConnectionOptions`), and the botocore
client of every read and write (:func:`data_client`). No pynamodb here: only the table's
creation uses it (:mod:`dedupe_store.model`)."""

from __future__ import annotations

import importlib.metadata
import platform
from dataclasses import dataclass
from typing import Any

import botocore
from botocore.config import Config

from dedupe_store.sessions import new_session

__all__ = ["ConnectionOptions", "data_client", "user_agent"]


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
    and a fixed user agent. pynamodb keeps a client of its own for the table's creation."""
    config = Config(
        user_agent=user_agent(),
        parameter_validation=False,
        connect_timeout=options.connect_timeout_s,
        read_timeout=options.read_timeout_s,
        max_pool_connections=options.max_pool_connections,
        retries={"total_max_attempts": 1 + options.max_retry_attempts, "mode": "standard"},
    )
    return new_session().create_client(
        "dynamodb",
        region_name=options.region,
        endpoint_url=options.host,
        aws_access_key_id=options.aws_access_key_id,
        aws_secret_access_key=options.aws_secret_access_key,
        aws_session_token=options.aws_session_token,
        config=config,
    )
