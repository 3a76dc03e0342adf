"""Prometheus metrics of the producer and the reconciler (the default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

OUTCOMES = Counter("keo_messages_total", "Messages by final outcome", ["stream", "outcome"])
CLAIMS = Counter("keo_claims_total", "Ledger claims by result", ["stream", "result"])
PUT_REQUESTS = Counter("keo_put_requests_total", "PutRecords calls", ["stream"])
PUT_RECORD_ERRORS = Counter(
    "keo_put_record_errors_total", "Records not written or ambiguous, by code", ["stream", "code"]
)
PUT_SECONDS = Histogram(
    "keo_put_seconds",
    "PutRecords latency",
    ["stream"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
LEDGER_SECONDS = Histogram(
    "keo_ledger_seconds",
    "Ledger call latency",
    ["operation"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
READ_BACKS = Counter(
    "keo_read_backs_total",
    "Claims resolved by reading the stream back, by resolution",
    ["stream", "resolution"],
)
