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
    from kinesis_store.reader import KinesisReader
    from kinesis_store.writer import KinesisWriter
    from producer.audit.rows import RowAuditReport
    from producer.audit.stream import Anomaly, AuditReport, audit_rows, audit_stream
    from producer.errors import (
        AuditTooLargeError,
        ConfigurationError,
        KeoError,
        ReplayWindowTrimmedError,
        StreamError,
        StreamNotFoundError,
        StreamUnavailableError,
        UnresolvedKeysError,
    )
    from producer.hooks import NO_HOOKS, Hooks, Step
    from producer.key.producer import ExactlyOnceProducer, ProducerPolicy
    from producer.outcomes import Outcome, OutcomeStatus
    from producer.protocol import LeasePolicy, Message
    from producer.reconcile.reconciler import Reconciler, ReconcileReport
    from producer.replay.attempt import ReplayAttempt
    from producer.replay.context import ReplayPolicy, ReplayTask
    from producer.replay.producer import ReplayProducer
    from producer.settings import Dedupe, ProducerSettings
    from producer.wiring import Stack, build_stack

__getattr__ = lazy_exports(
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

__all__ = [
    "NO_HOOKS",
    "Anomaly",
    "AuditReport",
    "AuditTooLargeError",
    "ConfigurationError",
    "Dedupe",
    "ExactlyOnceProducer",
    "Hooks",
    "KeoError",
    "KinesisReader",
    "KinesisWriter",
    "LeasePolicy",
    "Message",
    "Outcome",
    "OutcomeStatus",
    "ProducerPolicy",
    "ProducerSettings",
    "ReconcileReport",
    "Reconciler",
    "ReplayAttempt",
    "ReplayPolicy",
    "ReplayProducer",
    "ReplayTask",
    "ReplayWindowTrimmedError",
    "RowAuditReport",
    "Stack",
    "Step",
    "StreamError",
    "StreamNotFoundError",
    "StreamUnavailableError",
    "UnresolvedKeysError",
    "audit_rows",
    "audit_stream",
    "build_stack",
]
