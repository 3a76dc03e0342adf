"""Prometheus metrics of the producer and the reconciler (the default registry).

Names follow Prometheus's conventions: a unit in the name (``_seconds``, ``_units``), counters
end in ``_total``, and labels take few values: the stream, an outcome, an operation, an error
code. Never a message key, a group id or a payload. ``keo send`` and ``keo reconcile`` expose
them (``--metrics-port``, ``--metrics-file``); ``docs/grafana-dashboard.json`` charts them.

The ledger's requests are counted on its botocore client (:func:`count_ledger_calls`), so every
call is seen, whichever code path made it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import Counter, Gauge, Histogram

from dedupe_store.billing import item_size_bytes, write_units
from dedupe_store.errors import DYNAMODB_THROTTLING_CODES, aws_error_code

if TYPE_CHECKING:
    from kinesis_store.kpl import MalformedAggregate

log = logging.getLogger(__name__)

OUTCOMES = Counter("keo_messages_total", "Messages by final outcome", ["stream", "outcome"])
CLAIMS = Counter("keo_claims_total", "Ledger claims by result", ["stream", "result"])
PUT_REQUESTS = Counter("keo_put_requests_total", "PutRecords calls", ["stream"])
PUT_RECORD_ERRORS = Counter(
    "keo_put_record_errors_total", "Records not written or ambiguous, by code", ["stream", "code"]
)
PUT_PACED_SECONDS = Counter(
    "keo_put_paced_seconds_total",
    "Seconds PutRecords requests waited for their shards' share of the write quota "
    "(KEO_PUT_RATE_LIMIT_PERCENT; requests waiting side by side each count)",
    ["stream"],
)
PUT_SECONDS = Histogram(
    "keo_put_request_duration_seconds",
    "PutRecords latency",
    ["stream"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
LEDGER_SECONDS = Histogram(
    "keo_ledger_call_duration_seconds",
    "Ledger call latency, by protocol step (open, claim, judge, settle)",
    ["operation"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
READ_BACKS = Counter(
    "keo_read_backs_total",
    "Claims resolved by reading the stream back, by resolution",
    ["stream", "resolution"],
)

# --- the ledger's DynamoDB requests --------------------------------------------------------------

LEDGER_REQUESTS = Counter(
    "keo_ledger_requests_total",
    "DynamoDB requests of the ledger, by operation and result "
    "(ok, condition_failed, throttled, error); SDK retries are not counted again",
    ["operation", "result"],
)
LEDGER_WRITE_UNITS = Counter(
    "keo_ledger_write_units_total",
    "Table write units of the ledger's writes, estimated from item sizes as AWS bills them "
    "(1 KB each, at least 1 per write, failed conditions included; index writes not included)",
    ["operation"],
)

# --- the reconciler ---------------------------------------------------------------------------

RECONCILE_RUNS = Counter(
    "keo_reconcile_runs_total", "Reconciler passes over a stream's stale claim groups", ["stream"]
)
RECONCILE_CLAIMS = Counter(
    "keo_reconcile_claims_total",
    "Stale claims the reconciler resolved or left, by outcome (delivered, resent, released, "
    "unverifiable, conflicts, pending, lost_races, errors)",
    ["stream", "outcome"],
)
STALE_GROUPS = Gauge(
    "keo_reconcile_stale_groups",
    "Stale claim groups the last pass took over (left OPEN by a producer past its lease)",
    ["stream"],
)
LAST_RECONCILE = Gauge(
    "keo_reconcile_last_run_timestamp_seconds",
    "When the last reconciler pass over the stream finished (Unix time)",
    ["stream"],
)

# --- replay mode (dedupe=replay) -----------------------------------------------------------------
#
# What a replay-mode writer counts: a run is a Spark micro-batch, a batch write or a named CLI
# run; an attempt is a Spark task attempt or a CLI process (docs: DESIGN.md "Replay mode").

REPLAY_RUNS = Counter(
    "keo_replay_runs_total",
    "Replay-mode runs by result: completed (this writer marked the run COMPLETE), skipped (the "
    "run was COMPLETE already: a replay sent nothing)",
    ["stream", "result"],
)
REPLAY_ATTEMPTS = Counter(
    "keo_replay_attempts_total",
    "Replay-mode attempts by the step their recovery plan took: FAST_PATH (no earlier attempt: "
    "plain puts), RECOVER (earlier attempts' windows read back), WAIT (an earlier attempt's lease "
    "still ran), DONE (the run was COMPLETE: nothing sent)",
    ["stream", "step"],
)
REPLAY_RECOVERIES = Counter(
    "keo_replay_recoveries_total",
    "Replay-mode attempts that read back the rows of earlier attempts of their run",
    ["stream"],
)
REPLAY_ROWS_FOUND = Counter(
    "keo_replay_rows_found_total",
    "Rows a recovery found in the stream (same key and data, counted as a multiset): not sent "
    "again",
    ["stream"],
)
REPLAY_PAST_RETENTION = Counter(
    "keo_replay_past_retention_total",
    "Replay-mode recoveries whose earlier attempts' windows reach past the stream's trim "
    "horizon (what they put is partly gone): failed (nothing sent), or sent anyway "
    "(KEO_REPLAY_PAST_RETENTION=send: duplicates possible)",
    ["stream", "resolution"],
)
REPLAY_ROWS_MATCHED_AMBIGUOUSLY = Counter(
    "keo_replay_rows_matched_ambiguously_total",
    "Replay-mode rows matched (found from an earlier attempt, or an ambiguous put found) beside "
    "an identical record (same key and data) left unmatched in the window read: another "
    "writer's copy was there, so the one taken may be it (one copy short); key mode counts "
    "such rows exactly",
    ["stream"],
)
REPLAY_RUNS_OPEN = Gauge(
    "keo_replay_runs_open",
    "Replay-mode runs the last reconciler pass found left OPEN past every attempt's lease (a "
    "driver that did not commit; nothing to resend: a replay of the run ends it, or its TTL)",
    ["stream"],
)
# --- what a KCL consumer does not get of what the stream holds (read-back, reconciler, audit) -----

DROPPED_OUTSIDE_SHARD: Final = "outside_shard"
DROPPED_MALFORMED: Final = "malformed_aggregate"
READ_DROPPED = Counter(
    "keo_read_dropped_user_records_total",
    "User records read from the stream that a KCL consumer does not get, by reason: "
    "outside_shard (every member of an aggregate that has a member outside its shard's hash "
    "range), malformed_aggregate (the members of a malformed aggregate from its fault on)",
    ["stream", "reason"],
)
MALFORMED_AGGREGATES = Counter(
    "keo_malformed_aggregates_total",
    "Records read with the KPL magic and a valid MD5 that could not be read whole: read as the "
    "KCL reads them (the members before the fault, or the record raw), logged with shard and "
    "sequence number",
    ["stream"],
)


def count_malformed(stream: str) -> Callable[[MalformedAggregate], None]:
    """A reader's ``on_malformed`` that counts each malformed aggregate of ``stream``."""

    def count(fault: MalformedAggregate) -> None:
        MALFORMED_AGGREGATES.labels(stream).inc()
        if fault.dropped:
            READ_DROPPED.labels(stream, DROPPED_MALFORMED).inc(fault.dropped)

    return count


# The counters of a producer's work, which a Spark task reports to its driver (format("keo")'s
# metrics_port): keyed by sample name and labels, e.g. ("keo_claims_total", (("result",
# "won"), ("stream", "orders"))).
PRODUCER_COUNTERS: Final = (
    OUTCOMES,
    CLAIMS,
    PUT_REQUESTS,
    PUT_RECORD_ERRORS,
    PUT_PACED_SECONDS,
    READ_BACKS,
    LEDGER_REQUESTS,
    LEDGER_WRITE_UNITS,
    REPLAY_RUNS,
    REPLAY_ATTEMPTS,
    REPLAY_RECOVERIES,
    REPLAY_ROWS_FOUND,
    REPLAY_PAST_RETENTION,
    REPLAY_ROWS_MATCHED_AMBIGUOUSLY,
    READ_DROPPED,
    MALFORMED_AGGREGATES,
)
SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def producer_counts() -> dict[SampleKey, float]:
    """This process's producer counters now: the start of a delta (:func:`counts_since`)."""
    found: dict[SampleKey, float] = {}
    for counter in PRODUCER_COUNTERS:
        for family in counter.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def counts_since(before: Mapping[SampleKey, float]) -> dict[SampleKey, float]:
    """What this process's producer counters grew by since ``before``: the work in between,
    when nothing else in the process produced meanwhile (a Spark task has its worker alone)."""
    return {
        key: value - before.get(key, 0.0)
        for key, value in producer_counts().items()
        if value != before.get(key, 0.0)
    }


_WRITES: Final = frozenset({"PutItem", "UpdateItem", "DeleteItem"})
_CONDITION_FAILED: Final = "ConditionalCheckFailedException"
_UNIQUE_ID: Final = "keo-ledger-metrics"


def count_ledger_calls(client: Any) -> None:
    """Count every DynamoDB request of ``client`` (the ledger's botocore client) and the write
    units of its writes. Attaching twice has no further effect."""
    client.meta.events.register(
        "before-parameter-build.dynamodb.PutItem", _remember_put_item, unique_id=_UNIQUE_ID
    )
    client.meta.events.register(
        "after-call.dynamodb", _on_response, unique_id=f"{_UNIQUE_ID}-response"
    )
    client.meta.events.register(
        "after-call-error.dynamodb", _on_no_response, unique_id=f"{_UNIQUE_ID}-error"
    )


def _on_response(
    parsed: Mapping[str, Any], model: Any, context: Mapping[str, Any], **_: Any
) -> None:
    # botocore emits after-call for an error response too, before it raises
    operation = str(model.name)
    code = aws_error_code(parsed)
    result = "ok" if code is None else _result_of(code)
    LEDGER_REQUESTS.labels(operation, result).inc()
    if operation in _WRITES and result in {"ok", "condition_failed"}:
        try:
            LEDGER_WRITE_UNITS.labels(operation).inc(_write_units(operation, parsed, context))
        except (KeyError, TypeError, ValueError) as exc:  # a metric must never fail a call
            log.debug("ledger metrics: cannot size operation=%s error=%r", operation, exc)


def _on_no_response(event_name: str, **_: Any) -> None:
    # after-call-error.dynamodb.<Operation>: botocore passes no operation model with it
    LEDGER_REQUESTS.labels(event_name.rsplit(".", 1)[-1], "error").inc()


def _result_of(code: str) -> str:
    if code == _CONDITION_FAILED:
        return "condition_failed"
    return "throttled" if code in DYNAMODB_THROTTLING_CODES else "error"


def _write_units(operation: str, parsed: Mapping[str, Any], context: Mapping[str, Any]) -> int:
    """What the write is billed, from the item it leaves (``ALL_NEW``), the item it put, or the
    item a failed condition found (``ALL_OLD``); 1 when none is at hand."""
    item = parsed.get("Attributes") or parsed.get("Item")
    if item is None and operation == "PutItem":
        item = context.get("keo_put_item")
    return write_units(item_size_bytes(item)) if item else 1


def _remember_put_item(params: Mapping[str, Any], context: dict[str, Any], **_: Any) -> None:
    context["keo_put_item"] = params.get("Item")
