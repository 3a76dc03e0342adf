"""What every part of a send shares (:class:`SendContext`): the stream, its clients, clock and
policy, and the ledger calls the parts make, timed into the metrics, with a ledger failure
returned as a value (the caller decides what it means for each message)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from tenacity import wait_exponential

from dedupe_store.clock import Clock
from dedupe_store.contract import Ledger
from dedupe_store.errors import LedgerError
from dedupe_store.records import ClaimRequest, ClaimResult, Group, KeyClaim, PendingClaim
from kinesis_store.shards import OpenShards
from kinesis_store.writer import KinesisWriter
from producer import metrics
from producer.hooks import Hooks
from producer.key.readback import ReadBackResolver
from producer.protocol import MAX_GROUP_KEYS, LeasePolicy, PreparedMessage, chunked
from producer.retries import (
    CLAIM_WAIT_INITIAL_MS,
    CLAIM_WAIT_MAX_MS,
    PUT_MAX_ATTEMPTS,
    PUT_RETRY_INITIAL_MS,
    PUT_RETRY_MAX_MS,
    wait_full_jitter,
)

if TYPE_CHECKING:
    from tenacity.wait import wait_base

__all__ = ["LedgerCalls", "ProducerPolicy", "SendContext"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class ProducerPolicy:
    lease: LeasePolicy
    put_max_attempts: int = PUT_MAX_ATTEMPTS
    retry_initial_ms: int = PUT_RETRY_INITIAL_MS
    retry_max_ms: int = PUT_RETRY_MAX_MS
    wait_initial_ms: int = CLAIM_WAIT_INITIAL_MS
    wait_max_ms: int = CLAIM_WAIT_MAX_MS
    ledger_concurrency: int = 32
    store_payload_max_bytes: int | None = None  # None: never store payloads in claims
    group_size: int = MAX_GROUP_KEYS
    groups_in_flight: int = 3  # ProducerSettings.groups_in_flight says why


class LedgerCalls:
    """The ledger calls the producer and the reconciler make alike, timed into the metrics,
    a failure returned as a value: the caller decides what it means for each message."""

    def __init__(
        self, *, stream: str, owner: str, ledger: Ledger, clock: Clock, lease: LeasePolicy
    ) -> None:
        self.stream = stream
        self.owner = owner
        self.ledger = ledger
        self.clock = clock
        self.lease = lease

    def open_group(self, keys: list[str]) -> Group | LedgerError:
        started = time.perf_counter()
        try:
            return self.ledger.open_group(
                self.stream,
                keys,
                owner=self.owner,
                now_ms=self.clock.now_ms(),
                lease_ms=self.lease.lease_ms,
            )
        except LedgerError as exc:
            return exc
        finally:
            metrics.LEDGER_SECONDS.labels("open").observe(time.perf_counter() - started)

    def renew(self, group: Group) -> Group | None:
        """``group`` with a new lease from now, or None when it cannot be renewed (it expired,
        was taken over, or the write failed)."""
        try:
            renewed = self.ledger.renew_lease(
                group,
                now_ms=self.clock.now_ms(),
                lease_ms=self.lease.lease_ms,
                skew_ms=self.lease.skew_ms,
            )
        except LedgerError as exc:
            log.warning("lease renewal failed stream=%s error=%s", self.stream, exc)
            return None
        return renewed.current if renewed.applied else None

    def take_over_key(self, claim: KeyClaim, group: Group) -> ClaimResult | LedgerError:
        try:
            return self.ledger.take_over_key(claim, group, now_ms=self.clock.now_ms())
        except LedgerError as exc:
            return exc

    def group_of(self, claim: KeyClaim | None) -> Group | None:
        """The group ``claim`` names, read consistently; None when it is gone or unreadable."""
        if claim is None:
            return None
        try:
            return self.ledger.get_group(self.stream, claim.group_id)
        except LedgerError:
            return None


class SendContext(LedgerCalls):
    """The stream, clients, clock, policy and waits one producer's sends share."""

    def __init__(
        self,
        *,
        stream: str,
        owner: str,
        ledger: Ledger,
        writer: KinesisWriter,
        clock: Clock,
        policy: ProducerPolicy,
        resolver: ReadBackResolver | None,
        executor: Executor,
        hooks: Hooks,
        sleep: Callable[[float], None],
        rng: random.Random,
        shards: OpenShards | None,
        max_record_bytes: int,
    ) -> None:
        super().__init__(stream=stream, owner=owner, ledger=ledger, clock=clock, lease=policy.lease)
        self.writer = writer
        self.policy = policy
        self.resolver = resolver
        self.hooks = hooks
        self.sleep = sleep
        self.shards = shards  # aggregation is on when the stream's shards are given
        self.max_record_bytes = max_record_bytes
        self.interrupted = threading.Event()
        self._executor = executor
        self.resend_wait: wait_base = wait_full_jitter(
            initial_s=policy.retry_initial_ms / 1000, max_s=policy.retry_max_ms / 1000, rng=rng
        )
        # waiting on another owner's claim: no contention to spread, so no jitter
        self.claim_wait: wait_base = wait_exponential(
            multiplier=policy.wait_initial_ms / 1000, max=policy.wait_max_ms / 1000
        )

    def map(self, fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
        """``fn`` over ``items`` on the ledger pool: its latency is hidden by concurrency."""
        items = list(items)
        if len(items) <= 1:
            return [fn(item) for item in items]
        return list(self._executor.map(fn, items))

    def claim_all(
        self, items: Sequence[PreparedMessage], group: Group
    ) -> list[ClaimResult | LedgerError]:
        """Claim each item's key for ``group``; a result or a ledger error each, in order.
        ``claims_per_request`` keys to a ledger request (25 where DynamoDB runs PartiQL
        batches, one where it does not), the requests concurrent on the ledger pool. The keys
        those leave pending (not new) are judged together, ``judged_per_request`` (100) to a
        read, concurrent too, and those a claim can still take are claimed one each: a group of
        new keys makes no read, a resend of 500 delivered keys 20 batches and 5 reads."""
        requests = [self._claim_request(item) for item in items]
        inserted = self._each_batch(
            requests,
            self.ledger.claims_per_request,
            "claim",
            lambda batch: self.ledger.insert_claims(batch, group, now_ms=self.clock.now_ms()),
        )
        pending = [r for r in inserted if isinstance(r, PendingClaim)]
        verdicts = iter(
            self._each_batch(
                pending,
                self.ledger.judged_per_request,
                "judge",
                lambda batch: self.ledger.judge_claims(batch, now_ms=self.clock.now_ms()),
            )
        )
        judged = [next(verdicts) if isinstance(r, PendingClaim) else r for r in inserted]
        singles = iter(
            self.map(
                lambda request: self._claim_one(request, group),
                [r for r in judged if isinstance(r, ClaimRequest)],
            )
        )
        results = [next(singles) if isinstance(r, ClaimRequest) else r for r in judged]
        for result in results:
            outcome = "error" if isinstance(result, LedgerError) else result.status.value.lower()
            metrics.CLAIMS.labels(self.stream, outcome).inc()
        return results

    def _each_batch(
        self,
        items: Sequence[_T],
        size: int,
        step: str,
        call: Callable[[Sequence[_T]], list[_R]],
    ) -> list[_R]:
        """``call`` on ``items`` in batches of ``size``, concurrent on the ledger pool, each
        timed into the metrics as ``step``; the answers joined, in order."""

        def timed(batch: Sequence[_T]) -> list[_R]:
            started = time.perf_counter()
            try:
                return call(batch)
            finally:
                metrics.LEDGER_SECONDS.labels(step).observe(time.perf_counter() - started)

        return [answer for answers in self.map(timed, chunked(items, size)) for answer in answers]

    def _claim_one(self, request: ClaimRequest, group: Group) -> ClaimResult | LedgerError:
        started = time.perf_counter()
        try:
            return self.ledger.claim(request, group, now_ms=self.clock.now_ms())
        except LedgerError as exc:
            return exc
        finally:
            metrics.LEDGER_SECONDS.labels("claim").observe(time.perf_counter() - started)

    def _claim_request(self, item: PreparedMessage) -> ClaimRequest:
        payload = None
        limit = self.policy.store_payload_max_bytes
        if limit is not None and len(item.message.data) <= limit:
            payload = item.message.data
        return ClaimRequest(
            self.stream, item.key, item.payload_digest, item.explicit_hash_key, payload
        )
