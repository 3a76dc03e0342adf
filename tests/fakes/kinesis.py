"""``FakeKinesisClient``: a boto3-shaped Kinesis client over in-memory shards, with put faults.

Enough of the Kinesis API for :class:`kinesis_store.writer.KinesisWriter` and
:class:`kinesis_store.reader.KinesisReader`: ``put_records``, ``list_shards``,
``get_shard_iterator`` (TRIM_HORIZON, LATEST, AT/AFTER_SEQUENCE_NUMBER, AT_TIMESTAMP),
``get_records``, ``describe_stream_summary``, plus ``split_shard`` for lineage.
:class:`FakePutClient` is one process's put client over it: its own ``meta.events``, so the
before-send check ``keo`` installs (:func:`producer.fence.fence_for`) runs on each put, on
that process's clock.

Time is the injected clock's: a record's ``ApproximateArrivalTimestamp`` is the clock when it
lands. Sequence numbers are increasing integers (as strings), unique across the stream.

A put meets one :class:`PutFault`, scripted (:meth:`FakeKinesisClient.script`) or drawn from a
seeded ``random.Random`` with ``fault_weights``:

    WRITTEN        written and answered
    RESPONSE_LOST  written, the response lost: ``ReadTimeoutError``
    NOT_WRITTEN    not written, timed out: ``ReadTimeoutError`` (the client cannot tell it apart)
    LATE           held pending, lands at a later step, always before ``sent_at + put_timeout_ms``
                   (within the put's timeout): ``ReadTimeoutError``
    HELD           held by the network past the put's timeout (its client gave up:
                   ``ReadTimeoutError``), landing before the lease it was sent under ends
                   (:meth:`FakeKinesisClient.under_lease`; as LATE when no lease is given).
                   Past the lease it could duplicate: fence-off mode's documented bound
    THROTTLED      some records get a per-record ``ProvisionedThroughputExceededException``
                   (those are not written), the others are written and answered

The clock only moves through :meth:`FakeKinesisClient.advance`, which lands pending writes in
the order of their due times with the clock at each one, so arrival times stay monotonic.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import random
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from types import SimpleNamespace
from typing import Any

import botocore.exceptions

from dedupe_store.clock import ManualClock

MAX_HASH_KEY = 2**128 - 1
_ENDPOINT = "https://kinesis.fake.invalid"
_BEFORE_SEND = "before-send.kinesis.PutRecords"
# The end of the lease the put being made is sent under (FakeKinesisClient.under_lease).
_PUT_LEASE_MS: ContextVar[int | None] = ContextVar("fake_put_lease", default=None)


class PutFault(StrEnum):
    WRITTEN = "written"
    RESPONSE_LOST = "response_lost"
    NOT_WRITTEN = "not_written"
    LATE = "late"
    HELD = "held"
    THROTTLED = "throttled"


@dataclass(frozen=True, slots=True)
class StoredRecord:
    shard_id: str
    sequence_number: str
    partition_key: str
    data: bytes
    arrival_ms: int
    explicit_hash_key: str | None


@dataclass(slots=True)
class FakeShard:
    shard_id: str
    starting_hash_key: int
    ending_hash_key: int
    starting_sequence_number: str
    parent_shard_id: str | None = None
    adjacent_parent_shard_id: str | None = None
    ending_sequence_number: str | None = None
    records: list[StoredRecord] = field(default_factory=list)

    def covers(self, hash_key: int) -> bool:
        return self.starting_hash_key <= hash_key <= self.ending_hash_key


@dataclass(frozen=True, slots=True)
class PendingPut:
    """A record of a LATE put: it will land at ``due_ms``."""

    due_ms: int
    order: int
    entry: Mapping[str, Any]
    sent_at_ms: int


def _client_error(code: str, message: str, operation: str, status: int = 400) -> Exception:
    return botocore.exceptions.ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


def _hash_key_of(entry: Mapping[str, Any]) -> int:
    explicit = entry.get("ExplicitHashKey")
    if explicit is not None:
        return int(explicit)
    digest = hashlib.md5(str(entry["PartitionKey"]).encode("utf-8"), usedforsecurity=False)
    return int.from_bytes(digest.digest())


def _timestamp_ms(value: Any) -> int:
    if isinstance(value, datetime):
        return round(value.timestamp() * 1000)
    return round(float(value) * 1000)


class FakeKinesisClient:
    """One stream's Kinesis. Thread-safe: one lock around every call."""

    def __init__(
        self,
        *,
        stream: str,
        clock: ManualClock,
        shard_count: int = 2,
        put_timeout_ms: int = 7_000,
        rng: random.Random | None = None,
        fault_weights: Mapping[PutFault, float] | None = None,
        throttle_probability: float = 0.5,
        retention_hours: int = 24,
        max_record_kib: int | None = None,
    ) -> None:
        self.stream = stream
        self._clock = clock
        self.put_timeout_ms = put_timeout_ms
        self._rng = rng or random.Random(0)
        self._weights = dict(fault_weights or {})
        self._throttle_probability = throttle_probability
        self.retention_hours = retention_hours
        self._max_record_kib = max_record_kib
        self._lock = threading.RLock()
        self._sequence = itertools.count(1_000_000)
        self._shard_ids = itertools.count(0)
        self._shards: dict[str, FakeShard] = {}
        self._pending: list[tuple[int, int, PendingPut]] = []
        self._order = itertools.count()
        self._script: deque[PutFault] = deque()
        self.faults_met: list[PutFault] = []
        self.put_calls = 0
        self.get_records_calls = 0
        # kinesalite's way: a closed shard read to its end answers first an empty page at its
        # tip with a next iterator, and only the call after it none (Kinesis promises neither)
        self.tip_page_before_end = False
        width = (MAX_HASH_KEY + 1) // shard_count
        for index in range(shard_count):
            end = MAX_HASH_KEY if index == shard_count - 1 else (index + 1) * width - 1
            self._new_shard(index * width, end)

    # --- the model's knobs ------------------------------------------------------------------

    def script(self, *faults: PutFault | str) -> None:
        """The next puts meet these faults, in order, before any drawn at random."""
        with self._lock:
            self._script.extend(PutFault(fault) for fault in faults)

    def seed(self, seed: int) -> None:
        """Re-seed the fault draws (and the late writes' landing times)."""
        with self._lock:
            self._rng.seed(seed)

    def clear_script(self) -> None:
        with self._lock:
            self._script.clear()

    def set_fault_weights(self, weights: Mapping[PutFault, float]) -> None:
        with self._lock:
            self._weights = dict(weights)

    def advance(self, ms: int) -> None:
        """Move the clock ``ms`` forward, landing each due write with the clock at its time."""
        with self._lock:
            target = self._clock.now_ms() + max(ms, 0)
            while self._pending and self._pending[0][0] <= target:
                due_ms, _, pending = heapq.heappop(self._pending)
                if due_ms > self._clock.now_ms():
                    self._clock.advance(due_ms - self._clock.now_ms())
                self._write(pending.entry)
            self._clock.advance(target - self._clock.now_ms())

    def sleep(self, seconds: float) -> None:
        """An injectable ``sleep``: model time passes, nothing really waits."""
        self.advance(max(1, round(seconds * 1000)))

    def land_all(self) -> None:
        """Advance to the last pending write's due time, landing every one of them."""
        with self._lock:
            if self._pending:
                self.advance(max(due for due, _, _ in self._pending) - self._clock.now_ms())

    def pending(self) -> list[PendingPut]:
        with self._lock:
            return [pending for _, _, pending in sorted(self._pending)]

    def visible(self) -> list[StoredRecord]:
        """Every record in the stream, shard by shard, in sequence order."""
        with self._lock:
            return [record for shard in self._shards.values() for record in shard.records]

    @contextlib.contextmanager
    def under_lease(self, lease_expires_at_ms: int | None) -> Iterator[None]:
        """The puts made inside are sent under a lease that ends at ``lease_expires_at_ms``:
        a HELD write lands before then."""
        token = _PUT_LEASE_MS.set(lease_expires_at_ms)
        try:
            yield
        finally:
            _PUT_LEASE_MS.reset(token)

    def split_shard(self, shard_id: str, new_starting_hash_key: int) -> tuple[str, str]:
        """Close ``shard_id`` and open two children that split its hash range."""
        with self._lock:
            parent = self._shards[shard_id]
            if parent.ending_sequence_number is not None:
                raise _client_error("ResourceInUseException", "shard is closed", "SplitShard")
            parent.ending_sequence_number = str(next(self._sequence))
            left = self._new_shard(parent.starting_hash_key, new_starting_hash_key - 1, shard_id)
            right = self._new_shard(new_starting_hash_key, parent.ending_hash_key, shard_id)
            return left.shard_id, right.shard_id

    def _new_shard(self, start: int, end: int, parent: str | None = None) -> FakeShard:
        shard_id = f"shardId-{next(self._shard_ids):012d}"
        shard = FakeShard(shard_id, start, end, str(next(self._sequence)), parent)
        self._shards[shard_id] = shard
        return shard

    # --- the API ------------------------------------------------------------------------------

    def put_records(self, *, Records: Sequence[Mapping[str, Any]], StreamName: str) -> Any:  # noqa: N803 - boto3's names
        with self._lock:
            self._check_stream(StreamName, "PutRecords")
            self._validate(Records)
            self.put_calls += 1
            fault = self._next_fault()
            self.faults_met.append(fault)
            now_ms = self._clock.now_ms()
            if fault is PutFault.NOT_WRITTEN:
                raise botocore.exceptions.ReadTimeoutError(endpoint_url=_ENDPOINT)
            if fault in {PutFault.LATE, PutFault.HELD}:
                for entry in Records:
                    due_ms = self._due_ms(fault, now_ms)
                    pending = PendingPut(due_ms, next(self._order), dict(entry), now_ms)
                    heapq.heappush(self._pending, (due_ms, pending.order, pending))
                raise botocore.exceptions.ReadTimeoutError(endpoint_url=_ENDPOINT)
            results: list[dict[str, Any]] = []
            failed = 0
            for entry in Records:
                if fault is PutFault.THROTTLED and self._rng.random() < self._throttle_probability:
                    failed += 1
                    results.append(
                        {
                            "ErrorCode": "ProvisionedThroughputExceededException",
                            "ErrorMessage": "Rate exceeded for shard (injected)",
                        }
                    )
                    continue
                record = self._write(entry)
                results.append(
                    {"ShardId": record.shard_id, "SequenceNumber": record.sequence_number}
                )
            if fault is PutFault.RESPONSE_LOST:
                raise botocore.exceptions.ReadTimeoutError(endpoint_url=_ENDPOINT)
            return {"FailedRecordCount": failed, "Records": results, "EncryptionType": "NONE"}

    def list_shards(
        self,
        *,
        StreamName: str | None = None,  # noqa: N803 - boto3's names
        NextToken: str | None = None,  # noqa: N803
        **_: Any,
    ) -> Any:
        with self._lock:
            if NextToken is None:
                self._check_stream(StreamName, "ListShards")
            return {"Shards": [self._describe_shard(s) for s in self._shards.values()]}

    def describe_stream_summary(self, *, StreamName: str) -> Any:  # noqa: N803 - boto3's names
        with self._lock:
            self._check_stream(StreamName, "DescribeStreamSummary")
            summary: dict[str, Any] = {
                "StreamName": self.stream,
                "StreamARN": f"arn:aws:kinesis:us-east-1:000000000000:stream/{self.stream}",
                "StreamStatus": "ACTIVE",
                "RetentionPeriodHours": self.retention_hours,
                "OpenShardCount": sum(
                    1 for s in self._shards.values() if s.ending_sequence_number is None
                ),
            }
            if self._max_record_kib is not None:
                summary["MaxRecordSizeInKiB"] = self._max_record_kib
            return {"StreamDescriptionSummary": summary}

    def get_shard_iterator(
        self,
        *,
        StreamName: str,  # noqa: N803 - boto3's names
        ShardId: str,  # noqa: N803
        ShardIteratorType: str,  # noqa: N803
        StartingSequenceNumber: str | None = None,  # noqa: N803
        Timestamp: Any = None,  # noqa: N803
    ) -> Any:
        with self._lock:
            self._check_stream(StreamName, "GetShardIterator")
            shard = self._shard(ShardId, "GetShardIterator")
            records = shard.records
            trim_ms = self._clock.now_ms() - self.retention_hours * 3600 * 1000
            horizon = next((i for i, r in enumerate(records) if r.arrival_ms >= trim_ms), None)
            horizon = len(records) if horizon is None else horizon
            if ShardIteratorType == "TRIM_HORIZON":
                index = horizon
            elif ShardIteratorType == "LATEST":
                index = len(records)
            elif ShardIteratorType in {"AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"}:
                if StartingSequenceNumber is None:
                    raise _client_error(
                        "InvalidArgumentException",
                        "StartingSequenceNumber needed",
                        "GetShardIterator",
                    )
                wanted = int(StartingSequenceNumber)
                after = ShardIteratorType == "AFTER_SEQUENCE_NUMBER"
                index = next(
                    (
                        i
                        for i, r in enumerate(records)
                        if int(r.sequence_number) > wanted
                        or (not after and int(r.sequence_number) == wanted)
                    ),
                    len(records),
                )
            elif ShardIteratorType == "AT_TIMESTAMP":
                if Timestamp is None:
                    raise _client_error(
                        "InvalidArgumentException", "Timestamp needed", "GetShardIterator"
                    )
                start_ms = _timestamp_ms(Timestamp)
                index = next(
                    (i for i, r in enumerate(records) if r.arrival_ms >= start_ms), len(records)
                )
            else:
                raise _client_error(
                    "InvalidArgumentException",
                    f"unknown ShardIteratorType {ShardIteratorType}",
                    "GetShardIterator",
                )
            # reading before the trim horizon starts at the horizon
            return {"ShardIterator": f"{ShardId}|{max(index, horizon)}"}

    def get_records(self, *, ShardIterator: str, Limit: int = 10_000) -> Any:  # noqa: N803 - boto3's names
        with self._lock:
            self.get_records_calls += 1
            shard_id, _, position = ShardIterator.partition("|")
            position, _, tipped = position.partition("|")
            shard = self._shard(shard_id, "GetRecords")
            start = int(position)
            page = shard.records[start : start + max(1, min(Limit, 10_000))]
            end = start + len(page)
            at_tip = end >= len(shard.records)
            closed = shard.ending_sequence_number is not None
            next_iterator: str | None = f"{shard_id}|{end}"
            if closed and at_tip and (tipped or not self.tip_page_before_end):
                next_iterator = None
            elif closed and at_tip and not page:  # the empty page at the tip, then the end
                next_iterator = f"{shard_id}|{end}|tipped"
            behind = 0
            if not at_tip:
                behind = max(1, self._clock.now_ms() - shard.records[end].arrival_ms)
            response: dict[str, Any] = {
                "Records": [
                    {
                        "SequenceNumber": r.sequence_number,
                        "ApproximateArrivalTimestamp": datetime.fromtimestamp(
                            r.arrival_ms / 1000, tz=UTC
                        ),
                        "Data": r.data,
                        "PartitionKey": r.partition_key,
                    }
                    for r in page
                ],
                "MillisBehindLatest": behind,
            }
            if next_iterator is not None:
                response["NextShardIterator"] = next_iterator
            return response

    # --- inside ---------------------------------------------------------------------------------

    def _next_fault(self) -> PutFault:
        if self._script:
            return self._script.popleft()
        if not self._weights:
            return PutFault.WRITTEN
        faults = list(self._weights)
        return self._rng.choices(faults, weights=[self._weights[f] for f in faults])[0]

    def _due_ms(self, fault: PutFault, now_ms: int) -> int:
        """When a late write lands: LATE strictly inside ``(sent_at, sent_at + put_timeout)``;
        HELD from the put's timeout on, strictly before its lease ends (by Kinesis' clock,
        which every party's is within the skew of: no one takes its keys over before then)."""
        lease_ms = _PUT_LEASE_MS.get()
        if fault is PutFault.HELD and lease_ms is not None and lease_ms - 1 > now_ms:
            last_ms = lease_ms - 1
            return self._rng.randint(min(now_ms + self.put_timeout_ms, last_ms), last_ms)
        return now_ms + self._rng.randint(1, max(1, self.put_timeout_ms - 1))

    def _write(self, entry: Mapping[str, Any]) -> StoredRecord:
        hash_key = _hash_key_of(entry)
        shard = next(
            s
            for s in self._shards.values()
            if s.ending_sequence_number is None and s.covers(hash_key)
        )
        explicit = entry.get("ExplicitHashKey")
        record = StoredRecord(
            shard.shard_id,
            str(next(self._sequence)),
            str(entry["PartitionKey"]),
            bytes(entry["Data"]),
            self._clock.now_ms(),
            str(explicit) if explicit is not None else None,
        )
        shard.records.append(record)
        return record

    def _validate(self, records: Sequence[Mapping[str, Any]]) -> None:
        if not 1 <= len(records) <= 500:
            raise _client_error(
                "ValidationException", f"{len(records)} records: 1 to 500 allowed", "PutRecords"
            )
        limit = (self._max_record_kib or 1024) * 1024
        for entry in records:
            key = str(entry.get("PartitionKey", ""))
            if not 1 <= len(key) <= 256:
                raise _client_error("ValidationException", "bad partition key", "PutRecords")
            if len(entry["Data"]) + len(key.encode("utf-8")) > limit:
                raise _client_error("ValidationException", "record too large", "PutRecords")

    def _check_stream(self, name: str | None, operation: str) -> None:
        if name != self.stream:
            raise _client_error("ResourceNotFoundException", f"Stream {name} not found", operation)

    def _shard(self, shard_id: str, operation: str) -> FakeShard:
        shard = self._shards.get(shard_id)
        if shard is None:
            raise _client_error(
                "ResourceNotFoundException", f"Shard {shard_id} not found", operation
            )
        return shard

    @staticmethod
    def _describe_shard(shard: FakeShard) -> dict[str, Any]:
        sequences = {"StartingSequenceNumber": shard.starting_sequence_number}
        if shard.ending_sequence_number is not None:
            sequences["EndingSequenceNumber"] = shard.ending_sequence_number
        body: dict[str, Any] = {
            "ShardId": shard.shard_id,
            "HashKeyRange": {
                "StartingHashKey": str(shard.starting_hash_key),
                "EndingHashKey": str(shard.ending_hash_key),
            },
            "SequenceNumberRange": sequences,
        }
        if shard.parent_shard_id is not None:
            body["ParentShardId"] = shard.parent_shard_id
        return body


@dataclass(frozen=True, slots=True)
class FakeRequest:
    """What a ``before-send`` handler is given: the request about to leave (unsigned)."""

    headers: Mapping[str, str] = field(default_factory=dict)


class FakeEvents:
    """The part of botocore's ``client.meta.events`` a put client's checks use."""

    def __init__(self) -> None:
        self._handlers: dict[str, dict[str, Callable[..., Any]]] = {}

    def register_last(
        self, event_name: str, handler: Callable[..., Any], unique_id: str | None = None
    ) -> None:
        handlers = self._handlers.setdefault(event_name, {})
        handlers[unique_id or f"handler-{id(handler)}"] = handler

    def emit(self, event_name: str, **kwargs: Any) -> None:
        for handler in list(self._handlers.get(event_name, {}).values()):
            handler(**kwargs)


class FakePutClient:
    """One process's put client over a shared :class:`FakeKinesisClient`: its ``before-send``
    handlers (``meta.events``) run on each PutRecords, right before it leaves, as botocore runs
    them; a handler that raises keeps the request from being sent. Everything else is the
    shared stream's."""

    def __init__(self, kinesis: FakeKinesisClient) -> None:
        self.kinesis = kinesis
        self.meta = SimpleNamespace(events=FakeEvents())

    def put_records(self, *, Records: Sequence[Mapping[str, Any]], StreamName: str) -> Any:  # noqa: N803 - boto3's names
        self.meta.events.emit(_BEFORE_SEND, request=FakeRequest())
        return self.kinesis.put_records(Records=Records, StreamName=StreamName)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kinesis, name)
