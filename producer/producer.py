"""``ExactlyOnceProducer``: claim, put, classify, mark, and read back what is ambiguous.

::

    send(messages)
      ├─ validate ─────────────── REJECTED (reason)                nothing claimed
      ├─ claim (concurrent) ──┬── lost, DELIVERED same digest ──── DUPLICATE
      │                       ├── lost, other digest ───────────── CONFLICT
      │                       └── lost, IN_FLIGHT elsewhere ────── wait, then read back
      ├─ lease check ───────────── renew by taking over our own claim when short
      ├─ PutRecords (SDK retries off)
      │     ├─ written ─────────── mark (concurrent) ────────────── SENT / TAKEN_OVER
      │     ├─ not written ─────── resend, same claim, backoff + jitter
      │     └─ ambiguous ───────── read back: found ─> mark; not found after lease ─> take over, resend
      └─ one Outcome per message, in input order
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import RetryCallState, stop_after_attempt, stop_never, wait_exponential

from dedupe_store.clock import Clock
from dedupe_store.contract import Ledger
from dedupe_store.errors import LedgerError
from dedupe_store.records import ClaimRequest, ClaimResult, ClaimStatus, LedgerRecord, Position
from dedupe_store.states import LedgerState
from producer import metrics
from producer.encoding import PutUnit, aggregated_units, single_units
from producer.errors import StreamError
from producer.hooks import NO_HOOKS, Hooks, Step
from producer.kinesis import KinesisWriter
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import (
    DEFAULT_MAX_RECORD_BYTES,
    MAX_RECORDS_PER_PUT,
    STALE_SHARD_MAP,
    LeasePolicy,
    Message,
    PreparedMessage,
    PutResultKind,
    RecordResult,
    batch_by_size,
    not_written,
    prepare,
)
from producer.readback import ReadBackResolver, Resolution
from producer.retries import repeat_while, wait_full_jitter
from producer.shards import Shard, open_shards

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_R = TypeVar("_R")
_MAX_ROUNDS = 4  # take-over rounds per call before a key is reported IN_FLIGHT


@dataclass(frozen=True, slots=True)
class ProducerPolicy:
    lease: LeasePolicy
    put_max_attempts: int = 8
    retry_initial_ms: int = 100
    retry_max_ms: int = 5_000
    wait_initial_ms: int = 100
    wait_max_ms: int = 5_000
    ledger_concurrency: int = 32
    store_payload_max_bytes: int | None = None  # None: never store payloads in claims


@dataclass(slots=True)
class _Held:
    """A message and the ledger record that decides what happens to it next."""

    item: PreparedMessage
    record: LedgerRecord
    mine: bool  # our claim (we may have sent it) or someone else's we wait on


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
        self._ledger = ledger
        self._writer = writer
        self._clock = clock
        self._policy = policy
        self._resolver = resolver
        self.owner = owner or default_owner()
        self._max_record_bytes = max_record_bytes
        self._sleep = sleep
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(
            policy.ledger_concurrency, thread_name_prefix="keo-ledger"
        )
        self._resend_wait = wait_full_jitter(
            initial_s=policy.retry_initial_ms / 1000,
            max_s=policy.retry_max_ms / 1000,
            rng=rng or random.Random(),
        )
        # waiting on another owner's claim: no contention to spread, so no jitter
        self._claim_wait = wait_exponential(
            multiplier=policy.wait_initial_ms / 1000, max=policy.wait_max_ms / 1000
        )
        # aggregation is on when a shard map is given: user records are packed per shard
        self._shard_map = shard_map
        self._open_shards: list[Shard] | None = None
        self._hooks = hooks

    def close(self) -> None:
        if self._own_executor and isinstance(self._executor, ThreadPoolExecutor):
            self._executor.shutdown(wait=True)

    def __enter__(self) -> ExactlyOnceProducer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- public API -------------------------------------------------------------------------

    def send(self, messages: Sequence[Message]) -> list[Outcome]:
        """Deliver ``messages``; one outcome per message, in order."""
        prepared, rejections = prepare(messages, self._max_record_bytes)
        outcomes: dict[int, Outcome] = {
            r.index: Outcome(r.index, r.key, OutcomeStatus.REJECTED, reason=r.reason)
            for r in rejections
        }
        firsts: dict[str, PreparedMessage] = {}
        repeats: list[tuple[PreparedMessage, PreparedMessage]] = []
        for item in prepared:
            first = firsts.setdefault(item.key, item)
            if first is not item:
                repeats.append((item, first))
        self._deliver(list(firsts.values()), outcomes)
        for item, first in repeats:
            outcomes[item.index] = _repeat_outcome(item, first, outcomes[first.index])
        ordered = [outcomes[i] for i in range(len(messages))]
        for outcome in ordered:
            metrics.OUTCOMES.labels(self.stream, outcome.status.value).inc()
        return ordered

    # --- the protocol -----------------------------------------------------------------------

    def _deliver(self, items: list[PreparedMessage], outcomes: dict[int, Outcome]) -> None:
        to_send: list[_Held] = []
        to_wait: list[_Held] = []
        for item, result in zip(items, self._map(self._claim, items), strict=True):
            if isinstance(result, LedgerError):
                outcomes[item.index] = _failed(item, f"ledger unavailable at claim: {result}")
            elif result.status is ClaimStatus.WON and result.record is not None:
                self._hooks.at(Step.AFTER_CLAIM)
                to_send.append(_Held(item, result.record, mine=True))
            else:
                self._judge_lost_claim(item, result.record, outcomes, to_wait)

        for _ in range(_MAX_ROUNDS):
            ambiguous = self._send(to_send, outcomes) if to_send else []
            to_send = []
            held = ambiguous + to_wait
            to_wait = []
            if not held:
                return
            to_send = self._settle_held(held, outcomes)
        for entry in to_send:
            outcomes[entry.item.index] = _in_flight(
                entry, "claim changed hands repeatedly; run 'keo reconcile'"
            )

    def _claim(self, item: PreparedMessage) -> ClaimResult | LedgerError:
        payload = None
        limit = self._policy.store_payload_max_bytes
        if limit is not None and len(item.message.data) <= limit:
            payload = item.message.data
        request = ClaimRequest(
            self.stream, item.key, item.payload_digest, item.explicit_hash_key, payload
        )
        started = time.perf_counter()
        try:
            result = self._ledger.claim(
                request,
                owner=self.owner,
                now_ms=self._clock.now_ms(),
                lease_ms=self._policy.lease.lease_ms,
            )
        except LedgerError as exc:
            metrics.CLAIMS.labels(self.stream, "error").inc()
            return exc
        finally:
            metrics.LEDGER_SECONDS.labels("claim").observe(time.perf_counter() - started)
        metrics.CLAIMS.labels(self.stream, result.status.value.lower()).inc()
        return result

    def _judge_lost_claim(
        self,
        item: PreparedMessage,
        current: LedgerRecord | None,
        outcomes: dict[int, Outcome],
        to_wait: list[_Held],
    ) -> None:
        if current is None:
            outcomes[item.index] = _failed(item, "claim lost and the item vanished; send again")
            return
        if current.payload_digest != item.payload_digest:
            outcomes[item.index] = Outcome(
                item.index,
                item.key,
                OutcomeStatus.CONFLICT,
                position=current.position,
                reason=f"key already used for another payload (state {current.state})",
                attempt=current.attempt,
            )
        elif current.state is LedgerState.DELIVERED:
            outcomes[item.index] = Outcome(
                item.index,
                item.key,
                OutcomeStatus.DUPLICATE,
                position=current.position,
                attempt=current.attempt,
            )
        elif current.state is LedgerState.IN_FLIGHT:
            to_wait.append(_Held(item, current, mine=False))
        elif current.state is LedgerState.UNVERIFIABLE:
            outcomes[item.index] = Outcome(
                item.index,
                item.key,
                OutcomeStatus.UNVERIFIABLE,
                reason="an earlier claim of this key could not be verified within retention",
                attempt=current.attempt,
            )
        else:  # RELEASED again between our claim and our read: a later call claims it
            outcomes[item.index] = _failed(item, "claim raced a release; send again")

    def _send(self, held: list[_Held], outcomes: dict[int, Outcome]) -> list[_Held]:
        """Put every held claim of ours; mark what was written. Returns the ambiguous ones.

        A record is put at most ``put_max_attempts`` times: a PutRecords is never repeated
        whole, only the records classified not written and retriable are sent again, under
        the same claim, after a jittered backoff. The others are given up at once.
        """
        written: list[tuple[_Held, Position]] = []
        ambiguous: list[_Held] = []
        pending = held

        def put_round() -> list[tuple[_Held, RecordResult]]:
            nonlocal pending
            resend = self._put_round(pending, outcomes, written, ambiguous)
            pending = [entry for entry, _ in resend]
            return resend

        still_refused = repeat_while(
            put_round,
            more=bool,
            wait=self._resend_wait,
            stop=stop_after_attempt(self._policy.put_max_attempts),
            sleep=self._sleep,
            before_sleep=self._log_resend,
        )
        for entry, result in still_refused:
            self._give_up(entry, result, outcomes)
        self._mark_all(written, outcomes)
        return ambiguous

    def _put_round(
        self,
        pending: list[_Held],
        outcomes: dict[int, Outcome],
        written: list[tuple[_Held, Position]],
        ambiguous: list[_Held],
    ) -> list[tuple[_Held, RecordResult]]:
        """Put each pending claim once; gives up what is not worth resending, returns the rest."""
        refused: list[tuple[_Held, RecordResult]] = []
        # the lease is checked right before each request leaves, not once for all of them
        for start in range(0, len(pending), MAX_RECORDS_PER_PUT):
            ready = self._ensure_leases(pending[start : start + MAX_RECORDS_PER_PUT], outcomes)
            units = self._units(ready)
            for batch in batch_by_size(units, lambda unit: unit.size_bytes):
                self._hooks.at(Step.BEFORE_PUT)
                results = self._put([unit.entry for unit in batch])
                self._hooks.at(Step.AFTER_PUT)
                for unit, result in zip(batch, results, strict=True):
                    self._sort_result(unit, result, written, ambiguous, refused)
        resend: list[tuple[_Held, RecordResult]] = []
        for entry, result in refused:
            if result.retriable:
                resend.append((entry, result))
            else:
                self._give_up(entry, result, outcomes)
        return resend

    def _log_resend(self, retry_state: RetryCallState) -> None:
        outcome = retry_state.outcome
        log.info(
            "put resend stream=%s records=%d after_attempt=%d wait_s=%.3f",
            self.stream,
            len(outcome.result()) if outcome is not None else 0,
            retry_state.attempt_number,
            retry_state.upcoming_sleep,
        )

    def _units(self, pending: list[_Held]) -> list[PutUnit[_Held]]:
        if self._shard_map is None:
            return single_units(pending, _item_of)
        if self._open_shards is None:
            self._open_shards = open_shards(self._shard_map())
        return aggregated_units(pending, _item_of, self._open_shards, self._max_record_bytes)

    def _sort_result(
        self,
        unit: PutUnit[_Held],
        result: RecordResult,
        written: list[tuple[_Held, Position]],
        ambiguous: list[_Held],
        refused: list[tuple[_Held, RecordResult]],
    ) -> None:
        if result.kind is PutResultKind.AMBIGUOUS:
            ambiguous.extend(unit.members)
            return
        if result.kind is not PutResultKind.WRITTEN:
            refused.extend((member, result) for member in unit.members)
            return
        shard_id, sequence_number = str(result.shard_id), str(result.sequence_number)
        if not unit.aggregated:
            written.append((unit.members[0], Position(shard_id, sequence_number)))
            return
        shard = self._landed_on(shard_id)
        for sub_sequence, member in enumerate(unit.members):
            if shard is None or not shard.covers(int(member.item.explicit_hash_key)):
                # the shard map was stale (a reshard): KCL drops this user record on read,
                # so it is not delivered; send it again under the same claim, newly routed
                self._open_shards = None
                refused.append((member, not_written(STALE_SHARD_MAP)))
                continue
            written.append((member, Position(shard_id, sequence_number, sub_sequence)))

    def _landed_on(self, shard_id: str) -> Shard | None:
        """The shard an aggregate landed on, re-reading the map when it is a new one: its
        members inside the new shard's range are delivered, whatever our map said."""
        known = next((s for s in self._open_shards or [] if s.shard_id == shard_id), None)
        if known is not None or self._shard_map is None:
            return known
        shards = self._shard_map()
        self._open_shards = open_shards(shards)
        return next((s for s in shards if s.shard_id == shard_id), None)

    def _put(self, entries: list[dict[str, Any]]) -> list[RecordResult]:
        metrics.PUT_REQUESTS.labels(self.stream).inc()
        started = time.perf_counter()
        try:
            results = self._writer.put_entries(entries)
        finally:
            metrics.PUT_SECONDS.labels(self.stream).observe(time.perf_counter() - started)
        for result in results:
            if result.kind is not PutResultKind.WRITTEN:
                metrics.PUT_RECORD_ERRORS.labels(self.stream, result.error_code or "none").inc()
        return results

    def _ensure_leases(self, held: list[_Held], outcomes: dict[int, Outcome]) -> list[_Held]:
        """Renew claims whose lease is too short to outlive a put sent now.

        Kinesis cannot fence a stale writer, so a put must only leave while the lease covers
        it. Our claim has not been sent under this attempt, so taking it over ourselves
        (attempt + 1, conditional on the attempt we hold) is safe and gives a fresh lease.
        """
        now_ms = self._clock.now_ms()
        short = [
            h
            for h in held
            if not self._policy.lease.safe_to_send(h.record.lease_expires_at_ms or 0, now_ms)
        ]
        if not short:
            return held
        renewed = dict(zip(map(id, short), self._map(self._take_over, short), strict=True))
        keep: list[_Held] = []
        for entry in held:
            result = renewed.get(id(entry))
            if result is None:
                keep.append(entry)
            elif isinstance(result, LedgerError):
                outcomes[entry.item.index] = _in_flight(entry, f"lease renewal failed: {result}")
            elif result.status is ClaimStatus.WON and result.record is not None:
                entry.record = result.record
                keep.append(entry)
            else:
                outcomes[entry.item.index] = _in_flight(
                    entry, "claim was taken over before it could be sent"
                )
        return keep

    def _take_over(self, entry: _Held) -> ClaimResult | LedgerError:
        try:
            return self._ledger.take_over(
                entry.record,
                owner=self.owner,
                now_ms=self._clock.now_ms(),
                lease_ms=self._policy.lease.lease_ms,
            )
        except LedgerError as exc:
            return exc

    def _give_up(self, entry: _Held, result: RecordResult, outcomes: dict[int, Outcome]) -> None:
        """Definitely not written and not worth resending: release the claim for a later send."""
        reason = f"not written: {result.error_code}: {result.error_message or ''}".rstrip(": ")
        try:
            self._ledger.release(entry.record)
        except LedgerError as exc:
            reason += f" (release failed, the reconciler will release it: {exc})"
        outcomes[entry.item.index] = _failed(entry.item, reason)

    def _mark_all(
        self, written: list[tuple[_Held, Position]], outcomes: dict[int, Outcome]
    ) -> None:
        def mark(pair: tuple[_Held, Position]) -> Outcome:
            entry, position = pair
            self._hooks.at(Step.BEFORE_MARK)
            item = entry.item
            started = time.perf_counter()
            try:
                result = self._ledger.mark_delivered(
                    entry.record, position, now_ms=self._clock.now_ms()
                )
            except LedgerError as exc:
                # written once; the claim stays IN_FLIGHT and read-back will mark it later
                log.warning("mark failed stream=%s error=%s", self.stream, exc)
                return Outcome(
                    item.index,
                    item.key,
                    OutcomeStatus.SENT,
                    position=position,
                    attempt=entry.record.attempt,
                    reason=f"written; ledger mark failed ({exc}); read-back will mark it",
                    ledger_marked=False,
                )
            finally:
                metrics.LEDGER_SECONDS.labels("mark").observe(time.perf_counter() - started)
            self._hooks.at(Step.AFTER_MARK)
            current = result.current
            if result.applied or (
                current is not None
                and current.state is LedgerState.DELIVERED
                and current.attempt == entry.record.attempt
                and current.position == position
            ):
                # ours, or another party (a reconciler, a waiting producer) recorded our write
                return Outcome(
                    item.index,
                    item.key,
                    OutcomeStatus.SENT,
                    position=position,
                    attempt=entry.record.attempt,
                )
            log.warning(
                "mark lost stream=%s attempt=%d current_attempt=%s",
                self.stream,
                entry.record.attempt,
                result.current.attempt if result.current else None,
            )
            return Outcome(
                item.index,
                item.key,
                OutcomeStatus.TAKEN_OVER,
                position=position,
                attempt=entry.record.attempt,
                reason="written, but the claim was taken over before the mark: the audit "
                "reports a duplicate if the new owner also wrote it",
            )

        for outcome in self._map(mark, written):
            outcomes[outcome.index] = outcome

    # --- held claims: ambiguous puts of ours, in-flight claims of others --------------------

    def _settle_held(self, held: list[_Held], outcomes: dict[int, Outcome]) -> list[_Held]:
        """Resolve held claims by polling and read-back; returns claims we took over to send."""
        if self._resolver is None:
            for entry in held:
                outcomes[entry.item.index] = _in_flight(
                    entry, "ambiguous put; resolve with 'keo reconcile'"
                )
            return []
        to_send: list[_Held] = []
        waiting = held
        first_pass = True

        def look() -> list[_Held]:
            """Read back what is due; returns the claims still to wait on."""
            nonlocal waiting, first_pass
            if not first_pass:
                waiting = self._refresh(waiting, outcomes)
            now_ms = self._clock.now_ms()
            # ambiguous puts of ours are read back at once: "written, response lost" is common
            due = [
                h
                for h in waiting
                if (first_pass and h.mine)
                or self._policy.lease.expired_for_everyone(
                    h.record.lease_expires_at_ms or 0, now_ms
                )
            ]
            first_pass = False
            still: list[_Held] = [h for h in waiting if h not in due]
            if due:
                still.extend(self._read_back(due, outcomes, to_send))
            waiting = still
            return still

        # every claim waited on settles once its lease has expired for everyone: no stop rule
        repeat_while(look, more=bool, wait=self._claim_wait, stop=stop_never, sleep=self._sleep)
        return to_send

    def _refresh(self, waiting: list[_Held], outcomes: dict[int, Outcome]) -> list[_Held]:
        """Re-read waited-on claims: the holder may have delivered, released or renewed them."""
        try:
            current = self._ledger.batch_get(self.stream, [h.item.key for h in waiting])
        except LedgerError as exc:
            log.warning("refresh failed stream=%s error=%s", self.stream, exc)
            return waiting
        still: list[_Held] = []
        for entry in waiting:
            record = current.get(entry.item.key)
            if record is None or record.state is not LedgerState.IN_FLIGHT:
                lost: list[_Held] = []
                self._judge_lost_claim(entry.item, record, outcomes, lost)
                still.extend(lost)
                continue
            if record.attempt != entry.record.attempt:
                entry.mine = record.owner == self.owner
            entry.record = record
            still.append(entry)
        return still

    def _read_back(
        self, due: list[_Held], outcomes: dict[int, Outcome], to_send: list[_Held]
    ) -> list[_Held]:
        resolver = self._resolver
        if resolver is None:  # pragma: no cover - checked by the caller
            return due
        try:
            results = resolver.resolve([h.record for h in due])
        except StreamError as exc:
            # the claims stay IN_FLIGHT: the reconciler settles them once Kinesis answers
            for entry in due:
                outcomes[entry.item.index] = _in_flight(
                    entry, f"read-back failed: {exc}; run 'keo reconcile'"
                )
            return []
        still: list[_Held] = []
        found: list[tuple[_Held, Position]] = []
        takeovers: list[_Held] = []
        for entry in due:
            result = results[entry.item.key]
            metrics.READ_BACKS.labels(self.stream, result.resolution.value).inc()
            if result.resolution is Resolution.FOUND and result.position is not None:
                found.append((entry, result.position))
            elif result.resolution is Resolution.PENDING:
                still.append(entry)
            elif result.resolution is Resolution.NOT_FOUND:
                takeovers.append(entry)
            elif result.resolution is Resolution.UNVERIFIABLE:
                outcomes[entry.item.index] = Outcome(
                    entry.item.index,
                    entry.item.key,
                    OutcomeStatus.UNVERIFIABLE,
                    reason="the claim's window is older than the stream's retention",
                    attempt=entry.record.attempt,
                )
            else:
                outcomes[entry.item.index] = Outcome(
                    entry.item.index,
                    entry.item.key,
                    OutcomeStatus.CONFLICT,
                    position=result.position,
                    reason="the stream holds this key with other data",
                    attempt=entry.record.attempt,
                )
        self._mark_found(found, outcomes)
        return still + self._take_over_all(takeovers, outcomes, to_send)

    def _take_over_all(
        self, entries: list[_Held], outcomes: dict[int, Outcome], to_send: list[_Held]
    ) -> list[_Held]:
        """Read-back proved these puts can no longer land: claim a new attempt to send them.
        Returns the ones to keep waiting on (someone else took them first)."""
        still: list[_Held] = []
        for entry, taken in zip(entries, self._map(self._take_over, entries), strict=True):
            if isinstance(taken, LedgerError):
                outcomes[entry.item.index] = _in_flight(entry, f"take over failed: {taken}")
            elif taken.status is ClaimStatus.WON and taken.record is not None:
                to_send.append(_Held(entry.item, taken.record, mine=True))
            else:
                self._judge_lost_claim(entry.item, taken.record, outcomes, still)
        return still

    def _mark_found(
        self, found: list[tuple[_Held, Position]], outcomes: dict[int, Outcome]
    ) -> None:
        """Records found by read-back: ours are SENT, others' are DUPLICATE (they sent them)."""
        self._mark_all([pair for pair in found if pair[0].mine], outcomes)
        for entry, position in found:
            if entry.mine:
                continue
            try:
                self._ledger.mark_delivered(entry.record, position, now_ms=self._clock.now_ms())
            except LedgerError as exc:
                log.warning("mark of a found record failed stream=%s error=%s", self.stream, exc)
            outcomes[entry.item.index] = Outcome(
                entry.item.index,
                entry.item.key,
                OutcomeStatus.DUPLICATE,
                position=position,
                attempt=entry.record.attempt,
            )

    def _map(self, fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
        items = list(items)
        if len(items) <= 1:
            return [fn(item) for item in items]
        return list(self._executor.map(fn, items))


def _item_of(entry: _Held) -> PreparedMessage:
    return entry.item


def _failed(item: PreparedMessage, reason: str) -> Outcome:
    return Outcome(item.index, item.key, OutcomeStatus.FAILED, reason=reason)


def _in_flight(entry: _Held, reason: str) -> Outcome:
    return Outcome(
        entry.item.index,
        entry.item.key,
        OutcomeStatus.IN_FLIGHT,
        reason=reason,
        attempt=entry.record.attempt,
    )


def _repeat_outcome(item: PreparedMessage, first: PreparedMessage, outcome: Outcome) -> Outcome:
    if item.payload_digest != first.payload_digest:
        return Outcome(
            item.index,
            item.key,
            OutcomeStatus.CONFLICT,
            reason=f"the same key appears earlier in this input (#{first.index}) with other data",
        )
    if outcome.delivered:
        return Outcome(
            item.index,
            item.key,
            OutcomeStatus.DUPLICATE,
            position=outcome.position,
            attempt=outcome.attempt,
            reason=f"repeat of message #{first.index} in this input",
        )
    return Outcome(
        item.index,
        item.key,
        outcome.status,
        position=outcome.position,
        attempt=outcome.attempt,
        reason=f"repeat of message #{first.index} in this input: {outcome.reason}",
    )
