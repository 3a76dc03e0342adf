"""The ledger: who claimed which key, where it landed, and the batches Spark finished.

One DynamoDB table holds a key item per message key (its state, attempt and claim group), a
group item per claim group (its owner, lease, members and their positions), and the Spark
batch records. The state machine (:mod:`dedupe_store.states`) and the plain records
(:mod:`dedupe_store.records`) are pure; :class:`DynamoDBLedger` is the one adapter, and every
backend meets :class:`Ledger` (:mod:`dedupe_store.contract`). The lowest layer: it imports no
other package of the project.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dedupe_store.exports import lazy_exports

if TYPE_CHECKING:
    from dedupe_store.clock import Clock, ManualClock, SkewedClock, SystemClock
    from dedupe_store.contract import Ledger, LedgerReader
    from dedupe_store.errors import (
        DYNAMODB_THROTTLING_CODES,
        InvalidTransitionError,
        LedgerError,
        LedgerSchemaError,
        LedgerThrottledError,
        LedgerUnavailableError,
        aws_error_code,
    )
    from dedupe_store.ledger import DynamoDBLedger
    from dedupe_store.records import (
        AttemptRenewal,
        BatchRecord,
        ClaimRequest,
        ClaimResult,
        ClaimStatus,
        Group,
        GroupUpdate,
        KeyClaim,
        KeyUpdate,
        LedgerRecord,
        Position,
        ReplayRun,
        RunAttempt,
        RunRecord,
        RunRegistration,
    )
    from dedupe_store.settings import LedgerSettings
    from dedupe_store.states import GroupState, KeyState, LedgerState, RunState

__getattr__ = lazy_exports(
    __name__,
    {
        "dedupe_store.clock": (
            "Clock",
            "ManualClock",
            "SkewedClock",
            "SystemClock",
        ),
        "dedupe_store.contract": (
            "Ledger",
            "LedgerReader",
        ),
        "dedupe_store.errors": (
            "DYNAMODB_THROTTLING_CODES",
            "InvalidTransitionError",
            "LedgerError",
            "LedgerSchemaError",
            "LedgerThrottledError",
            "LedgerUnavailableError",
            "aws_error_code",
        ),
        "dedupe_store.ledger": ("DynamoDBLedger",),
        "dedupe_store.records": (
            "AttemptRenewal",
            "BatchRecord",
            "ClaimRequest",
            "ClaimResult",
            "ClaimStatus",
            "Group",
            "GroupUpdate",
            "KeyClaim",
            "KeyUpdate",
            "LedgerRecord",
            "Position",
            "ReplayRun",
            "RunAttempt",
            "RunRecord",
            "RunRegistration",
        ),
        "dedupe_store.settings": ("LedgerSettings",),
        "dedupe_store.states": (
            "GroupState",
            "KeyState",
            "LedgerState",
            "RunState",
        ),
    },
)

__all__ = [
    "DYNAMODB_THROTTLING_CODES",
    "AttemptRenewal",
    "BatchRecord",
    "ClaimRequest",
    "ClaimResult",
    "ClaimStatus",
    "Clock",
    "DynamoDBLedger",
    "Group",
    "GroupState",
    "GroupUpdate",
    "InvalidTransitionError",
    "KeyClaim",
    "KeyState",
    "KeyUpdate",
    "Ledger",
    "LedgerError",
    "LedgerReader",
    "LedgerRecord",
    "LedgerSchemaError",
    "LedgerSettings",
    "LedgerState",
    "LedgerThrottledError",
    "LedgerUnavailableError",
    "ManualClock",
    "Position",
    "ReplayRun",
    "RunAttempt",
    "RunRecord",
    "RunRegistration",
    "RunState",
    "SkewedClock",
    "SystemClock",
    "aws_error_code",
]
