"""``ExactlyOnceProducer``: open a claim group, claim, put, classify, settle, and read back
what is ambiguous (ledger schema v2: one conditional write per message).

::

    send(messages)
      ├─ validate ─────────────── REJECTED (reason)                nothing claimed
      └─ per chunk of at most group_size keys:
         ├─ open group G (OPEN, lease, members) ── before any claim names it
         ├─ claim each key for G (concurrent) ──┬── lost, holder's group has its position ── DUPLICATE
         │                                      ├── lost, other digest ───────────── CONFLICT
         │                                      └── lost, holder's lease runs ────── wait, then read back
         ├─ lease check before each request ───── renew G (one write) while valid; else a fresh group
         ├─ PutRecords (SDK retries off), signature fence: signed_at + window + skew <= lease
         │     ├─ written ─────────── position kept for G's settle
         │     ├─ not written ─────── resend, same claim, backoff + jitter (tenacity); a fenced
         │     │                      or expired-signature request checks the lease again first
         │     └─ ambiguous ───────── read back: found ─> position; not found after lease ─> take over, resend
         └─ settle G: every position in one conditional write (epoch = ours) ─ SENT / TAKEN_OVER
      └─ one Outcome per message, in input order
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tenacity import RetryCallState, stop_after_attempt, stop_when_event_set, wait_exponential

from dedupe_store.clock import Clock
from dedupe_store.contract import Ledger
from dedupe_store.errors import LedgerError
from dedupe_store.records import (
    ClaimRequest,
    ClaimResult,
    ClaimStatus,
    Group,
    KeyClaim,
    LedgerRecord,
    Position,
)
from dedupe_store.states import GroupState, KeyState
from producer import metrics
from producer.encoding import PutUnit, aggregated_units, single_units
from producer.errors import StreamError
from producer.hooks import NO_HOOKS, Hooks, Step
from producer.kinesis import KinesisWriter
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import (
    DEFAULT_MAX_RECORD_BYTES,
    MAX_GROUP_KEYS,
    MAX_GROUP_MEMBER_BYTES,
    MAX_RECORDS_PER_PUT,
    STALE_SHARD_MAP,
    LeasePolicy,
    Message,
    PreparedMessage,
    PutResultKind,
    RecordResult,
    batch_by_size,
    group_member_bytes,
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
    group_size: int = MAX_GROUP_KEYS
    groups_in_flight: int = 2  # a group's claims start once the one before it has claimed


@dataclass(slots=True)
class _Held:
    """A message, its key item, and the group that item names (ours, or the holder's)."""

    item: PreparedMessage
    claim: KeyClaim
    # the holder's group as last read, for a claim of another party's (or of an earlier call of
    # ours); None: that group is gone (expired): its lease is long over
    holder: Group | None
    # our claim (we may have sent it): the group of this call that holds it. Its lease is read
    # from there, renewals included: a put sent under a renewed lease may land until its end
    home: _Ours | None = None

    @property
    def mine(self) -> bool:
        return self.home is not None

    @property
    def group(self) -> Group | None:
        return self.home.group if self.home is not None else self.holder

    @property
    def lease_expires_at_ms(self) -> int:
        return self.group.lease_expires_at_ms if self.group is not None else 0

    @property
    def record(self) -> LedgerRecord:
        """The claim as read-back sees it: its window runs from the claim to the group's lease."""
        return LedgerRecord.of(self.claim, self.group)


@dataclass(slots=True)
class _Ours:
    """One of our groups in a send: what it holds now, and what is known of its keys."""

    group: Group
    positions: dict[str, Position] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)  # of the keys with a position
    unresolved: set[str] = field(default_factory=set)  # claimed for it, not settled by us


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
        # the groups of one send in flight at once: one claims while the others put and settle
        self._groups = ThreadPoolExecutor(policy.groups_in_flight, thread_name_prefix="keo-group")
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
        self._interrupted = threading.Event()

    def close(self) -> None:
        self._groups.shutdown(wait=True)
        if self._own_executor and isinstance(self._executor, ThreadPoolExecutor):
            self._executor.shutdown(wait=True)

    def __enter__(self) -> ExactlyOnceProducer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- public API -------------------------------------------------------------------------

    def interrupt(self) -> None:
        """Finish the call in flight early (Ctrl-C): send nothing more, stop waiting on other
        producers' claims (their keys are reported IN_FLIGHT), release our claims not yet sent
        (they are FAILED: send them again), and settle what was written. Thread-safe."""
        self._interrupted.set()

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
        self._deliver_all(list(firsts.values()), outcomes)
        for item, first in repeats:
            outcomes[item.index] = _repeat_outcome(item, first, outcomes[first.index])
        ordered = [outcomes[i] for i in range(len(messages))]
        for outcome in ordered:
            metrics.OUTCOMES.labels(self.stream, outcome.status.value).inc()
        return ordered

    # --- the protocol -----------------------------------------------------------------------

    def _deliver_all(self, items: list[PreparedMessage], outcomes: dict[int, Outcome]) -> None:
        """One group per chunk: at most ``group_size`` keys, and a group item of bounded size.

        Groups are pipelined: a group opens and claims once the group before it has made its
        claims, so its claims fill the time the other spends putting and settling (the ledger
        and the client sit idle during a put otherwise). At most ``groups_in_flight`` at once.
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
                    outcomes.update(in_flight.popleft().result())
                if self._interrupted.is_set():
                    for item in chunk:
                        outcomes[item.index] = _failed(
                            item, "interrupted before it was claimed; send it again"
                        )
                    continue
                claimed = threading.Event()
                in_flight.append(self._groups.submit(self._deliver, chunk, claimed))
                claimed.wait()
        finally:
            # every group started finishes its protocol, even when one of them raised
            failures: list[BaseException] = []
            for future in in_flight:
                try:
                    outcomes.update(future.result())
                except BaseException as exc:  # the first one is raised below
                    failures.append(exc)
            if failures:
                raise failures[0]

    def _deliver(
        self, items: list[PreparedMessage], claimed: threading.Event
    ) -> dict[int, Outcome]:
        """One group's protocol; ``claimed`` is set once its claims are made (or abandoned)."""
        outcomes: dict[int, Outcome] = {}
        try:
            ours: dict[str, _Ours] = {}
            group = self._open([item.key for item in items], ours)
            if isinstance(group, LedgerError):
                for item in items:
                    outcomes[item.index] = _failed(item, f"ledger unavailable at open: {group}")
                return outcomes
            claims = self._map(lambda item: self._claim(item, group), items)
        finally:
            claimed.set()
        to_send: list[_Held] = []
        lost: list[tuple[PreparedMessage, KeyClaim | None]] = []
        for item, result in zip(items, claims, strict=True):
            if isinstance(result, LedgerError):
                # it may have applied: the group keeps it unresolved, the reconciler settles it
                ours[group.group_id].unresolved.add(item.key)
                outcomes[item.index] = _failed(item, f"ledger unavailable at claim: {result}")
            elif result.status is ClaimStatus.WON and result.claim is not None:
                ours[group.group_id].unresolved.add(item.key)
                to_send.append(_Held(item, result.claim, None, ours[group.group_id]))
            else:
                lost.append((item, result.claim))
        if to_send:
            # once per chunk, once its claims are made (a sleep there stalls the chunk once)
            self._hooks.at(Step.AFTER_CLAIM)
        to_wait = self._judge_lost_claims(lost, outcomes)

        for _ in range(_MAX_ROUNDS):
            if self._interrupted.is_set():
                self._release_unsent(to_send, ours, outcomes)
                to_send = []
            ambiguous = self._send(to_send, ours, outcomes) if to_send else []
            to_send = []
            held = ambiguous + to_wait
            to_wait = []
            if not held:
                break
            to_send = self._settle_held(held, ours, outcomes)
        for entry in to_send:
            outcomes[entry.item.index] = _in_flight(
                entry, "claim changed hands repeatedly; run 'keo reconcile'"
            )
        self._settle_groups(ours, items, outcomes)
        return outcomes

    def _release_unsent(
        self, entries: list[_Held], ours: dict[str, _Ours], outcomes: dict[int, Outcome]
    ) -> None:
        """Claims of ours never sent (interrupted): released, conditional on the attempt."""
        for entry in entries:
            reason = "interrupted before it was sent; send it again"
            try:
                if self._ledger.release(entry.claim).applied:
                    self._resolved(entry, ours, None)
            except LedgerError as exc:
                reason += f" (release failed, the reconciler will release it: {exc})"
            outcomes[entry.item.index] = _failed(entry.item, reason)

    def _open(self, keys: list[str], ours: dict[str, _Ours]) -> Group | LedgerError:
        started = time.perf_counter()
        try:
            group = self._ledger.open_group(
                self.stream,
                keys,
                owner=self.owner,
                now_ms=self._clock.now_ms(),
                lease_ms=self._policy.lease.lease_ms,
            )
        except LedgerError as exc:
            return exc
        finally:
            metrics.LEDGER_SECONDS.labels("open").observe(time.perf_counter() - started)
        ours[group.group_id] = _Ours(group)
        return group

    def _claim(self, item: PreparedMessage, group: Group) -> ClaimResult | LedgerError:
        payload = None
        limit = self._policy.store_payload_max_bytes
        if limit is not None and len(item.message.data) <= limit:
            payload = item.message.data
        request = ClaimRequest(
            self.stream, item.key, item.payload_digest, item.explicit_hash_key, payload
        )
        started = time.perf_counter()
        try:
            result = self._ledger.claim(request, group, now_ms=self._clock.now_ms())
        except LedgerError as exc:
            metrics.CLAIMS.labels(self.stream, "error").inc()
            return exc
        finally:
            metrics.LEDGER_SECONDS.labels("claim").observe(time.perf_counter() - started)
        metrics.CLAIMS.labels(self.stream, result.status.value.lower()).inc()
        return result

    def _judge_lost_claims(
        self, lost: list[tuple[PreparedMessage, KeyClaim | None]], outcomes: dict[int, Outcome]
    ) -> list[_Held]:
        """What each lost claim's holder says: delivered, conflicting, or still to wait on.
        The holders' groups are read once, in batches."""
        if not lost:
            return []
        group_ids = {c.group_id for _, c in lost if c is not None and c.state is KeyState.CLAIMED}
        try:
            groups = self._ledger.batch_get_groups(self.stream, group_ids) if group_ids else {}
        except LedgerError as exc:
            for item, _ in lost:
                outcomes[item.index] = _failed(item, f"ledger unavailable reading a claim: {exc}")
            return []
        to_wait: list[_Held] = []
        for item, current in lost:
            group = groups.get(current.group_id) if current is not None else None
            self._judge(item, current, group, outcomes, to_wait)
        return to_wait

    def _judge(
        self,
        item: PreparedMessage,
        current: KeyClaim | None,
        group: Group | None,
        outcomes: dict[int, Outcome],
        to_wait: list[_Held],
    ) -> None:
        if current is None:
            outcomes[item.index] = _failed(item, "claim lost and the item vanished; send again")
            return
        position = group.position_of(item.key) if group is not None else None
        if current.payload_digest != item.payload_digest:
            outcomes[item.index] = Outcome(
                item.index,
                item.key,
                OutcomeStatus.CONFLICT,
                position=position,
                reason=f"key already used for another payload (state {current.state})",
                attempt=current.attempt,
            )
        elif current.state is KeyState.UNVERIFIABLE:
            outcomes[item.index] = Outcome(
                item.index,
                item.key,
                OutcomeStatus.UNVERIFIABLE,
                reason="an earlier claim of this key could not be verified within retention",
                attempt=current.attempt,
            )
        elif current.state is KeyState.RELEASED:
            # released again between our claim and our read: a later call claims it
            outcomes[item.index] = _failed(item, "claim raced a release; send again")
        elif position is not None:
            outcomes[item.index] = _duplicate(item, position, current.attempt)
        else:
            # held by another party, or by an earlier call of ours: its put is not this call's
            to_wait.append(_Held(item, current, group))

    def _send(
        self, held: list[_Held], ours: dict[str, _Ours], outcomes: dict[int, Outcome]
    ) -> list[_Held]:
        """Put every held claim of ours; keep the positions written. Returns the ambiguous ones.

        A record is put at most ``put_max_attempts`` times: a PutRecords is never repeated
        whole, only the records classified not written and retriable are sent again, under
        the same claim, after a jittered backoff. The others are given up at once.
        """
        written: list[tuple[_Held, Position]] = []
        ambiguous: list[_Held] = []
        pending = held

        def put_round() -> list[tuple[_Held, RecordResult]]:
            nonlocal pending
            resend = self._put_round(pending, ours, outcomes, written, ambiguous)
            pending = [entry for entry, _ in resend]
            return resend

        still_refused = repeat_while(
            put_round,
            more=bool,
            wait=self._resend_wait,
            stop=stop_after_attempt(self._policy.put_max_attempts)
            | stop_when_event_set(self._interrupted),
            sleep=self._sleep,
            before_sleep=self._log_resend,
        )
        for entry, result in still_refused:
            self._give_up(entry, result, ours, outcomes)
        for entry, position in written:
            self._resolved(entry, ours, position)
        return ambiguous

    def _put_round(
        self,
        pending: list[_Held],
        ours: dict[str, _Ours],
        outcomes: dict[int, Outcome],
        written: list[tuple[_Held, Position]],
        ambiguous: list[_Held],
    ) -> list[tuple[_Held, RecordResult]]:
        """Put each pending claim once; gives up what is not worth resending, returns the rest."""
        refused: list[tuple[_Held, RecordResult]] = []
        # the lease is checked right before each request leaves, not once for all of them
        for start in range(0, len(pending), MAX_RECORDS_PER_PUT):
            ready = self._ensure_leases(
                pending[start : start + MAX_RECORDS_PER_PUT], ours, outcomes
            )
            units = self._units(ready)
            for batch in batch_by_size(units, lambda unit: unit.size_bytes):
                self._hooks.at(Step.BEFORE_PUT)
                # the request mixes groups when keys moved to a fresh one: the earliest lease
                lease_expires_at_ms = min(
                    ours[member.claim.group_id].group.lease_expires_at_ms
                    for unit in batch
                    for member in unit.members
                )
                results = self._put([unit.entry for unit in batch], lease_expires_at_ms)
                self._hooks.at(Step.AFTER_PUT)
                for unit, result in zip(batch, results, strict=True):
                    self._sort_result(unit, result, written, ambiguous, refused)
        resend: list[tuple[_Held, RecordResult]] = []
        for entry, result in refused:
            if result.retriable:
                resend.append((entry, result))
            else:
                self._give_up(entry, result, ours, outcomes)
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

    def _put(self, entries: list[dict[str, Any]], lease_expires_at_ms: int) -> list[RecordResult]:
        metrics.PUT_REQUESTS.labels(self.stream).inc()
        started = time.perf_counter()
        try:
            results = self._writer.put_entries(entries, lease_expires_at_ms=lease_expires_at_ms)
        finally:
            metrics.PUT_SECONDS.labels(self.stream).observe(time.perf_counter() - started)
        for result in results:
            if result.kind is not PutResultKind.WRITTEN:
                metrics.PUT_RECORD_ERRORS.labels(self.stream, result.error_code or "none").inc()
        return results

    def _ensure_leases(
        self, held: list[_Held], ours: dict[str, _Ours], outcomes: dict[int, Outcome]
    ) -> list[_Held]:
        """Keep a put from leaving unless its group's lease outlives it.

        A put must only leave while the lease covers it (with the signature fence: the window
        Kinesis accepts its signature in, plus the skew; the fence checks it again once the
        request is signed). A group whose lease is short is renewed (one write for all its
        keys) while it is still valid by more than the skew margin; past that, its keys (none
        of them sent under it, or definitely not written) move to a fresh group of ours.
        """
        now_ms = self._clock.now_ms()
        lease = self._policy.lease
        short = {
            h.claim.group_id
            for h in held
            if not lease.safe_to_send(ours[h.claim.group_id].group.lease_expires_at_ms, now_ms)
        }
        if not short:
            return held
        stuck: list[_Held] = []
        for group_id in short:
            if not self._renew(ours[group_id], now_ms):
                stuck.extend(h for h in held if h.claim.group_id == group_id)
        if not stuck:
            return held
        moved = self._move_to_fresh_group(stuck, ours, outcomes)
        return [h for h in held if h.claim.group_id not in short or h in moved] + [
            h for h in moved if h not in held
        ]

    def _renew(self, mine: _Ours, now_ms: int) -> bool:
        try:
            renewed = self._ledger.renew_lease(
                mine.group,
                now_ms=now_ms,
                lease_ms=self._policy.lease.lease_ms,
                skew_ms=self._policy.lease.skew_ms,
            )
        except LedgerError as exc:
            log.warning("lease renewal failed stream=%s error=%s", self.stream, exc)
            return False
        if renewed.applied and renewed.current is not None:
            mine.group = renewed.current
            return True
        return False

    def _fence_holders(
        self, entries: list[_Held], ours: dict[str, _Ours], outcomes: dict[int, Outcome]
    ) -> list[_Held]:
        """Before taking keys of another party's expired group, take that group over (its
        epoch + 1, a lease already over): its owner, if it wakes up, can no longer settle it,
        and learns it was TAKEN_OVER. A group that settled first is read again: a key it
        records is a DUPLICATE, not a key to send. Returns the entries to take over."""
        holders = {
            h.group.group_id: h.group
            for h in entries
            if h.group is not None
            and h.group.group_id not in ours
            and h.group.state is GroupState.OPEN
        }
        if not holders:
            return entries
        now_ms = self._clock.now_ms()
        settled: dict[str, Group] = {}
        for group in holders.values():
            try:
                fenced = self._ledger.take_over_group(
                    group,
                    owner=self.owner,
                    now_ms=now_ms,
                    lease_ms=0,
                    skew_ms=self._policy.lease.skew_ms,
                )
            except LedgerError as exc:
                log.warning("fencing a group failed stream=%s error=%s", self.stream, exc)
                continue
            current = fenced.current
            if not fenced.applied and current is not None and current.positions:
                settled[group.group_id] = current
        keep: list[_Held] = []
        for entry in entries:
            holder = settled.get(entry.claim.group_id)
            position = holder.position_of(entry.item.key) if holder is not None else None
            if position is None:
                keep.append(entry)
                continue
            outcomes[entry.item.index] = _duplicate(entry.item, position, entry.claim.attempt)
        return keep

    def _move_to_fresh_group(
        self, entries: list[_Held], ours: dict[str, _Ours], outcomes: dict[int, Outcome]
    ) -> list[_Held]:
        """Take claims over into a new group of ours (open it first, then attempt + 1).
        Returns the entries now held there; the others have their outcome."""
        group = self._open([h.item.key for h in entries], ours)
        if isinstance(group, LedgerError):
            for entry in entries:
                outcomes[entry.item.index] = _in_flight(entry, f"ledger unavailable: {group}")
            return []
        moved: list[_Held] = []
        taken = self._map(lambda entry: self._take_over(entry, group), entries)
        for entry, result in zip(entries, taken, strict=True):
            previous = ours.get(entry.claim.group_id)
            if isinstance(result, LedgerError):
                ours[group.group_id].unresolved.add(entry.item.key)  # it may have applied
                outcomes[entry.item.index] = _in_flight(entry, f"take over failed: {result}")
            elif result.status is ClaimStatus.WON and result.claim is not None:
                if previous is not None:
                    previous.unresolved.discard(entry.item.key)
                ours[group.group_id].unresolved.add(entry.item.key)
                entry.claim, entry.holder, entry.home = result.claim, None, ours[group.group_id]
                moved.append(entry)
            else:
                if previous is not None:
                    previous.unresolved.discard(entry.item.key)
                still: list[_Held] = []
                holder = self._holder_group(result.claim)
                self._judge(entry.item, result.claim, holder, outcomes, still)
                moved.extend(still)
        return moved

    def _holder_group(self, claim: KeyClaim | None) -> Group | None:
        if claim is None:
            return None
        try:
            return self._ledger.get_group(self.stream, claim.group_id)
        except LedgerError:
            return None

    def _take_over(self, entry: _Held, group: Group) -> ClaimResult | LedgerError:
        try:
            return self._ledger.take_over_key(entry.claim, group, now_ms=self._clock.now_ms())
        except LedgerError as exc:
            return exc

    def _give_up(
        self,
        entry: _Held,
        result: RecordResult,
        ours: dict[str, _Ours],
        outcomes: dict[int, Outcome],
    ) -> None:
        """Definitely not written and not worth resending: release the claim for a later send."""
        reason = f"not written: {result.error_code}: {result.error_message or ''}".rstrip(": ")
        try:
            released = self._ledger.release(entry.claim).applied
        except LedgerError as exc:
            released = False
            reason += f" (release failed, the reconciler will release it: {exc})"
        if released:
            self._resolved(entry, ours, None)
        outcomes[entry.item.index] = _failed(entry.item, reason)

    def _resolved(self, entry: _Held, ours: dict[str, _Ours], position: Position | None) -> bool:
        """Our claim is settled as far as we are concerned: written at ``position``, or
        released (None). Its group records the position when it is settled. False when the
        claim's group is not one of this call's."""
        mine = ours.get(entry.claim.group_id)
        if mine is None:
            return False
        mine.unresolved.discard(entry.item.key)
        if position is not None:
            mine.positions[entry.item.key] = position
            mine.attempts[entry.item.key] = entry.claim.attempt
        return True

    def _settle_groups(
        self, ours: dict[str, _Ours], items: list[PreparedMessage], outcomes: dict[int, Outcome]
    ) -> None:
        """One conditional write per group of ours: its positions, SETTLED when nothing of it
        is left unresolved. What was written is SENT, or TAKEN_OVER when the group moved on."""
        by_key = {item.key: item for item in items}
        for mine in ours.values():
            if not mine.positions and mine.unresolved:
                continue  # nothing to record; the reconciler settles the group after its lease
            self._hooks.at(Step.BEFORE_MARK)
            started = time.perf_counter()
            failure: str | None = None
            try:
                settled = self._ledger.record_positions(
                    mine.group,
                    mine.positions,
                    settle=not mine.unresolved,
                    now_ms=self._clock.now_ms(),
                )
            except LedgerError as exc:
                # written once; the group stays OPEN and the reconciler records it from the stream
                log.warning("settle failed stream=%s error=%s", self.stream, exc)
                failure = f"written; ledger settle failed ({exc}); the reconciler records it"
                settled = None
            finally:
                metrics.LEDGER_SECONDS.labels("settle").observe(time.perf_counter() - started)
            self._hooks.at(Step.AFTER_MARK)
            lost = settled is not None and not settled.applied
            if lost:
                log.warning(
                    "settle lost stream=%s group=%s epoch=%d current_epoch=%s",
                    self.stream,
                    mine.group.group_id,
                    mine.group.epoch,
                    settled.current.epoch if settled and settled.current else None,
                )
            for key, position in mine.positions.items():
                item = by_key[key]
                attempt = mine.attempts[key]
                outcomes[item.index] = _written(item, position, attempt, failure, taken=lost)

    # --- held claims: ambiguous puts of ours, in-flight claims of others --------------------

    def _settle_held(
        self, held: list[_Held], ours: dict[str, _Ours], outcomes: dict[int, Outcome]
    ) -> list[_Held]:
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
                or self._policy.lease.expired_for_everyone(h.lease_expires_at_ms, now_ms)
                or (h.group is not None and h.group.state is GroupState.SETTLED)
            ]
            first_pass = False
            still: list[_Held] = [h for h in waiting if h not in due]
            if due:
                still.extend(self._read_back(due, ours, outcomes, to_send))
            waiting = still
            return still

        self._say_waiting(held)
        # every claim waited on settles once its lease has expired for everyone: no stop rule
        # but an interrupt
        repeat_while(
            look,
            more=bool,
            wait=self._claim_wait,
            stop=stop_when_event_set(self._interrupted),
            sleep=self._sleep,
        )
        for entry in waiting:  # interrupted: what was still awaited is left as it is
            outcomes[entry.item.index] = _in_flight(
                entry, "interrupted while waiting on its claim; run 'keo reconcile' or send again"
            )
        return to_send

    def _say_waiting(self, held: list[_Held]) -> None:
        others = [h for h in held if not h.mine]
        if not others:
            return
        left_ms = max(h.lease_expires_at_ms for h in others) - self._clock.now_ms()
        log.warning(
            "waiting on claims held by other producers stream=%s keys=%d lease_left_s=%.0f",
            self.stream,
            len(others),
            max(left_ms + self._policy.lease.skew_ms, 0) / 1000,
        )

    def _refresh(self, waiting: list[_Held], outcomes: dict[int, Outcome]) -> list[_Held]:
        """Re-read waited-on claims and their groups: the holder may have settled, released,
        renewed or handed them on."""
        try:
            claims = self._ledger.batch_get_claims(self.stream, [h.item.key for h in waiting])
            groups = self._ledger.batch_get_groups(
                self.stream, {c.group_id for c in claims.values()}
            )
        except LedgerError as exc:
            log.warning("refresh failed stream=%s error=%s", self.stream, exc)
            return waiting
        still: list[_Held] = []
        for entry in waiting:
            claim = claims.get(entry.item.key)
            group = groups.get(claim.group_id) if claim is not None else None
            if entry.mine and claim == entry.claim:
                still.append(entry)  # ours, unchanged: keep waiting on our own lease
                continue
            judged: list[_Held] = []
            self._judge(entry.item, claim, group, outcomes, judged)
            still.extend(judged)
        return still

    def _read_back(
        self,
        due: list[_Held],
        ours: dict[str, _Ours],
        outcomes: dict[int, Outcome],
        to_send: list[_Held],
    ) -> list[_Held]:
        resolver = self._resolver
        if resolver is None:  # pragma: no cover - checked by the caller
            return due
        try:
            results = resolver.resolve([h.record for h in due])
        except StreamError as exc:
            # the claims stay as they are: the reconciler settles them once Kinesis answers
            for entry in due:
                outcomes[entry.item.index] = _in_flight(
                    entry, f"read-back failed: {exc}; run 'keo reconcile'"
                )
            return []
        still: list[_Held] = []
        takeovers: list[_Held] = []
        for entry in due:
            result = results[entry.item.key]
            metrics.READ_BACKS.labels(self.stream, result.resolution.value).inc()
            if result.resolution is Resolution.FOUND and result.position is not None:
                if not (entry.mine and self._resolved(entry, ours, result.position)):
                    # another's put landed: the key is in the stream once; its group's owner
                    # or the reconciler records the position
                    outcomes[entry.item.index] = _duplicate(
                        entry.item, result.position, entry.claim.attempt
                    )
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
                    attempt=entry.claim.attempt,
                )
            else:
                outcomes[entry.item.index] = Outcome(
                    entry.item.index,
                    entry.item.key,
                    OutcomeStatus.CONFLICT,
                    position=result.position,
                    reason="the stream holds this key with other data",
                    attempt=entry.claim.attempt,
                )
        if takeovers:
            # read-back proved these puts can no longer land: claim a new attempt to send them
            takeovers = self._fence_holders(takeovers, ours, outcomes)
            moved = self._move_to_fresh_group(takeovers, ours, outcomes) if takeovers else []
            to_send.extend(h for h in moved if h.mine)
            still.extend(h for h in moved if not h.mine)
        return still

    def _map(self, fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
        items = list(items)
        if len(items) <= 1:
            return [fn(item) for item in items]
        return list(self._executor.map(fn, items))


def _item_of(entry: _Held) -> PreparedMessage:
    return entry.item


def _duplicate(item: PreparedMessage, position: Position, attempt: int) -> Outcome:
    """Already in the stream once, at ``position``: nothing sent."""
    return Outcome(
        item.index, item.key, OutcomeStatus.DUPLICATE, position=position, attempt=attempt
    )


def _failed(item: PreparedMessage, reason: str) -> Outcome:
    return Outcome(item.index, item.key, OutcomeStatus.FAILED, reason=reason)


def _in_flight(entry: _Held, reason: str) -> Outcome:
    return Outcome(
        entry.item.index,
        entry.item.key,
        OutcomeStatus.IN_FLIGHT,
        reason=reason,
        attempt=entry.claim.attempt,
    )


def _written(
    item: PreparedMessage,
    position: Position,
    attempt: int,
    failure: str | None,
    *,
    taken: bool,
) -> Outcome:
    if taken:
        return Outcome(
            item.index,
            item.key,
            OutcomeStatus.TAKEN_OVER,
            position=position,
            attempt=attempt,
            reason="written, but the group was taken over before it was settled: the new "
            "owner records it from the stream",
        )
    return Outcome(
        item.index,
        item.key,
        OutcomeStatus.SENT,
        position=position,
        attempt=attempt,
        reason=failure,
        ledger_marked=failure is None,
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
