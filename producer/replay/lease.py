"""An attempt's own lease (:class:`AttemptLease`): renewed when a put sent now could outlive
it, and waits for another lease to be over for every clock while it is kept."""

from __future__ import annotations

import logging

from dedupe_store.errors import LedgerError
from dedupe_store.records import RunAttempt
from producer.replay.context import ReplayContext, ReplayTask

__all__ = ["AttemptLease"]

log = logging.getLogger(__name__)


class AttemptLease:
    """The lease ``me`` registered with, ending at ``end_ms`` (its own, or its execution's
    when that ends first); lost once a renewal is refused."""

    def __init__(self, context: ReplayContext, task: ReplayTask, me: RunAttempt) -> None:
        self._context = context
        self._task = task
        self._me = me
        self.end_ms = me.lease_expires_at_ms
        self._lost = False

    def keep(self) -> bool:
        """Renew the lease when a put sent now could outlive it; False once it cannot be
        (superseded, ran out, the run completed, or the ledger failed)."""
        context = self._context
        lease = context.lease
        now_ms = context.clock.now_ms()
        if self._lost:
            return False
        if lease.safe_to_send(self.end_ms, now_ms):
            return True
        try:
            renewal = context.ledger.renew_attempt(
                context.stream,
                self._task.run,
                self._me,
                now_ms=now_ms,
                lease_ms=lease.lease_ms,
                skew_ms=lease.skew_ms,
                keep_s=context.keep_s,
            )
        except LedgerError as exc:
            log.warning(
                "replay lease renewal failed stream=%s run=%s error=%s",
                context.stream,
                self._task.run,
                exc,
            )
            return False
        if not renewal.applied or renewal.lease_expires_at_ms is None:
            self._lost = True
            log.warning(
                "replay attempt lease lost stream=%s run=%s attempt=%s refused=%s",
                context.stream,
                self._task.run,
                self._me.attempt_id,
                renewal.refused,
            )
            return False
        self.end_ms = renewal.lease_expires_at_ms
        return True

    def wait_until_over(self, lease_end_ms: int) -> bool:
        """Wait until a lease that ends at ``lease_end_ms`` is over for every clock, keeping
        this one; False when interrupted, the wait would outlast ``max_wait_ms``, or this
        lease was lost."""
        context = self._context
        policy = context.policy
        lease = context.lease
        started_ms = context.clock.now_ms()
        wait_ms = lease_end_ms + lease.skew_ms - started_ms
        if policy.max_wait_ms is not None and wait_ms > policy.max_wait_ms:
            return False
        if wait_ms > 0:
            log.info(
                "replay attempt waiting stream=%s run=%s attempt=%s wait_s=%.1f",
                context.stream,
                self._task.run,
                self._me.attempt_id,
                wait_ms / 1000,
            )
        while not lease.expired_for_everyone(lease_end_ms, context.clock.now_ms()):
            if context.interrupted.is_set() or not self.keep():
                return False
            left_ms = lease_end_ms + lease.skew_ms - context.clock.now_ms()
            context.sleep(max(0.0, min(policy.wait_poll_ms, left_ms)) / 1000)
        return True
