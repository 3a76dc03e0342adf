"""The demo without Spark (``keo demo --no-spark``), and what both demos report.

A plain at-least-once producer (boto3 ``put_records`` in batches of 500, retrying a batch
whose response was lost, as the SDK does) against the exactly-once producer, in this process.
Faults injected into both identically: PutRecords responses lost after the write, a batch
replayed as Spark replays a crashed micro-batch, and a producer stalled past its lease right
before its put while another one sends its keys (Kinesis reached through the fault proxy,
which enforces the signature window the fence relies on). Both streams are then audited by
the same audit. The Spark demo (``devstack/spark_demo.py``) runs the same comparison, without
the stalled producer, through a plain ``foreachBatch`` sink and ``format("keo")``, and returns
the same :class:`DemoResult`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import botocore.exceptions
from tenacity import stop_after_attempt, wait_exponential, wait_random_exponential

from devstack.fault_proxy import FaultProxy
from kinesis_store.entries import MAX_RECORDS_PER_PUT, put_entry
from kinesis_store.provisioning import create_stream
from kinesis_store.reader import KinesisReader
from producer.audit import Anomaly, AuditReport, audit_stream
from producer.errors import ConfigurationError
from producer.hooks import Step
from producer.outcomes import OutcomeStatus
from producer.protocol import Message, explicit_hash_key
from producer.reconciler import ReconcileReport
from producer.retries import repeat_while
from producer.settings import ProducerSettings
from producer.wiring import build_stack, kinesis_client, ledger_from

log = logging.getLogger(__name__)


LOST_RESPONSES: Final = "responses lost after the write"
THROTTLED_PUTS: Final = "PutRecords with throttled records"
DRIVER_KILLS: Final = "driver killed mid-batch"
SHARD_SPLITS: Final = "shards split mid-run"
STALLED_PRODUCERS: Final = "producer stalled past its lease before its put"
# the plain producer keeps resending, as users' retry loops do; bounded so a dead endpoint ends
PLAIN_MAX_ATTEMPTS: Final = 20


@dataclass
class DemoResult:
    """One side of the comparison: what went in, what was injected, what the audit found."""

    name: str
    messages_in: int
    report: AuditReport
    seconds: float
    batches_replayed: int
    faults: dict[str, int] = field(default_factory=dict)  # injected, by label
    table: str | None = None  # the ledger table: None for the plain producer
    reconciled: ReconcileReport | None = None

    @property
    def faults_injected(self) -> int:
        return sum(self.faults.values())

    @property
    def duplicated(self) -> int:
        """Keys in the stream more than once."""
        return self.report.count(Anomaly.DUPLICATE)

    @property
    def in_flight(self) -> int:
        return self.report.count(Anomaly.IN_FLIGHT)

    @property
    def missing(self) -> int:
        return self.report.missing

    @property
    def exactly_once(self) -> bool:
        """Every expected key in the stream exactly once."""
        return not self.duplicated and not self.missing


class LostResponses:
    """Every ``every``-th PutRecords is written, then its response is lost (a read timeout)."""

    def __init__(self, client: Any, every: int) -> None:
        self._every = every
        self._calls = itertools.count(1)
        self._lock = threading.Lock()
        self.injected = 0
        client.meta.events.register("after-call.kinesis.PutRecords", self._after_call)

    def _after_call(self, **_: Any) -> None:
        with self._lock:
            call = next(self._calls)
            if call % self._every:
                return
            self.injected += 1
        raise botocore.exceptions.ReadTimeoutError(endpoint_url="injected: response lost")


def messages(count: int) -> list[Message]:
    return [
        Message(f"order-{i:06d}", f'{{"order": {i}, "amount": {i % 97}}}'.encode())
        for i in range(count)
    ]


class PutGaveUpError(RuntimeError):
    """The plain producer gave up resending a request."""

    def __init__(self, stream: str, records: int, attempts: int) -> None:
        super().__init__(f"{records} records not written to {stream} after {attempts} attempts")
        self.stream = stream
        self.records = records
        self.attempts = attempts


def put_at_least_once(client: Any, stream: str, entries: list[dict[str, Any]]) -> None:
    """What users have today: resend until every record has a sequence number, the whole
    request when its outcome is unknown (a timeout may hide a write: that resend is the
    duplicate keo exists to prevent), the failed records after a per-record error.

    Deliberately blind, like the SDK's retries and users' loops; waits 0.05..0.1 s doubling
    to 0.5..1 s between tries, at most ``PLAIN_MAX_ATTEMPTS`` of them.
    """
    pending = entries
    attempts = 0

    def put() -> list[dict[str, Any]]:
        nonlocal pending, attempts
        attempts += 1
        try:
            response = client.put_records(StreamName=stream, Records=pending)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            log.info(
                "plain put failed, resending the request stream=%s records=%d attempt=%d error=%s",
                stream,
                len(pending),
                attempts,
                type(exc).__name__,
            )
            return pending
        pending = [
            entry
            for entry, result in zip(pending, response["Records"], strict=True)
            if result.get("ErrorCode")
        ]
        return pending

    left = repeat_while(
        put,
        more=bool,
        # half the cap, plus up to half again at random: 0.05..0.1 s, doubling to 0.5..1 s
        wait=wait_exponential(multiplier=0.05, max=0.5)
        + wait_random_exponential(multiplier=0.05, max=0.5),
        stop=stop_after_attempt(PLAIN_MAX_ATTEMPTS),
    )
    if left:
        raise PutGaveUpError(stream, len(left), PLAIN_MAX_ATTEMPTS)


def run_at_least_once(
    settings: ProducerSettings, batch: Sequence[Message], lose_every: int
) -> tuple[int, int]:
    """What users have today: put_records, resend the batch when the response is lost."""
    client = kinesis_client(settings, for_put=True)
    faults = LostResponses(client, lose_every)
    for start in range(0, len(batch), MAX_RECORDS_PER_PUT):
        chunk = batch[start : start + MAX_RECORDS_PER_PUT]
        put_at_least_once(
            client, settings.stream, [put_entry(m.key, m.data, explicit_hash_key(m)) for m in chunk]
        )
    return faults.injected, 0


def stall_at_least_once(settings: ProducerSettings, batch: Sequence[Message]) -> int:
    """A plain producer stalls before its put while another sends the same records; then it
    resumes and sends them too."""
    client = kinesis_client(settings, for_put=True)
    entries = [put_entry(m.key, m.data, explicit_hash_key(m)) for m in batch]
    put_at_least_once(client, settings.stream, entries)  # the other one
    put_at_least_once(client, settings.stream, entries)  # the stalled one, resumed
    return 1


class _StallBeforePut:
    """Hooks: the first put waits (after its lease check) until ``resume`` is set."""

    def __init__(self) -> None:
        self.stalled, self.resume = threading.Event(), threading.Event()

    def at(self, step: Step, *, batch_id: int | None = None) -> None:  # noqa: ARG002
        if step is Step.BEFORE_PUT and not self.stalled.is_set():
            self.stalled.set()
            self.resume.wait()


def stall_exactly_once(
    settings: ProducerSettings, batch: Sequence[Message], say: Callable[[str], None]
) -> int:
    """A producer stalls before its put until another one waited out its lease, read the
    stream back and sent its keys; then it resumes, and the signature fence refuses its put."""
    hooks = _StallBeforePut()
    stalled: list[OutcomeStatus] = []

    def run_stalled() -> None:
        try:
            with build_stack(settings, hooks=hooks).producer(owner="demo-stalled") as producer:
                stalled.extend(o.status for o in producer.send(batch))
        finally:
            hooks.stalled.set()  # never left waiting on a producer that did not get to its put

    thread = threading.Thread(target=run_stalled, name="demo-stalled-producer")
    thread.start()
    try:
        hooks.stalled.wait()
        with build_stack(settings).producer(owner="demo-taker") as producer:
            taken = Counter(o.status for o in producer.send(batch))
    finally:
        hooks.resume.set()
        thread.join()
    say(
        f"  a producer stalled past its {settings.lease_s:g} s lease: the other one sent "
        f"{taken[OutcomeStatus.SENT]} of its keys; resumed, it sent none "
        f"({dict(Counter(s.value for s in stalled))})"
    )
    return 1


def run_exactly_once(
    settings: ProducerSettings, batch: Sequence[Message], lose_every: int
) -> tuple[int, list[OutcomeStatus]]:
    stack = build_stack(settings)
    faults = LostResponses(stack.writer.client, lose_every)
    statuses: list[OutcomeStatus] = []
    with stack.producer(owner="demo") as producer:
        for start in range(0, len(batch), 500):
            statuses.extend(o.status for o in producer.send(batch[start : start + 500]))
    return faults.injected, statuses


def run_demo(
    settings: ProducerSettings,
    *,
    count: int = 2000,
    lose_every: int = 2,
    say: Callable[[str], None],
) -> list[DemoResult]:
    suffix = time.strftime("%H%M%S")
    batch = messages(count)
    stalled = batch[-max(1, count // 10) :]  # sent only by the stalled producer and its taker
    sent = batch[: len(batch) - len(stalled)]
    replay = sent[:500]  # the first micro-batch, replayed after a "crash"
    results: list[DemoResult] = []
    if settings.kinesis_endpoint_url is None:
        raise ConfigurationError(
            "the demo needs a local Kinesis endpoint (KEO_KINESIS_ENDPOINT_URL)",
            setting="KEO_KINESIS_ENDPOINT_URL",
        )
    window_s = settings.signature_window_s if settings.fenced else None
    for name in ("at-least-once", "exactly-once"):
        stream = f"demo-{name}-{suffix}"
        run_settings = settings.model_copy(update={"stream": stream})
        _create(run_settings)
        say(f"{name}: {count} messages into {stream}, every {lose_every}. response lost")
        started = time.monotonic()
        # the proxy stands for Kinesis: it enforces the signature window the fence relies on
        with FaultProxy(settings.kinesis_endpoint_url, signature_window_s=window_s) as proxy:
            via_proxy = run_settings.model_copy(update={"kinesis_endpoint_url": proxy.endpoint})
            if name == "at-least-once":
                faults, _ = run_at_least_once(via_proxy, sent, lose_every)
                more, _ = run_at_least_once(via_proxy, replay, lose_every)
                stalls = stall_at_least_once(via_proxy, stalled)
            else:
                faults, _ = run_exactly_once(via_proxy, sent, lose_every)
                more, _ = run_exactly_once(via_proxy, replay, lose_every)
                stalls = stall_exactly_once(via_proxy, stalled, say)
        seconds = time.monotonic() - started
        reader = KinesisReader(kinesis_client(run_settings, for_put=False), stream)
        ledger = ledger_from(run_settings) if name == "exactly-once" else None
        report = audit_stream(reader, ledger, expected=[m.key for m in batch])
        results.append(
            DemoResult(
                name,
                count,
                report,
                seconds,
                batches_replayed=1,
                faults={LOST_RESPONSES: faults + more, STALLED_PRODUCERS: stalls},
                table=run_settings.table if ledger is not None else None,
            )
        )
    return results


def _create(settings: ProducerSettings) -> None:
    create_stream(kinesis_client(settings, for_put=False), settings.stream, 4, timeout_s=20)
    ledger_from(settings).create_table()
