"""Prometheus metrics of ``format("keo")`` on the driver: the ``metrics_port`` option.

Spark runs the data source's commits in Python workers of the driver, and those are a pool:
one query's commits land in any of them, two queries commit in two at once, and the JVM
stops a worker that was idle for a minute. So neither the counts nor the port can live in
one worker::

    the driver's Python workers (commit, abort)       the exporter: one per driver and port
      MetricsEndpoint.record(...)                       python -m spark_jobs.driver_metrics
        ├─ this process's totals ─> <folder>/<pid>-<token>.json      holds <folder>/exporter.lock
        │    (replaced whole, so a scrape never reads half)         serves /metrics on host:port,
        └─ exporter.lock free? start the exporter ───────────────>  summing every totals file
                                                                    at each scrape; ends with
                                                                    the driver

    <folder> is keo-metrics-<port> in the driver's Spark local directory (SPARK_LOCAL_DIRS,
    which Spark gives every Python worker of the driver and deletes when the driver stops).

Totals files stay when their process ends, so counters never go back. A second query with the
same port adds its labels to the same exporter; the exporter binds ``metrics_host`` of the
first write that started it. The exporter leaves when the process that started its worker
(Spark's worker daemon, or the driver JVM) is gone, or when the folder is.

The metrics (``query`` is the ``query_name`` option, else Spark's query id, and
``batch-write`` for ``df.write``; ``stream`` is the Kinesis stream)::

    keo_spark_batches_committed_total{query,stream}       batches whose every row settled
    keo_spark_batches_skipped_total{query,stream}         replays the batch ledger had as
                                                          complete: nothing sent, nothing read
    keo_spark_batch_failures_total{query,stream,reason}   unresolved_keys (the commit raised so
                                                          Spark retries the batch), aborted (a
                                                          task failed), error (the commit raised)
    keo_spark_rows_total{query,stream,outcome}            rows as the commit messages report
                                                          them, failed batches included: SENT,
                                                          DUPLICATE, CONFLICT and REJECTED (both
                                                          dead-lettered), UNRESOLVED
    keo_spark_last_commit_timestamp_seconds{query,stream}

And what the executors' producers did, as each task's commit message carries it (its
producer counters' growth, ``producer.metrics.counts_since``), under ``keo send``'s names
with ``query`` and ``stream`` in front: ``keo_messages_total``, ``keo_claims_total``,
``keo_put_requests_total``, ``keo_put_record_errors_total``,
``keo_put_paced_seconds_total``, ``keo_read_backs_total``,
``keo_ledger_requests_total``, ``keo_ledger_write_units_total``, and replay mode's
``keo_replay_runs_total``, ``keo_replay_attempts_total``, ``keo_replay_recoveries_total``,
``keo_replay_rows_found_total`` and ``keo_replay_rows_matched_ambiguously_total``
(``producer.metrics.PRODUCER_COUNTERS``). A failed task sends no
commit message, so its work is not counted (its retry's is).

A streaming read (``readStream.format("keo")`` with ``metrics_port``) has no commit message:
each task counts the shard range it read where it runs (:meth:`MetricsEndpoint.record_read`),
into the same folder as the driver's own counts on ``local[n]``, and into its executor's local
directory on a cluster, where the first read starts an exporter on the same port::

    keo_spark_read_records_total{query,stream,shard}      user records the read gave Spark
    keo_spark_read_bytes_total{query,stream,shard}        their data, in bytes
    keo_spark_read_malformed_aggregates_total{query,stream,shard}
                                                          malformed KPL aggregates the read met
                                                          (read as the KCL reads them, logged)
    keo_spark_read_millis_behind_latest{query,stream,shard}
                                                          how far behind the shard's tip its
                                                          last read ended (MillisBehindLatest of
                                                          its last GetRecords; the latest read's)
    keo_spark_read_planned_millis_behind{query,stream,shard}
                                                          how far behind the shard's tail the
                                                          latest batch started, when the driver
                                                          planned it (arrival times: the tail's
                                                          less the last record read before)

``query`` is the read's ``query_name`` option, else ``stream-read``. The planned lag is the
driver's (:meth:`MetricsEndpoint.record_lags`, from what planning a batch learnt anyway: each
shard's tail), so it is known before the batch runs, and on a cluster too.

Nothing here imports pyspark or boto3: the exporter only reads files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from producer.metrics import SampleKey

log = logging.getLogger(__name__)

BATCH_WRITE_QUERY: Final = "batch-write"
STREAM_READ_QUERY: Final = "stream-read"
FOLDER_PREFIX: Final = "keo-metrics-"
_LOCK: Final = "exporter.lock"
_WATCH_INTERVAL_S: Final = 1.0
_BIND_RETRY_S: Final = 5.0
# The counts a commit message carries (spark_jobs.writer.COUNT_NAMES), as outcome labels:
# keo_messages_total's values where the producer has one.
ROW_OUTCOMES: Final = {
    "sent": "SENT",
    "duplicates": "DUPLICATE",
    "conflicts": "CONFLICT",
    "rejected": "REJECTED",
    "unresolved": "UNRESOLVED",
}


class BatchResult(StrEnum):
    COMMITTED = "committed"
    SKIPPED = "skipped"
    FAILED = "failed"


class FailureReason(StrEnum):
    UNRESOLVED_KEYS = "unresolved_keys"
    ABORTED = "aborted"
    ERROR = "error"


@dataclass(frozen=True)
class BatchEnd:
    """How one batch (or batch write) of a query ended on the driver, and its rows' counts
    (``spark_jobs.writer.COUNT_NAMES``)."""

    query: str
    stream: str
    result: BatchResult
    counts: Mapping[str, int]
    reason: FailureReason | None = None  # of a failure
    # what the executors' producers did for the batch (producer.metrics.counts_since), summed
    # over the tasks whose commit messages reached the driver
    producer_counts: Mapping[SampleKey, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ShardRead:
    """One task's read of a shard range in a streaming read: the rows it gave Spark, their
    data's bytes, and the last GetRecords' ``MillisBehindLatest`` (None: none answered)."""

    query: str
    stream: str
    shard_id: str
    records: int
    data_bytes: int
    millis_behind_latest: int | None
    malformed_aggregates: int = 0


@dataclass(frozen=True)
class PlannedLag:
    """How far behind each shard's tail a streaming read's batch started, when the driver
    planned it (:meth:`spark_jobs.stream_planner.StreamPlanner.latest`), by shard id."""

    query: str
    stream: str
    millis_behind: Mapping[str, int]


# --- what one process counted --------------------------------------------------------------


@dataclass
class QueryTotals:
    """One query's counts, in one process or summed over them."""

    committed: int = 0
    skipped: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    last_commit_s: float | None = None
    # the executors' producer counters, each sample keyed as _sample_id writes it
    producer: dict[str, float] = field(default_factory=dict)
    # a streaming read's, by shard: records and bytes, and [millis behind latest, at (s)]
    read_records: dict[str, int] = field(default_factory=dict)
    read_bytes: dict[str, int] = field(default_factory=dict)
    read_malformed: dict[str, int] = field(default_factory=dict)
    behind: dict[str, list[float]] = field(default_factory=dict)
    # the driver's planning, by shard: [millis behind the tail at the batch's start, at (s)]
    planned_behind: dict[str, list[float]] = field(default_factory=dict)

    def add(self, end: BatchEnd, now_s: float) -> None:
        if end.result is BatchResult.COMMITTED:
            self.committed += 1
            self.last_commit_s = now_s
        elif end.result is BatchResult.SKIPPED:
            self.skipped += 1
        else:
            _bump(self.failures, end.reason or FailureReason.ERROR, 1)
        for name, count in end.counts.items():
            _bump(self.rows, ROW_OUTCOMES.get(name, name.upper()), count)
        for key, grown in end.producer_counts.items():
            _bump(self.producer, _sample_id(key), grown)

    def add_read(self, read: ShardRead, now_s: float) -> None:
        _bump(self.read_records, read.shard_id, read.records)
        _bump(self.read_bytes, read.shard_id, read.data_bytes)
        if read.malformed_aggregates:
            _bump(self.read_malformed, read.shard_id, read.malformed_aggregates)
        if read.millis_behind_latest is not None:
            self.behind[read.shard_id] = [read.millis_behind_latest, now_s]

    def add_lag(self, lag: PlannedLag, now_s: float) -> None:
        for shard_id, behind_ms in lag.millis_behind.items():
            self.planned_behind[shard_id] = [behind_ms, now_s]

    def merge(self, other: QueryTotals) -> None:
        self.committed += other.committed
        self.skipped += other.skipped
        for reason, count in other.failures.items():
            _bump(self.failures, reason, count)
        for outcome, count in other.rows.items():
            _bump(self.rows, outcome, count)
        for sample, grown in other.producer.items():
            _bump(self.producer, sample, grown)
        if other.last_commit_s is not None:
            self.last_commit_s = max(self.last_commit_s or 0.0, other.last_commit_s)
        for shard_id, count in other.read_records.items():
            _bump(self.read_records, shard_id, count)
        for shard_id, count in other.read_bytes.items():
            _bump(self.read_bytes, shard_id, count)
        for shard_id, count in other.read_malformed.items():
            _bump(self.read_malformed, shard_id, count)
        for gauge, others in (
            (self.behind, other.behind),
            (self.planned_behind, other.planned_behind),
        ):
            for shard_id, (behind_ms, at_s) in others.items():
                # a gauge: the latest value, whichever process had it
                if shard_id not in gauge or at_s >= gauge[shard_id][1]:
                    gauge[shard_id] = [behind_ms, at_s]


def _bump(counts: dict[str, Any], name: str, by: float) -> None:
    counts[name] = counts.get(name, 0) + by


def _sample_id(key: SampleKey) -> str:
    """A producer sample as a JSON object key: its name and labels, as JSON."""
    name, labels = key
    return json.dumps([name, dict(labels)], sort_keys=True)


@dataclass
class ProcessTotals:
    """One process's totals for one folder, saved whole to a file of its own."""

    folder: Path
    name: str = field(default_factory=lambda: f"{os.getpid()}-{uuid.uuid4().hex[:12]}.json")
    queries: dict[tuple[str, str], QueryTotals] = field(default_factory=dict)

    def record(self, end: BatchEnd, now_s: float) -> None:
        self.totals(end.query, end.stream).add(end, now_s)

    def totals(self, query: str, stream: str) -> QueryTotals:
        return self.queries.setdefault((query, stream), QueryTotals())

    def save(self) -> None:
        entries = [
            {"query": query, "stream": stream, **vars(totals)}
            for (query, stream), totals in sorted(self.queries.items())
        ]
        _replace(self.folder / self.name, json.dumps(entries))


# keyed by pid too: a worker forked from a process that counted starts a file of its own
_TOTALS: dict[tuple[int, Path], ProcessTotals] = {}
_TOTALS_LOCK = threading.Lock()
_EXPORTERS: list[subprocess.Popen[bytes]] = []  # kept to be reaped, never waited on


@dataclass(frozen=True)
class MetricsEndpoint:
    """Where a write's driver metrics are served; picklable (it travels in the write plan).

    ``format("keo")`` counts in Python workers, whose parent (Spark's worker daemon, or the
    driver JVM) the exporter watches, in their Spark local directory. The ``foreachBatch``
    sink counts in the driver's own Python process (``in_driver``): the exporter watches that
    process, and the folder is in ``local_dir`` (the driver's Spark files directory, which
    Spark deletes when the driver stops)."""

    port: int
    host: str = "127.0.0.1"
    local_dir: str | None = None
    in_driver: bool = False

    @property
    def folder(self) -> Path:
        if self.local_dir is not None:
            return Path(self.local_dir) / f"{FOLDER_PREFIX}{self.port}"
        return metrics_folder(self.port)

    def record(self, end: BatchEnd) -> None:
        """Count one batch's end on the driver, and see the exporter runs. A metric never
        fails a commit: a folder or a process that cannot be made is a warning."""
        self._count(end.query, lambda totals, now_s: totals.record(end, now_s))

    def record_read(self, read: ShardRead) -> None:
        """Count one task's read of a shard range where it ran, and see the exporter runs
        there. A metric never fails a read."""
        self._count(
            read.query,
            lambda totals, now_s: totals.totals(read.query, read.stream).add_read(read, now_s),
        )

    def record_lags(self, lag: PlannedLag) -> None:
        """Set how far behind each shard's tail a batch started, on the driver as it planned
        the batch. A metric never fails a query."""
        if lag.millis_behind:
            self._count(
                lag.query,
                lambda totals, now_s: totals.totals(lag.query, lag.stream).add_lag(lag, now_s),
            )

    def _count(self, query: str, count: Callable[[ProcessTotals, float], None]) -> None:
        try:
            folder = self.folder
            folder.mkdir(parents=True, exist_ok=True)
            with _TOTALS_LOCK:
                mine = _TOTALS.get((os.getpid(), folder))
                if mine is None:
                    mine = _TOTALS[(os.getpid(), folder)] = ProcessTotals(folder)
                count(mine, time.time())
                mine.save()
            # the process whose end the exporter's follows: the driver's, however reached
            watch = os.getpid() if self.in_driver else os.getppid()
            ensure_exporter(folder, self.port, self.host, watch)
        except OSError as exc:
            log.warning(
                "spark driver metrics not recorded port=%d query=%s error=%r",
                self.port,
                query,
                exc,
            )


def metrics_folder(port: int, environ: Mapping[str, str] | None = None) -> Path:
    """The driver's folder for ``port``: in its Spark local directory, else the temp dir."""
    local_dirs = (os.environ if environ is None else environ).get("SPARK_LOCAL_DIRS", "")
    first = next((d for d in local_dirs.split(",") if d.strip()), None)
    root = Path(first) if first else Path(tempfile.gettempdir())
    return root / f"{FOLDER_PREFIX}{port}"


def _replace(path: Path, text: str) -> None:
    """Whole or not at all: a scrape reads the old file or the new one."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        Path(temporary).replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(temporary).unlink()
        raise


# --- the exporter: started once per driver and port ------------------------------------------


def ensure_exporter(folder: Path, port: int, host: str, watch: int) -> None:
    """Start the exporter for ``folder`` unless one holds its lock; it leaves when the process
    ``watch`` is gone (or the folder is). Two workers may both start one; the second finds the
    lock taken and leaves."""
    for running in list(_EXPORTERS):
        if running.poll() is not None:  # reap it
            _EXPORTERS.remove(running)
    with (folder / _LOCK).open("a") as lock:
        if _locked_elsewhere(lock):
            return
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [sys.executable, "-m", __name__, str(folder), str(port), host, str(watch)]
    _EXPORTERS.append(
        subprocess.Popen(  # noqa: S603 - this interpreter, this module, our own arguments
            command,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # not in the worker's group: Spark signals that group
        )
    )
    log.info("spark driver metrics exporter started port=%d host=%s folder=%s", port, host, folder)


def _locked_elsewhere(lock: IO[str]) -> bool:
    import fcntl

    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(lock, fcntl.LOCK_UN)
    return False


class TotalsCollector(Collector):
    """The sum of every totals file in a folder, read at each scrape."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    def collect(self) -> Iterator[Metric]:
        return iter(families(self._read()))

    def _read(self) -> dict[tuple[str, str], QueryTotals]:
        summed: dict[tuple[str, str], QueryTotals] = defaultdict(QueryTotals)
        for path in self._folder.glob("*.json"):
            if path.name.startswith("."):
                continue  # a file being written
            try:
                entries = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                log.warning("spark driver metrics: unreadable file=%s error=%r", path, exc)
                continue
            for entry in entries:
                query, stream = entry.pop("query"), entry.pop("stream")
                summed[(query, stream)].merge(QueryTotals(**entry))
        return summed


def families(totals: Mapping[tuple[str, str], QueryTotals]) -> list[Metric]:
    """The metric families of these totals (every family, even with no sample)."""
    labels = ["query", "stream"]
    committed = CounterMetricFamily(
        "keo_spark_batches_committed",
        "format('keo') batches committed on the driver: every row settled",
        labels=labels,
    )
    skipped = CounterMetricFamily(
        "keo_spark_batches_skipped",
        "Replayed format('keo') batches the batch ledger had as complete: nothing done",
        labels=labels,
    )
    failures = CounterMetricFamily(
        "keo_spark_batch_failures",
        "format('keo') batches that failed, by reason (unresolved_keys, aborted, error)",
        labels=[*labels, "reason"],
    )
    rows = CounterMetricFamily(
        "keo_spark_rows",
        "Rows of format('keo') batches by outcome, as the commit messages report them",
        labels=[*labels, "outcome"],
    )
    last_commit = GaugeMetricFamily(
        "keo_spark_last_commit_timestamp_seconds",
        "When a batch of the query was last committed (Unix time)",
        labels=labels,
    )
    producer = _producer_families(totals)
    reads = _read_families(totals)
    for (query, stream), query_totals in sorted(totals.items()):
        committed.add_metric([query, stream], query_totals.committed)
        skipped.add_metric([query, stream], query_totals.skipped)
        for reason, count in sorted(query_totals.failures.items()):
            failures.add_metric([query, stream, reason], count)
        for outcome, count in sorted(query_totals.rows.items()):
            rows.add_metric([query, stream, outcome], count)
        if query_totals.last_commit_s is not None:
            last_commit.add_metric([query, stream], query_totals.last_commit_s)
    return [committed, skipped, failures, rows, last_commit, *reads, *producer]


def _read_families(totals: Mapping[tuple[str, str], QueryTotals]) -> list[Metric]:
    """A streaming read's metrics, by shard (every family, even with no sample)."""
    labels = ["query", "stream", "shard"]
    records = CounterMetricFamily(
        "keo_spark_read_records",
        "User records readStream.format('keo') gave Spark, by shard",
        labels=labels,
    )
    data_bytes = CounterMetricFamily(
        "keo_spark_read_bytes",
        "Bytes of the data of the records readStream.format('keo') gave Spark, by shard",
        labels=labels,
    )
    malformed = CounterMetricFamily(
        "keo_spark_read_malformed_aggregates",
        "Malformed KPL aggregates readStream.format('keo') met, by shard: read as the KCL reads "
        "them (the user records before the fault, or the record raw), logged",
        labels=labels,
    )
    behind = GaugeMetricFamily(
        "keo_spark_read_millis_behind_latest",
        "How far behind the shard's tip the last read of readStream.format('keo') ended "
        "(MillisBehindLatest of its last GetRecords)",
        labels=labels,
    )
    planned = GaugeMetricFamily(
        "keo_spark_read_planned_millis_behind",
        "How far behind the shard's tail the latest batch of readStream.format('keo') started, "
        "when the driver planned it (the tail's arrival time less the last record read's)",
        labels=labels,
    )
    for (query, stream), query_totals in sorted(totals.items()):
        for shard_id, count in sorted(query_totals.read_records.items()):
            records.add_metric([query, stream, shard_id], count)
        for shard_id, count in sorted(query_totals.read_bytes.items()):
            data_bytes.add_metric([query, stream, shard_id], count)
        for shard_id, count in sorted(query_totals.read_malformed.items()):
            malformed.add_metric([query, stream, shard_id], count)
        for shard_id, (behind_ms, _) in sorted(query_totals.behind.items()):
            behind.add_metric([query, stream, shard_id], behind_ms)
        for shard_id, (behind_ms, _) in sorted(query_totals.planned_behind.items()):
            planned.add_metric([query, stream, shard_id], behind_ms)
    return [records, data_bytes, malformed, behind, planned]


def _producer_families(totals: Mapping[tuple[str, str], QueryTotals]) -> list[Metric]:
    """The executors' producer counters under the names ``keo send`` exports them by, the
    query's labels in front (``keo_claims_total{query,stream,result}``...): only those counted
    so far, their names and labels read from the totals files."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for (query, stream), query_totals in sorted(totals.items()):
        for sample, value in sorted(query_totals.producer.items()):
            name, labels = json.loads(sample)
            samples[name].append(({**labels, "query": query, "stream": stream}, value))
    found: list[Metric] = []
    for name, rows in sorted(samples.items()):
        others = sorted({label for labels, _ in rows for label in labels} - {"query", "stream"})
        family = CounterMetricFamily(
            name.removesuffix("_total"),
            f"{name} of the producers on format('keo')'s executors, as keo send counts it",
            labels=["query", "stream", *others],
        )
        for labels, value in rows:
            family.add_metric(
                [labels["query"], labels["stream"], *(labels.get(o, "") for o in others)], value
            )
        found.append(family)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process has that pid now: ours is gone
    return True


def serve(folder: Path, port: int, host: str, watch_pid: int) -> int:
    """The exporter's life: the lock, then the port, until the driver is gone."""
    import fcntl

    with (folder / _LOCK).open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # another exporter serves this driver's port
        registry = CollectorRegistry()
        registry.register(TotalsCollector(folder))
        serving = _bind(registry, port, host, watch_pid, folder)
        if serving is None:
            return 0
        server, thread = serving
        shown = f"[{host}]" if ":" in host else host
        log.info("spark driver metrics on http://%s:%d/metrics", shown, port)
        while folder.is_dir() and _alive(watch_pid):
            time.sleep(_WATCH_INTERVAL_S)
        server.shutdown()
        server.server_close()
        thread.join()
    return 0


def _bind(
    registry: CollectorRegistry, port: int, host: str, watch_pid: int, folder: Path
) -> tuple[Any, threading.Thread] | None:
    """The server on ``host:port``, tried again while the port is taken (said once); None
    when the driver went away first."""
    said = False
    while folder.is_dir() and _alive(watch_pid):
        try:
            return start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            refused = exc
        if not said:
            log.error("cannot serve spark driver metrics on %s:%d: %s", host, port, refused)
            said = True
        time.sleep(_BIND_RETRY_S)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.driver_metrics",
        description="Serve format('keo')'s driver metrics (started by the data source itself).",
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("port", type=int)
    parser.add_argument("host")
    parser.add_argument("watch_pid", type=int, help="leave when this process is gone")
    args: Any = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return serve(args.folder, args.port, args.host, args.watch_pid)


if __name__ == "__main__":
    sys.exit(main())
