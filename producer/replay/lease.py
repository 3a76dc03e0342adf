"""An attempt's own lease (:class:`AttemptLease`): renewed when a put sent now could outlive
it, and waits for another lease to be over for every clock while it is kept.

A renewal reads the run's item, and extends its execution's lease there when no sibling did
within the last twentieth of a lease (:data:`dedupe_store.runs.RENEWALS_SHARE_EXTENSION`). The
tasks of a batch start together, so their leases run short together: T tasks longer than a
lease's slack (the lease less the send margin: 55 s with the fence's defaults) would renew T
times in the same second, each writing its task's item and reading the run's. So each attempt
renews up to half the slack early, by a fraction its id fixes (:func:`early_renewal_ms`): their
renewals spread over that half (27 s by default), and stay spread.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Final

from dedupe_store.errors import LedgerError
from dedupe_store.records import RunAttempt
from producer.protocol import LeasePolicy
from producer.replay.context import ReplayContext, ReplayTask

__all__ = ["AttemptLease", "early_renewal_ms"]

log = logging.getLogger(__name__)

# an early renewal the ledger failed is tried again this much later, while the lease is safe
_EARLY_RETRY_MS: Final = 1_000


def early_renewal_ms(lease: LeasePolicy, attempt_id: str) -> int:
    """How long before it must an attempt renews its lease: a fraction of half the slack (the
    lease less the send margin), fixed by the attempt's id, uniform over the attempts."""
    slack_ms = max(0, lease.lease_ms - lease.send_margin_ms)
    digest = hashlib.blake2b(attempt_id.encode(), digest_size=4).digest()
    return slack_ms * int.from_bytes(digest, "big") // (2 * 2**32)


class AttemptLease:
    """The lease ``me`` registered with, ending at ``end_ms`` (its own, or its execution's
    when that ends first); lost once a renewal is refused."""

    def __init__(self, context: ReplayContext, task: ReplayTask, me: RunAttempt) -> None:
        self._context = context
        self._task = task
        self._me = me
        self.end_ms = me.lease_expires_at_ms
        self._lost = False
        self._early_ms = early_renewal_ms(context.lease, me.attempt_id)
        self._early_retry_at_ms = 0  # after an early renewal the ledger failed

    def keep(self) -> bool:
        """Renew the lease when a put sent now could outlive it (early: :func:`early_renewal_ms`);
        False once it cannot be kept (superseded, ran out, the run completed, or the ledger
        failed while a put sent now could outlive it)."""
        context = self._context
        lease = context.lease
        now_ms = context.clock.now_ms()
        if self._lost:
            return False
        if lease.safe_to_send(self.end_ms - self._early_ms, now_ms):
            return True
        safe = lease.safe_to_send(self.end_ms, now_ms)
        if safe and now_ms < self._early_retry_at_ms:
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
            self._early_retry_at_ms = now_ms + _EARLY_RETRY_MS
            return safe
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
