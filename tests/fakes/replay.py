"""A replay-mode producer over the fakes: ``InMemoryLedger``, ``FakeKinesisClient`` and the
fake's clock, whose sleeps move model time (nothing really waits)."""

from __future__ import annotations

import random
from collections.abc import Callable

from dedupe_store.clock import ManualClock
from fakes.kinesis import FakeKinesisClient
from fakes.ledger import InMemoryLedger
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import Shard
from kinesis_store.writer import KinesisWriter
from producer.hooks import NO_HOOKS, Hooks
from producer.protocol import LeasePolicy
from producer.replay.context import ReplayPolicy
from producer.replay.producer import ReplayProducer


def replay_producer_over(
    ledger: InMemoryLedger,
    kinesis: FakeKinesisClient,
    clock: ManualClock,
    lease: LeasePolicy,
    *,
    hooks: Hooks = NO_HOOKS,
    seed: int = 0,
    retention_hours: int = 24,
    shard_map: Callable[[], list[Shard]] | None = None,
    **policy: int,
) -> ReplayProducer:
    return ReplayProducer(
        stream=kinesis.stream,
        ledger=ledger,
        writer=KinesisWriter(kinesis, kinesis.stream),
        reader=KinesisReader(kinesis, kinesis.stream, sleep=kinesis.sleep),
        clock=clock,
        policy=ReplayPolicy(lease=lease, **policy),
        retention_hours=retention_hours,
        shard_map=shard_map,  # given: user records are aggregated
        hooks=hooks,
        sleep=kinesis.sleep,
        rng=random.Random(seed),
    )
