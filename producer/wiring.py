"""Builds clients and the producer from settings. Entry points (CLI, Spark job) call this;
nothing in the protocol creates its own clients.

Each wing (key mode's producer, replay mode's, the reconciler) is imported by the method that
builds it, on first use: a process of one mode does not load the other's modules.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dedupe_store.clock import Clock, SystemClock
from dedupe_store.ledger import DynamoDBLedger
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import SHARD_MAP_MAX_AGE_S, OpenShards, Shard, StreamInfo
from kinesis_store.write_pacing import WritePacer
from kinesis_store.writer import KinesisWriter
from producer import metrics
from producer.clients import kinesis_client, kinesis_read_client
from producer.fence import fence_for
from producer.hooks import NO_HOOKS, Hooks
from producer.settings import PastRetention, ProducerSettings

if TYPE_CHECKING:
    from producer.key.producer import ExactlyOnceProducer, ProducerPolicy
    from producer.key.readback import ReadBackResolver
    from producer.reconcile.reconciler import Reconciler
    from producer.replay.context import ReplayPolicy
    from producer.replay.producer import ReplayProducer

log = logging.getLogger(__name__)

# What fence-off mode cannot bound (docs/guarantees.md), said once per process.
UNFENCED_WARNING = (
    "signature fence off (KEO_PUT_FENCE=off): a put the network holds, or a process stalled "
    "as it sends, longer than its lease (%g s) can land after its keys were taken over and "
    "write a duplicate (keo audit reports it); see docs/guarantees.md"
)
_said: set[str] = set()
_said_lock = threading.Lock()


def put_writer(
    settings: ProducerSettings,
    clock: Clock | None = None,
    shard_map: Callable[[], list[Shard]] | None = None,
) -> KinesisWriter:
    """The writer of the producer and the reconciler: a put client with SDK retries off and a
    check of each request's lease right before it leaves: the signature fence, or with
    ``KEO_PUT_FENCE=off`` the lease deadline by ``clock`` (the system clock by default). With
    ``shard_map`` (ListShards), each request keeps within ``KEO_PUT_RATE_LIMIT_PERCENT`` of its
    shards' write quota, paced with every writer of this process to the stream."""
    client = kinesis_client(settings, for_put=True)
    fence_for(settings.lease_policy(), clock or SystemClock()).install(client)
    percent = settings.put_rate_limit_percent
    if shard_map is None or percent == 0:
        return KinesisWriter(client, settings.stream)
    return KinesisWriter(
        client,
        settings.stream,
        pacer=_pacer_of(settings.stream, percent),
        shards=OpenShards(shard_map, max_age_s=SHARD_MAP_MAX_AGE_S),
        on_paced=metrics.PUT_PACED_SECONDS.labels(settings.stream).inc,
    )


# One pacer a process and stream: the process's writers share each shard's quota.
_PACERS: dict[tuple[str, float], WritePacer] = {}
_PACERS_LOCK = threading.Lock()


def _pacer_of(stream: str, percent: float) -> WritePacer:
    with _PACERS_LOCK:
        pacer = _PACERS.get((stream, percent))
        if pacer is None:
            pacer = _PACERS[(stream, percent)] = WritePacer(percent=percent)
        return pacer


def warn_if_unfenced(settings: ProducerSettings) -> bool:
    """Say on the log (a WARNING: stderr) what ``KEO_PUT_FENCE=off`` cannot bound, once per
    process, whatever the settings of later calls. For the entry points that put: ``keo send``,
    ``keo reconcile``, ``format("keo")`` on the driver. True when this call said it."""
    if settings.fenced:
        return False
    with _said_lock:
        if UNFENCED_WARNING in _said:
            return False
        _said.add(UNFENCED_WARNING)
    log.warning(
        UNFENCED_WARNING, settings.lease_s, extra={"event": "fence_off", "stream": settings.stream}
    )
    return True


def ledger_from(settings: ProducerSettings) -> DynamoDBLedger:
    return DynamoDBLedger(
        settings.ledger_connection(),
        dedupe_ttl_s=settings.dedupe_ttl_s,
        inflight_buckets=settings.inflight_buckets,
        batch_claims=settings.ledger_batch_claims.supported,
    )


def policy_from(settings: ProducerSettings) -> ProducerPolicy:
    from producer.key.producer import ProducerPolicy

    return ProducerPolicy(
        lease=settings.lease_policy(),
        put_max_attempts=settings.put_max_attempts,
        wait_initial_ms=round(settings.wait_initial_s * 1000),
        wait_max_ms=round(settings.wait_max_s * 1000),
        ledger_concurrency=settings.ledger_concurrency,
        groups_in_flight=settings.groups_in_flight,
        store_payload_max_bytes=settings.store_payload_max_bytes
        if settings.store_payload
        else None,
    )


def replay_policy_from(settings: ProducerSettings) -> ReplayPolicy:
    from producer.replay.context import ReplayPolicy

    max_wait_s = settings.replay_max_wait_s
    return ReplayPolicy(
        lease=settings.lease_policy(),
        put_max_attempts=settings.put_max_attempts,
        max_wait_ms=round(max_wait_s * 1000) if max_wait_s is not None else None,
        send_past_retention=settings.replay_past_retention == PastRetention.SEND,
    )


@dataclass(frozen=True)
class Stack:
    """Everything a producer or reconciler process needs, wired once."""

    settings: ProducerSettings
    ledger: DynamoDBLedger
    writer: KinesisWriter
    reader: KinesisReader
    info: StreamInfo
    clock: Clock
    hooks: Hooks = NO_HOOKS  # the test seam: failpoints, installed by entry points

    def resolver(self) -> ReadBackResolver:
        from producer.key.readback import ReadBackResolver

        return ReadBackResolver(
            self.reader,
            self.clock,
            self.settings.lease_policy(),
            retention_hours=self.info.retention_hours,
        )

    def reconciler(self, *, owner: str, buckets: Sequence[int] | None = None) -> Reconciler:
        from producer.reconcile.reconciler import Reconciler

        return Reconciler(
            stream=self.settings.stream,
            ledger=self.ledger,
            resolver=self.resolver(),
            writer=self.writer,
            clock=self.clock,
            lease=self.settings.lease_policy(),
            owner=owner,
            buckets=buckets,
            concurrency=self.settings.ledger_concurrency,
            hooks=self.hooks,
        )

    def producer(
        self, *, owner: str | None = None, hooks: Hooks | None = None
    ) -> ExactlyOnceProducer:
        from producer.key.producer import ExactlyOnceProducer

        return ExactlyOnceProducer(
            stream=self.settings.stream,
            ledger=self.ledger,
            writer=self.writer,
            clock=self.clock,
            policy=policy_from(self.settings),
            resolver=self.resolver(),
            owner=owner or self.settings.owner,
            max_record_bytes=self.settings.max_record_bytes or self.info.max_record_bytes,
            shard_map=self.reader.shards if self.settings.aggregate else None,
            hooks=self.hooks if hooks is None else hooks,
        )

    def replay_producer(
        self, *, hooks: Hooks | None = None, sleep: Callable[[float], None] = time.sleep
    ) -> ReplayProducer:
        """``sleep`` is how the producer waits (for an earlier attempt's lease, between
        resends): a benchmark times its waits through it."""
        from producer.replay.producer import ReplayProducer

        return ReplayProducer(
            stream=self.settings.stream,
            ledger=self.ledger,
            writer=self.writer,
            reader=self.reader,
            clock=self.clock,
            policy=replay_policy_from(self.settings),
            max_record_bytes=self.settings.max_record_bytes or self.info.max_record_bytes,
            retention_hours=self.info.retention_hours,
            shard_map=self.reader.shards if self.settings.aggregate else None,
            hooks=self.hooks if hooks is None else hooks,
            sleep=sleep,
        )


def build_stack(
    settings: ProducerSettings,
    *,
    clock: Clock | None = None,
    hooks: Hooks = NO_HOOKS,
    checked: StreamInfo | None = None,
) -> Stack:
    """Wire clients for one stream and table; checks both exist (fails fast otherwise), unless
    ``checked`` says what a driver found when it checked them for the whole write: a Spark
    write's executors then build clients and ask nothing (AWS answers 20
    ``DescribeStreamSummary`` a second for the whole account, and each Python worker asked one,
    and a ``DescribeTable``)."""
    reader = KinesisReader(
        kinesis_read_client(settings),
        settings.stream,
        on_malformed=metrics.count_malformed(settings.stream),
    )
    info = reader.describe() if checked is None else checked
    ledger = ledger_from(settings)
    metrics.count_ledger_calls(ledger.client)
    if checked is None:  # a writer: a new, empty table becomes this version's
        ledger.ensure_ready(stamp_new=True)
    clock = clock or SystemClock()
    return Stack(
        settings=settings,
        ledger=ledger,
        writer=put_writer(settings, clock, reader.shards),
        reader=reader,
        info=info,
        clock=clock,
        hooks=hooks,
    )
