"""``keo bench``: what exactly-once costs, measured on the embedded stack in one run.

Every scenario gets its own stream and table. Requests are counted with botocore event
hooks on the clients the code under test really uses, so the figures are operation counts
as AWS would bill them, next to rates measured on this machine.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.config import Config

from dedupe_store.clock import SystemClock
from dedupe_store.records import ClaimRequest
from producer.kinesis import KinesisReader, create_stream
from producer.protocol import Message, explicit_hash_key, payload_digest, put_entry
from producer.settings import ProducerSettings
from producer.wiring import build_stack, kinesis_client, ledger_from

log = logging.getLogger(__name__)

_WRITES = frozenset({"UpdateItem", "PutItem", "DeleteItem", "BatchWriteItem"})


@dataclass
class CallCounter:
    """Counts API calls by operation on a botocore client (retries included)."""

    calls: Counter[str] = field(default_factory=Counter)
    capacity_units: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attach(self, client: Any) -> CallCounter:
        client.meta.events.register("before-send", self._before_send)
        client.meta.events.register("after-call", self._after_call)
        return self

    def _before_send(self, request: Any = None, **_: Any) -> None:
        target = request.headers.get("X-Amz-Target", b"") if request is not None else b""
        name = target.decode() if isinstance(target, bytes) else str(target)
        with self._lock:
            self.calls[name.rsplit(".", 1)[-1]] += 1

    def _after_call(self, parsed: Any = None, **_: Any) -> None:
        capacity = (parsed or {}).get("ConsumedCapacity")
        units = 0.0
        for entry in capacity if isinstance(capacity, list) else [capacity] if capacity else []:
            units += float(entry.get("CapacityUnits", 0) or 0)
        if units:
            with self._lock:
                self.capacity_units += units

    @property
    def writes(self) -> int:
        return sum(n for op, n in self.calls.items() if op in _WRITES)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def _messages(count: int, size: int, prefix: str) -> list[Message]:
    body = b"x" * max(size - 24, 1)
    return [Message(f"{prefix}-{i:08d}", body) for i in range(count)]


class Bench:
    def __init__(
        self, base: ProducerSettings, *, say: Callable[[str], None] = lambda _s: None
    ) -> None:
        self._base = base
        self._say = say
        self._n = 0

    def _fresh(self, label: str, shards: int = 4, **overrides: Any) -> ProducerSettings:
        self._n += 1
        name = f"bench-{label}-{os.getpid()}-{self._n}"
        settings = self._base.model_copy(update={"stream": name, "table": name, **overrides})
        create_stream(kinesis_client(settings, for_put=False), name, shards, timeout_s=30)
        ledger_from(settings).create_table()
        return settings

    # --- the scenarios --------------------------------------------------------------------

    def baseline(self, count: int, size: int) -> dict[str, Any]:
        """What users have today: boto3 put_records, 500 per call, SDK defaults."""
        settings = self._fresh("baseline")
        client = kinesis_client(settings, for_put=False)
        counter = CallCounter().attach(client)
        messages = _messages(count, size, "base")
        started = time.perf_counter()
        for start in range(0, count, 500):
            entries = [
                put_entry(m.key, m.data, explicit_hash_key(m))
                for m in messages[start : start + 500]
            ]
            while entries:
                response = client.put_records(StreamName=settings.stream, Records=entries)
                entries = [
                    e
                    for e, r in zip(entries, response["Records"], strict=True)
                    if r.get("ErrorCode")
                ]
        seconds = time.perf_counter() - started
        return {
            "messages": count,
            "seconds": round(seconds, 3),
            "messages_per_second": round(count / seconds, 1),
            "kinesis_requests_per_message": round(counter.calls["PutRecords"] / count, 4),
        }

    def ledger_ceiling(self, count: int, concurrency: int) -> dict[str, Any]:
        """The DynamoDB emulator's own rate of conditional writes at this concurrency."""
        settings = self._fresh("ceiling", shards=1)
        options = settings.ledger_connection()
        client = boto3.session.Session().client(
            "dynamodb",
            region_name=options.region,
            endpoint_url=options.host,
            aws_access_key_id=options.aws_access_key_id,
            aws_secret_access_key=options.aws_secret_access_key,
            config=Config(max_pool_connections=max(concurrency, 10), retries={"max_attempts": 3}),
        )

        def write(i: int) -> None:
            client.update_item(
                TableName=settings.table,
                Key={"pk": {"S": f"ceiling#{i}"}},
                UpdateExpression="SET #s = :s",
                ConditionExpression="attribute_not_exists(pk)",
                ExpressionAttributeNames={"#s": "state"},
                ExpressionAttributeValues={":s": {"S": "IN_FLIGHT"}},
            )

        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(write, range(count)))
        seconds = time.perf_counter() - started
        writes_per_second = count / seconds
        return {
            "conditional_writes": count,
            "concurrency": concurrency,
            "writes_per_second": round(writes_per_second, 1),
            # the protocol needs 2 conditional writes per message (claim, mark)
            "messages_per_second_ceiling": round(writes_per_second / 2, 1),
        }

    def exactly_once(
        self, count: int, size: int, concurrency: int, *, aggregate: bool = False
    ) -> dict[str, Any]:
        settings = self._fresh(
            "eo-agg" if aggregate else "eo", ledger_concurrency=concurrency, aggregate=aggregate
        )
        stack = build_stack(settings)
        dynamo = CallCounter().attach(stack.ledger.client)
        kinesis = CallCounter().attach(stack.writer.client)
        messages = _messages(count, size, "eo")
        with stack.producer(owner="bench") as producer:
            started = time.perf_counter()
            outcomes = []
            for start in range(0, count, 5000):
                outcomes.extend(producer.send(messages[start : start + 5000]))
            seconds = time.perf_counter() - started
        delivered = sum(1 for o in outcomes if o.delivered)
        puts = kinesis.calls["PutRecords"]
        records = _count_records(stack.reader)
        return {
            "messages": count,
            "concurrency": concurrency,
            "aggregate": aggregate,
            "delivered": delivered,
            "seconds": round(seconds, 3),
            "messages_per_second": round(count / seconds, 1),
            "dynamodb_requests_per_message": round(dynamo.total / max(delivered, 1), 4),
            "dynamodb_write_requests_per_message": round(dynamo.writes / max(delivered, 1), 4),
            "dynamodb_capacity_units_per_message": round(
                dynamo.capacity_units / max(delivered, 1), 4
            ),
            "kinesis_requests_per_message": round(puts / max(delivered, 1), 5),
            "kinesis_records_per_message": round(records / max(delivered, 1), 5),
            "mean_batch_fill": round(records / max(puts, 1), 1),
        }

    def reconcile(self, stale: int, *, shards: int = 4) -> dict[str, Any]:
        """Resolve ``stale`` claims whose records are in the stream but were never marked:
        what producers that crashed after their put leave behind."""
        settings = self._fresh(
            "reconcile",
            shards=shards,
            put_connect_timeout_s=1.0,
            put_read_timeout_s=1.0,
            clock_skew_s=0.5,
            lease_s=10.0,  # covers claiming a chunk of 500 and putting it, on a busy machine
        )
        stack = build_stack(settings)
        ledger = stack.ledger
        clock = SystemClock()
        messages = _messages(stale, 64, "stale")

        def claim(message: Message) -> None:
            ehk = explicit_hash_key(message)
            ledger.claim(
                ClaimRequest(settings.stream, message.key, payload_digest(message.data, ehk), ehk),
                owner="crashed",
                now_ms=clock.now_ms(),
                lease_ms=settings.lease_policy().lease_ms,
            )

        # like crashed producers: each chunk claimed, then put at once, then never marked
        with ThreadPoolExecutor(settings.ledger_concurrency) as pool:
            for start in range(0, stale, 500):
                chunk = messages[start : start + 500]
                list(pool.map(claim, chunk))
                stack.writer.put_entries(
                    [put_entry(m.key, m.data, explicit_hash_key(m)) for m in chunk]
                )
        time.sleep(settings.lease_s + 2 * settings.clock_skew_s + 0.2)
        reconciler = stack.reconciler(owner="bench-reconciler")
        started = time.perf_counter()
        report = reconciler.run_once()
        seconds = time.perf_counter() - started
        return {
            "stale_claims": stale,
            "shards": shards,
            "resolved": report.delivered,
            "seconds": round(seconds, 3),
            "claims_per_second": round(report.delivered / seconds, 1),
            "get_records_calls": report.get_records_calls,
            "get_records_calls_per_claim": round(report.get_records_calls / max(stale, 1), 5),
            "get_records_calls_per_shard": round(report.get_records_calls / shards, 2),
        }


def _count_records(reader: KinesisReader) -> int:
    """Kinesis records in the stream (an aggregate counts once, as Kinesis bills it)."""
    return len(
        {
            (record.shard_id, record.sequence_number)
            for shard in reader.shards()
            for record in reader.read_all(shard.shard_id)
        }
    )


def machine() -> dict[str, Any]:
    memory_gib = None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            memory_gib = round(int(meminfo.readline().split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "backends": "kinesalite 3.3.3 + dynalite 4.0.0 on 127.0.0.1 (LevelDB on local disk)",
    }


def run(
    base: ProducerSettings,
    *,
    messages: int,
    size: int,
    concurrencies: Sequence[int],
    reconcile_sizes: Sequence[int],
    say: Callable[[str], None],
) -> dict[str, Any]:
    bench = Bench(base, say=say)
    say(f"baseline: {messages} messages")
    baseline = bench.baseline(messages, size)
    runs = []
    for concurrency in concurrencies:
        say(f"ledger ceiling at concurrency {concurrency}")
        ceiling = bench.ledger_ceiling(min(messages * 2, 4000), concurrency)
        say(f"exactly-once at concurrency {concurrency}: {messages} messages")
        result = bench.exactly_once(messages, size, concurrency)
        result["ledger_ceiling"] = ceiling
        result["ceiling_fraction"] = round(
            result["messages_per_second"] / ceiling["messages_per_second_ceiling"], 3
        )
        result["ratio_to_baseline"] = round(
            result["messages_per_second"] / baseline["messages_per_second"], 4
        )
        runs.append(result)
    best = max(runs, key=lambda r: r["messages_per_second"])
    say(f"exactly-once with aggregation at concurrency {best['concurrency']}")
    aggregated = bench.exactly_once(messages, size, best["concurrency"], aggregate=True)
    reconciles = []
    for stale in reconcile_sizes:
        say(f"reconciler: {stale} stale claims")
        reconciles.append(bench.reconcile(stale))
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "message_bytes": size,
        "baseline": baseline,
        "exactly_once": runs,
        "best": {
            "concurrency": best["concurrency"],
            "messages_per_second": best["messages_per_second"],
            "ceiling_fraction": best["ceiling_fraction"],
            "dynamodb_write_requests_per_message": best["dynamodb_write_requests_per_message"],
            "ratio_to_baseline": best["ratio_to_baseline"],
        },
        "aggregation": {"off": best, "on": aggregated},
        "reconcile": reconciles,
    }
