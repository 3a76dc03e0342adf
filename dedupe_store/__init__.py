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
    from dedupe_store.clock import (
        Clock as Clock,
    )
    from dedupe_store.clock import (
        ManualClock as ManualClock,
    )
    from dedupe_store.clock import (
        SkewedClock as SkewedClock,
    )
    from dedupe_store.clock import (
        SystemClock as SystemClock,
    )
    from dedupe_store.contract import Ledger as Ledger
    from dedupe_store.contract import LedgerReader as LedgerReader
    from dedupe_store.errors import (
        DYNAMODB_THROTTLING_CODES as DYNAMODB_THROTTLING_CODES,
    )
    from dedupe_store.errors import (
        InvalidTransitionError as InvalidTransitionError,
    )
    from dedupe_store.errors import (
        LedgerError as LedgerError,
    )
    from dedupe_store.errors import (
        LedgerSchemaError as LedgerSchemaError,
    )
    from dedupe_store.errors import (
        LedgerThrottledError as LedgerThrottledError,
    )
    from dedupe_store.errors import (
        LedgerUnavailableError as LedgerUnavailableError,
    )
    from dedupe_store.errors import (
        aws_error_code as aws_error_code,
    )
    from dedupe_store.ledger import DynamoDBLedger as DynamoDBLedger
    from dedupe_store.records import (
        AttemptRenewal as AttemptRenewal,
    )
    from dedupe_store.records import (
        BatchRecord as BatchRecord,
    )
    from dedupe_store.records import (
        ClaimRequest as ClaimRequest,
    )
    from dedupe_store.records import (
        ClaimResult as ClaimResult,
    )
    from dedupe_store.records import (
        ClaimStatus as ClaimStatus,
    )
    from dedupe_store.records import (
        Group as Group,
    )
    from dedupe_store.records import (
        GroupUpdate as GroupUpdate,
    )
    from dedupe_store.records import (
        KeyClaim as KeyClaim,
    )
    from dedupe_store.records import (
        KeyUpdate as KeyUpdate,
    )
    from dedupe_store.records import (
        LedgerRecord as LedgerRecord,
    )
    from dedupe_store.records import (
        Position as Position,
    )
    from dedupe_store.records import (
        ReplayRun as ReplayRun,
    )
    from dedupe_store.records import (
        RunAttempt as RunAttempt,
    )
    from dedupe_store.records import (
        RunRecord as RunRecord,
    )
    from dedupe_store.records import (
        RunRegistration as RunRegistration,
    )
    from dedupe_store.settings import LedgerSettings as LedgerSettings
    from dedupe_store.states import (
        GroupState as GroupState,
    )
    from dedupe_store.states import (
        KeyState as KeyState,
    )
    from dedupe_store.states import (
        LedgerState as LedgerState,
    )
    from dedupe_store.states import (
        RunState as RunState,
    )

__getattr__, __all__ = lazy_exports(
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
