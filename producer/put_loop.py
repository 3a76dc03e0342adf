"""The put loop: PutRecords for claimed messages, each record classified, and only what was
definitely not written sent again.

::

    put(messages)
      └─ per round (at most put_max_attempts, jittered backoff between them):
         ├─ per 500 messages: leases checked (renewed, or keys moved to a fresh group)
         ├─ per request (500 records, 5 MiB): PutRecords under the earliest lease it carries
         │     ├─ written ───── position (an aggregate's members off its shard: not written)
         │     ├─ ambiguous ─── read back by the caller, never resent blindly
         │     └─ not written ─ retriable: next round, same claim; else given up (released)
         └─ diverted: messages no longer ours to put (a take-over lost): waited on
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from tenacity import RetryCallState, stop_after_attempt, stop_when_event_set

from dedupe_store.errors import LedgerError
from dedupe_store.records import Position
from kinesis_store.entries import MAX_RECORDS_PER_PUT
from kinesis_store.results import STALE_SHARD_MAP, PutResultKind, RecordResult, not_written
from producer import metrics, outcomes
from producer.claims import ChunkState, ClaimedMessage
from producer.context import SendContext
from producer.encoding import PutUnit, aggregated_units, single_units
from producer.hooks import Step
from producer.protocol import PreparedMessage, batch_by_size
from producer.retries import repeat_while

__all__ = ["LeaseKeeper", "PutLoop", "PutReport"]

log = logging.getLogger("producer.producer")


class LeaseKeeper(Protocol):
    def ready_to_put(
        self, messages: list[ClaimedMessage]
    ) -> tuple[list[ClaimedMessage], list[ClaimedMessage]]:
        """The messages whose groups' leases outlive a put sent now (renewed, or moved to a
        fresh group), and those no longer ours to put (to wait on)."""
        ...


@dataclass(slots=True)
class PutReport:
    """What became of the messages put: the caller reads back ``ambiguous`` and waits on
    ``diverted``; the others are settled (written) or have their outcome (given up)."""

    written: list[tuple[ClaimedMessage, Position]] = field(default_factory=list)
    ambiguous: list[ClaimedMessage] = field(default_factory=list)
    diverted: list[ClaimedMessage] = field(default_factory=list)

    @property
    def held(self) -> list[ClaimedMessage]:
        """The messages left to settle by waiting and read-back."""
        return self.ambiguous + self.diverted


def _item_of(message: ClaimedMessage) -> PreparedMessage:
    return message.item


class PutLoop:
    """Puts the claimed messages of one chunk."""

    def __init__(self, context: SendContext, state: ChunkState, leases: LeaseKeeper) -> None:
        self._context = context
        self._state = state
        self._leases = leases

    def put(self, messages: list[ClaimedMessage]) -> PutReport:
        """Put every message once written; each record is put at most ``put_max_attempts``
        times. A PutRecords is never repeated whole: only records classified not written and
        retriable are sent again, under the same claim, after a jittered backoff."""
        context = self._context
        report = PutReport()
        pending = messages

        def put_round() -> list[tuple[ClaimedMessage, RecordResult]]:
            nonlocal pending
            resend = self._round(pending, report)
            pending = [message for message, _ in resend]
            return resend

        still_refused = repeat_while(
            put_round,
            more=bool,
            wait=context.resend_wait,
            stop=stop_after_attempt(context.policy.put_max_attempts)
            | stop_when_event_set(context.interrupted),
            sleep=context.sleep,
            before_sleep=self._log_resend,
        )
        for message, result in still_refused:
            self._give_up(message, result)
        for message, position in report.written:
            self._state.resolved(message, position)
        return report

    def _round(
        self, pending: list[ClaimedMessage], report: PutReport
    ) -> list[tuple[ClaimedMessage, RecordResult]]:
        """Put each pending message once; gives up what is not worth resending, returns the
        rest. The lease is checked right before each request leaves, not once for all."""
        refused: list[tuple[ClaimedMessage, RecordResult]] = []
        for start in range(0, len(pending), MAX_RECORDS_PER_PUT):
            ready, diverted = self._leases.ready_to_put(
                pending[start : start + MAX_RECORDS_PER_PUT]
            )
            report.diverted.extend(diverted)
            for batch in batch_by_size(self._units(ready), lambda unit: unit.size_bytes):
                self._request(batch, report, refused)
        resend: list[tuple[ClaimedMessage, RecordResult]] = []
        for message, result in refused:
            if result.retriable:
                resend.append((message, result))
            else:
                self._give_up(message, result)
        return resend

    def _request(
        self,
        batch: list[PutUnit[ClaimedMessage]],
        report: PutReport,
        refused: list[tuple[ClaimedMessage, RecordResult]],
    ) -> None:
        self._context.hooks.at(Step.BEFORE_PUT)
        # the request mixes groups when keys moved to a fresh one: the earliest lease
        lease_expires_at_ms = min(
            member.lease_expires_at_ms for unit in batch for member in unit.members
        )
        results = self._send([unit.entry for unit in batch], lease_expires_at_ms)
        self._context.hooks.at(Step.AFTER_PUT)
        for unit, result in zip(batch, results, strict=True):
            self._sort_result(unit, result, report, refused)

    def _units(self, messages: list[ClaimedMessage]) -> list[PutUnit[ClaimedMessage]]:
        shards = self._context.shards
        if shards is None:
            return single_units(messages, _item_of)
        return aggregated_units(
            messages, _item_of, shards.current(), self._context.max_record_bytes
        )

    def _sort_result(
        self,
        unit: PutUnit[ClaimedMessage],
        result: RecordResult,
        report: PutReport,
        refused: list[tuple[ClaimedMessage, RecordResult]],
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
        for sub_sequence, member in enumerate(unit.members):
            if (
                shards is None
                or shard is None
                or not shard.covers(int(member.item.explicit_hash_key))
            ):
                # the shard map was stale (a reshard): KCL drops this user record on read,
                # so it is not delivered; send it again under the same claim, newly routed
                if shards is not None:
                    shards.forget()
                refused.append((member, not_written(STALE_SHARD_MAP)))
                continue
            report.written.append((member, Position(shard_id, sequence_number, sub_sequence)))

    def _send(self, entries: list[dict[str, Any]], lease_expires_at_ms: int) -> list[RecordResult]:
        stream = self._context.stream
        metrics.PUT_REQUESTS.labels(stream).inc()
        started = time.perf_counter()
        try:
            results = self._context.writer.put_entries(
                entries, lease_expires_at_ms=lease_expires_at_ms
            )
        finally:
            metrics.PUT_SECONDS.labels(stream).observe(time.perf_counter() - started)
        for result in results:
            if result.kind is not PutResultKind.WRITTEN:
                metrics.PUT_RECORD_ERRORS.labels(stream, result.error_code or "none").inc()
        return results

    def _give_up(self, message: ClaimedMessage, result: RecordResult) -> None:
        """Definitely not written and not worth resending: release the claim for a later send."""
        reason = f"not written: {result.error_code}: {result.error_message or ''}".rstrip(": ")
        try:
            released = self._context.ledger.release(message.claim).applied
        except LedgerError as exc:
            released = False
            reason += f" (release failed, the reconciler will release it: {exc})"
        if released:
            self._state.resolved(message, None)
        self._state.report(outcomes.failed(message.item, reason))

    def _log_resend(self, retry_state: RetryCallState) -> None:
        outcome = retry_state.outcome
        log.info(
            "put resend stream=%s records=%d after_attempt=%d wait_s=%.3f",
            self._context.stream,
            len(outcome.result()) if outcome is not None else 0,
            retry_state.attempt_number,
            retry_state.upcoming_sleep,
        )
