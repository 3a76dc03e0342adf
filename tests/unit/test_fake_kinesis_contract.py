"""The Kinesis contract of ``tests/kinesis_contract.py``, run on ``FakeKinesisClient``.

A fake must pass the same contract as the real one: the protocol's unit tests and its
Hypothesis model run on this fake, so what they prove holds on Kinesis only as far as the
fake behaves like it. ``tests/integration/test_kinesis_contract.py`` runs the same cases on
kinesalite. Time is the fake's manual clock: letting time pass advances it.
"""

from __future__ import annotations

import pytest
from fakes.kinesis import FakeKinesisClient

# the cases every Kinesis backend passes, collected by pytest from this module's namespace
from kinesis_contract import *  # noqa: F403
from kinesis_contract import SHARDS, KinesisUnderTest

from dedupe_store.clock import ManualClock
from kinesis_store.reader import KinesisReader
from kinesis_store.writer import KinesisWriter

STREAM = "orders"


@pytest.fixture
def kinesis() -> KinesisUnderTest:
    clock = ManualClock()
    client = FakeKinesisClient(stream=STREAM, clock=clock, shard_count=SHARDS)

    def split(shard_id: str, new_starting_hash_key: int) -> None:
        client.split_shard(shard_id, new_starting_hash_key)

    return KinesisUnderTest(
        stream=STREAM,
        writer_for=lambda stream: KinesisWriter(client, stream),
        reader_for=lambda stream: KinesisReader(client, stream, sleep=client.sleep),
        now_ms=clock.now_ms,
        let_pass=client.advance,
        split=split,
    )
