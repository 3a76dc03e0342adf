"""Request and response models of the API: its contract, kept apart from the ledger's records.

Times are RFC 3339 in UTC. Positions and digests are strings (sequence numbers exceed 64 bits).
The payload is never returned: only its SHA-256 digest.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, Literal, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    field_validator,
)

from dedupe_store.records import ANY_ROW, MAX_KEY_CHARS, LedgerRecord, ReplayRun, RunExecution
from dedupe_store.states import LedgerState, RunState

MAX_LOOKUP_KEYS = 100


# pydantic refuses a lone surrogate ("\ud800" in JSON) as not a valid string
MessageKey = Annotated[str, StringConstraints(min_length=1, max_length=MAX_KEY_CHARS)]


class DeliveryState(StrEnum):
    """The state of a key in the ledger (the protocol's state machine)."""

    IN_FLIGHT = "IN_FLIGHT"
    DELIVERED = "DELIVERED"
    RELEASED = "RELEASED"
    UNVERIFIABLE = "UNVERIFIABLE"


_DELIVERED_EXAMPLE: dict[str, JsonValue] = {
    "stream": "orders",
    "key": "order-2024-000123",
    "state": "DELIVERED",
    "attempt": 1,
    "owner": "spark-executor-3:4711",
    "payload_digest": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "routing_hash_key": "125682502940294434281236497209743069186",
    "claimed_at": "2024-05-01T12:00:00.120000Z",
    "lease_expires_at": None,
    "stale": False,
    "shard_id": "shardId-000000000001",
    "sequence_number": "49651234567890123456789012345678901234567890123456789012",
    "sub_sequence_number": None,
    "delivered_at": "2024-05-01T12:00:00.480000Z",
    "dedupe_expires_at": "2024-05-08T12:00:00Z",
}

_IN_FLIGHT_EXAMPLE: dict[str, JsonValue] = {
    **_DELIVERED_EXAMPLE,
    "key": "order-2024-000124",
    "state": "IN_FLIGHT",
    "attempt": 2,
    "lease_expires_at": "2024-05-01T12:01:00.120000Z",
    "stale": True,
    "shard_id": None,
    "sequence_number": None,
    "delivered_at": None,
    "dedupe_expires_at": None,
}


class MessageState(BaseModel):
    """Where and when one message key was delivered, or how far its delivery got."""

    model_config = ConfigDict(json_schema_extra={"examples": [_DELIVERED_EXAMPLE]})

    stream: str = Field(description="the Kinesis stream")
    key: str = Field(description="the message key (the record's PartitionKey)")
    state: DeliveryState = Field(
        description=(
            "IN_FLIGHT: claimed, put sent or about to be; DELIVERED: in the stream at the "
            "position below; RELEASED: not in the stream, the next producer of the key sends it; "
            "UNVERIFIABLE: the read-back window reached past the stream's retention"
        )
    )
    attempt: int = Field(ge=1, description="fencing epoch: +1 on every claim or takeover")
    owner: str = Field(description="the producer that holds or held the claim")
    payload_digest: str = Field(description="SHA-256 (hex) of the data and routing key")
    routing_hash_key: str = Field(description="the ExplicitHashKey that picks the shard")
    claimed_at: dt.datetime = Field(description="when the current attempt was claimed")
    lease_expires_at: dt.datetime | None = Field(
        description="while IN_FLIGHT: after this, no put of the claim can still land"
    )
    stale: bool = Field(
        description="IN_FLIGHT with its lease expired: waiting for read-back (the reconciler)"
    )
    shard_id: str | None = Field(description="DELIVERED: the shard holding the record")
    sequence_number: str | None = Field(
        description="DELIVERED: the record's sequence number (unique per shard; compare as integers)"
    )
    sub_sequence_number: int | None = Field(
        description="DELIVERED in an aggregated record: its index inside the aggregate"
    )
    delivered_at: dt.datetime | None = Field(description="when the delivery was recorded")
    dedupe_expires_at: dt.datetime | None = Field(
        description="DELIVERED: the end of the dedupe TTL; after it the key may be sent again"
    )

    @classmethod
    def from_record(cls, record: LedgerRecord, *, now_ms: int) -> MessageState:
        position = record.position
        return cls(
            stream=record.stream,
            key=record.key,
            state=DeliveryState(record.state.value),
            attempt=record.attempt,
            owner=record.owner,
            payload_digest=record.payload_digest,
            routing_hash_key=record.routing_hash_key,
            claimed_at=from_epoch_ms(record.claimed_at_ms),
            lease_expires_at=from_epoch_ms(record.lease_expires_at_ms),
            stale=record.state is LedgerState.IN_FLIGHT and record.lease_expired(now_ms),
            shard_id=position.shard_id if position is not None else None,
            sequence_number=position.sequence_number if position is not None else None,
            sub_sequence_number=position.sub_sequence_number if position is not None else None,
            delivered_at=from_epoch_ms(record.delivered_at_ms),
            dedupe_expires_at=from_epoch_ms(
                record.expires_at_s * 1000 if record.expires_at_s is not None else None
            ),
        )


class LookupRequest(BaseModel):
    """Keys to look up in one stream, answered with consistent reads."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"keys": ["order-2024-000123", "order-2024-000124"]}]},
    )

    keys: list[MessageKey] = Field(
        min_length=1,
        max_length=MAX_LOOKUP_KEYS,
        json_schema_extra={"uniqueItems": True},
        description=f"1..{MAX_LOOKUP_KEYS} distinct keys, each 1..{MAX_KEY_CHARS} characters",
    )

    @field_validator("keys")
    @classmethod
    def _keys_are_distinct(cls, keys: list[str]) -> list[str]:
        # one result per key, in request order: a repeated key has no single place
        seen: set[str] = set()
        for key in keys:
            if key in seen:
                raise ValueError(f"keys must be distinct: {key!r} is repeated")
            seen.add(key)
        return keys


class LookupResult(BaseModel):
    """The answer for one requested key."""

    key: str = Field(description="the key as requested")
    found: bool = Field(description="false: the ledger has no item for the key")
    message: MessageState | None = Field(description="the key's delivery state when found")


class LookupResponse(BaseModel):
    """One result per requested key, in request order."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "stream": "orders",
                    "results": [
                        {"key": "order-2024-000123", "found": True, "message": _DELIVERED_EXAMPLE},
                        {"key": "order-2024-999999", "found": False, "message": None},
                    ],
                }
            ]
        }
    )

    stream: str
    results: list[LookupResult]


class InFlightPage(BaseModel):
    """One page of the claims in flight, read from the sparse in-flight index."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "stream": "orders",
                    "stale_only": True,
                    "as_of": "2024-05-01T12:05:00Z",
                    "items": [_IN_FLIGHT_EXAMPLE],
                    "next_cursor": "eyJ2IjoxLCJzIjoib3JkZXJzIiwiYiI6NH0",
                }
            ]
        }
    )

    stream: str
    stale_only: bool = Field(description="true: only claims whose lease had expired at as_of")
    as_of: dt.datetime = Field(description="the stale cut-off of this listing (its first page)")
    items: list[MessageState] = Field(
        description=(
            "claims still IN_FLIGHT when re-read consistently; a page holds whole claim "
            "groups, so it can hold up to limit + 499 items, or fewer than limit, even none, "
            "while next_cursor is set"
        )
    )
    next_cursor: str | None = Field(
        description="pass as cursor for the next page; null when the listing is complete"
    )


class ExactlyOnceWindow(BaseModel):
    """How long a delivered key suppresses duplicates: min(dedupe TTL, stream retention)."""

    dedupe_ttl_seconds: int = Field(description="how long a DELIVERED item is kept")
    stream_retention_seconds: int | None = Field(
        description="the stream's retention, read from Kinesis (or KEO_STREAM_RETENTION_HOURS); null: unknown"
    )
    window_seconds: int | None = Field(
        description="min(dedupe TTL, retention); null when the retention is unknown (then at most the TTL)"
    )
    limited_by: Literal["dedupe_ttl", "stream_retention"] | None = Field(
        description="which of the two bounds the window; null when the retention is unknown"
    )


class ReconcileRun(BaseModel):
    """One run of the reconciler over a stream's stale claims."""

    started_at: dt.datetime
    finished_at: dt.datetime
    outcomes: dict[str, int] = Field(description="claims resolved, by outcome")


class StreamSummary(BaseModel):
    """The delivery state of a stream at a glance."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "stream": "orders",
                    "as_of": "2024-05-01T12:05:00Z",
                    "in_flight": 12,
                    "stale": 1,
                    "counts_complete": True,
                    "exactly_once_window": {
                        "dedupe_ttl_seconds": 604800,
                        "stream_retention_seconds": 86400,
                        "window_seconds": 86400,
                        "limited_by": "stream_retention",
                    },
                    "last_reconcile": None,
                }
            ]
        }
    )

    stream: str
    as_of: dt.datetime
    in_flight: int = Field(
        ge=0,
        description=(
            "keys listed by the open claim groups of the in-flight index: an upper bound of "
            "the claims in flight (a group lists each key its producer sent, until it settles)"
        ),
    )
    stale: int = Field(
        ge=0, description="of those, the keys of groups whose lease had expired at as_of"
    )
    counts_complete: bool = Field(
        description=(
            "false when counting stopped at the configured cap (KEO_SUMMARY_COUNT_CAP); "
            "the index is eventually consistent, so counts may lag by a moment"
        )
    )
    exactly_once_window: ExactlyOnceWindow
    last_reconcile: ReconcileRun | None = Field(
        description=(
            "the reconciler's last recorded run over this stream; null when none is recorded "
            "(the reconciler has never recorded a run)"
        )
    )


# --- replay-mode runs ----------------------------------------------------------------------------


class ReplayState(StrEnum):
    """A replay-mode run's state in the ledger."""

    OPEN = "OPEN"
    COMPLETE = "COMPLETE"


_EXECUTION_EXAMPLE: dict[str, JsonValue] = {
    "id": "7d41c2b0",
    "started_at": "2024-05-01T12:00:00.120000Z",
    "lease_expires_at": "2024-05-01T12:06:00.120000Z",
    "lease_expired": True,
    "attempts": 8,
    "finished": True,
    "late_rows": 0,
    "superseded": False,
}

_RUN_EXAMPLE: dict[str, JsonValue] = {
    "stream": "orders",
    "run": "orders-to-kinesis/42",
    "state": "COMPLETE",
    "left_open": False,
    "attempts": 8,
    "executions": [_EXECUTION_EXAMPLE],
    "counts": {"rows": 1200, "sent": 1180, "found_on_recovery": 20},
    "completed_at": "2024-05-01T12:00:03.480000Z",
}


class RunExecutionState(BaseModel):
    """One execution of a run: a driver run of a Spark query or batch write (all of its task
    attempts), or one CLI process. Another execution of the same run is a replay of it."""

    model_config = ConfigDict(json_schema_extra={"examples": [_EXECUTION_EXAMPLE]})

    id: str = Field(description="the execution's id, chosen by its driver (or CLI process)")
    started_at: dt.datetime = Field(description="when its first attempt registered on the run")
    lease_expires_at: dt.datetime = Field(
        description="after this, none of its attempts' puts can land (renewed while they run)"
    )
    lease_expired: bool = Field(description="its lease had ended at the time of the answer")
    attempts: int = Field(
        ge=0,
        description=(
            "task attempts registered (Spark tasks and their retries; 1 for a CLI run); a "
            "request the SDK repeated may count twice"
        ),
    )
    finished: bool = Field(
        description="every attempt that registered finished with every put definite"
    )
    late_rows: int | None = Field(
        description=(
            "rows whose ambiguous put an attempt settled by a record found before its lease "
            "was over: that record may be a sibling task's identical copy, so the put may land "
            "until the lease ends, and a replay that does not find one waits for it; null: "
            "more than could be listed (every row waits)"
        )
    )
    superseded: bool = Field(
        description=(
            "a replay of the run recovered its rows: its lease can no longer be renewed and "
            "no attempt of it can register"
        )
    )

    @classmethod
    def from_execution(cls, execution: RunExecution, *, now_ms: int) -> RunExecutionState:
        return cls(
            id=execution.execution_id,
            started_at=from_epoch_ms(execution.started_at_ms),
            lease_expires_at=from_epoch_ms(execution.lease_expires_at_ms),
            # as the ledger's listing of runs left open compares them
            lease_expired=execution.lease_expires_at_ms < now_ms,
            attempts=execution.attempts,
            finished=execution.finished,
            late_rows=None if ANY_ROW in execution.late_rows else len(execution.late_rows),
            superseded=execution.superseded,
        )


class ReplayRunState(BaseModel):
    """A replay-mode run (``dedupe=replay``): a Spark micro-batch ``<query>/<batch id>``, a
    batch write, or a named CLI run; OPEN while its attempts put, COMPLETE once committed."""

    model_config = ConfigDict(json_schema_extra={"examples": [_RUN_EXAMPLE]})

    stream: str = Field(description="the Kinesis stream")
    run: str = Field(description="the run's name: '<query>/<batch id>', or a CLI --run-id")
    state: ReplayState = Field(
        description=(
            "OPEN: attempts register and put; COMPLETE: the driver (or the CLI) committed it, "
            "and a replay of it sends nothing"
        )
    )
    left_open: bool = Field(
        description=(
            "OPEN with every execution's lease ended (or every attempt finished): its driver "
            "did not commit it. Nothing to resend (the ledger holds no rows of it): a replay of the run recovers and "
            "commits it. The reconciler reports such runs"
        )
    )
    attempts: int = Field(ge=0, description="task attempts registered, over every execution")
    executions: list[RunExecutionState] = Field(
        description="every execution (a first run, then its replays), in the order they started"
    )
    counts: dict[str, int] = Field(
        description="what the commit recorded (rows delivered and the like); empty while OPEN"
    )
    completed_at: dt.datetime | None = Field(description="COMPLETE: when it was committed")

    @classmethod
    def from_run(cls, run: ReplayRun, *, now_ms: int) -> ReplayRunState:
        return cls(
            stream=run.stream,
            run=run.run,
            state=ReplayState(run.state.value),
            left_open=run.state is RunState.OPEN and run.leases_ended_before(now_ms),
            attempts=run.attempts,
            executions=[RunExecutionState.from_execution(e, now_ms=now_ms) for e in run.executions],
            counts=dict(run.counts),
            completed_at=from_epoch_ms(run.completed_at_ms),
        )


class OpenRunsPage(BaseModel):
    """The OPEN replay-mode runs of a stream, from the sparse in-flight index."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "stream": "orders",
                    "stale_only": True,
                    "as_of": "2024-05-01T12:10:00Z",
                    "items": [
                        {
                            **_RUN_EXAMPLE,
                            "state": "OPEN",
                            "left_open": True,
                            "counts": {},
                            "completed_at": None,
                        }
                    ],
                    "complete": True,
                }
            ]
        }
    )

    stream: str
    stale_only: bool = Field(description="true: only runs left open past every execution's lease")
    as_of: dt.datetime = Field(description="the time leases were compared with")
    items: list[ReplayRunState] = Field(
        description="OPEN runs, re-read consistently, bucket after bucket of the index"
    )
    complete: bool = Field(
        description="false: more OPEN runs than limit; ask with stale=true, or a larger limit"
    )


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready"] = "ready"
    table: str = Field(description="the ledger table that answered")


def exactly_once_window(dedupe_ttl_s: int, retention_hours: int | None) -> ExactlyOnceWindow:
    if retention_hours is None:
        return ExactlyOnceWindow(
            dedupe_ttl_seconds=dedupe_ttl_s,
            stream_retention_seconds=None,
            window_seconds=None,
            limited_by=None,
        )
    retention_s = retention_hours * 3600
    return ExactlyOnceWindow(
        dedupe_ttl_seconds=dedupe_ttl_s,
        stream_retention_seconds=retention_s,
        window_seconds=min(dedupe_ttl_s, retention_s),
        limited_by="dedupe_ttl" if dedupe_ttl_s <= retention_s else "stream_retention",
    )


@overload
def from_epoch_ms(epoch_ms: int) -> dt.datetime: ...
@overload
def from_epoch_ms(epoch_ms: None) -> None: ...
@overload
def from_epoch_ms(epoch_ms: int | None) -> dt.datetime | None: ...
def from_epoch_ms(epoch_ms: int | None) -> dt.datetime | None:
    if epoch_ms is None:
        return None
    # whole seconds plus milliseconds: exact, where epoch_ms / 1000 would round
    seconds, millis = divmod(epoch_ms, 1000)
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC) + dt.timedelta(milliseconds=millis)
