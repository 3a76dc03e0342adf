"""The exactly-once producer: claim, put, classify, mark, and read back what is ambiguous.

:class:`ExactlyOnceProducer` sends each key once (``dedupe=key``); :class:`ReplayProducer`
sends a named run's rows once however often it is re-run (``dedupe=replay``:
:meth:`ReplayProducer.send_run`, or an attempt per task with :meth:`ReplayProducer.attempt`);
:class:`Reconciler` resolves the claims crashes left in flight; :func:`audit_stream` proves
the stream holds each key once (:func:`audit_rows`, for replay mode: each expected row as many
times as expected). The protocol's decisions are pure (:mod:`producer.protocol`); Kinesis is
reached through :class:`KinesisWriter` and
:class:`KinesisReader`; :func:`build_stack` wires them all from :class:`ProducerSettings`.
The test seam is :mod:`producer.hooks` (no-op unless an entry point injects hooks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dedupe_store.exports import lazy_exports

if TYPE_CHECKING:
    from kinesis_store.reader import KinesisReader as KinesisReader
    from kinesis_store.writer import KinesisWriter as KinesisWriter
    from producer.audit.rows import RowAuditReport as RowAuditReport
    from producer.audit.stream import (
        Anomaly as Anomaly,
    )
    from producer.audit.stream import (
        AuditReport as AuditReport,
    )
    from producer.audit.stream import (
        audit_rows as audit_rows,
    )
    from producer.audit.stream import (
        audit_stream as audit_stream,
    )
    from producer.errors import (
        AuditTooLargeError as AuditTooLargeError,
    )
    from producer.errors import (
        ConfigurationError as ConfigurationError,
    )
    from producer.errors import (
        KeoError as KeoError,
    )
    from producer.errors import (
        ReplayWindowTrimmedError as ReplayWindowTrimmedError,
    )
    from producer.errors import (
        StreamError as StreamError,
    )
    from producer.errors import (
        StreamNotFoundError as StreamNotFoundError,
    )
    from producer.errors import (
        StreamUnavailableError as StreamUnavailableError,
    )
    from producer.errors import (
        UnresolvedKeysError as UnresolvedKeysError,
    )
    from producer.hooks import NO_HOOKS as NO_HOOKS
    from producer.hooks import Hooks as Hooks
    from producer.hooks import Step as Step
    from producer.key.producer import (
        ExactlyOnceProducer as ExactlyOnceProducer,
    )
    from producer.key.producer import (
        ProducerPolicy as ProducerPolicy,
    )
    from producer.outcomes import Outcome as Outcome
    from producer.outcomes import OutcomeStatus as OutcomeStatus
    from producer.protocol import LeasePolicy as LeasePolicy
    from producer.protocol import Message as Message
    from producer.reconcile.reconciler import (
        Reconciler as Reconciler,
    )
    from producer.reconcile.reconciler import (
        ReconcileReport as ReconcileReport,
    )
    from producer.replay.attempt import ReplayAttempt as ReplayAttempt
    from producer.replay.context import ReplayPolicy as ReplayPolicy
    from producer.replay.context import ReplayTask as ReplayTask
    from producer.replay.producer import ReplayProducer as ReplayProducer
    from producer.settings import Dedupe as Dedupe
    from producer.settings import ProducerSettings as ProducerSettings
    from producer.wiring import Stack as Stack
    from producer.wiring import build_stack as build_stack

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "kinesis_store.reader": ("KinesisReader",),
        "kinesis_store.writer": ("KinesisWriter",),
        "producer.audit.stream": (
            "Anomaly",
            "AuditReport",
            "audit_rows",
            "audit_stream",
        ),
        "producer.errors": (
            "AuditTooLargeError",
            "ConfigurationError",
            "KeoError",
            "ReplayWindowTrimmedError",
            "StreamError",
            "StreamNotFoundError",
            "StreamUnavailableError",
            "UnresolvedKeysError",
        ),
        "producer.hooks": (
            "NO_HOOKS",
            "Hooks",
            "Step",
        ),
        "producer.outcomes": (
            "Outcome",
            "OutcomeStatus",
        ),
        "producer.key.producer": (
            "ExactlyOnceProducer",
            "ProducerPolicy",
        ),
        "producer.protocol": (
            "LeasePolicy",
            "Message",
        ),
        "producer.reconcile.reconciler": (
            "Reconciler",
            "ReconcileReport",
        ),
        "producer.replay.attempt": ("ReplayAttempt",),
        "producer.replay.context": (
            "ReplayPolicy",
            "ReplayTask",
        ),
        "producer.replay.producer": ("ReplayProducer",),
        "producer.audit.rows": ("RowAuditReport",),
        "producer.settings": (
            "Dedupe",
            "ProducerSettings",
        ),
        "producer.wiring": (
            "Stack",
            "build_stack",
        ),
    },
)
