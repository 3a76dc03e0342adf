"""Held claims: ambiguous puts of ours and other parties' claims in flight, waited on and read
back until each is decided.

::

    settle(held)
      └─ look, then back off (100 ms doubling to 5 s) and look again, until none is left:
         ├─ refresh (not on the first look): re-read the key items and their groups; a claim
         │   that changed hands is judged again (decisions.judge_lost_claim)
         ├─ due (decisions.due_for_read_back): ours at once, any once its lease expired for
         │   every clock or its holder's group SETTLED
         └─ read back the due ones, one pass per shard window (decisions.read_back_action):
             RECORD / DUPLICATE / WAIT / RESEND (take over: TakeOvers) / UNVERIFIABLE / CONFLICT
"""

from __future__ import annotations

import logging

from tenacity import stop_when_event_set

from dedupe_store.errors import LedgerError
from producer import metrics, outcomes
from producer.errors import StreamError
from producer.key.claims import ChunkState, ClaimedMessage
from producer.key.context import SendContext
from producer.key.decisions import ReadBackAction, due_for_read_back, read_back_action
from producer.key.readback import ReadBackResult
from producer.key.takeover import TakeOvers
from producer.retries import repeat_while

__all__ = ["HeldClaims"]

log = logging.getLogger(__name__)


class HeldClaims:
    """Settles the held claims of one chunk's delivery by waiting and reading back."""

    def __init__(self, context: SendContext, state: ChunkState, takeovers: TakeOvers) -> None:
        self._context = context
        self._state = state
        self._takeovers = takeovers

    def settle(self, held: list[ClaimedMessage]) -> list[ClaimedMessage]:
        """Wait on ``held`` until every claim is decided; returns the messages taken over, to
        send again. Every claim waited on is decided once its lease has expired for everyone:
        no stop rule but an interrupt."""
        state = self._state
        if self._context.resolver is None:
            for message in held:
                state.in_flight(message, "ambiguous put; resolve with 'keo reconcile'")
            return []
        to_send: list[ClaimedMessage] = []
        waiting = held
        first_look = True

        def look() -> list[ClaimedMessage]:
            """Read back what is due; returns the claims still to wait on."""
            nonlocal waiting, first_look
            if not first_look:
                waiting = self._refresh(waiting)
            due, waiting = self._due(waiting, first_look=first_look)
            first_look = False
            if due:
                waiting.extend(self._read_back(due, to_send))
            return waiting

        self._say_waiting(held)
        repeat_while(
            look,
            more=bool,
            wait=self._context.claim_wait,
            stop=stop_when_event_set(self._context.interrupted),
            sleep=self._context.sleep,
        )
        for message in waiting:  # interrupted: what was still awaited is left as it is
            state.in_flight(
                message,
                "interrupted while waiting on its claim; run 'keo reconcile' or send again",
            )
        return to_send

    def _due(
        self, waiting: list[ClaimedMessage], *, first_look: bool
    ) -> tuple[list[ClaimedMessage], list[ClaimedMessage]]:
        now_ms = self._context.clock.now_ms()
        due: list[ClaimedMessage] = []
        not_yet: list[ClaimedMessage] = []
        for message in waiting:
            is_due = due_for_read_back(
                ours=message.is_ours,
                first_look=first_look,
                lease_expires_at_ms=message.lease_expires_at_ms,
                holder=message.holder,
                now_ms=now_ms,
                lease=self._context.lease,
            )
            (due if is_due else not_yet).append(message)
        return due, not_yet

    def _say_waiting(self, held: list[ClaimedMessage]) -> None:
        others = [m for m in held if not m.is_ours]
        if not others:
            return
        left_ms = max(m.lease_expires_at_ms for m in others) - self._context.clock.now_ms()
        log.warning(
            "waiting on claims held by other producers stream=%s keys=%d lease_left_s=%.0f",
            self._context.stream,
            len(others),
            max(left_ms + self._context.lease.skew_ms, 0) / 1000,
        )

    def _refresh(self, waiting: list[ClaimedMessage]) -> list[ClaimedMessage]:
        """Re-read waited-on claims and their groups: the holder may have settled, released,
        renewed or handed them on. A claim of ours that is unchanged waits on our own lease."""
        context = self._context
        try:
            claims = context.ledger.batch_get_claims(context.stream, [m.key for m in waiting])
            groups = context.ledger.batch_get_groups(
                context.stream, {c.group_id for c in claims.values()}
            )
        except LedgerError as exc:
            log.warning("refresh failed stream=%s error=%s", context.stream, exc)
            return waiting
        still_waiting: list[ClaimedMessage] = []
        for message in waiting:
            claim = claims.get(message.key)
            if message.is_ours and claim == message.claim:
                still_waiting.append(message)
                continue
            holder = groups.get(claim.group_id) if claim is not None else None
            judged = self._state.judge_lost(message.item, claim, holder)
            if judged is not None:
                still_waiting.append(judged)
        return still_waiting

    def _read_back(
        self, due: list[ClaimedMessage], to_send: list[ClaimedMessage]
    ) -> list[ClaimedMessage]:
        """Resolve ``due`` by reading the stream; returns the claims to keep waiting on, and
        adds the messages taken over to ``to_send``."""
        resolver = self._context.resolver
        if resolver is None:  # pragma: no cover - checked by the caller
            return due
        try:
            results = resolver.resolve([m.record for m in due])
        except StreamError as exc:
            # the claims stay as they are: the reconciler settles them once Kinesis answers
            for message in due:
                self._state.in_flight(message, f"read-back failed: {exc}; run 'keo reconcile'")
            return []
        waiting: list[ClaimedMessage] = []
        to_take: list[ClaimedMessage] = []
        for message in due:
            result = results[message.key]
            metrics.READ_BACKS.labels(self._context.stream, result.resolution.value).inc()
            action = read_back_action(result.resolution, ours=message.is_ours, can_resend=True)
            if action is ReadBackAction.WAIT:
                waiting.append(message)
            elif action is ReadBackAction.RESEND:
                to_take.append(message)
            else:
                self._decided(message, action, result)
        if to_take:
            # read-back proved these puts can no longer land: claim a new attempt to send them
            for message in self._takeovers.take(to_take):
                (to_send if message.is_ours else waiting).append(message)
        return waiting

    def _decided(
        self, message: ClaimedMessage, action: ReadBackAction, result: ReadBackResult
    ) -> None:
        state, item, attempt = self._state, message.item, message.claim.attempt
        position = result.position
        if action is ReadBackAction.RECORD and position is not None:
            if not state.resolved(message, position):
                state.report(outcomes.duplicate(item, position, attempt))
        elif action in (ReadBackAction.RECORD, ReadBackAction.DUPLICATE) and position is not None:
            # another's put landed: the key is in the stream once; its group's owner or the
            # reconciler records the position
            state.report(outcomes.duplicate(item, position, attempt))
        elif action is ReadBackAction.UNVERIFIABLE:
            reason = "the claim's window is older than the stream's retention"
            state.report(outcomes.unverifiable(item, reason, attempt))
        else:
            reason = "the stream holds this key with other data"
            state.report(outcomes.conflict(item, reason, attempt=attempt, position=position))
