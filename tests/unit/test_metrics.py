"""keo's Prometheus metrics follow the conventions, and the Grafana dashboard charts only them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric

from api.metrics import ApiMetrics
from producer import metrics  # registers the producer's and the reconciler's metrics
from spark_jobs.driver_metrics import families as spark_driver_families

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
# labels take few values: never a message key, a group id, a sequence number or a payload
# (step: a replay-mode attempt's recovery step, one of four)
BOUNDED_LABELS = {"stream", "outcome", "result", "code", "resolution", "operation", "step"}
# the Spark driver's: a query is one per streaming query (its query_name), a reason one of three,
# a shard one per shard of the stream a streaming read reads (as Kinesis's shard-level metrics)
SPARK_LABELS = {"query", "reason", "shard"}
API_LABELS = {"method", "route", "status", "error"}
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
}


def keo_families() -> list[tuple[Metric, set[str]]]:
    """Every keo metric family, with its label names (the Spark driver's too)."""
    api = ApiMetrics.create()
    api_labels = {
        c._name: set(c._labelnames) for c in (api.requests, api.duration_s, api.ledger_errors)
    }
    families = []
    for family in [*REGISTRY.collect(), *api.registry.collect()]:
        if not family.name.startswith("keo_"):
            continue
        collector = REGISTRY._names_to_collectors.get(family.name)
        labels = set(collector._labelnames) if collector else api_labels[family.name]
        families.append((family, labels))
    for family in spark_driver_families({}):
        families.append((family, set(family._labelnames)))
    return families


def test_names_carry_their_unit_and_labels_are_bounded() -> None:
    # GIVEN every keo metric of the producer, the reconciler, the ledger and the API
    families = keo_families()
    assert len(families) >= 10
    for family, labels in families:
        # THEN durations say seconds, counters are *_total, gauges of time say so too
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
        if "timestamp" in family.name:
            assert family.name.endswith("_timestamp_seconds"), family.name
        assert family.type in SUFFIXES, family.name
        # AND no label can take a value per message
        assert labels <= BOUNDED_LABELS | API_LABELS | SPARK_LABELS, family.name


def exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in exprs(value)]
    if isinstance(node, list):
        return [e for value in node for e in exprs(value)]
    return []


def test_the_dashboard_charts_only_metrics_keo_exports() -> None:
    # GIVEN the dashboard's queries and the sample names keo's metrics expose
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = exprs(dashboard["panels"])
    exported = {
        family.name + suffix for family, _ in keo_families() for suffix in SUFFIXES[family.type]
    }
    # THEN every metric a query names is one of them
    named = {name for query in queries for name in re.findall(r"\bkeo_[a-z_]+", query)}
    assert named, "no query names a keo metric"
    assert named - exported == set()
    # AND the panels the operators asked for are there
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {
        "Delivered",
        "Duplicates suppressed",
        "Conflicts and failures",
        "In flight",
        "Stale groups",
        "Put latency",
        "Ledger writes",
        "Spark batches",
        "Spark stream reads",
        "Spark stream read lag",
    } <= titles


def test_counts_since_is_what_the_producer_counters_grew_by() -> None:
    # GIVEN the counters now, then a task's work: 3 claims won and one PutRecords call
    before = metrics.producer_counts()
    metrics.CLAIMS.labels("counted-task", "won").inc(3)
    metrics.PUT_REQUESTS.labels("counted-task").inc()
    # WHEN the growth since then is taken
    grown = metrics.counts_since(before)
    # THEN it is that work alone, each sample by name and labels
    assert grown[("keo_claims_total", (("result", "won"), ("stream", "counted-task")))] == 3
    assert grown[("keo_put_requests_total", (("stream", "counted-task"),))] == 1
    assert all(value > 0 for value in grown.values())
