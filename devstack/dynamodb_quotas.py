"""AWS's DynamoDB throughput quotas for an on-demand table, as the local stack's quota mode
enforces them (pure: no I/O, the time passed in). :mod:`devstack.dynamodb_quota_proxy` applies
them in front of DynamoDB Local or dynalite.

Each figure is a field of :class:`DynamoDbQuotas` (raise them to model an account whose quotas
were raised), from the Amazon DynamoDB Developer Guide:

    per partition key   1,000 write units/s and 3,000 read units/s: "Each partition on the
                        table can serve up to 3,000 read request units or 1,000 write request
                        units" (Service, account, and table quotas, "Read/write throughput";
                        https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html).
                        Every item of one partition key value is on one partition, so this is
                        the most one key's items can take, whatever the table's mode.
                        Over it: ProvisionedThroughputExceededException, throttling reason
                        ``TableWriteKeyRangeThroughputExceeded`` (or Read).
    per table           40,000 read and 40,000 write request units/s, the per-table quota that
                        bounds an on-demand table ("DynamoDB maximum throughput for on-demand
                        tables": on-demand-capacity-mode-max-throughput.html). A new on-demand
                        table starts at 4,000 write and 12,000 read units and doubles toward
                        its previous peak (on-demand-capacity-mode.html, "Initial throughput");
                        set the figures to model one. Over it: ThrottlingException, reason
                        ``TableWriteAccountLimitExceeded`` (or Read).

A unit is priced by :mod:`dedupe_store.billing` (1 KB a write unit, 4 KB a read unit; eventual
reads half). Buckets hold one second of their rate (AWS documents no burst for a partition).
A write is admitted only while its key's and its table's buckets hold its units (it takes
them before it is written: a refused write writes nothing); a read, while both hold any, and
it owes what it read once its answer is known (a read's size is known only then).

Each partition key's admitted writes are counted, with the most it took in any one second
(:class:`KeyWrites`): how hot the hottest item of a table runs, quota or not.

Not modelled: secondary indexes' partitions (an index write is billed to the index, and a
throttled index throttles the table's writes on AWS), adaptive capacity's splitting of a hot
partition, transactions.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from devstack.quotas import ADMITTED, Admission, TokenBucket

__all__ = ["Direction", "DynamoDbQuotaState", "DynamoDbQuotas", "KeyWrites"]

KEY_THROTTLED: Final = "ProvisionedThroughputExceededException"
TABLE_THROTTLED: Final = "ThrottlingException"
_HOT_KEYS_REPORTED: Final = 20


class Direction(StrEnum):
    READ = "Read"
    WRITE = "Write"


@dataclass(frozen=True)
class DynamoDbQuotas:
    """The figures the quota mode enforces (AWS's defaults for an on-demand table)."""

    key_write_units_per_s: float = 1000
    key_read_units_per_s: float = 3000
    table_write_units_per_s: float = 40_000
    table_read_units_per_s: float = 40_000

    def __post_init__(self) -> None:
        if (
            min(
                self.key_write_units_per_s,
                self.key_read_units_per_s,
                self.table_write_units_per_s,
                self.table_read_units_per_s,
            )
            <= 0
        ):
            raise ValueError("every quota must be a positive rate")

    def per_key(self, direction: Direction) -> float:
        if direction is Direction.WRITE:
            return self.key_write_units_per_s
        return self.key_read_units_per_s

    def per_table(self, direction: Direction) -> float:
        if direction is Direction.WRITE:
            return self.table_write_units_per_s
        return self.table_read_units_per_s


@dataclass
class KeyWrites:
    """One partition key's admitted writes: how many, their units, and the most of each that
    fell within one second (a sliding second: the writes of the last second are kept)."""

    writes: int = 0
    units: float = 0.0
    peak_writes_per_s: int = 0
    peak_units_per_s: float = 0.0
    _last_second: deque[tuple[float, float]] = field(default_factory=deque)  # (time, units)
    _units_in_last_second: float = 0.0

    def add(self, units: float, now_s: float) -> None:
        self.writes += 1
        self.units += units
        last = self._last_second
        while last and last[0][0] <= now_s - 1.0:
            self._units_in_last_second -= last.popleft()[1]
        last.append((now_s, units))
        self._units_in_last_second += units
        self.peak_writes_per_s = max(self.peak_writes_per_s, len(last))
        self.peak_units_per_s = max(self.peak_units_per_s, self._units_in_last_second)

    def as_json(self) -> dict[str, float]:
        return {
            "writes": self.writes,
            "units": self.units,
            "peak_writes_per_s": self.peak_writes_per_s,
            "peak_units_per_s": self.peak_units_per_s,
        }


@dataclass
class DynamoDbQuotaState:
    """The buckets per (table, partition key) and per table, created on first use, and what
    they counted: calls and throttles by operation, units admitted by table, throttled
    requests by key, and each key's admitted writes (:class:`KeyWrites`)."""

    quotas: DynamoDbQuotas = field(default_factory=DynamoDbQuotas)
    _buckets: dict[tuple[str, ...], TokenBucket] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    throttles: Counter[str] = field(default_factory=Counter)
    # units admitted (writes) and read, by (table, Read|Write)
    units: defaultdict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    throttled_keys: Counter[tuple[str, str]] = field(default_factory=Counter)
    key_writes: defaultdict[tuple[str, str], KeyWrites] = field(
        default_factory=lambda: defaultdict(KeyWrites)
    )

    def _bucket(self, scope: tuple[str, ...], rate_per_s: float) -> TokenBucket:
        bucket = self._buckets.get(scope)
        if bucket is None:
            bucket = self._buckets[scope] = TokenBucket(rate_per_s, rate_per_s)
        return bucket

    def _table_bucket(self, table: str, direction: Direction) -> TokenBucket:
        return self._bucket(("table", direction, table), self.quotas.per_table(direction))

    def _key_bucket(self, table: str, key: str, direction: Direction) -> TokenBucket:
        return self._bucket(("key", direction, table, key), self.quotas.per_key(direction))

    def call(self, operation: str) -> None:
        """Count one call of ``operation`` (every call, metered or not)."""
        self.calls[operation] += 1

    def admit_write(
        self, operation: str, table: str, key: str, units: float, now_s: float
    ) -> Admission:
        """One item's write of ``units`` on ``key`` (a partition key value): taken from the
        key's and the table's buckets when both hold them, else refused, nothing taken."""
        per_key = self._key_bucket(table, key, Direction.WRITE)
        per_table = self._table_bucket(table, Direction.WRITE)
        if not per_key.holds(units, now_s):
            return self._refuse(operation, table, key, Direction.WRITE, KEY_THROTTLED)
        if not per_table.holds(units, now_s):
            return self._refuse(operation, table, key, Direction.WRITE, TABLE_THROTTLED)
        per_key.take(units, now_s)
        per_table.take(units, now_s)
        self.units[(table, Direction.WRITE)] += units
        self.key_writes[(table, key)].add(units, now_s)
        return ADMITTED

    def admit_read(self, operation: str, table: str, key: str | None, now_s: float) -> Admission:
        """A read of ``key`` (None: a Query or Scan, counted at the table): admitted while the
        key's and the table's read buckets are not in debt; :meth:`charge_read` follows."""
        if key is not None and self._key_bucket(table, key, Direction.READ).available(now_s) <= 0:
            return self._refuse(operation, table, key, Direction.READ, KEY_THROTTLED)
        if self._table_bucket(table, Direction.READ).available(now_s) <= 0:
            return self._refuse(operation, table, key, Direction.READ, TABLE_THROTTLED)
        return ADMITTED

    def charge_read(self, table: str, key: str | None, units: float, now_s: float) -> None:
        """What an admitted read cost, owed by its key's and its table's buckets."""
        if key is not None:
            self._key_bucket(table, key, Direction.READ).owe(units, now_s)
        self._table_bucket(table, Direction.READ).owe(units, now_s)
        self.units[(table, Direction.READ)] += units

    def _refuse(
        self, operation: str, table: str, key: str | None, direction: Direction, code: str
    ) -> Admission:
        self.throttles[operation] += 1
        if key is not None:
            self.throttled_keys[(table, key)] += 1
        limit = "KeyRangeThroughputExceeded" if code == KEY_THROTTLED else "AccountLimitExceeded"
        # the message is AWS's throttling reason: ResourceType + OperationType + LimitType
        return Admission(admitted=False, code=code, message=f"Table{direction}{limit}")

    def busiest_write_keys(self) -> dict[str, dict[str, object]]:
        """Per table, the key that took the most writes in one second, and its counts."""
        busiest: dict[str, tuple[str, KeyWrites]] = {}
        for (table, key), counted in self.key_writes.items():
            held = busiest.get(table)
            if held is None or counted.peak_writes_per_s > held[1].peak_writes_per_s:
                busiest[table] = (key, counted)
        return {
            table: {"key": key, **counted.as_json()}
            for table, (key, counted) in sorted(busiest.items())
        }

    def most_written_keys(self) -> dict[str, list[dict[str, object]]]:
        """Per table, the keys that took the most writes in all, the most first, with their
        counts (a run's items side by side: the run item and its stripes)."""
        by_table: dict[str, list[tuple[str, KeyWrites]]] = {}
        for (table, key), counted in self.key_writes.items():
            by_table.setdefault(table, []).append((key, counted))
        return {
            table: [
                {"key": key, **counted.as_json()}
                for key, counted in sorted(keys, key=lambda kc: (-kc[1].writes, kc[0]))[
                    :_HOT_KEYS_REPORTED
                ]
            ]
            for table, keys in sorted(by_table.items())
        }

    def snapshot(self) -> dict[str, object]:
        """The counters, as JSON-ready data (the proxy's ``GET /__keo/report``)."""
        return {
            "calls": dict(sorted(self.calls.items())),
            "throttles": dict(sorted(self.throttles.items())),
            "units": {f"{table}/{kind}": n for (table, kind), n in sorted(self.units.items())},
            "most_throttled_keys": [
                {"table": table, "key": key, "throttled": n}
                for (table, key), n in self.throttled_keys.most_common(_HOT_KEYS_REPORTED)
            ],
            "busiest_write_keys": self.busiest_write_keys(),
            "most_written_keys": self.most_written_keys(),
        }
