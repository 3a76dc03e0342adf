"""What a replay-mode attempt is given: who it is (:class:`ReplayTask`), the rules it keeps
(:class:`ReplayPolicy`), and what it shares with its producer and the put loop
(:class:`ReplayContext`). Plain values; nothing here does I/O."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dedupe_store.clock import Clock
from dedupe_store.contract import Ledger
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import OpenShards
from kinesis_store.writer import KinesisWriter
from producer.hooks import Hooks
from producer.protocol import LeasePolicy
from producer.retries import PUT_MAX_ATTEMPTS, PUT_RETRY_INITIAL_MS, PUT_RETRY_MAX_MS

if TYPE_CHECKING:
    from tenacity.wait import wait_base

__all__ = ["ReplayContext", "ReplayPolicy", "ReplayTask"]


@dataclass(frozen=True, slots=True)
class ReplayTask:
    """Who puts a run's rows: ``execution_id`` names one driver run of a query (or one CLI
    process), ``task`` Spark's partition, ``task_attempt`` an ordinal that grows with each
    attempt of that task in the execution (Spark's task attempt id)."""

    run: str
    execution_id: str
    task: str = "0"
    task_attempt: int = 0


@dataclass(frozen=True, slots=True)
class ReplayPolicy:
    lease: LeasePolicy
    put_max_attempts: int = PUT_MAX_ATTEMPTS
    retry_initial_ms: int = PUT_RETRY_INITIAL_MS
    retry_max_ms: int = PUT_RETRY_MAX_MS
    wait_poll_ms: int = 1_000  # how often a wait looks at the clock, the lease and the interrupt
    max_wait_ms: int | None = None  # the longest wait for a lease; None: as long as it runs
    # a recovery whose windows reach past the trim horizon: fail (nothing sent), or send the
    # rows not found anyway (duplicates possible)
    send_past_retention: bool = False


@dataclass
class ReplayContext:
    """What an attempt shares with its producer (and the put loop: a PutContext)."""

    stream: str
    ledger: Ledger
    writer: KinesisWriter
    reader: KinesisReader
    clock: Clock
    policy: ReplayPolicy
    hooks: Hooks
    sleep: Callable[[float], None]
    shards: OpenShards | None
    max_record_bytes: int
    resend_wait: wait_base
    retention_ms: int
    interrupted: threading.Event = field(default_factory=threading.Event)

    @property
    def keep_s(self) -> int:
        """How long a run's items must live at least: the stream's retention (recovery reads
        the stream back that far)."""
        return self.retention_ms // 1000

    @property
    def lease(self) -> LeasePolicy:
        return self.policy.lease
