"""What the ledger contract's cases stage a ledger with: a fixed "now", lease and dedupe TTL, a
stream, two producers and two positions in the stream; a group opened and its keys claimed, one
by one or as the producer claims a group (in batches where the backend can); a replay run's
task attempts and the executions they register.
"""

from __future__ import annotations

from dedupe_store.contract import Ledger
from dedupe_store.errors import LedgerError
from dedupe_store.records import (
    ClaimRequest,
    ClaimResult,
    ClaimStatus,
    Group,
    KeyClaim,
    PendingClaim,
    Position,
    ReplayRun,
    RunAttempt,
    RunExecution,
)
from producer.protocol import Message, explicit_hash_key, payload_digest

T0_MS = 1_700_000_000_000  # a fixed "now": the ledger takes time as an argument
LEASE_MS = 30_000
SKEW_MS = 1_000
TTL_S = 3_600
STREAM = "orders"
ALICE, BOB = "producer-alice", "producer-bob"


def request_for(key: str, data: bytes = b"payload", stream: str = STREAM) -> ClaimRequest:
    hash_key = explicit_hash_key(Message(key, data))
    return ClaimRequest(stream, key, payload_digest(data, hash_key), hash_key)


def open_group(
    ledger: Ledger, *keys: str, owner: str = ALICE, now_ms: int = T0_MS, stream: str = STREAM
) -> Group:
    return ledger.open_group(stream, keys, owner=owner, now_ms=now_ms, lease_ms=LEASE_MS)


def claim(ledger: Ledger, key: str, group: Group, *, now_ms: int = T0_MS) -> KeyClaim:
    result = ledger.claim(request_for(key, stream=group.stream), group, now_ms=now_ms)
    assert result.status is ClaimStatus.WON, result
    assert result.claim is not None
    return result.claim


def claimed(ledger: Ledger, *keys: str, owner: str = ALICE, now_ms: int = T0_MS) -> Group:
    """A group of ``keys``, each claimed for it."""
    group = open_group(ledger, *keys, owner=owner, now_ms=now_ms)
    for key in keys:
        claim(ledger, key, group, now_ms=now_ms)
    return group


POSITION = Position(
    "shardId-000000000001", "49590338271490256608559692538361571095921575989136588898"
)
LATER = Position("shardId-000000000001", "49590338271490256608559692538361571095921575989136588999")


# --- key claims in batches -----------------------------------------------------------------------


def in_two_halves(
    ledger: Ledger, requests: list[ClaimRequest], group: Group, *, now_ms: int
) -> list[ClaimResult | LedgerError]:
    """Each request claimed as the producer claims a group (``SendContext.claim_all``, one
    call after the other here): ``insert_claims`` in batches of ``claims_per_request``,
    ``judge_claims`` of all their pending claims together, then a single ``claim`` of each
    request the judge handed back. A result or the ledger error each key got, in order."""
    size = ledger.claims_per_request
    inserted = [
        result
        for start in range(0, len(requests), size)
        for result in ledger.insert_claims(requests[start : start + size], group, now_ms=now_ms)
    ]
    verdicts = iter(
        ledger.judge_claims([r for r in inserted if isinstance(r, PendingClaim)], now_ms=now_ms)
    )
    results: list[ClaimResult | LedgerError] = []
    for result in inserted:
        verdict = next(verdicts) if isinstance(result, PendingClaim) else result
        if isinstance(verdict, ClaimRequest):
            try:
                verdict = ledger.claim(verdict, group, now_ms=now_ms)
            except LedgerError as exc:  # one key's error never fails the others'
                verdict = exc
        results.append(verdict)
    return results


# --- replay-mode runs ----------------------------------------------------------------------------

RUN = "query-a/7"


def attempt(
    attempt_id: str,
    *,
    execution: str = "exec-1",
    task: str = "0",
    task_attempt: int = 0,
    started_at_ms: int = T0_MS,
) -> RunAttempt:
    return RunAttempt(
        attempt_id=attempt_id,
        execution_id=execution,
        task=task,
        task_attempt=task_attempt,
        started_at_ms=started_at_ms,
        lease_expires_at_ms=started_at_ms + LEASE_MS,
    )


def execution(
    execution_id: str, *attempts: RunAttempt, finished: int = 0, superseded: bool = False
) -> RunExecution:
    """The execution ``attempts`` registered (the first one's bounds), ``finished`` of them
    finished."""
    first = attempts[0]
    return RunExecution(
        execution_id,
        first.started_at_ms,
        first.lease_expires_at_ms,
        superseded=superseded,
        attempts=len(attempts),
        open_tags=sum(a.tag for a in attempts[finished:]),
    )


def execution_of(run: ReplayRun | None, execution_id: str) -> RunExecution:
    """The execution ``execution_id`` of ``run``, which must have it."""
    assert run is not None
    found = run.execution(execution_id)
    assert found is not None
    return found
