"""Read a whole stream back and check it against the ledger: the oracle of the integration tests.

It reads with plain boto3 calls (ListShards, GetShardIterator TRIM_HORIZON, GetRecords to the
tip), not with the product's ``KinesisReader``, so a bug in the reader cannot hide a duplicate.
Aggregated records are split with ``kinesis_store.kpl.deaggregate``, and one the KCL drops
whole (a member outside the hash range of the shard it was read from: a stray aggregate put on a
stale shard map) is dropped, as a KCL consumer drops it: the decision is ``tests/kcl_rule.py``'s,
the tests' own port of the KCL's rule, not the product's.

    contents = read_stream(kinesis, stream)
    assert_exactly_once(contents, keys, ledger)        # once each, ledger position == stream
    assert_at_most_once(contents, in_flight, ledger)   # outcomes IN_FLIGHT: never twice
    assert_only(contents, keys)                        # nothing else was written
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import boto3
import kcl_rule

from dedupe_store.ledger import DynamoDBLedger
from dedupe_store.records import Position
from dedupe_store.states import LedgerState
from devstack import emulators as local_stack
from kinesis_store.kpl import UserRecord, deaggregate


@dataclass(frozen=True)
class StreamContents:
    """Every user record of a stream, as a consumer reading from TRIM_HORIZON sees it."""

    stream: str
    records: list[UserRecord]
    counts: Counter[str] = field(default_factory=Counter)
    by_key: dict[str, list[UserRecord]] = field(default_factory=dict)

    @classmethod
    def of(cls, stream: str, records: list[UserRecord]) -> StreamContents:
        by_key: dict[str, list[UserRecord]] = defaultdict(list)
        for record in records:
            by_key[record.partition_key].append(record)
        return cls(
            stream,
            records,
            Counter({key: len(found) for key, found in by_key.items()}),
            dict(by_key),
        )

    def positions(self, key: str) -> list[Position]:
        return [position_of(r) for r in self.by_key.get(key, [])]

    def duplicates(self) -> dict[str, int]:
        return {key: n for key, n in self.counts.items() if n > 1}

    def per_shard(self) -> Counter[str]:
        return Counter(r.shard_id for r in self.records)


class StepClock:
    """A monotonic clock the test moves (a quota proxy's: every figure exact, whatever the
    machine's speed)."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def kinesis_client(endpoint: str, config: Any = None) -> Any:
    """A plain boto3 client (``config``: a botocore ``Config``, e.g. the SDK's retries off)."""
    return aws_client("kinesis", endpoint, config)


def aws_client(service: str, endpoint: str, config: Any = None) -> Any:
    """A plain boto3 client of ``service`` on the emulator at ``endpoint``."""
    return boto3.session.Session().client(
        service,
        endpoint_url=endpoint,
        region_name=local_stack.REGION,
        aws_access_key_id=local_stack.DUMMY_ACCESS_KEY_ID,
        aws_secret_access_key=local_stack.DUMMY_SECRET_ACCESS_KEY,
        config=config,
    )


def read_stream(client: Any, stream: str) -> StreamContents:
    """Every user record a KCL consumer gets from every shard (open and closed), from
    TRIM_HORIZON to the tip."""
    records: list[UserRecord] = []
    for shard in kcl_rule.shards_of(client, stream):
        for raw in kcl_rule.records_of(client, stream, shard.shard_id):
            if kcl_rule.kcl_deaggregate(shard, raw):  # else dropped whole by the KCL
                records.extend(deaggregate(shard.shard_id, raw).records)
    return StreamContents.of(stream, records)


def assert_exactly_once(
    contents: StreamContents,
    keys: Iterable[str],
    ledger: DynamoDBLedger,
    *,
    payloads: Mapping[str, bytes] | None = None,
) -> None:
    """Each key is in the stream exactly once, and the ledger says DELIVERED at that position
    (shard id, sequence number, and sub-sequence number for an aggregated record)."""
    wanted = list(dict.fromkeys(keys))
    missing = [k for k in wanted if contents.counts[k] == 0]
    twice = {k: contents.counts[k] for k in wanted if contents.counts[k] > 1}
    assert not missing, f"{len(missing)} keys never reached the stream, e.g. {missing[:5]}"
    assert not twice, f"{len(twice)} keys are in the stream more than once: {_head(twice)}"

    ledger_records = ledger.batch_get(contents.stream, wanted)
    problems: dict[str, str] = {}
    for key in wanted:
        (record,) = contents.by_key[key]
        entry = ledger_records.get(key)
        if entry is None:
            problems[key] = "no ledger item"
        elif entry.state is not LedgerState.DELIVERED:
            problems[key] = f"ledger state {entry.state}"
        elif entry.position != position_of(record):
            problems[key] = f"ledger {entry.position} != stream {position_of(record)}"
        elif payloads is not None and record.data != payloads[key]:
            problems[key] = "the stream holds other data than was sent"
    assert not problems, f"ledger and stream disagree on {len(problems)} keys: {_head(problems)}"


def assert_at_most_once(
    contents: StreamContents, keys: Iterable[str], ledger: DynamoDBLedger
) -> None:
    """Keys left unresolved (IN_FLIGHT): never twice; where the ledger says DELIVERED, it is right."""
    wanted = list(dict.fromkeys(keys))
    twice = {k: contents.counts[k] for k in wanted if contents.counts[k] > 1}
    assert not twice, f"{len(twice)} keys are in the stream more than once: {_head(twice)}"
    delivered = {
        key: record
        for key, record in ledger.batch_get(contents.stream, wanted).items()
        if record.state is LedgerState.DELIVERED
    }
    for key, record in delivered.items():
        assert record.position is not None
        assert contents.counts[key] == 1, f"{key}: the ledger says DELIVERED, the stream lacks it"
        (found,) = contents.by_key[key]
        assert record.position == position_of(found), (
            f"{key}: ledger {record.position} != stream {position_of(found)}"
        )


def assert_only(contents: StreamContents, keys: Iterable[str]) -> None:
    """The stream holds no key but ``keys``: nothing was written for rejected or conflicting input."""
    extra = set(contents.counts) - set(keys)
    assert not extra, f"{len(extra)} unexpected keys in the stream, e.g. {sorted(extra)[:5]}"


def assert_absent(contents: StreamContents, keys: Iterable[str]) -> None:
    present = [k for k in keys if contents.counts[k]]
    assert not present, f"{len(present)} keys are in the stream and should not be: {present[:5]}"


def position_of(record: UserRecord) -> Position:
    """Where a consumer finds the record: shard, sequence number, and the sub-sequence number
    inside a KPL aggregate (None for a plain record)."""
    return Position(record.shard_id, record.sequence_number, record.sub_sequence_number)


def _head(mapping: Mapping[str, object], n: int = 5) -> str:
    return ", ".join(f"{k!r}: {v}" for k, v in list(mapping.items())[:n])


at_most_once = assert_at_most_once  # the name the test plan uses
