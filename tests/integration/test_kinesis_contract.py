"""The contract of ``KinesisWriter`` and ``KinesisReader``, run against kinesalite.

The cases every backend passes live in ``tests/kinesis_contract.py``;
``tests/unit/test_fake_kinesis_contract.py`` runs them on the in-memory fake. Here is the
fixture: a fresh stream of two shards on the session's kinesalite, a put client with the SDK's
retries off (as the producer's), a read client with them on, and the wall clock, which
kinesalite stamps arrivals with.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.config import Config

# the cases every Kinesis backend passes, collected by pytest from this module's namespace
from kinesis_contract import *  # noqa: F403
from kinesis_contract import SHARDS, KinesisUnderTest

from dedupe_store.clock import SystemClock
from devstack import emulators as local_stack
from kinesis_store.provisioning import create_stream, wait_active
from kinesis_store.reader import KinesisReader
from kinesis_store.writer import KinesisWriter

if TYPE_CHECKING:
    from conftest import Names


def _client(endpoint: str, **config: Any) -> Any:
    return boto3.session.Session().client(
        "kinesis",
        region_name=local_stack.REGION,
        endpoint_url=endpoint,
        aws_access_key_id=local_stack.DUMMY_ACCESS_KEY_ID,
        aws_secret_access_key=local_stack.DUMMY_SECRET_ACCESS_KEY,
        config=Config(connect_timeout=2, read_timeout=10, **config),
    )


@pytest.fixture
def kinesis(emulators: local_stack.Endpoints, names: Names) -> KinesisUnderTest:
    put_client = _client(emulators.kinesis, retries={"total_max_attempts": 1, "mode": "standard"})
    read_client = _client(emulators.kinesis, retries={"max_attempts": 5, "mode": "standard"})
    create_stream(read_client, names.stream, SHARDS, timeout_s=30)

    def split(shard_id: str, new_starting_hash_key: int) -> None:
        read_client.split_shard(
            StreamName=names.stream,
            ShardToSplit=shard_id,
            NewStartingHashKey=str(new_starting_hash_key),
        )
        wait_active(read_client, names.stream, timeout_s=30)

    return KinesisUnderTest(
        stream=names.stream,
        writer_for=lambda stream: KinesisWriter(put_client, stream),
        reader_for=lambda stream: KinesisReader(read_client, stream),
        now_ms=SystemClock().now_ms,
        let_pass=lambda ms: time.sleep(ms / 1000),
        split=split,
    )
