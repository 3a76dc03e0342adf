"""The claim groups of a producer's sends in flight (:class:`GroupPipeline`): one pipeline for
all the batches of a :meth:`ExactlyOnceProducer.send_each`, so that the end of a batch does not
drain it.

::

    batch 1: group a ── claim ── put ────── settle
             group b ──── claim ──── put ────── settle       (at most groups_in_flight)
    batch 2:           group c ── claim ──── put ────── settle   claims while b puts

A batch's outcomes are ready once every group of it has finished; batches come out in
order. Sends one after another drained the pipeline at each batch's end: the next batch's
claims (20 ``BatchExecuteStatement`` a group of 500, 1 to 2.6 s on DynamoDB Local beside
Spark) began only once the last put of the batch before was answered, and a Spark task's
1,000-row batches left its shards idle that long every two groups (two tasks in key mode on a
shard, the shard idle 2.2 s at a time: ``python -m devstack.quota_bench --spark --named
'format("keo") dedupe=key'``). A key of the batch that is still in flight in an earlier
group waits for that group (it is then found delivered, as a later send finds it).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field

from producer import outcomes
from producer.key.context import SendContext
from producer.key.delivery import ChunkDelivery
from producer.outcomes import Outcome
from producer.protocol import PreparedMessage

__all__ = ["Batch", "GroupPipeline"]


@dataclass(slots=True)
class Batch:
    """One batch of a send: ``size`` messages, the outcomes decided so far (by input index),
    and the repeats of a key in it, answered from its first occurrence once that is decided."""

    size: int
    decided: dict[int, Outcome]
    repeats: list[tuple[PreparedMessage, PreparedMessage]]
    groups: int = 0  # groups of it in flight
    sealed: bool = False  # every group of it opened

    @property
    def done(self) -> bool:
        return self.sealed and self.groups == 0

    def outcomes(self) -> list[Outcome]:
        for item, first in self.repeats:
            self.decided[item.index] = outcomes.repeat_outcome(
                item, first, self.decided[first.index]
            )
        return [self.decided[i] for i in range(self.size)]


@dataclass(slots=True)
class _Flight:
    batch: Batch
    keys: frozenset[str]
    future: Future[dict[int, Outcome]] = field(repr=False)


class GroupPipeline:
    """At most ``depth`` groups in flight on ``groups`` (a pool of that many threads), in the
    order they opened; a group opens once the one before it is open, then claims beside it."""

    def __init__(self, context: SendContext, groups: Executor, depth: int) -> None:
        self._context = context
        self._groups = groups
        self._depth = depth
        self._flights: deque[_Flight] = deque()
        self._keys: set[str] = set()  # the keys of the groups in flight
        self._batches: deque[Batch] = deque()  # not yet handed out, in order

    def start(self, batch: Batch) -> None:
        self._batches.append(batch)

    def open(self, batch: Batch, chunk: list[PreparedMessage]) -> None:
        """A group for ``chunk`` (distinct keys) of ``batch``; waits first for room, and for
        the groups holding any of its keys."""
        keys = frozenset(item.key for item in chunk)
        while self._flights and (len(self._flights) >= self._depth or keys & self._keys):
            self._land(self._flights.popleft())
        if self._context.interrupted.is_set():
            for item in chunk:
                batch.decided[item.index] = outcomes.failed(
                    item, "interrupted before it was claimed; send it again"
                )
            return
        opened = threading.Event()
        delivery = ChunkDelivery(self._context, chunk)
        self._flights.append(_Flight(batch, keys, self._groups.submit(delivery.run, opened)))
        self._keys |= keys
        batch.groups += 1
        opened.wait()

    def ready(self) -> Iterator[list[Outcome]]:
        """The outcomes of the oldest batches whose groups have all finished, in order."""
        while self._flights and self._flights[0].future.done():
            self._land(self._flights.popleft())
        while self._batches and self._batches[0].done:
            yield self._batches.popleft().outcomes()

    def finish(self) -> Iterator[list[Outcome]]:
        """Every group landed; the outcomes of every batch left, in order."""
        while self._flights:
            self._land(self._flights.popleft())
        yield from self.ready()

    def close(self) -> None:
        """Every group started finishes its protocol, even when one of them raised (the
        first failure is raised then)."""
        failures: list[BaseException] = []
        while self._flights:
            try:
                self._land(self._flights.popleft())
            except BaseException as exc:  # the first one is raised below
                failures.append(exc)
        if failures:
            raise failures[0]

    def _land(self, flight: _Flight) -> None:
        self._keys -= flight.keys
        flight.batch.groups -= 1
        flight.batch.decided.update(flight.future.result())
