"""The demo without Spark (``keo demo --no-spark``), and what both demos report.

Three writers of the same messages, each into a stream of its own, in this process::

    at-least-once   boto3 put_records, 500 records a request, the request resent when its
                    response was lost, as the SDK does
    dedupe=key      ExactlyOnceProducer: each key once, ever (one conditional write a message)
    dedupe=replay   ReplayProducer: each micro-batch of 500 a named run, whose re-runs deliver
                    only what its earlier attempts did not (a few writes a run)

The same faults for each:
  - every N-th PutRecords written, then its response lost (a read timeout);
  - the first micro-batch replayed once the others are written, as Spark replays a crashed
    micro-batch (in replay mode that run's first attempt dies after its puts, before its commit,
    so the run is still OPEN when it is replayed);
  - a writer stalled past its lease right before its put while another one sends the same
    messages: in key mode another producer waits out the group's lease and takes the keys over;
    in replay mode the run is re-run, waits out the stalled attempt's lease and reads the stream
    back. Resumed, the stalled put is refused by the signature fence: Kinesis is reached through
    the fault proxy, which enforces the signature window as AWS does. The stalls (a lease's
    wait each) run in the background while the micro-batches are written.

Each writer reaches DynamoDB through a :class:`devstack.metering_proxy.MeteringProxy`: its
requests, writes and billed write units are AWS's bill for them. Each stream is then audited
the way its guarantee is defined (:func:`audited`): each key once (``keo audit``), or, in
replay mode, the multiset of ``(key, data)`` rows sent (``keo audit --dedupe replay``). The
Spark demo (``devstack/spark_demo.py``) runs the same comparison, without the stalled writer,
through a plain ``foreachBatch`` sink and ``format("keo")`` in both modes, and returns the same
:class:`DemoResult`.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import botocore.exceptions
from tenacity import stop_after_attempt, wait_exponential, wait_random_exponential

from devstack.cost_meter import BillingMeter, MeterReading
from devstack.fault_proxy import FaultProxy
from devstack.metering_proxy import MeteringProxy
from kinesis_store.entries import MAX_RECORDS_PER_PUT, put_entry
from kinesis_store.provisioning import create_stream
from kinesis_store.reader import KinesisReader
from producer.audit.rows import ExpectedRow, RowAnomaly, RowAuditReport
from producer.audit.stream import Anomaly, AuditReport, audit_rows, audit_stream
from producer.clients import kinesis_client
from producer.errors import ConfigurationError
from producer.hooks import Hooks, Step
from producer.outcomes import Outcome, OutcomeStatus
from producer.parties import new_execution_id
from producer.protocol import Message, explicit_hash_key
from producer.reconcile.reconciler import ReconcileReport
from producer.replay.context import ReplayTask
from producer.retries import repeat_while
from producer.settings import Dedupe, ProducerSettings
from producer.wiring import build_stack, ledger_from

log = logging.getLogger(__name__)


# the faults injected, as the table names them (short: a label shares 80 columns with three)
LOST_RESPONSES: Final = "lost responses"  # PutRecords written, then its response lost
THROTTLED_PUTS: Final = "throttled puts"  # PutRecords with some records refused
DRIVER_KILLS: Final = "driver kills"  # after a batch's puts, before its commit
SHARD_SPLITS: Final = "shard splits"  # between two batches
STALLED_WRITERS: Final = "stalled writer"  # past its lease, right before its put
THROTTLED_READS: Final = "throttled reads"  # GetRecords refused: rate exceeded
EXPIRED_ITERATORS: Final = "expired iterators"  # GetRecords refused: its iterator expired
# the plain producer keeps resending, as users' retry loops do; bounded so a dead endpoint ends
PLAIN_MAX_ATTEMPTS: Final = 20
MICRO_BATCH: Final = 500
EXPECTED_ROWS: Final = "expected-rows.jsonl"


@dataclass(frozen=True)
class Column:
    """One writer of the comparison: ``dedupe`` None is the plain at-least-once one."""

    name: str  # the table's heading
    slug: str  # in its stream's name
    dedupe: Dedupe | None

    def stream(self, suffix: str) -> str:
        return f"demo-{self.slug}-{suffix}"


AT_LEAST_ONCE: Final = Column("at-least-once", "at-least-once", None)
KEY: Final = Column(f"dedupe={Dedupe.KEY}", "key", Dedupe.KEY)
REPLAY: Final = Column(f"dedupe={Dedupe.REPLAY}", "replay", Dedupe.REPLAY)
COLUMNS: Final = (AT_LEAST_ONCE, KEY, REPLAY)


@dataclass(frozen=True)
class AuditFigures:
    """What the table shows of an audit, counted in the unit of the column's guarantee: keys
    (each key once) or rows (the ``(key, data)`` rows sent, each as often as it was sent)."""

    unit: Literal["keys", "rows"]
    records: int  # user records in the stream, as KCL delivers them
    duplicated: int  # keys (rows) in the stream more often than sent
    extra: int  # records past those sent: duplicates, and rows nobody sent
    missing: int  # keys (copies of rows) sent and not in the stream
    in_flight: int = 0  # keys still claimed, their put unknown (a key audit with the ledger)

    @property
    def exactly_once(self) -> bool:
        return not (self.duplicated or self.extra or self.missing)

    @classmethod
    def of_keys(cls, report: AuditReport) -> AuditFigures:
        return cls(
            unit="keys",
            records=report.user_records,
            duplicated=report.count(Anomaly.DUPLICATE),
            extra=report.user_records - report.distinct_keys,
            missing=report.missing,
            in_flight=report.count(Anomaly.IN_FLIGHT),
        )

    @classmethod
    def of_rows(cls, report: RowAuditReport) -> AuditFigures:
        return cls(
            unit="rows",
            records=report.totals.get("user_records", 0),
            duplicated=report.count(RowAnomaly.DUPLICATED),
            extra=report.copies.get(RowAnomaly.DUPLICATED, 0)
            + report.copies.get(RowAnomaly.UNEXPECTED, 0),
            missing=report.copies.get(RowAnomaly.MISSING, 0),
        )


@dataclass
class DemoResult:
    """One column of the comparison: what went in, what was injected, what the audit found,
    what DynamoDB billed for the writing (the audit's and the reconciler's reads aside)."""

    column: Column
    messages_in: int
    report: AuditReport | RowAuditReport
    audit: AuditFigures
    seconds: float  # writing: the query's runs (Spark), or the micro-batches and the replay
    batches_replayed: int
    bill: MeterReading
    faults: dict[str, int] = field(default_factory=dict)  # injected, by label
    reconciled: ReconcileReport | None = None
    replayed_run: str | None = None  # replay mode: the run replayed, as the API names it

    @property
    def name(self) -> str:
        return self.column.name

    @property
    def stream(self) -> str:
        return self.report.stream

    @property
    def faults_injected(self) -> int:
        return sum(self.faults.values())

    @property
    def exactly_once(self) -> bool:
        """Every key once (key audit), or every row as often as it was sent (row audit)."""
        return self.audit.exactly_once


def audited(
    column: Column,
    settings: ProducerSettings,
    sent: Sequence[Message],
    *,
    seconds: float,
    batches_replayed: int,
    bill: MeterReading,
    faults: dict[str, int],
    reconciled: ReconcileReport | None = None,
    replayed_run: str | None = None,
) -> DemoResult:
    """Audit ``settings.stream`` as the column's guarantee is defined: replay mode against the
    multiset of rows sent (strict: nobody else writes the demo's streams), the others per key
    (with the ledger in key mode)."""
    reader = KinesisReader(kinesis_client(settings, for_put=False), settings.stream)
    report: AuditReport | RowAuditReport
    if column.dedupe is Dedupe.REPLAY:
        report = audit_rows(reader, [ExpectedRow(m.key, m.data) for m in sent], strict=True)
        figures = AuditFigures.of_rows(report)
    else:
        ledger = ledger_from(settings) if column.dedupe is Dedupe.KEY else None
        report = audit_stream(reader, ledger, expected=[m.key for m in sent])
        figures = AuditFigures.of_keys(report)
    return DemoResult(
        column,
        len(sent),
        report,
        figures,
        seconds,
        batches_replayed,
        bill,
        faults,
        reconciled,
        replayed_run if column.dedupe is Dedupe.REPLAY else None,
    )


def write_expected(workdir: Path, sent: Sequence[Message]) -> Path:
    """The messages as the JSON lines ``keo send`` reads: ``keo audit --expected`` takes them
    in both modes (the keys, or with ``--dedupe replay`` the rows)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / EXPECTED_ROWS
    with path.open("w", encoding="utf-8") as out:
        for message in sent:
            row = {"key": message.key, "data": message.data.decode("utf-8")}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def local_endpoints(settings: ProducerSettings) -> tuple[str, str]:
    """The Kinesis and DynamoDB endpoints the demo puts its proxies in front of."""
    for name, url in (
        ("KEO_KINESIS_ENDPOINT_URL", settings.kinesis_endpoint_url),
        ("KEO_DYNAMODB_ENDPOINT_URL", settings.dynamodb_endpoint_url),
    ):
        if url is None:
            raise ConfigurationError(f"the demo needs a local endpoint ({name})", setting=name)
    return str(settings.kinesis_endpoint_url), str(settings.dynamodb_endpoint_url)


class LostResponses:
    """Every ``every``-th PutRecords, from the first on, is written, then its response is lost
    (a read timeout): even a writer that puts once meets it."""

    def __init__(self, client: Any, every: int) -> None:
        self._every = every
        self._calls = itertools.count(1)
        self._lock = threading.Lock()
        self.injected = 0
        client.meta.events.register("after-call.kinesis.PutRecords", self._after_call)

    def _after_call(self, **_: Any) -> None:
        with self._lock:
            call = next(self._calls)
            if (call - 1) % self._every:
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


# --- the writers of the demo without Spark ------------------------------------------------------


class Writer(Protocol):
    """One column's writer: the micro-batches, the first one replayed, the stalled writer."""

    @property
    def lost_responses(self) -> int: ...

    def deliver(self, batches: Sequence[Sequence[Message]]) -> None: ...

    def replay(self, batch: Sequence[Message]) -> None: ...

    def stall(self, batch: Sequence[Message], say: Callable[[str], None]) -> None: ...


class PlainWriter:
    """at-least-once: put_records, the request resent when its response was lost."""

    def __init__(self, settings: ProducerSettings, lose_every: int) -> None:
        self._settings = settings
        self._client = kinesis_client(settings, for_put=True)
        self._lost = LostResponses(self._client, lose_every)

    @property
    def lost_responses(self) -> int:
        return self._lost.injected

    def deliver(self, batches: Sequence[Sequence[Message]]) -> None:
        for batch in batches:
            self._put(self._client, batch)

    def replay(self, batch: Sequence[Message]) -> None:
        self._put(self._client, batch)

    def stall(self, batch: Sequence[Message], say: Callable[[str], None]) -> None:  # noqa: ARG002
        """It stalls before its put while another sends the same records; then it resumes,
        and sends them too."""
        client = kinesis_client(self._settings, for_put=True)
        self._put(client, batch)  # the other one
        self._put(client, batch)  # the stalled one, resumed

    def _put(self, client: Any, batch: Sequence[Message]) -> None:
        for start in range(0, len(batch), MAX_RECORDS_PER_PUT):
            chunk = batch[start : start + MAX_RECORDS_PER_PUT]
            entries = [put_entry(m.key, m.data, explicit_hash_key(m)) for m in chunk]
            put_at_least_once(client, self._settings.stream, entries)


class KeyWriter:
    """dedupe=key: the exactly-once producer; a replayed batch's keys are DUPLICATE."""

    def __init__(self, settings: ProducerSettings, lose_every: int) -> None:
        self._settings = settings
        self._stack = build_stack(settings)
        self._lost = LostResponses(self._stack.writer.client, lose_every)

    @property
    def lost_responses(self) -> int:
        return self._lost.injected

    def deliver(self, batches: Sequence[Sequence[Message]]) -> None:
        with self._stack.producer(owner="demo") as producer:
            for batch in batches:
                producer.send(batch)

    def replay(self, batch: Sequence[Message]) -> None:
        with self._stack.producer(owner="demo-replayed") as producer:
            producer.send(batch)

    def stall(self, batch: Sequence[Message], say: Callable[[str], None]) -> None:
        """A producer stalls before its put until another one waited out its lease, read the
        stream back and sent its keys; resumed, the signature fence refuses its put."""
        settings = self._settings

        def stalled(hooks: Hooks) -> list[Outcome]:
            with build_stack(settings, hooks=hooks).producer(owner="demo-stalled") as producer:
                return producer.send(batch)

        def taker() -> list[Outcome]:
            with build_stack(settings).producer(owner="demo-taker") as producer:
                return producer.send(batch)

        resumed, other = race_a_stalled_writer(stalled, taker)
        say(
            f"  {KEY.name}: a producer stalled past its {settings.lease_s:g} s lease; another "
            f"one sent {other[OutcomeStatus.SENT]} of its keys; resumed, it sent "
            f"{resumed[OutcomeStatus.SENT]} ({_statuses(resumed)})"
        )


class ReplayWriter:
    """dedupe=replay: micro-batch ``n`` is run ``demo/<n>``; a replayed run is recovered from
    the stream (its rows found are not sent again), a COMPLETE one sends nothing."""

    def __init__(self, settings: ProducerSettings, lose_every: int) -> None:
        self._settings = settings
        stack = build_stack(settings)
        self._producer = stack.replay_producer()
        self._lost = LostResponses(stack.writer.client, lose_every)

    @property
    def lost_responses(self) -> int:
        return self._lost.injected

    def deliver(self, batches: Sequence[Sequence[Message]]) -> None:
        first, *rest = batches
        # the driver dies after the first batch's puts, before its commit: the run stays OPEN
        with self._producer.attempt(ReplayTask(_run(0), new_execution_id())) as attempt:
            attempt.send(first)
        for number, batch in enumerate(rest, start=1):
            self._producer.send_run(_run(number), batch)

    def replay(self, batch: Sequence[Message]) -> None:
        self._producer.send_run(_run(0), batch)

    def stall(self, batch: Sequence[Message], say: Callable[[str], None]) -> None:
        """A run's attempt stalls before its put until the run is re-run: the re-run waits out
        the stalled attempt's lease, reads the stream back and sends what it did not find;
        resumed, the stalled attempt has lost its lease (superseded) and sends nothing."""
        settings = self._settings
        run = _run("stalled")

        def stalled(hooks: Hooks) -> list[Outcome]:
            producer = build_stack(settings).replay_producer(hooks=hooks)
            with producer.attempt(ReplayTask(run, new_execution_id())) as attempt:
                return attempt.send(batch)

        def rerun() -> list[Outcome]:
            return build_stack(settings).replay_producer().send_run(run, batch)

        resumed, other = race_a_stalled_writer(stalled, rerun)
        say(
            f"  {REPLAY.name}: an attempt at run {run} stalled past its {settings.lease_s:g} s "
            f"lease; the run's re-run sent {other[OutcomeStatus.SENT]} of its rows; resumed, it "
            f"sent {resumed[OutcomeStatus.SENT]} ({_statuses(resumed)})"
        )


WRITERS: Final[dict[Column, Callable[[ProducerSettings, int], Writer]]] = {
    AT_LEAST_ONCE: PlainWriter,
    KEY: KeyWriter,
    REPLAY: ReplayWriter,
}


def _run(name: int | str) -> str:
    return f"demo/{name}"


def _statuses(outcomes: Counter[OutcomeStatus]) -> str:
    return ", ".join(f"{status.value} {n}" for status, n in sorted(outcomes.items()))


class _StallBeforePut:
    """Hooks: every put waits (after its lease check) until ``resume`` is set; ``stalled`` is
    set once the first one waits."""

    def __init__(self) -> None:
        self.stalled, self.resume = threading.Event(), threading.Event()

    def at(self, step: Step, *, batch_id: int | None = None) -> None:  # noqa: ARG002
        if step is Step.BEFORE_PUT:
            self.stalled.set()
            self.resume.wait()


def race_a_stalled_writer(
    stalled: Callable[[Hooks], Sequence[Outcome]], other: Callable[[], Sequence[Outcome]]
) -> tuple[Counter[OutcomeStatus], Counter[OutcomeStatus]]:
    """Run ``stalled`` with hooks that hold its puts, then ``other`` while they are held; then
    let them go. The outcomes of each, counted: the resumed one's, the other's."""
    hooks = _StallBeforePut()
    resumed: Counter[OutcomeStatus] = Counter()

    def run_stalled() -> None:
        try:
            resumed.update(o.status for o in stalled(hooks))
        finally:
            hooks.stalled.set()  # never left waiting on a writer that did not get to its put

    thread = threading.Thread(target=run_stalled, name="demo-stalled-writer")
    thread.start()
    try:
        hooks.stalled.wait()
        sent = Counter(o.status for o in other())
    finally:
        hooks.resume.set()
        thread.join()
    return resumed, sent


@dataclass
class _Side:
    """A column of the demo without Spark: its stream, how its writer reaches the emulators
    (through its proxies), its meter, and how long it took to write."""

    column: Column
    settings: ProducerSettings  # the stream's, direct
    through: ProducerSettings  # the stream's, through the column's proxies
    meter: BillingMeter
    seconds: float = 0.0  # writing the micro-batches and the replay (the stall aside)

    def ready(self, lose_every: int) -> Writer:
        """Create the stream and the writer (wired through the proxies)."""
        create_stream(
            kinesis_client(self.settings, for_put=False), self.settings.stream, 4, timeout_s=20
        )
        return WRITERS[self.column](self.through, lose_every)


def run_demo(
    settings: ProducerSettings,
    *,
    count: int = 2000,
    lose_every: int = 2,
    say: Callable[[str], None],
    workdir: Path | None = None,
) -> list[DemoResult]:
    """The three columns over ``count`` messages; ``workdir`` receives ``expected-rows.jsonl``.
    Streams, stalls and audits run side by side (they wait on the emulators, or on a lease)."""
    kinesis_url, dynamodb_url = local_endpoints(settings)
    suffix = time.strftime("%H%M%S")
    batch = messages(count)
    if workdir is not None:
        write_expected(workdir, batch)
    stalled = batch[-max(1, count // 10) :]  # sent only by the stalled writer and the other one
    sent = batch[: len(batch) - len(stalled)]
    micro_batches = [sent[i : i + MICRO_BATCH] for i in range(0, len(sent), MICRO_BATCH)]
    window_s = settings.signature_window_s if settings.fenced else None
    ledger_from(settings).create_table()
    sides: list[_Side] = []
    with (
        ExitStack() as proxies,
        ThreadPoolExecutor(len(COLUMNS), thread_name_prefix="demo") as pool,
    ):
        for column in COLUMNS:
            direct = settings.model_copy(update={"stream": column.stream(suffix)})
            # the proxy stands for Kinesis: it enforces the signature window the fence relies on
            kinesis = proxies.enter_context(FaultProxy(kinesis_url, signature_window_s=window_s))
            dynamodb = proxies.enter_context(MeteringProxy(dynamodb_url, settings.table))
            through = direct.model_copy(
                update={
                    "kinesis_endpoint_url": kinesis.endpoint,
                    "dynamodb_endpoint_url": dynamodb.endpoint,
                }
            )
            sides.append(_Side(column, direct, through, dynamodb.meter))
        writers = list(pool.map(lambda side: side.ready(lose_every), sides))
        # the stalls wait out a lease each: in the background, while the batches are written
        say(
            f"each writer also stalls before putting the last {len(stalled)} messages while "
            "another sends them (in the background)"
        )
        stalls = [pool.submit(writer.stall, stalled, say) for writer in writers]
        for side, writer in zip(sides, writers, strict=True):
            say(
                f"[bold]{side.column.name}[/bold]: {len(sent)} messages into "
                f"{side.settings.stream} in micro-batches of {MICRO_BATCH}, every "
                f"{lose_every}. response lost; the first micro-batch replayed"
            )
            started = time.monotonic()
            writer.deliver(micro_batches)
            writer.replay(micro_batches[0])
            side.seconds = time.monotonic() - started
        for stall in stalls:
            stall.result()

        def audit(side: _Side, writer: Writer) -> DemoResult:
            return audited(
                side.column,
                side.settings,
                batch,
                seconds=side.seconds,
                batches_replayed=1,
                bill=side.meter.snapshot(),
                faults={LOST_RESPONSES: writer.lost_responses, STALLED_WRITERS: 1},
                replayed_run=_run(0),
            )

        return list(pool.map(audit, sides, writers))
