"""``ExactlyOnceProducer``: the public face of the protocol (ledger schema v2: one
conditional write per message). It validates a send, splits it into chunks of at most
``group_size`` keys and pipelines them; each chunk's protocol is a :class:`ChunkDelivery`.

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
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor

from dedupe_store.clock import Clock
from dedupe_store.contract import Ledger
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from kinesis_store.shards import OpenShards, Shard
from kinesis_store.writer import KinesisWriter
from producer import metrics, outcomes
from producer.hooks import NO_HOOKS, Hooks
from producer.key.context import ProducerPolicy, SendContext
from producer.key.delivery import ChunkDelivery
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
        prepared, rejections = prepare(messages, self._context.max_record_bytes)
        decided: dict[int, Outcome] = {
            r.index: Outcome(r.index, r.key, OutcomeStatus.REJECTED, reason=r.reason)
            for r in rejections
        }
        firsts: dict[str, PreparedMessage] = {}
        repeats: list[tuple[PreparedMessage, PreparedMessage]] = []
        for item in prepared:
            first = firsts.setdefault(item.key, item)
            if first is not item:
                repeats.append((item, first))
        self._deliver_all(list(firsts.values()), decided)
        for item, first in repeats:
            decided[item.index] = outcomes.repeat_outcome(item, first, decided[first.index])
        ordered = [decided[i] for i in range(len(messages))]
        for outcome in ordered:
            metrics.OUTCOMES.labels(self.stream, outcome.status.value).inc()
        return ordered

    def _deliver_all(self, items: list[PreparedMessage], decided: dict[int, Outcome]) -> None:
        """One group per chunk: at most ``group_size`` keys, and a group item of bounded size.

        Groups are pipelined: a group opens once the group before it is open (the groups open
        in input order), then claims beside it: its claims fill the time the other spends
        claiming, putting and settling (the ledger and the client sit idle during a put
        otherwise, and a batched claim's last answers leave the ledger idle until the next
        group claims). At most ``groups_in_flight`` at once; their keys are distinct (a key
        repeated in ``messages`` is sent once).
        """
        chunks = batch_by_size(
            items,
            lambda item: group_member_bytes(item.key),
            max_records=self._policy.group_size,
            max_request_bytes=MAX_GROUP_MEMBER_BYTES,
        )
        in_flight: deque[Future[dict[int, Outcome]]] = deque()
        try:
            for chunk in chunks:
                if len(in_flight) == self._policy.groups_in_flight:
                    decided.update(in_flight.popleft().result())
                if self._context.interrupted.is_set():
                    for item in chunk:
                        decided[item.index] = outcomes.failed(
                            item, "interrupted before it was claimed; send it again"
                        )
                    continue
                opened = threading.Event()
                delivery = ChunkDelivery(self._context, chunk)
                in_flight.append(self._groups.submit(delivery.run, opened))
                opened.wait()
        finally:
            # every group started finishes its protocol, even when one of them raised
            failures: list[BaseException] = []
            for future in in_flight:
                try:
                    decided.update(future.result())
                except BaseException as exc:  # the first one is raised below
                    failures.append(exc)
            if failures:
                raise failures[0]
