"""``keo bench``: what exactly-once costs, measured on the embedded stack in one run.

Every scenario gets its own stream and table. Requests are counted with botocore event
hooks on the clients the code under test really uses, so the figures are operation counts
as AWS would bill them, next to rates measured on this machine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from botocore.exceptions import ClientError

from dedupe_store.batch_claims import insert_statement, split
from dedupe_store.connection import data_client
from dedupe_store.errors import aws_error_code
from dedupe_store.records import ClaimRequest
from devstack.cost_meter import BillingMeter, MeterReading, ledger_table_spec
from devstack.failpoints import FailpointError, Failpoints
from devstack.metering_proxy import MeteringProxy
from kinesis_store.entries import put_entry
from kinesis_store.provisioning import create_stream
from kinesis_store.reader import KinesisReader
from producer.clients import kinesis_client
from producer.hooks import Step
from producer.key.producer import ExactlyOnceProducer
from producer.outcomes import OutcomeStatus
from producer.parties import new_execution_id
from producer.protocol import Message, explicit_hash_key
from producer.replay.context import ReplayTask
from producer.settings import ProducerSettings, PutFence
from producer.wiring import Stack, build_stack, ledger_from
from spark_jobs.session import worker_python_path

log = logging.getLogger(__name__)

_WRITES = frozenset({"UpdateItem", "PutItem", "DeleteItem", "BatchWriteItem"})
# keo send's --chunk-size default: the messages it hands the producer at once
CLI_CHUNK: Final = 5_000
# what the `keo` console script runs: the same entry point whatever the install layout
CLI_COMMAND: Final = (sys.executable, "-c", "import sys; from cli import main; sys.exit(main())")
_SEND_TIMEOUT_S: Final = 1800
_SEND_SUMMARY: Final = re.compile(r"^keo send: (\d+) messages: ([^;\n]*)", re.MULTILINE)


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
        # the producer's own cost, unpaced: the emulators keep no quota, and a paced writer
        # would measure the quota (1,000 records a second a shard), not the producer
        self._base = base.model_copy(update={"put_rate_limit_percent": 0.0})
        self._say = say
        self._n = 0
        self._ready: dict[str, list[ProducerSettings]] = {}  # made by prepare(), by label

    def prepare(self, labels: Sequence[str]) -> None:
        """Make the streams (4 shards) and tables of the scenarios about to run, all at once:
        dynalite takes about 2 s to make a table ACTIVE, whatever the load. ``_fresh`` then
        hands them out, one per call, by label."""
        names = [(label, self._name(label)) for label in labels]
        with ThreadPoolExecutor(len(names)) as pool:
            made = list(pool.map(lambda named: self._create(named[1], 4), names))
        for (label, _), settings in zip(names, made, strict=True):
            self._ready.setdefault(label, []).append(settings)

    def startup(self) -> dict[str, float]:
        """``keo``'s start (:func:`cli_startup_cpu`) on a stream and table of its own."""
        settings = self._fresh("start")
        return cli_startup_cpu(
            {**os.environ, **settings_env(settings), "PYTHONPATH": worker_python_path()}
        )

    def _fresh(self, label: str, shards: int = 4, **overrides: Any) -> ProducerSettings:
        ready = self._ready.get(label) if shards == 4 else None
        settings = ready.pop(0) if ready else self._create(self._name(label), shards)
        return settings.model_copy(update=overrides)

    def _name(self, label: str) -> str:
        self._n += 1
        return f"bench-{label}-{os.getpid()}-{self._n}"

    def _create(self, name: str, shards: int) -> ProducerSettings:
        settings = self._base.model_copy(update={"stream": name, "table": name})
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
        """The DynamoDB emulator's own rate of conditional writes at this concurrency: the
        floor of the protocol is one conditional write per message, so it is also the
        ceiling in messages per second."""
        settings = self._fresh("ceiling", shards=1)
        # the ledger's own client configuration: the ceiling is the emulator's, not a slower
        # client's
        client = data_client(
            replace(settings.ledger_connection(), max_pool_connections=max(concurrency, 10))
        )

        def write(i: int) -> None:
            client.update_item(
                TableName=settings.table,
                Key={"pk": {"S": f"ceiling#{i}"}},
                UpdateExpression="SET #s = :s",
                ConditionExpression="attribute_not_exists(pk)",
                ExpressionAttributeNames={"#s": "state"},
                ExpressionAttributeValues={":s": {"S": "CLAIMED"}},
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
            # the protocol's floor: one conditional write per message (its claim)
            "messages_per_second_ceiling": round(writes_per_second, 1),
        }

    def ledger_batch_ceiling(self, count: int, concurrency: int) -> dict[str, Any] | None:
        """The emulator's own rate of claims written 25 to a ``BatchExecuteStatement`` (the
        ledger's ``INSERT`` of a new key, the same item a claim writes) at this concurrency:
        the floor of batched claims, so the ceiling of key mode in messages per second. None
        when the emulator has no PartiQL (dynalite)."""
        settings = self._fresh("batch-ceiling", shards=1)
        client = data_client(
            replace(settings.ledger_connection(), max_pool_connections=max(concurrency, 10))
        )
        claim = ClaimRequest(
            stream=settings.stream,
            key="ceiling",
            payload_digest="0" * 43,
            routing_hash_key=str(2**127),
        )
        now_ms = int(time.time() * 1000)

        def write(batch: Sequence[int]) -> None:
            statements = [
                insert_statement(
                    settings.table,
                    f"{settings.stream}#ceiling-{i}",
                    claim,
                    group_id=f"ceiling-{batch[0]}",
                    now_ms=now_ms,
                    expires_at_s=now_ms // 1000 + 3600,
                    token=f"token-{i}",
                )
                for i in batch
            ]
            client.batch_execute_statement(Statements=statements)

        try:
            write([count])  # one statement past the timed ones: PartiQL or not
        except ClientError as exc:
            if aws_error_code(exc) == "UnknownOperationException":
                return None
            raise
        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(write, split(range(count))))
        seconds = time.perf_counter() - started
        return {
            "claims": count,
            "concurrency": concurrency,
            "claims_per_second": round(count / seconds, 1),
        }

    def exactly_once(
        self,
        count: int,
        size: int,
        concurrency: int,
        *,
        aggregate: bool = False,
        ceiling: Callable[[], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A clean run of ``count`` new messages, then the same messages again (the
        DUPLICATE path), each metered as AWS would bill it.

        The meter prices every call in the producer's process, which costs CPU a producer in
        production does not spend (about 0.1 ms a message here). So each path runs twice on
        keys of its own: unmetered for the rate and the client CPU, metered for the bill.
        ``ceiling``, when given, is measured right before and right after the unmetered clean
        run, and their mean is the ceiling that run is compared with: the machine's load
        drifts over the seconds a run takes.
        """
        settings = self._fresh(
            "eo-agg" if aggregate else "eo", ledger_concurrency=concurrency, aggregate=aggregate
        )
        stack = build_stack(settings)
        kinesis = CallCounter().attach(stack.writer.client)
        billed = _messages(count, size, "eo")
        timed = _messages(count, size, "eo-timed")
        with stack.producer(owner="bench") as producer:
            clean = _metered(stack, lambda: _send_all(producer, billed))
            before = ceiling() if ceiling is not None else None
            clean_timed = _timed(lambda: _send_all(producer, timed))
            after = ceiling() if ceiling is not None else None
            again = _metered(stack, lambda: _send_all(producer, billed))
            again_timed = _timed(lambda: _send_all(producer, timed))
        puts = kinesis.calls["PutRecords"]  # the DUPLICATE runs put nothing
        records = _count_records(stack.reader)
        delivered = clean.pop("delivered")
        sent = delivered + clean_timed.pop("delivered")
        again_timed.pop("delivered")
        return {
            "messages": count,
            "concurrency": concurrency,
            "aggregate": aggregate,
            "delivered": delivered,
            **_rates_of(clean, clean_timed),
            "kinesis_requests_per_message": round(puts / max(sent, 1), 5),
            "kinesis_records_per_message": round(records / max(sent, 1), 5),
            "mean_batch_fill": round(records / max(puts, 1), 1),
            "duplicate_path": _rates_of(again, again_timed),
            **({"ledger_ceiling": _mean_ceiling(before, after)} if before and after else {}),
        }

    def reconcile(self, stale: int, *, shards: int = 4, lease_s: float = 10.0) -> dict[str, Any]:
        """Resolve ``stale`` claims whose records are in the stream but were never marked:
        what producers that crashed after their put leave behind. They are stale once their
        lease is over: the bench waits it out (``lease_s``, which must cover claiming a chunk
        of 500 and putting it, on a busy machine), then times the reconciler."""
        settings = self._fresh(
            "reconcile",
            shards=shards,
            put_connect_timeout_s=1.0,
            put_read_timeout_s=1.0,
            clock_skew_s=0.5,
            lease_s=lease_s,
            # the fence off: the reconciler's pace does not depend on it, and a lease shorter
            # than the signature window keeps the wait for the claims to expire short
            put_fence=PutFence.OFF,
        )
        stack = build_stack(settings)
        messages = _messages(stale, 64, "stale")
        # like crashed producers: each group claimed and put, then never settled
        crashing = Failpoints(f"{Step.BEFORE_MARK}=raise")
        with stack.producer(owner="crashed", hooks=crashing) as producer:
            for start in range(0, stale, 500):
                with contextlib.suppress(FailpointError):
                    producer.send(messages[start : start + 500])
        time.sleep(settings.lease_s + 2 * settings.clock_skew_s + 0.2)
        reconciler = stack.reconciler(owner="bench-reconciler")
        started = time.perf_counter()
        report = reconciler.run_once()
        seconds = time.perf_counter() - started
        return {
            "stale_claims": stale,
            "shards": shards,
            "lease_s": lease_s,
            "resolved": report.delivered,
            "seconds": round(seconds, 3),
            "claims_per_second": round(report.delivered / seconds, 1),
            "get_records_calls": report.get_records_calls,
            "get_records_calls_per_claim": round(report.get_records_calls / max(stale, 1), 5),
            "get_records_calls_per_shard": round(report.get_records_calls / shards, 2),
        }

    def resend(self, count: int, size: int, concurrency: int) -> dict[str, Any]:
        """The resend path alone (issue 25): ``count`` messages delivered, then the same keys
        sent again (every one DUPLICATE) by a producer whose DynamoDB calls go through a
        :class:`MeteringProxy`, which counts and prices each as AWS bills it. Its start's calls
        are left out; its rate is a proxied one (one hop longer per call)."""
        settings = self._fresh("resend", ledger_concurrency=concurrency)
        messages = _messages(count, size, "resend")
        with build_stack(settings).producer(owner="bench") as producer:
            _send_all(producer, messages)
        with metered_dynamodb(settings) as (endpoint, meter):
            stack = build_stack(settings.model_copy(update={"dynamodb_endpoint_url": endpoint}))
            with stack.producer(owner="bench") as producer:
                started = meter.snapshot()
                timed = _timed(lambda: _send_all(producer, messages))
                bill = meter.snapshot()
        return {
            "messages": count,
            "concurrency": concurrency,
            **timed,
            **per_message(bill, count, since=started),
        }

    # --- replay mode (dedupe=replay) -----------------------------------------------------------

    def replay_send(self, count: int, size: int) -> dict[str, Any]:
        """Replay mode as ``keo send --dedupe replay --run-id R`` drives it, in this process
        (``ReplayProducer.send_run``, the Python API): one attempt at a new run over
        ``count`` messages (two writes to register it, the puts, one to finish it, one to
        complete the run), then the same run again (COMPLETE: every message DUPLICATE,
        nothing sent). Metered: a few ledger calls a run cost the meter nothing measurable,
        so the metered rate is the rate."""
        settings = self._fresh("replay")
        stack = build_stack(settings)
        kinesis = CallCounter().attach(stack.writer.client)
        messages = _messages(count, size, "replay")
        producer = stack.replay_producer()
        clean = _metered(stack, lambda: _delivered(producer.send_run("bench", messages)))
        puts = kinesis.calls["PutRecords"]
        again = _metered(stack, lambda: _delivered(producer.send_run("bench", messages)))
        return {
            "messages": count,
            "rows_per_attempt": count,
            **clean,
            "kinesis_requests_per_message": round(puts / max(clean["delivered"], 1), 5),
            "kinesis_records_per_message": round(
                _count_records(stack.reader) / max(clean["delivered"], 1), 5
            ),
            "duplicate_path": {**again, "kinesis_requests": kinesis.calls["PutRecords"] - puts},
        }

    def replay_tasks(self, tasks: int, size: int, rows_per_task: int) -> dict[str, Any]:
        """A batch as ``format("keo")`` writes it in replay mode: ``tasks`` tasks of
        ``rows_per_task`` rows, each task one attempt at the batch's run (register, puts, end
        of lease), one after the other, then the driver's commit completes the run. Metered:
        the bill of tasks of that size; the run item lists every attempt, so its writes grow
        with the tasks of the batch."""
        settings = self._fresh("replay-tasks")
        count = tasks * rows_per_task
        stack = build_stack(settings)
        messages = _messages(count, size, "task")
        producer = stack.replay_producer()
        execution = new_execution_id()

        def batch() -> int:
            counts: Counter[str] = Counter()
            for task, start in enumerate(range(0, count, rows_per_task)):
                with producer.attempt(ReplayTask("batch/0", execution, task=str(task))) as attempt:
                    attempt.send(messages[start : start + rows_per_task])
                counts.update(attempt.counts)
            producer.complete("batch/0", dict(counts))
            return counts["SENT"] + counts["DUPLICATE"]

        return {
            "messages": count,
            "rows_per_attempt": rows_per_task,
            "attempts": tasks,
            **_metered(stack, batch),
        }

    def keo_send_replay(self, count: int, size: int) -> dict[str, Any]:
        """``keo send --dedupe replay --run-id`` as a user runs it: a process of its own on a
        JSON-lines file of ``count`` messages, its DynamoDB calls priced by a
        :class:`MeteringProxy` (its start's included: a few calls, each one hop longer). Its
        start (imports, clients, the stream's and the table's description) is timed first on
        an empty file, under another run id, and is in its time; ``..._after_start``
        leaves it out."""
        settings = self._fresh("send-replay")
        with (
            tempfile.TemporaryDirectory(prefix="keo-send-") as folder,
            metered_dynamodb(settings) as (endpoint, meter),
        ):
            env = {
                **os.environ,
                **settings_env(settings),
                # the code this process runs, not whatever copy the interpreter has installed
                "PYTHONPATH": worker_python_path(),
            }
            empty = write_lines(Path(folder) / "empty.jsonl", 0, size, "send")
            startup_s = timed_keo_send(env, empty, "none", _replay_args("start"))
            lines = write_lines(Path(folder) / "rows.jsonl", count, size, "send")
            env["KEO_DYNAMODB_ENDPOINT_URL"] = endpoint
            seconds = timed_keo_send(env, lines, f"SENT {count}", _replay_args("bench"))
            bill = meter.snapshot()
        return {
            "messages": count,
            "startup_s": round(startup_s, 3),
            "seconds": round(seconds, 3),
            "messages_per_second": round(count / seconds, 1),
            "messages_per_second_after_start": round(count / max(seconds - startup_s, 1e-3), 1),
            **per_message(bill, count),
        }

    def replay_recovery(
        self,
        rows: int,
        size: int,
        *,
        landed: int,
        lease_s: float = 10.0,
        replay_lease_s: float = 60.0,
    ) -> dict[str, Any]:
        """A replay of a run whose first attempt put ``landed`` of its ``rows`` and stopped
        without ending its lease (killed): a second execution's attempt over the same rows
        reads the first one's window back and sends only what it did not find.

        All landed: everything is found, nothing sent, no wait. Halfway: the rows not found
        cannot be decided while the first lease runs, so the replay waits for it, reads the
        shards again and sends the rest. The first attempt's lease is short (``lease_s``, the
        signature fence off, ``KEO_PUT_FENCE=off``) so that wait is seconds, and it is
        reported apart (``wait_s``, the replay's sleeps) from the reads and puts. The replay's
        own lease is the fence-off default (``replay_lease_s``): an attempt renews its lease
        only as it puts or waits, so one that reads back for longer than its lease loses it
        (its rows come back IN_FLIGHT; under load, 50,000 rows took more than 6 s)."""
        settings = self._fresh(
            "recovery",
            put_fence=PutFence.OFF,
            lease_s=lease_s,
            put_connect_timeout_s=1.0,
            put_read_timeout_s=2.0,
            clock_skew_s=0.5,
        )
        messages = _messages(rows, size, "recover")
        first = build_stack(settings).replay_producer().attempt(ReplayTask("bench", "killed"))
        started = time.perf_counter()
        for start in range(0, landed, CLI_CHUNK):
            first.send(messages[start : min(start + CLI_CHUNK, landed)])
        first_s = time.perf_counter() - started
        # killed: never finished, its lease left running
        # the replay's process: its own clients and counts, its own lease
        stack = build_stack(settings.model_copy(update={"lease_s": replay_lease_s}))
        slept: list[float] = []

        def sleep(seconds: float) -> None:
            slept.append(seconds)
            time.sleep(seconds)

        started = time.perf_counter()
        with stack.replay_producer(sleep=sleep).attempt(ReplayTask("bench", "replay")) as replay:
            chunks = _chunks(messages)
            # the first call reads every shard the rows route to (all of them, here) back
            outcomes = replay.send(chunks[0])
            first_read_s = time.perf_counter() - started
            outcomes += [o for c in chunks[1:] for o in replay.send(c)]
            replay.finish()
        seconds = time.perf_counter() - started
        wait_s = sum(slept)
        sent = sum(1 for o in outcomes if o.status is OutcomeStatus.SENT)
        get_records_calls = replay.get_records_calls  # before the count below reads too
        return {
            "rows": rows,
            "landed_before": landed,
            "lease_s": lease_s,
            "replay_lease_s": replay_lease_s,
            "first_attempt_put_s": round(first_s, 3),
            "step": str(replay.step),
            "rows_found": replay.rows_found,
            "rows_sent": sent,
            "delivered": sum(1 for o in outcomes if o.delivered),
            "seconds": round(seconds, 3),
            "wait_s": round(wait_s, 3),
            "seconds_without_wait": round(seconds - wait_s, 3),
            "first_read_s": round(first_read_s, 3),
            "get_records_calls": get_records_calls,
            "rows_found_per_second_without_wait": round(
                replay.rows_found / max(seconds - wait_s, 1e-3), 1
            ),
            "records_in_stream": _count_records(stack.reader),
        }


def _send_all(producer: ExactlyOnceProducer, messages: Sequence[Message]) -> int:
    """Messages DELIVERED or DUPLICATE after sending ``messages`` in CLI-sized chunks."""
    settled = 0
    for start in range(0, len(messages), 5000):
        settled += sum(1 for o in producer.send(messages[start : start + 5000]) if o.delivered)
    return settled


def _delivered(outcomes: Sequence[Any]) -> int:
    return sum(1 for o in outcomes if o.delivered)


def _chunks(messages: Sequence[Message]) -> list[Sequence[Message]]:
    """``messages`` as keo send hands them over: chunks of its default size."""
    return [messages[start : start + CLI_CHUNK] for start in range(0, len(messages), CLI_CHUNK)]


def _read_item_of(settings: ProducerSettings) -> Callable[[str, Mapping[str, Any]], Any]:
    """The meter's own reads of an item's new image, on a client it does not watch."""
    unwatched = ledger_from(settings).client

    def read_item(table: str, key: Mapping[str, Any]) -> Any:
        return unwatched.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")

    return read_item


def per_message(
    bill: MeterReading, messages: int, *, since: MeterReading | None = None
) -> dict[str, Any]:
    """A meter's reading per message (what it priced ``since`` an earlier reading, if given),
    as the bench reports it."""
    before = since or MeterReading()
    per = max(messages, 1)

    def each(figure: Callable[[MeterReading], float]) -> float:
        return round((figure(bill) - figure(before)) / per, 5)

    operations = Counter(bill.requests_by_operation)
    operations.subtract(before.requests_by_operation)
    return {
        "dynamodb_requests_per_message": each(lambda b: b.requests),
        "dynamodb_write_requests_per_message": each(lambda b: b.write_requests),
        "billed_write_units_per_message": each(lambda b: b.total_write_units),
        "billed_index_write_units_per_message": each(lambda b: b.billed_index_write_units),
        "billed_read_units_per_message": each(lambda b: b.billed_read_units),
        "conditional_check_failures_per_message": each(lambda b: b.conditional_check_failures),
        "dynamodb_requests_by_operation": {op: n for op, n in sorted(operations.items()) if n},
        "inexact_meter_calls": bill.inexact_calls - before.inexact_calls,
    }


@contextlib.contextmanager
def metered_dynamodb(settings: ProducerSettings) -> Iterator[tuple[str, BillingMeter]]:
    """An endpoint in front of ``settings``' DynamoDB that prices every call made through it
    (a :class:`MeteringProxy`), and its meter: the bill of other processes (``keo send``,
    Spark's Python workers). The local stack's only: AWS's endpoint cannot be proxied."""
    upstream = settings.dynamodb_endpoint_url
    if upstream is None:
        raise ValueError("metering another process needs a DynamoDB endpoint URL to proxy")
    with MeteringProxy(upstream, settings.table, region=settings.resolved_region()) as proxy:
        yield proxy.endpoint, proxy.meter


def _replay_args(run_id: str) -> tuple[str, ...]:
    return ("--dedupe", "replay", "--run-id", run_id)


def settings_env(settings: ProducerSettings) -> dict[str, str]:
    """The ``KEO_*`` values a process needs to write where ``settings`` do."""
    values = {
        "KEO_STREAM": settings.stream,
        "KEO_TABLE": settings.table,
        "KEO_KINESIS_ENDPOINT_URL": settings.kinesis_endpoint_url,
        "KEO_DYNAMODB_ENDPOINT_URL": settings.dynamodb_endpoint_url,
        "KEO_REGION": settings.resolved_region(),
    }
    return {name: value for name, value in values.items() if value is not None}


class SendFailedError(RuntimeError):
    """``keo send`` did not settle every row as the measure expects: its time means nothing."""

    def __init__(self, expected: str, returncode: int, stderr: str) -> None:
        super().__init__(
            f"keo send exited {returncode}, expected {expected}; its stderr ends: {stderr[-2000:]}"
        )
        self.expected = expected
        self.returncode = returncode


def write_lines(path: Path, rows: int, size: int, prefix: str) -> Path:
    """``rows`` messages of ``size`` bytes of data as ``keo send``'s input, JSON lines."""
    data = "x" * size
    with path.open("w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps({"key": f"{prefix}-{i}", "data": data}) + "\n")
    return path


def cli_startup_cpu(env: Mapping[str, str], repeat: int = 5) -> dict[str, float]:
    """The CPU seconds (user and system, the median of ``repeat`` runs) ``keo`` spends to
    answer ``--version``, ``--help``, and ``keo send`` of an empty file in ``env``, in key mode
    and in replay mode (a new run each time): the start a short send pays in full (issue 38
    asks at most 0.25 s of the first two, 0.45 s of a send)."""
    with tempfile.TemporaryDirectory(prefix="keo-start-") as folder:
        empty = Path(folder) / "empty.jsonl"
        empty.write_text("", encoding="utf-8")
        send = ["send", "--input", str(empty), "--no-progress"]
        asks: dict[str, Callable[[], Sequence[str]]] = {
            "version": lambda: ["--version"],
            "help": lambda: ["--help"],
            "send_empty": lambda: send,
            "send_empty_replay": lambda: [*send, *_replay_args(f"keo-start-{uuid.uuid4().hex}")],
        }
        return {
            name: round(statistics.median(_cpu_s_of(env, ask()) for _ in range(repeat)), 3)
            for name, ask in asks.items()
        }


def _cpu_s_of(env: Mapping[str, str], args: Sequence[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
        [*CLI_COMMAND, *args],
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
        timeout=_SEND_TIMEOUT_S,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def timed_keo_send(
    env: Mapping[str, str], lines: Path, expected: str, args: Sequence[str] = ()
) -> float:
    """``keo send --input lines [args]``; ``expected`` is its summary, e.g. ``SENT 20000``."""
    started = time.perf_counter()
    done = subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
        [*CLI_COMMAND, "send", "--input", str(lines), "--no-progress", *args],
        env=dict(env),
        stdout=subprocess.DEVNULL,  # one outcome per row: written, as a user's run writes them
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        timeout=_SEND_TIMEOUT_S,
    )
    seconds = time.perf_counter() - started
    summary = _SEND_SUMMARY.search(done.stderr)
    if done.returncode != 0 or summary is None or summary.group(2) != expected:
        raise SendFailedError(expected, done.returncode, done.stderr)
    return seconds


def _mean_ceiling(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    rates = [before["messages_per_second_ceiling"], after["messages_per_second_ceiling"]]
    return {
        **before,
        "conditional_writes": before["conditional_writes"] + after["conditional_writes"],
        "before_and_after": rates,
        "writes_per_second": round(sum(rates) / 2, 1),
        "messages_per_second_ceiling": round(sum(rates) / 2, 1),
    }


def _timed(send: Callable[[], int]) -> dict[str, Any]:
    """Run ``send`` alone: messages delivered, wall time, rate and the process' CPU per message
    (every thread of the producer)."""
    cpu_started, started = time.process_time(), time.perf_counter()
    settled = send()
    seconds = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    return {
        "delivered": settled,
        "seconds": round(seconds, 3),
        "messages_per_second": round(settled / seconds, 1),
        "client_cpu_ms_per_message": round(cpu_s * 1000 / max(settled, 1), 3),
    }


def _rates_of(metered: dict[str, Any], timed: dict[str, Any]) -> dict[str, Any]:
    """The bill of a metered run with the rate and CPU of its unmetered twin."""
    return {
        **metered,
        "metered_messages_per_second": metered["messages_per_second"],
        "metered_client_cpu_ms_per_message": metered["client_cpu_ms_per_message"],
        **timed,
    }


def _metered(stack: Stack, send: Callable[[], int]) -> dict[str, Any]:
    """Run ``send`` with a billing meter on the ledger's client: the DynamoDB requests and
    units per message as AWS bills them (and the rate, slowed by the meter's own work)."""
    meter = BillingMeter(
        {stack.settings.table: ledger_table_spec()}, read_item=_read_item_of(stack.settings)
    )
    meter.attach(stack.ledger.client)
    try:
        timed = _timed(send)
    finally:
        meter.detach(stack.ledger.client)
    return {**timed, **per_message(meter.snapshot(), timed["delivered"])}


def cost_model(billed_write_units: float, billed_read_units: float) -> dict[str, Any]:
    """Dollars per million messages and per day at 2 billion a day, from billed units.

    Prices: DynamoDB us-east-1, on-demand $0.625 per million write request units and $0.125
    per million read request units; provisioned $0.00065 per WCU-hour and $0.00013 per
    RCU-hour at full utilisation (a floor: real tables keep headroom). Checked 2026-11-23.
    """
    on_demand = billed_write_units * 0.625 + billed_read_units * 0.125
    # one unit per second for 1e6 / 3600 hours serves a million messages
    provisioned = (billed_write_units * 0.00065 + billed_read_units * 0.00013) * 1e6 / 3600
    per_day = 2_000
    return {
        "prices": "us-east-1, on-demand $0.625/M WRU, $0.125/M RRU; provisioned "
        "$0.00065/WCU-h, $0.00013/RCU-h at full utilisation",
        # replay mode's cents a day need the digits key mode's thousands of dollars do not
        "on_demand_per_million_messages_usd": round(on_demand, 6),
        "provisioned_per_million_messages_usd": round(provisioned, 6),
        "on_demand_per_day_at_2_billion_usd": round(on_demand * per_day, 2),
        "provisioned_per_day_at_2_billion_usd": round(provisioned * per_day, 2),
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


def _at_concurrency(
    bench: Bench,
    baseline: dict[str, Any],
    *,
    messages: int,
    size: int,
    concurrency: int,
    repeat: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The ledger ceiling and the producer, measured ``repeat`` times.

    On a shared machine a rate swings with whatever else runs, so each producer run is
    compared with the ceiling measured right before and right after it, and the run with the
    median ratio is reported (its counts with it), every pair kept in ``repeats``.
    """
    pairs = []
    for attempt in range(1, repeat + 1):
        say(
            f"exactly-once at concurrency {concurrency}: {messages} messages, the ledger "
            f"ceiling before and after ({attempt}/{repeat})"
        )
        result = bench.exactly_once(
            messages,
            size,
            concurrency,
            ceiling=lambda: bench.ledger_ceiling(min(messages * 2, 4000), concurrency),
        )
        ceiling_rate = result["ledger_ceiling"]["messages_per_second_ceiling"]
        for path in (result, result["duplicate_path"]):
            path["ceiling_fraction"] = round(path["messages_per_second"] / ceiling_rate, 3)
            path["ratio_to_baseline"] = round(
                path["messages_per_second"] / baseline["messages_per_second"], 4
            )
        pairs.append(result)
    ranked = sorted(pairs, key=lambda r: r["ceiling_fraction"])
    chosen = dict(ranked[(len(ranked) - 1) // 2])
    chosen["repeats"] = [
        {
            "ceiling_messages_per_second": r["ledger_ceiling"]["messages_per_second_ceiling"],
            "messages_per_second": r["messages_per_second"],
            "ceiling_fraction": r["ceiling_fraction"],
            "duplicate_ceiling_fraction": r["duplicate_path"]["ceiling_fraction"],
            "client_cpu_ms_per_message": r["client_cpu_ms_per_message"],
        }
        for r in pairs
    ]
    chosen["cost"] = cost_model(
        chosen["billed_write_units_per_message"], chosen["billed_read_units_per_message"]
    )
    return chosen


def load_average() -> list[float]:
    """The system's load averages over 1, 5 and 15 minutes: how shared the machine was."""
    return [round(load, 2) for load in os.getloadavg()]


def machine(load_at_start: list[float]) -> dict[str, Any]:
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
        "backends": f"kinesalite 3.3.3 + {_dynamodb_backend()} on 127.0.0.1",
        "load_average": {"start": load_at_start, "end": load_average()},
    }


# what answers at KEO_DYNAMODB_ENDPOINT_URL, by KEO_DYNAMODB_EMULATOR (set by the local stack)
_DYNAMODB_BACKENDS: Final = {
    "dynalite": "dynalite 4.0.0 (LevelDB on local disk; no PartiQL: a claim a request)",
    "dynamodb-local": "DynamoDB Local 2026-05-28 (SQLite; PartiQL: 25 claims a request)",
}


def _dynamodb_backend() -> str:
    name = os.environ.get("KEO_DYNAMODB_EMULATOR", "dynalite")
    return _DYNAMODB_BACKENDS.get(name, name)


def run(
    base: ProducerSettings,
    *,
    messages: int,
    size: int,
    concurrencies: Sequence[int],
    reconcile_sizes: Sequence[int],
    say: Callable[[str], None],
    repeat: int = 3,
    replay_messages: int = 20_000,
    rows_per_task: int = 500,
    replay_tasks: Sequence[int] = (10, 40, 200),
    recovery_rows: int = 100_000,
    recovery_lease_s: float = 10.0,
    reconcile_lease_s: float = 10.0,
    resend_messages: int = 20_000,
) -> dict[str, Any]:
    load_at_start = load_average()
    bench = Bench(base, say=say)
    say(f"baseline: {messages} messages, {repeat} times")
    baselines = sorted(
        (bench.baseline(messages, size) for _ in range(repeat)),
        key=lambda b: b["messages_per_second"],
    )
    baseline = {
        **baselines[(repeat - 1) // 2],
        "repeats": [b["messages_per_second"] for b in baselines],
    }
    runs = [
        _at_concurrency(
            bench,
            baseline,
            messages=messages,
            size=size,
            concurrency=concurrency,
            repeat=repeat,
            say=say,
        )
        for concurrency in concurrencies
    ]
    best = max(runs, key=lambda r: r["messages_per_second"])
    say(f"exactly-once with aggregation at concurrency {best['concurrency']}")
    aggregated = bench.exactly_once(messages, size, best["concurrency"], aggregate=True)
    say(f"the resend path: {resend_messages} delivered keys again, through the metering proxy")
    resend = bench.resend(resend_messages, size, best["concurrency"])
    reconciles = []
    for stale in reconcile_sizes:
        say(f"reconciler: {stale} stale claims")
        reconciles.append(bench.reconcile(stale, lease_s=reconcile_lease_s))
    replay = _replay(
        bench,
        messages=replay_messages,
        size=size,
        rows_per_task=rows_per_task,
        tasks=replay_tasks,
        recovery_rows=recovery_rows,
        recovery_lease_s=recovery_lease_s,
        repeat=repeat,
        say=say,
    )
    say("keo's start: --version, --help, keo send of an empty file")
    startup = bench.startup()
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(load_at_start),
        "cli_startup_cpu_s": startup,
        "message_bytes": size,
        "baseline": baseline,
        "exactly_once": runs,
        "best": {
            "concurrency": best["concurrency"],
            "messages_per_second": best["messages_per_second"],
            "ceiling_fraction": best["ceiling_fraction"],
            "dynamodb_requests_per_message": best["dynamodb_requests_per_message"],
            "dynamodb_write_requests_per_message": best["dynamodb_write_requests_per_message"],
            "billed_write_units_per_message": best["billed_write_units_per_message"],
            "billed_read_units_per_message": best["billed_read_units_per_message"],
            "client_cpu_ms_per_message": best["client_cpu_ms_per_message"],
            "ratio_to_baseline": best["ratio_to_baseline"],
            "duplicate_path": best["duplicate_path"],
            "cost": best["cost"],
        },
        "aggregation": {"off": best, "on": aggregated},
        "resend": resend,
        "reconcile": reconciles,
        "replay": replay,
        "modes": _modes(best, replay),
    }


def _replay(
    bench: Bench,
    *,
    messages: int,
    size: int,
    rows_per_task: int,
    tasks: Sequence[int],
    recovery_rows: int,
    recovery_lease_s: float,
    repeat: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Replay mode's figures: its bill, its rate against plain ``put_records`` and its
    recoveries.

    The rates are taken in rounds, each the plain baseline, then the replay producer in this
    process, then ``keo send --dedupe replay`` (metered through a proxy): each ratio is taken
    within its round, where the machine's drift is shared, and the median round is reported
    (every round is kept in ``rounds``)."""
    say("replay mode: a stream and a ledger table for each measure")
    bench.prepare(
        ["baseline", "replay", "send-replay"] * repeat
        + ["replay-tasks"] * len(tasks)
        + ["recovery"] * 2
    )
    rounds = []
    for attempt in range(1, repeat + 1):
        say(
            f"replay mode: plain put_records, the replay producer, keo send --dedupe replay; "
            f"{messages} messages each ({attempt}/{repeat})"
        )
        baseline = bench.baseline(messages, size)
        producer = bench.replay_send(messages, size)
        command = bench.keo_send_replay(messages, size)
        rate = baseline["messages_per_second"]
        rounds.append(
            {
                "baseline_messages_per_second": rate,
                "producer": producer,
                "keo_send": command,
                "producer_vs_baseline": round(producer["messages_per_second"] / rate, 3),
                "keo_send_vs_baseline": round(command["messages_per_second"] / rate, 3),
                "keo_send_after_start_vs_baseline": round(
                    command["messages_per_second_after_start"] / rate, 3
                ),
            }
        )
    chosen = sorted(rounds, key=lambda r: r["producer_vs_baseline"])[(len(rounds) - 1) // 2]
    batches = []
    for count in tasks:
        say(f"replay mode: a batch in {count} tasks of {rows_per_task} rows, metered")
        batches.append(bench.replay_tasks(count, size, rows_per_task))
    recoveries = []
    for landed in (recovery_rows, recovery_rows // 2):
        say(f"replay mode: recovering {recovery_rows} rows, {landed} of them put before")
        recoveries.append(
            bench.replay_recovery(recovery_rows, size, landed=landed, lease_s=recovery_lease_s)
        )
    for figures in (chosen["producer"], chosen["keo_send"], *batches):
        figures["cost"] = cost_model(
            figures["billed_write_units_per_message"], figures["billed_read_units_per_message"]
        )
    medians = {
        name: round(statistics.median(r[name] for r in rounds), 3)
        for name in (
            "producer_vs_baseline",
            "keo_send_vs_baseline",
            "keo_send_after_start_vs_baseline",
        )
    }
    return {
        "messages": messages,
        **chosen,
        "median_ratios": medians,
        "rounds": [
            {
                "baseline_messages_per_second": r["baseline_messages_per_second"],
                "producer_messages_per_second": r["producer"]["messages_per_second"],
                "keo_send_messages_per_second": r["keo_send"]["messages_per_second"],
                "keo_send_startup_s": r["keo_send"]["startup_s"],
                "producer_vs_baseline": r["producer_vs_baseline"],
                "keo_send_vs_baseline": r["keo_send_vs_baseline"],
                "keo_send_after_start_vs_baseline": r["keo_send_after_start_vs_baseline"],
            }
            for r in rounds
        ],
        "batches": batches,
        "recovery": recoveries,
    }


def _modes(key: dict[str, Any], replay: dict[str, Any]) -> dict[str, Any]:
    """Key mode at its best concurrency next to replay mode, one run: the issue's figures."""
    producer, batch = replay["producer"], replay["batches"][0]
    return {
        "key": {
            "dynamodb_requests_per_message": key["dynamodb_requests_per_message"],
            "billed_write_units_per_message": key["billed_write_units_per_message"],
            "ratio_to_baseline": key["ratio_to_baseline"],
            "cost": key["cost"],
        },
        "replay": {
            "dynamodb_requests_per_message": producer["dynamodb_requests_per_message"],
            "billed_write_units_per_message": producer["billed_write_units_per_message"],
            "batch_of": f"{batch['attempts']} tasks of {batch['rows_per_attempt']} rows",
            "batch_dynamodb_requests_per_message": batch["dynamodb_requests_per_message"],
            "batch_billed_write_units_per_message": batch["billed_write_units_per_message"],
            "ratio_to_baseline": replay["producer_vs_baseline"],
            "keo_send_ratio_to_baseline": replay["keo_send_vs_baseline"],
            "cost": producer["cost"],
            "batch_cost": batch["cost"],
        },
    }
