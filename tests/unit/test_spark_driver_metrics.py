"""format("keo")'s driver metrics: the totals of every Python worker of the driver, summed at
each scrape (no Spark, no socket: the collector reads a folder)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from spark_jobs.driver_metrics import (
    ROW_OUTCOMES,
    BatchEnd,
    BatchResult,
    FailureReason,
    PlannedLag,
    ProcessTotals,
    ShardRead,
    TotalsCollector,
    metrics_folder,
)
from spark_jobs.writer import COUNT_NAMES

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
COMMITTED = BatchResult.COMMITTED


def scrape(folder: Path) -> Samples:
    registry = CollectorRegistry()
    registry.register(TotalsCollector(folder))
    text = generate_latest(registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_counts_of_every_worker_add_up_per_query(tmp_path: Path) -> None:
    # GIVEN two workers of one driver, each with its own file: one committed a batch of the
    # query and saw a replay skipped, the other saw the next batch fail and then commit
    one, other = ProcessTotals(tmp_path), ProcessTotals(tmp_path)
    query = {"query": "orders", "stream": "s"}
    one.record(BatchEnd(**query, result=COMMITTED, counts={"sent": 10, "rejected": 1}), 100.0)
    one.record(BatchEnd(**query, result=BatchResult.SKIPPED, counts={}), 101.0)
    other.record(
        BatchEnd(
            **query,
            result=BatchResult.FAILED,
            counts={"sent": 4, "unresolved": 2},
            reason=FailureReason.UNRESOLVED_KEYS,
        ),
        102.0,
    )
    other.record(BatchEnd(**query, result=COMMITTED, counts={"duplicates": 4}), 103.0)
    one.save()
    other.save()

    # WHEN the exporter is scraped
    found = scrape(tmp_path)

    # THEN each metric is the sum over both files
    assert found[("keo_spark_batches_committed_total", frozenset(query.items()))] == 2
    assert found[("keo_spark_batches_skipped_total", frozenset(query.items()))] == 1
    failed = {**query, "reason": "unresolved_keys"}
    assert found[("keo_spark_batch_failures_total", frozenset(failed.items()))] == 1
    rows = {
        outcome: found[("keo_spark_rows_total", frozenset({**query, "outcome": outcome}.items()))]
        for outcome in ("SENT", "DUPLICATE", "REJECTED", "UNRESOLVED")
    }
    assert rows == {"SENT": 14, "DUPLICATE": 4, "REJECTED": 1, "UNRESOLVED": 2}
    # AND the last commit is the later of the two
    last = ("keo_spark_last_commit_timestamp_seconds", frozenset(query.items()))
    assert found[last] == 103.0


def test_a_file_being_written_or_broken_is_not_counted(tmp_path: Path) -> None:
    # GIVEN a worker's totals, a temporary file beside them and a file that is not JSON
    totals = ProcessTotals(tmp_path)
    totals.record(BatchEnd("q", "s", COMMITTED, counts={}), 1.0)
    totals.save()
    (tmp_path / ".half.tmp").write_text("[", encoding="utf-8")
    (tmp_path / "broken.json").write_text("[", encoding="utf-8")
    # WHEN scraped
    # THEN only the worker's totals count
    labels = frozenset({"query": "q", "stream": "s"}.items())
    assert scrape(tmp_path)[("keo_spark_batches_committed_total", labels)] == 1


def test_every_count_a_commit_message_carries_has_an_outcome_label() -> None:
    assert set(ROW_OUTCOMES) == set(COUNT_NAMES)


def test_the_driver_keeps_its_metrics_in_its_spark_local_directory() -> None:
    # GIVEN the local directories Spark gives the driver's Python workers
    environ = {"SPARK_LOCAL_DIRS": "/disk1/blockmgr-1,/disk2/blockmgr-2"}
    # THEN the folder for a port is in the first one
    assert metrics_folder(9109, environ) == Path("/disk1/blockmgr-1/keo-metrics-9109")


def test_the_executors_producer_counters_are_served_by_query(tmp_path: Path) -> None:
    # GIVEN the counters two batches' tasks grew, as their commit messages carry them, in two
    # workers of the driver: the ledger's requests (no stream label) and the claims
    one, other = ProcessTotals(tmp_path), ProcessTotals(tmp_path)
    requests = ("keo_ledger_requests_total", (("operation", "UpdateItem"), ("result", "ok")))
    won = ("keo_claims_total", (("result", "won"), ("stream", "s")))
    one.record(
        BatchEnd("orders", "s", COMMITTED, counts={}, producer_counts={requests: 12, won: 10}),
        1.0,
    )
    other.record(
        BatchEnd("orders", "s", COMMITTED, counts={}, producer_counts={requests: 5, won: 4}),
        2.0,
    )
    one.save()
    other.save()

    # WHEN the exporter is scraped
    found = scrape(tmp_path)

    # THEN each counter keeps keo send's name and labels, the query's in front, summed
    ledger = {"query": "orders", "stream": "s", "operation": "UpdateItem", "result": "ok"}
    assert found[("keo_ledger_requests_total", frozenset(ledger.items()))] == 17
    claims = {"query": "orders", "stream": "s", "result": "won"}
    assert found[("keo_claims_total", frozenset(claims.items()))] == 14


def test_a_streaming_reads_records_and_bytes_add_up_by_shard_and_its_lag_is_the_latest_reads(
    tmp_path: Path,
) -> None:
    # GIVEN two workers that read ranges of a query's shards: shard 0 twice (the later read,
    # in the other worker, ended at the tip), shard 1 once with no lag reported
    one, other = ProcessTotals(tmp_path), ProcessTotals(tmp_path)
    query = {"query": "orders-in", "stream": "s"}
    one.totals("orders-in", "s").add_read(
        ShardRead(**query, shard_id="0", records=5, data_bytes=50, millis_behind_latest=4000), 10.0
    )
    one.totals("orders-in", "s").add_read(
        ShardRead(**query, shard_id="1", records=2, data_bytes=8, millis_behind_latest=None), 11.0
    )
    other.totals("orders-in", "s").add_read(
        ShardRead(**query, shard_id="0", records=3, data_bytes=30, millis_behind_latest=0), 12.0
    )
    one.save()
    other.save()

    # WHEN the exporter is scraped
    found = scrape(tmp_path)

    # THEN records and bytes are summed per shard, and the lag is the latest read's
    shard0 = frozenset({**query, "shard": "0"}.items())
    shard1 = frozenset({**query, "shard": "1"}.items())
    assert found[("keo_spark_read_records_total", shard0)] == 8
    assert found[("keo_spark_read_bytes_total", shard0)] == 80
    assert found[("keo_spark_read_records_total", shard1)] == 2
    assert found[("keo_spark_read_millis_behind_latest", shard0)] == 0
    assert ("keo_spark_read_millis_behind_latest", shard1) not in found


def test_the_malformed_aggregates_a_streaming_read_met_add_up_by_shard(tmp_path: Path) -> None:
    # GIVEN two workers whose reads of shard 0 met a malformed KPL aggregate each, and a read
    # of shard 1 that met none
    one, other = ProcessTotals(tmp_path), ProcessTotals(tmp_path)
    query = {"query": "orders-in", "stream": "s"}
    for totals, shard_id, malformed in ((one, "0", 1), (other, "0", 1), (one, "1", 0)):
        totals.totals("orders-in", "s").add_read(
            ShardRead(
                **query,
                shard_id=shard_id,
                records=1,
                data_bytes=1,
                millis_behind_latest=0,
                malformed_aggregates=malformed,
            ),
            10.0,
        )
    one.save()
    other.save()
    # WHEN the exporter is scraped
    found = scrape(tmp_path)
    # THEN shard 0 counts both, shard 1 none
    shard0 = frozenset({**query, "shard": "0"}.items())
    shard1 = frozenset({**query, "shard": "1"}.items())
    assert found[("keo_spark_read_malformed_aggregates_total", shard0)] == 2
    assert ("keo_spark_read_malformed_aggregates_total", shard1) not in found


def test_the_lag_a_batch_was_planned_with_is_the_latest_planning_s_by_shard(tmp_path: Path) -> None:
    # GIVEN the driver's planning of two batches, in two of its Python workers: shard 0 behind
    # then caught up, shard 1 planned once
    one, other = ProcessTotals(tmp_path), ProcessTotals(tmp_path)
    one.totals("orders-in", "s").add_lag(PlannedLag("orders-in", "s", {"0": 7_000, "1": 250}), 10.0)
    other.totals("orders-in", "s").add_lag(PlannedLag("orders-in", "s", {"0": 0}), 12.0)
    one.save()
    other.save()
    # WHEN the exporter is scraped
    found = scrape(tmp_path)
    # THEN each shard's gauge is its latest planning's
    query = {"query": "orders-in", "stream": "s"}
    shard0 = frozenset({**query, "shard": "0"}.items())
    shard1 = frozenset({**query, "shard": "1"}.items())
    assert found[("keo_spark_read_planned_millis_behind", shard0)] == 0
    assert found[("keo_spark_read_planned_millis_behind", shard1)] == 250
