"""How held claims become PutRecords entries: one record each, or KPL aggregates.

Aggregation packs user records that route to the same shard into one Kinesis record. Each
user record keeps its own partition key (the message key) and explicit hash key, so KCL
deaggregates it as if it had been sent alone. The KCL takes an aggregate whole or not at all
(:func:`kinesis_store.shards.kcl_delivers_whole`): an aggregate packed on a stale shard map
that lands on a shard not covering all its members is not delivered, none of it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kinesis_store.entries import record_size
from kinesis_store.kpl import Aggregate
from kinesis_store.shards import Shard
from producer.protocol import PreparedMessage

_M = TypeVar("_M")


@dataclass(slots=True)
class PutUnit(Generic[_M]):
    """One PutRecords entry and the members it carries, in sub-sequence order."""

    entry: dict[str, Any]
    members: list[_M]
    aggregated: bool

    @property
    def size_bytes(self) -> int:
        return record_size(self.entry["PartitionKey"], self.entry["Data"])


def single_units(
    members: Sequence[_M], item_of: Callable[[_M], PreparedMessage]
) -> list[PutUnit[_M]]:
    return [PutUnit(item_of(member).entry(), [member], aggregated=False) for member in members]


def aggregated_units(
    members: Sequence[_M],
    item_of: Callable[[_M], PreparedMessage],
    open_shards: Sequence[Shard],
    max_record_bytes: int,
) -> list[PutUnit[_M]]:
    """Group members by the open shard their hash key routes to, and fill aggregates."""
    by_shard: dict[str, list[_M]] = defaultdict(list)
    for member in members:
        hash_key = int(item_of(member).explicit_hash_key)
        shard = next((s for s in open_shards if s.covers(hash_key)), None)
        by_shard[shard.shard_id if shard else ""].append(member)
    units: list[PutUnit[_M]] = []
    for group in by_shard.values():
        aggregate = Aggregate(max_record_bytes)
        inside: list[_M] = []
        for member in group:
            item = item_of(member)
            if aggregate.add(item.message.key, item.message.data, item.explicit_hash_key):
                inside.append(member)
                continue
            if inside:
                units.append(PutUnit(aggregate.entry(), inside, aggregated=True))
                aggregate, inside = Aggregate(max_record_bytes), []
            if aggregate.add(item.message.key, item.message.data, item.explicit_hash_key):
                inside.append(member)
            else:  # too big to aggregate at all: send it as a plain record
                units.extend(single_units([member], item_of))
        if inside:
            units.append(PutUnit(aggregate.entry(), inside, aggregated=True))
    return units
