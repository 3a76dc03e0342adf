"""The put loop: PutRecords for messages put under a lease, each record classified, and only
what was definitely not written sent again. Both guarantees put through it: key mode's claimed
messages (:class:`producer.key.delivery.ChunkDelivery`), replay mode's rows
(:mod:`producer.replay.producer`); each is the loop's :class:`PutParty`, which says what a message is,
which lease it is put under, and what becomes of one given up.

::

    put(messages)
      └─ per round (at most put_max_attempts, jittered backoff between them):
         ├─ per 500 messages: the party's leases checked (ready_to_put: renewed, or not ours)
         ├─ per request (500 records, 5 MiB): PutRecords under the earliest lease it carries
         │     ├─ written ───── position (an aggregate not wholly inside the shard it
         │     │                landed on: none of it; every member resent, packed anew)
         │     ├─ ambiguous ─── read back by the caller, never resent blindly
         │     └─ not written ─ retriable: next round, same lease; else the party gives it up
         └─ diverted: messages no longer ours to put (key mode: a take-over lost): waited on
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from tenacity import RetryCallState, stop_after_attempt, stop_when_event_set

from dedupe_store.records import Position
from kinesis_store.entries import MAX_RECORDS_PER_PUT
from kinesis_store.results import STALE_SHARD_MAP, PutResultKind, RecordResult, not_written
from kinesis_store.shards import OpenShards, kcl_delivers_whole
from kinesis_store.writer import KinesisWriter
from producer import metrics
from producer.encoding import PutUnit, aggregated_units, single_units
from producer.hooks import Hooks, Step
from producer.protocol import PreparedMessage, batch_by_size
from producer.retries import repeat_while

if TYPE_CHECKING:
    from tenacity.wait import wait_base

__all__ = ["PutContext", "PutLoop", "PutParty", "PutReport"]

log = logging.getLogger(__name__)

_M = TypeVar("_M")
# each put loop's turn at a shard, in the order they were made (PutLoop)
_TURNS = itertools.count()


class PutContext(Protocol):
    """What the loop takes from a send's context: the writer, the shard map when records are
    aggregated, the test hooks, the backoff between rounds and the interrupt."""

    @property
    def stream(self) -> str: ...
    @property
    def writer(self) -> KinesisWriter: ...
    @property
    def hooks(self) -> Hooks: ...
    @property
    def shards(self) -> OpenShards | None: ...
    @property
    def max_record_bytes(self) -> int: ...
    @property
    def resend_wait(self) -> wait_base: ...
    @property
    def sleep(self) -> Callable[[float], None]: ...
    @property
    def interrupted(self) -> threading.Event: ...


class PutParty(Protocol[_M]):
    """Whose messages the loop puts: key mode's claims, or a replay attempt's rows."""

    def item_of(self, message: _M) -> PreparedMessage:
        """The validated message to put."""
        ...

    def lease_of(self, message: _M) -> int:
        """The end of the lease ``message`` is put under (epoch ms): the fence's bound."""
        ...

    def ready_to_put(self, messages: list[_M]) -> tuple[list[_M], list[_M]]:
        """The messages whose leases outlive a put sent now (renewed if they were short), and
        those no longer ours to put."""
        ...

    def give_up(self, message: _M, result: RecordResult) -> None:
        """``message`` was definitely not written and is not worth resending."""
        ...


@dataclass(slots=True)
class PutReport(Generic[_M]):
    """What became of the messages put: the caller reads back ``ambiguous`` and waits on
    ``diverted``; ``written`` have their position; the party has given up the others."""

    written: list[tuple[_M, Position]] = field(default_factory=list)
    ambiguous: list[_M] = field(default_factory=list)
    diverted: list[_M] = field(default_factory=list)

    @property
    def held(self) -> list[_M]:
        """The messages left to settle by waiting and read-back."""
        return self.ambiguous + self.diverted


class PutLoop(Generic[_M]):
    """Puts one party's messages."""

    def __init__(self, context: PutContext, party: PutParty[_M], *, max_attempts: int) -> None:
        self._context = context
        self._party = party
        self._max_attempts = max_attempts
        # its place among the process's put loops: the older first at a shard (a key-mode
        # sender's claim groups put one after the other, the next claiming meanwhile)
        self._turn = next(_TURNS)

    def put(self, messages: list[_M]) -> PutReport[_M]:
        """Put every message once written; each record is put at most ``max_attempts``
        times. A PutRecords is never repeated whole: only records classified not written and
        retriable are sent again, under the same lease, after a jittered backoff."""
        context = self._context
        report: PutReport[_M] = PutReport()
        pending = messages

        def put_round() -> list[tuple[_M, RecordResult]]:
            nonlocal pending
            resend = self._round(pending, report)
            pending = [message for message, _ in resend]
            return resend

        still_refused = repeat_while(
            put_round,
            more=bool,
            wait=context.resend_wait,
            stop=stop_after_attempt(self._max_attempts) | stop_when_event_set(context.interrupted),
            sleep=context.sleep,
            before_sleep=self._log_resend,
        )
        for message, result in still_refused:
            self._party.give_up(message, result)
        return report

    def _round(self, pending: list[_M], report: PutReport[_M]) -> list[tuple[_M, RecordResult]]:
        """Put each pending message once; gives up what is not worth resending, returns the
        rest. The lease is checked right before each request leaves, not once for all."""
        refused: list[tuple[_M, RecordResult]] = []
        for start in range(0, len(pending), MAX_RECORDS_PER_PUT):
            ready, diverted = self._party.ready_to_put(pending[start : start + MAX_RECORDS_PER_PUT])
            report.diverted.extend(diverted)
            for batch in batch_by_size(self._units(ready), lambda unit: unit.size_bytes):
                self._request(batch, report, refused)
        resend: list[tuple[_M, RecordResult]] = []
        for message, result in refused:
            if result.retriable:
                resend.append((message, result))
            else:
                self._party.give_up(message, result)
        return resend

    def _request(
        self,
        batch: list[PutUnit[_M]],
        report: PutReport[_M],
        refused: list[tuple[_M, RecordResult]],
    ) -> None:
        self._context.hooks.at(Step.BEFORE_PUT)
        # a request may mix leases (key mode: keys moved to a fresh group): the earliest
        lease_expires_at_ms = min(
            self._party.lease_of(member) for unit in batch for member in unit.members
        )
        results = self._send([unit.entry for unit in batch], lease_expires_at_ms)
        self._context.hooks.at(Step.AFTER_PUT)
        for unit, result in zip(batch, results, strict=True):
            self._sort_result(unit, result, report, refused)

    def _units(self, messages: list[_M]) -> list[PutUnit[_M]]:
        shards = self._context.shards
        item_of = self._party.item_of
        if shards is None:
            return single_units(messages, item_of)
        return aggregated_units(messages, item_of, shards.current(), self._context.max_record_bytes)

    def _sort_result(
        self,
        unit: PutUnit[_M],
        result: RecordResult,
        report: PutReport[_M],
        refused: list[tuple[_M, RecordResult]],
    ) -> None:
        if result.kind is PutResultKind.AMBIGUOUS:
            report.ambiguous.extend(unit.members)
            return
        if result.kind is not PutResultKind.WRITTEN:
            refused.extend((member, result) for member in unit.members)
            return
        shard_id, sequence_number = str(result.shard_id), str(result.sequence_number)
        if not unit.aggregated:
            report.written.append((unit.members[0], Position(shard_id, sequence_number)))
            return
        shards = self._context.shards
        shard = shards.landed_on(shard_id) if shards is not None else None
        hash_keys = [int(self._party.item_of(member).explicit_hash_key) for member in unit.members]
        if not kcl_delivers_whole(shard, hash_keys):
            # packed on a stale shard map (a reshard): the KCL drops the whole aggregate, so
            # none of it is delivered, though it is in the stream (a stray aggregate). Every
            # member is sent again under the same lease, packed on a fresh map.
            if shards is not None:
                shards.forget()
            log.info(
                "stray aggregate resent whole stream=%s shard=%s sequence=%s members=%d",
                self._context.stream,
                shard_id,
                sequence_number,
                len(unit.members),
            )
            refused.extend((member, not_written(STALE_SHARD_MAP)) for member in unit.members)
            return
        report.written.extend(
            (member, Position(shard_id, sequence_number, sub_sequence))
            for sub_sequence, member in enumerate(unit.members)
        )

    def _send(self, entries: list[dict[str, Any]], lease_expires_at_ms: int) -> list[RecordResult]:
        stream = self._context.stream
        metrics.PUT_REQUESTS.labels(stream).inc()
        started = time.perf_counter()
        try:
            results = self._context.writer.put_entries(
                entries, lease_expires_at_ms=lease_expires_at_ms, turn=self._turn
            )
        finally:
            metrics.PUT_SECONDS.labels(stream).observe(time.perf_counter() - started)
        for result in results:
            if result.kind is not PutResultKind.WRITTEN:
                metrics.PUT_RECORD_ERRORS.labels(stream, result.error_code or "none").inc()
        return results

    def _log_resend(self, retry_state: RetryCallState) -> None:
        outcome = retry_state.outcome
        log.info(
            "put resend stream=%s records=%d after_attempt=%d wait_s=%.3f",
            self._context.stream,
            len(outcome.result()) if outcome is not None else 0,
            retry_state.attempt_number,
            retry_state.upcoming_sleep,
        )
