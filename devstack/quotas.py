"""AWS's Kinesis Data Streams quotas, as the local stack's quota mode enforces them (pure: no
I/O, the time passed in). :mod:`devstack.quota_proxy` applies them in front of kinesalite.

Each figure is a field of :class:`KinesisQuotas` (so a user can model an account whose quotas
were raised), and comes from the API reference page of its operation (Amazon Kinesis Data
Streams API Reference, https://docs.aws.amazon.com/kinesis/latest/APIReference/):

    PutRecords, PutRecord   per shard: 1,000 records/s and 1 MiB/s of data and partition keys
                            ("Each shard can support writes up to 1,000 records per second, up
                            to a maximum data write total of 1 MiB per second"); over it, a
                            record of PutRecords fails alone (ErrorCode
                            ProvisionedThroughputExceededException), PutRecord fails whole
    GetRecords              per shard: 5 calls/s, and 2 MiB/s read by all its consumers
                            together; a call may return up to 10 MiB, and then "subsequent calls
                            made within the next 5 seconds throw
                            ProvisionedThroughputExceededException" (the shard's bytes are
                            owed until the rate pays them back)
    GetShardIterator        5 calls/s per open shard
    DescribeStreamSummary   20 calls/s per account
    DescribeStream          10 calls/s per account
    ListShards              1,000 calls/s per stream
    ListStreams             5 calls/s per account
    CreateStream, DeleteStream, SplitShard, MergeShards, UpdateShardCount
                            5 calls/s per account (UpdateShardCount: 2 per rolling 60 s is the
                            documented figure; 5/s is a ceiling here, not a model)
    DescribeLimits          1 call/s per account

AWS documents no burst for these: each is a token bucket that holds one second of its rate,
refilled continuously, so a caller at the rate never waits and one above it is refused the
excess within the second.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final

__all__ = [
    "MIB",
    "Admission",
    "KinesisQuotaState",
    "KinesisQuotas",
    "Scope",
    "TokenBucket",
]

MIB: Final = 1024 * 1024
# a refill computed from float seconds may fall short of a whole token by a rounding error
_ROUNDING: Final = 1e-9


class Scope(StrEnum):
    """Who a control-plane quota is counted for."""

    ACCOUNT = "account"
    STREAM = "stream"


# operation -> (calls a second, counted per): the control plane's quotas (module docstring)
CONTROL_PLANE: Final[Mapping[str, tuple[float, Scope]]] = MappingProxyType(
    {
        "DescribeStreamSummary": (20, Scope.ACCOUNT),
        "DescribeStream": (10, Scope.ACCOUNT),
        "ListShards": (1000, Scope.STREAM),
        "ListStreams": (5, Scope.ACCOUNT),
        "CreateStream": (5, Scope.ACCOUNT),
        "DeleteStream": (5, Scope.ACCOUNT),
        "SplitShard": (5, Scope.ACCOUNT),
        "MergeShards": (5, Scope.ACCOUNT),
        "UpdateShardCount": (5, Scope.ACCOUNT),
        "DescribeLimits": (1, Scope.ACCOUNT),
    }
)


@dataclass(frozen=True)
class KinesisQuotas:
    """The figures the quota mode enforces (AWS's defaults; raise them to model an account
    whose quotas were raised)."""

    shard_write_records_per_s: float = 1000
    shard_write_bytes_per_s: float = MIB
    shard_read_calls_per_s: float = 5
    shard_read_bytes_per_s: float = 2 * MIB
    shard_iterator_calls_per_s: float = 5
    control_plane: Mapping[str, tuple[float, Scope]] = field(default_factory=lambda: CONTROL_PLANE)

    def __post_init__(self) -> None:
        rates = [
            self.shard_write_records_per_s,
            self.shard_write_bytes_per_s,
            self.shard_read_calls_per_s,
            self.shard_read_bytes_per_s,
            self.shard_iterator_calls_per_s,
            *(rate for rate, _ in self.control_plane.values()),
        ]
        if any(rate <= 0 for rate in rates):
            raise ValueError("every quota must be a positive rate")


@dataclass
class TokenBucket:
    """``rate_per_s`` tokens a second, holding at most ``capacity``; starts full. ``take``
    is all or nothing; ``owe`` may leave it below zero (a GetRecords answer larger than what
    was left), and nothing can be taken until the rate has paid the debt back."""

    rate_per_s: float
    capacity: float
    tokens: float = field(init=False)
    updated_s: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tokens = self.capacity

    def _refill(self, now_s: float) -> None:
        if self.updated_s is not None and now_s > self.updated_s:
            self.tokens = min(
                self.capacity, self.tokens + (now_s - self.updated_s) * self.rate_per_s
            )
        if self.updated_s is None or now_s > self.updated_s:
            self.updated_s = now_s

    def available(self, now_s: float) -> float:
        self._refill(now_s)
        return self.tokens

    def holds(self, amount: float, now_s: float) -> bool:
        """Whether ``amount`` could be taken now."""
        self._refill(now_s)
        return amount <= self.tokens + _ROUNDING

    def take(self, amount: float, now_s: float) -> bool:
        if not self.holds(amount, now_s):
            return False
        self.tokens -= amount
        return True

    def owe(self, amount: float, now_s: float) -> None:
        self._refill(now_s)
        self.tokens -= amount


def _per_second(rate_per_s: float) -> TokenBucket:
    return TokenBucket(rate_per_s, rate_per_s)


@dataclass(frozen=True)
class Admission:
    """What a quota decided for one call (or one record of a PutRecords)."""

    admitted: bool
    code: str = ""
    message: str = ""


ADMITTED: Final = Admission(admitted=True)
THROTTLED: Final = "ProvisionedThroughputExceededException"
LIMITED: Final = "LimitExceededException"


@dataclass
class KinesisQuotaState:
    """Every bucket of the quota mode, created on first use, and what it counted: calls by
    operation, throttles by operation, records and bytes admitted and refused by shard, and
    the read calls (GetShardIterator, GetRecords) by shard, refused ones included."""

    quotas: KinesisQuotas = field(default_factory=KinesisQuotas)
    account: str = "000000000000"
    _buckets: dict[tuple[str, ...], TokenBucket] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    throttles: Counter[str] = field(default_factory=Counter)
    written: Counter[tuple[str, str]] = field(default_factory=Counter)  # records, by shard
    written_bytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)  # records, by shard
    read_bytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    shard_calls: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # op, by shard

    def _bucket(self, key: tuple[str, ...], rate_per_s: float) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _per_second(rate_per_s)
        return bucket

    def _throttled(self, operation: str, code: str, message: str) -> Admission:
        self.throttles[operation] += 1
        return Admission(admitted=False, code=code, message=message)

    def admit_records(
        self, operation: str, stream: str, records: Sequence[tuple[str, int]], now_s: float
    ) -> list[Admission]:
        """Each record ``(shard, bytes)`` of a put, in order: admitted while its shard has a
        record and its bytes left this second, else refused (nothing of it written)."""
        self.calls[operation] += 1
        quotas = self.quotas
        decided: list[Admission] = []
        for shard, size in records:
            count = self._bucket(("w-records", stream, shard), quotas.shard_write_records_per_s)
            volume = self._bucket(("w-bytes", stream, shard), quotas.shard_write_bytes_per_s)
            if count.available(now_s) + _ROUNDING >= 1 and volume.available(now_s) >= size:
                count.take(1, now_s)
                volume.take(size, now_s)
                self.written[(stream, shard)] += 1
                self.written_bytes[(stream, shard)] += size
                decided.append(ADMITTED)
                continue
            self.refused[(stream, shard)] += 1
            decided.append(
                self._throttled(
                    operation,
                    THROTTLED,
                    f"Rate exceeded for shard {shard} in stream {stream} under account "
                    f"{self.account}.",
                )
            )
        return decided

    def admit_read(self, stream: str, shard: str, now_s: float) -> Admission:
        """A GetRecords call on ``shard``: refused past 5 calls a second, or while the shard's
        read bytes are owed."""
        self.calls["GetRecords"] += 1
        self.shard_calls[("GetRecords", stream, shard)] += 1
        calls = self._bucket(("r-calls", stream, shard), self.quotas.shard_read_calls_per_s)
        volume = self._bucket(("r-bytes", stream, shard), self.quotas.shard_read_bytes_per_s)
        if volume.available(now_s) >= 0 and calls.take(1, now_s):
            return ADMITTED
        return self._throttled(
            "GetRecords",
            THROTTLED,
            f"Rate exceeded for Shard - {self.account}/{stream}/{shard}",
        )

    def charge_read(self, stream: str, shard: str, size: int, now_s: float) -> None:
        """What an admitted GetRecords returned, owed by the shard's read bytes."""
        self.read_bytes[(stream, shard)] += size
        volume = self._bucket(("r-bytes", stream, shard), self.quotas.shard_read_bytes_per_s)
        volume.owe(size, now_s)

    def admit_iterator(self, stream: str, shard: str, now_s: float) -> Admission:
        """A GetShardIterator call for ``shard``."""
        self.calls["GetShardIterator"] += 1
        self.shard_calls[("GetShardIterator", stream, shard)] += 1
        rate = self.quotas.shard_iterator_calls_per_s
        if self._bucket(("iterator", stream, shard), rate).take(1, now_s):
            return ADMITTED
        return self._throttled(
            "GetShardIterator",
            THROTTLED,
            f"Rate exceeded for shard {shard} in stream {stream} under account {self.account}.",
        )

    def admit_control(self, operation: str, stream: str, now_s: float) -> Admission:
        """A control-plane call: counted per account or per stream (``CONTROL_PLANE``); an
        operation without a quota here is admitted."""
        self.calls[operation] += 1
        quota = self.quotas.control_plane.get(operation)
        if quota is None:
            return ADMITTED
        rate, scope = quota
        key = ("control", operation, stream if scope is Scope.STREAM else "")
        if self._bucket(key, rate).take(1, now_s):
            return ADMITTED
        where = f"stream {stream} under account" if scope is Scope.STREAM else "account"
        return self._throttled(operation, LIMITED, f"Rate exceeded for {where} {self.account}.")

    def snapshot(self) -> dict[str, object]:
        """The counters, as JSON-ready data (``GET /__keo/quotas`` of the proxy)."""

        def by_shard(counter: Counter[tuple[str, str]]) -> dict[str, int]:
            return {f"{stream}/{shard}": n for (stream, shard), n in sorted(counter.items())}

        calls_by_shard: dict[str, dict[str, int]] = {}
        for (operation, stream, shard), n in sorted(self.shard_calls.items()):
            calls_by_shard.setdefault(operation, {})[f"{stream}/{shard}"] = n
        return {
            "calls": dict(sorted(self.calls.items())),
            "calls_by_shard": calls_by_shard,
            "throttles": dict(sorted(self.throttles.items())),
            "records_written": by_shard(self.written),
            "bytes_written": by_shard(self.written_bytes),
            "records_refused": by_shard(self.refused),
            "bytes_read": by_shard(self.read_bytes),
        }
