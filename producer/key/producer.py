"""``ExactlyOnceProducer``: the public face of the protocol (ledger schema v2: one
conditional write per message). It validates a send, splits it into chunks of at most
``group_size`` keys and pipelines them (:mod:`producer.key.pipeline`, across the batches of a
``send_each`` too); each chunk's protocol is a
:class:`producer.key.delivery.ChunkDelivery`.

::

    send(messages)
      ├─ validate ─────────────── REJECTED (reason)                nothing claimed
      ├─ a key repeated in the input: sent once, the repeats answered from the first
      └─ per chunk (producer.key.delivery): open a group, claim, put (producer.put_loop), wait
         and read back (producer.key.waiting), take over (producer.key.takeover), settle
      └─ one Outcome per message, in input order

The decisions are pure functions (:mod:`producer.key.decisions`); what a chunk holds is
:mod:`producer.key.claims`; the clients, clock and waits every part shares are
:class:`producer.key.context.SendContext`.
"""

from __future__ import annotations

import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor

from dedupe_store.clock import Clock
from dedupe_store.contract import Ledger
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from kinesis_store.shards import OpenShards, Shard
from kinesis_store.writer import KinesisWriter
from producer import metrics
from producer.hooks import NO_HOOKS, Hooks
from producer.key.context import ProducerPolicy, SendContext
from producer.key.pipeline import Batch, GroupPipeline
from producer.key.readback import ReadBackResolver
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import (
    MAX_GROUP_MEMBER_BYTES,
    Message,
    PreparedMessage,
    batch_by_size,
    group_member_bytes,
    prepare,
)

__all__ = ["ExactlyOnceProducer", "ProducerPolicy", "default_owner"]


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ExactlyOnceProducer:
    """Delivers messages into one stream exactly once per key. Thread-safe per call."""

    def __init__(
        self,
        *,
        stream: str,
        ledger: Ledger,
        writer: KinesisWriter,
        clock: Clock,
        policy: ProducerPolicy,
        resolver: ReadBackResolver | None = None,
        owner: str | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        sleep: Callable[[float], None] = time.sleep,
        executor: Executor | None = None,
        rng: random.Random | None = None,
        shard_map: Callable[[], list[Shard]] | None = None,
        hooks: Hooks = NO_HOOKS,
    ) -> None:
        self.stream = stream
        self.owner = owner or default_owner()
        self._policy = policy
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(
            policy.ledger_concurrency, thread_name_prefix="keo-ledger"
        )
        # the groups of one send in flight at once: one claims while the others put and settle
        self._groups = ThreadPoolExecutor(policy.groups_in_flight, thread_name_prefix="keo-group")
        self._context = SendContext(
            stream=stream,
            owner=self.owner,
            ledger=ledger,
            writer=writer,
            clock=clock,
            policy=policy,
            resolver=resolver,
            executor=self._executor,
            hooks=hooks,
            sleep=sleep,
            rng=rng or random.Random(),
            # aggregation is on when a shard map is given: user records are packed per shard
            shards=OpenShards(shard_map) if shard_map is not None else None,
            max_record_bytes=max_record_bytes,
        )

    def close(self) -> None:
        self._groups.shutdown(wait=True)
        if self._own_executor and isinstance(self._executor, ThreadPoolExecutor):
            self._executor.shutdown(wait=True)

    def __enter__(self) -> ExactlyOnceProducer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def interrupt(self) -> None:
        """Finish the call in flight early (Ctrl-C): send nothing more, stop waiting on other
        producers' claims (their keys are reported IN_FLIGHT), release our claims not yet sent
        (they are FAILED: send them again), and settle what was written. Thread-safe."""
        self._context.interrupted.set()

    def send(self, messages: Sequence[Message]) -> list[Outcome]:
        """Deliver ``messages``; one outcome per message, in order."""
        (sent,) = self.send_each([messages])
        return sent

    def send_each(self, batches: Iterable[Sequence[Message]]) -> Iterator[list[Outcome]]:
        """Deliver each of ``batches`` as :meth:`send` would, one after the other: each one's
        outcomes (one per message, in order) once they are all decided. One pipeline of
        groups for them all (:mod:`producer.key.pipeline`): the next batch's groups claim
        while this one's last groups put and settle. Every group started finishes its
        protocol, even when the caller stops early."""
        pipeline = GroupPipeline(self._context, self._groups, self._policy.groups_in_flight)
        try:
            for messages in batches:
                self._start(pipeline, messages)
                yield from self._counted(pipeline.ready())
            yield from self._counted(pipeline.finish())
        finally:
            pipeline.close()

    def _start(self, pipeline: GroupPipeline, messages: Sequence[Message]) -> None:
        """``messages`` as a batch of ``pipeline``: rejected, or answered from a key's first
        occurrence in it, or in a group. One group per chunk: at most ``group_size`` keys,
        and a group item of bounded size."""
        prepared, rejections = prepare(messages, self._context.max_record_bytes)
        firsts: dict[str, PreparedMessage] = {}
        repeats: list[tuple[PreparedMessage, PreparedMessage]] = []
        for item in prepared:
            first = firsts.setdefault(item.key, item)
            if first is not item:
                repeats.append((item, first))
        batch = Batch(
            len(messages),
            {
                r.index: Outcome(r.index, r.key, OutcomeStatus.REJECTED, reason=r.reason)
                for r in rejections
            },
            repeats,
        )
        pipeline.start(batch)
        for chunk in batch_by_size(
            list(firsts.values()),
            lambda item: group_member_bytes(item.key),
            max_records=self._policy.group_size,
            max_request_bytes=MAX_GROUP_MEMBER_BYTES,
        ):
            pipeline.open(batch, chunk)
        batch.sealed = True

    def _counted(self, batches: Iterator[list[Outcome]]) -> Iterator[list[Outcome]]:
        for sent in batches:
            for outcome in sent:
                metrics.OUTCOMES.labels(self.stream, outcome.status.value).inc()
            yield sent
