"""One chunk's delivery: open its claim group, claim each key, put, wait on and read back what
is held, settle. The steps are the parts beside it; this module keeps their order and the
leases.

::

    run(chunk)
      ├─ open group G (OPEN, lease, members) ── before any claim names it
      ├─ claim each key for G (concurrent) ──┬── won ────────────────────────── to put
      │                                      └── lost: ChunkState.judge_lost ─ outcome, or wait
      ├─ up to 4 rounds:
      │   ├─ PutLoop.put ── leases first (ready_to_put: renew G while valid, else move its keys
      │   │                 to a fresh group); ambiguous and diverted messages are held
      │   └─ HeldClaims.settle ── read back; what can no longer land is taken over (TakeOvers)
      │                           and put in the next round
      └─ settle each group of ours: its positions in one conditional write (epoch = ours)
"""

from __future__ import annotations

import logging
import threading
import time

from dedupe_store.errors import LedgerError
from dedupe_store.records import ClaimResult, ClaimStatus, KeyClaim
from kinesis_store.results import RecordResult
from producer import metrics, outcomes
from producer.hooks import Step
from producer.key.claims import ChunkState, ClaimedMessage, OwnGroup
from producer.key.context import SendContext
from producer.key.decisions import groups_to_renew
from producer.key.takeover import TakeOvers
from producer.key.waiting import HeldClaims
from producer.outcomes import Outcome
from producer.protocol import PreparedMessage
from producer.put_loop import PutLoop

__all__ = ["ChunkDelivery"]

log = logging.getLogger(__name__)

_MAX_ROUNDS = 4  # take-over rounds per call before a key is reported IN_FLIGHT


class ChunkDelivery:
    """The protocol for one chunk of at most ``group_size`` distinct keys; used once."""

    def __init__(self, context: SendContext, items: list[PreparedMessage]) -> None:
        self._context = context
        self._items = items
        self._state = ChunkState()
        self._takeovers = TakeOvers(context, self._state)
        self._held = HeldClaims(context, self._state, self._takeovers)
        self._puts = PutLoop(context, self, max_attempts=context.policy.put_max_attempts)

    def run(self, opened: threading.Event) -> dict[int, Outcome]:
        """Deliver the chunk; ``opened`` is set once its group is open (or could not be), so
        the next chunk may open its own and claim beside it. One outcome per item, by input
        index."""
        try:
            own = self._open()
        finally:
            opened.set()
        if own is None:
            return self._state.outcomes
        claims = self._context.claim_all(self._items, own.group)
        to_send, to_wait = self._sort_claims(own, claims)
        self._rounds(to_send, to_wait)
        self._settle_groups()
        return self._state.outcomes

    def _open(self) -> OwnGroup | None:
        opened = self._context.open_group([item.key for item in self._items])
        if isinstance(opened, LedgerError):
            for item in self._items:
                self._state.report(outcomes.failed(item, f"ledger unavailable at open: {opened}"))
            return None
        return self._state.add_group(opened)

    def _sort_claims(
        self, own: OwnGroup, claims: list[ClaimResult | LedgerError]
    ) -> tuple[list[ClaimedMessage], list[ClaimedMessage]]:
        """Won claims are ours to put; lost ones are judged by their holder's group (read
        once, in batches): delivered, conflicting, or to wait on."""
        to_send: list[ClaimedMessage] = []
        lost: list[tuple[PreparedMessage, KeyClaim | None]] = []
        for item, result in zip(self._items, claims, strict=True):
            if isinstance(result, LedgerError):
                # it may have applied: the group keeps it unresolved, the reconciler settles it
                own.unresolved.add(item.key)
                self._state.report(outcomes.failed(item, f"ledger unavailable at claim: {result}"))
            elif result.status is ClaimStatus.WON and result.claim is not None:
                own.unresolved.add(item.key)
                to_send.append(ClaimedMessage(item, result.claim, own=own))
            else:
                lost.append((item, result.claim))
        if to_send:
            # once per chunk, once its claims are made (a sleep there stalls the chunk once)
            self._context.hooks.at(Step.AFTER_CLAIM)
        return to_send, self._judge_lost_claims(lost)

    def _judge_lost_claims(
        self, lost: list[tuple[PreparedMessage, KeyClaim | None]]
    ) -> list[ClaimedMessage]:
        if not lost:
            return []
        context = self._context
        group_ids = {c.group_id for _, c in lost if c is not None}
        try:
            groups = context.ledger.batch_get_groups(context.stream, group_ids) if group_ids else {}
        except LedgerError as exc:
            for item, _ in lost:
                self._state.report(
                    outcomes.failed(item, f"ledger unavailable reading a claim: {exc}")
                )
            return []
        to_wait: list[ClaimedMessage] = []
        for item, current in lost:
            holder = groups.get(current.group_id) if current is not None else None
            judged = self._state.judge_lost(item, current, holder)
            if judged is not None:
                to_wait.append(judged)
        return to_wait

    def _rounds(self, to_send: list[ClaimedMessage], to_wait: list[ClaimedMessage]) -> None:
        """Put, then settle what is held; what was taken over is put in the next round."""
        for _ in range(_MAX_ROUNDS):
            if self._context.interrupted.is_set():
                self._release_unsent(to_send)
                to_send = []
            held = self._put(to_send) if to_send else []
            held, to_wait = held + to_wait, []
            if not held:
                return
            to_send = self._held.settle(held)
        for message in to_send:
            self._state.in_flight(message, "claim changed hands repeatedly; run 'keo reconcile'")

    def _put(self, messages: list[ClaimedMessage]) -> list[ClaimedMessage]:
        """Put ``messages``; returns those held (ambiguous, or diverted) to wait on."""
        report = self._puts.put(messages)
        for message, position in report.written:
            self._state.resolved(message, position)
        return report.held

    # --- the put loop's party (producer.put_loop.PutParty) ------------------------------------

    @staticmethod
    def item_of(message: ClaimedMessage) -> PreparedMessage:
        return message.item

    @staticmethod
    def lease_of(message: ClaimedMessage) -> int:
        return message.lease_expires_at_ms

    def give_up(self, message: ClaimedMessage, result: RecordResult) -> None:
        """Definitely not written and not worth resending: release the claim for a later send."""
        reason = result.failure_reason
        try:
            released = self._context.ledger.release(message.claim).applied
        except LedgerError as exc:
            released = False
            reason += f" (release failed, the reconciler will release it: {exc})"
        if released:
            self._state.resolved(message, None)
        self._state.report(outcomes.failed(message.item, reason))

    def _release_unsent(self, messages: list[ClaimedMessage]) -> None:
        """Claims of ours never sent (interrupted): released, conditional on the attempt."""
        for message in messages:
            reason = "interrupted before it was sent; send it again"
            try:
                if self._context.ledger.release(message.claim).applied:
                    self._state.resolved(message, None)
            except LedgerError as exc:
                reason += f" (release failed, the reconciler will release it: {exc})"
            self._state.report(outcomes.failed(message.item, reason))

    # --- leases: a put leaves only while its group's lease outlives it ------------------------

    def ready_to_put(
        self, messages: list[ClaimedMessage]
    ) -> tuple[list[ClaimedMessage], list[ClaimedMessage]]:
        """Keep a put from leaving unless its group's lease outlives it.

        A group whose lease is short is renewed (one write for all its keys) while it is still
        valid by more than the skew margin; past that, its keys (none of them sent under it,
        or definitely not written) move to a fresh group of ours, whose lease is renewed in
        turn if the take-overs took long. Returns the messages ready to put, and those that
        are no longer ours (another party moved them first: to wait on). The put client
        checks the lease once more as the request leaves."""
        # only a claim of ours is ever put (the others are waited on)
        others = [m for m in messages if m.own is None]
        ours = [(m, m.own) for m in messages if m.own is not None]
        lease_ends = {own.group_id: own.group.lease_expires_at_ms for _, own in ours}
        short = groups_to_renew(lease_ends, self._context.clock.now_ms(), self._context.lease)
        stuck = {group_id for group_id in short if not self._renew(self._state.groups[group_id])}
        ready = [m for m, own in ours if own.group_id not in stuck]
        if not stuck:
            return ready, others
        moved = self._takeovers.move([m for m, own in ours if own.group_id in stuck])
        fresh = [m for m in moved if m.is_ours]
        self._renew_short(fresh)
        return ready + fresh, others + [m for m in moved if not m.is_ours]

    def _renew(self, own: OwnGroup) -> bool:
        renewed = self._context.renew(own.group)
        if renewed is None:
            return False
        own.group = renewed
        return True

    def _renew_short(self, messages: list[ClaimedMessage]) -> None:
        """Renew the groups of ``messages`` whose lease is short already (a fresh group opens
        before its take-overs); one that cannot be renewed is refused as its put leaves."""
        lease_ends = {m.own.group_id: m.lease_expires_at_ms for m in messages if m.own}
        for group_id in groups_to_renew(
            lease_ends, self._context.clock.now_ms(), self._context.lease
        ):
            self._renew(self._state.groups[group_id])

    # --- settling -----------------------------------------------------------------------------

    def _settle_groups(self) -> None:
        """One conditional write per group of ours: its positions, SETTLED when nothing of it
        is left unresolved. What was written is SENT, or TAKEN_OVER when the group moved on."""
        by_key = {item.key: item for item in self._items}
        for own in self._state.groups.values():
            if not own.positions and own.unresolved:
                continue  # nothing to record; the reconciler settles the group after its lease
            failure, taken = self._settle(own)
            for key, position in own.positions.items():
                self._state.report(
                    outcomes.written(by_key[key], position, own.attempts[key], failure, taken=taken)
                )

    def _settle(self, own: OwnGroup) -> tuple[str | None, bool]:
        """Settle ``own``; returns why the ledger does not record it yet (None: it does), and
        whether the group was taken over before we could."""
        context = self._context
        context.hooks.at(Step.BEFORE_MARK)
        started = time.perf_counter()
        failure: str | None = None
        settled = None
        try:
            settled = context.ledger.record_positions(
                own.group,
                own.positions,
                settle=not own.unresolved,
                now_ms=context.clock.now_ms(),
            )
        except LedgerError as exc:
            # written once; the group stays OPEN and the reconciler records it from the stream
            log.warning("settle failed stream=%s error=%s", context.stream, exc)
            failure = f"written; ledger settle failed ({exc}); the reconciler records it"
        finally:
            metrics.LEDGER_SECONDS.labels("settle").observe(time.perf_counter() - started)
        context.hooks.at(Step.AFTER_MARK)
        if settled is None:
            return failure, False
        if settled.applied:
            return None, False
        log.warning(
            "settle lost stream=%s group=%s epoch=%d current_epoch=%s",
            context.stream,
            own.group_id,
            own.group.epoch,
            settled.current.epoch if settled.current else None,
        )
        return None, True
