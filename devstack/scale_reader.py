"""The scale harness's reader (issue 39): ``spark.readStream.format("keo")`` planning and
reading N micro-batches over a stream of S shards, under the quota mode of the local stack,
without Spark, calling the reader as Spark's micro-batch engine does.

::

    this process: the driver, as pyspark's streaming     W worker processes: Spark's Python
      source runner holds the reader for the query       workers (forked clean, reused from
    KeoStreamReader(StreamReadOptions.parse(options))     batch to batch)
    getDefaultReadLimit(), initialOffset()                read(ShardRangePartition): the
    each trigger: latestOffset(start, limit), the           reader pickled with each task, as
      offsets passed through JSON as Spark passes them;     Spark ships it; the rows' keys back
      when it moved: partitions(start, end), a task a     to the harness
      partition, commit(end)
    then idle triggers: latestOffset(start, limit) again and again, ``IDLE_POLL_S`` apart
      (spark.sql.streaming.pollingDelay), for ``idle_s``: what a query that has caught up asks

    the Kinesis quota proxy (devstack.quota_proxy) counts every call, by operation and by shard;
    rows are written on the emulator behind it (counted nothing), ``rows_per_shard`` a shard
    a batch, each routed to its shard by an explicit hash key

Options measured, each on a stream of its own:

    default                     no limit: a batch's end is each shard's tail; a batch's rows
                                are written to every shard right before its trigger
    max_records_per_trigger=M   M = S x rows_per_shard (one batch's rows): every batch's rows
                                written before the query starts (a backlog), each batch's end
                                counted forward from its start

Figures, per step (the query's start, each batch, the idle triggers): control-plane calls
(ListShards, DescribeStreamSummary, ...), GetShardIterator and GetRecords calls on the driver
(planning) and on the executors (reading), each in all and per shard (the most on one, the mean
over all S), throttles by operation, planning time (latestOffset and partitions; for the idle
triggers a trigger's mean and the slowest's, a look at Kinesis) and reading time; per option,
the rows read against the rows written: every one exactly once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from devstack import emulators
from devstack.bench_stack import as_env, quota_stack, write
from devstack.scale_bench import (
    READ_OPERATIONS,
    AuditFigures,
    Counted,
    calls_between,
    forkserver_processes,
    is_control_plane,
    proxied_streams,
    reads_per_shard,
    require_proxies,
    throttles_between,
)
from kinesis_store.entries import put_entry
from kinesis_store.reader import KinesisReader
from producer.clients import kinesis_client
from spark_jobs.writer import producer_settings

if TYPE_CHECKING:
    from pyspark.sql.datasource import InputPartition
    from pyspark.sql.streaming.datasource import ReadLimit

    from kinesis_store.shards import Shard
    from spark_jobs.stream_reader import KeoStreamReader

__all__ = [
    "OPTIONS",
    "ReaderShape",
    "StepFigures",
    "VariantFigures",
    "measure",
    "render",
]

OPTIONS: Final = ("default", "max_records_per_trigger")
IDLE_POLL_S: Final = 0.01  # spark.sql.streaming.pollingDelay: an idle trigger's wait
_PUT_BATCH: Final = 500  # PutRecords' most records a call


@dataclass(frozen=True)
class ReaderShape:
    """How big a measure is: N batches over S shards, read in W worker processes."""

    shards: int
    batches: int = 3
    workers: int = 4
    rows_per_shard: int = 20  # rows written to each shard for each batch
    idle_s: float = 5.0  # the idle triggers after the batches (0: none)

    @property
    def batch_rows(self) -> int:
        return self.shards * self.rows_per_shard


@dataclass(frozen=True)
class Variant:
    """One set of read options: ``name`` as the table shows it, ``backlog``: every batch's
    rows written before the query starts (else each batch's before its trigger)."""

    label: str
    name: str
    options: Mapping[str, str]
    backlog: bool


def variants(shape: ReaderShape, chosen: Sequence[str] = OPTIONS) -> list[Variant]:
    limit = shape.batch_rows
    known = {
        "default": Variant("default", "default", {}, backlog=False),
        "max_records_per_trigger": Variant(
            "limited",
            f"max_records_per_trigger={limit}",
            {"max_records_per_trigger": str(limit)},
            backlog=True,
        ),
    }
    return [known[option] for option in chosen]


# --- the rows ----------------------------------------------------------------------------------


class Rows:
    """Rows written on the emulator (no quota, nothing counted), ``per_shard`` a shard a batch,
    each to its shard by an explicit hash key (its shard's first)."""

    def __init__(self, direct: Mapping[str, str], label: str, per_shard: int) -> None:
        settings = producer_settings(as_env(direct))
        self._client = kinesis_client(settings, for_put=False)
        self._stream = settings.stream
        self._label = label
        self._per_shard = per_shard
        self._shards: list[Shard] = KinesisReader(self._client, self._stream).shards()
        self.written: list[str] = []

    def put_batch(self, batch: int) -> None:
        """Batch ``batch``'s rows, every shard's."""
        entries = [
            put_entry(
                f"{self._label}-b{batch:03d}-s{index:04d}-r{row:03d}",
                f"row {row} of shard {index} for batch {batch}".encode(),
                str(shard.starting_hash_key),
            )
            for index, shard in enumerate(self._shards)
            for row in range(self._per_shard)
        ]
        for first in range(0, len(entries), _PUT_BATCH):
            chunk = entries[first : first + _PUT_BATCH]
            while chunk:
                answer = self._client.put_records(StreamName=self._stream, Records=chunk)
                chunk = [
                    entry
                    for entry, result in zip(chunk, answer["Records"], strict=True)
                    if result.get("ErrorCode")
                ]
        self.written.extend(entry["PartitionKey"] for entry in entries)


# --- the executors -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskRead:
    """What one task read of its partition: the rows' keys."""

    shard_id: str
    keys: list[str]
    seconds: float


def read_task(reader: KeoStreamReader, partition: InputPartition) -> TaskRead:
    """One task as pyspark's worker runs it: the reader's ``read`` over its partition."""
    from spark_jobs.stream_reader import ShardRangePartition

    started = time.perf_counter()
    keys = [key for batch in reader.read(partition) for key in batch.column(0).to_pylist()]
    shard_id = partition.range.shard.shard_id if isinstance(partition, ShardRangePartition) else "-"
    return TaskRead(shard_id, keys, time.perf_counter() - started)


# --- the figures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadCalls:
    """One read operation's calls on the stream's shards: in all, the most on one shard, and
    the mean over all of them."""

    total: int
    max: int
    mean: float


@dataclass
class StepFigures:
    """The query's start, one batch, or the idle triggers (``triggers`` of them)."""

    step: str
    triggers: int
    partitions: int
    rows: int
    control_plane: dict[str, int]
    planning: dict[str, ReadCalls]  # the driver's GetShardIterator and GetRecords
    reading: dict[str, ReadCalls]  # the executors'
    throttles: dict[str, int]
    plan_s: float  # latestOffset and partitions (for the idle triggers: a trigger's mean)
    read_s: float | None
    # the idle triggers' slowest: one that asked Kinesis (a look), where a trigger within the
    # idle poll's second stays put in microseconds
    slowest_plan_s: float | None = None


def audited(written: Sequence[str], read: Counter[str]) -> AuditFigures:
    """The rows read across the batches against those written, by key."""
    expected = set(written)
    return AuditFigures(
        rows=len(written),
        missing=len(expected - read.keys()),
        duplicated=sum(1 for n in read.values() if n > 1),
        unexpected=sum(1 for key in read if key not in expected),
    )


@dataclass(frozen=True)
class VariantFigures:
    variant: str
    shape: ReaderShape
    steps: list[StepFigures]
    rows_read: int  # over every batch
    audit: AuditFigures

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _read_calls(before: Counted, after: Counted, stream: str, shards: int) -> dict[str, ReadCalls]:
    spread = reads_per_shard(before, after, stream, shards)
    calls = calls_between(before, after)
    return {
        operation: ReadCalls(calls.get(operation, 0), spread[operation].max, spread[operation].mean)
        for operation in READ_OPERATIONS
    }


# --- the driver --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ran:
    """What a step did, and the counters when its planning ended (its reading began)."""

    planned: Counted
    plan_s: float
    partitions: int = 0
    rows: int = 0
    read_s: float | None = None


def _through_json(offset: Mapping[str, Any]) -> dict[str, Any]:
    """An offset as the reader gets it back from Spark: JSON, through the checkpoint."""
    parsed: dict[str, Any] = json.loads(json.dumps(offset))
    return parsed


class ReadQuery:
    """One streaming query's driver side, on ``stack``'s proxies, its tasks in ``executors``."""

    def __init__(
        self,
        stack: emulators.Endpoints,
        options: Mapping[str, str],
        shards: int,
        executors: Executor,
    ) -> None:
        from spark_jobs.options import StreamReadOptions
        from spark_jobs.stream_reader import KeoStreamReader

        self._stack = stack
        self._stream = options["stream"]
        self._shards = shards
        self._executors = executors
        self.reader = KeoStreamReader(StreamReadOptions.parse(dict(options)))
        # Spark asks it once, when the query starts (no call to Kinesis)
        self._limit: ReadLimit = self.reader.getDefaultReadLimit()
        self._start: dict[str, Any] = {}
        self.read: Counter[str] = Counter()

    def _step(self, step: str, run: Callable[[], _Ran]) -> StepFigures:
        before = Counted.now(self._stack)
        ran = run()
        after = Counted.now(self._stack)
        calls = calls_between(before, after)
        return StepFigures(
            step=step,
            triggers=1,
            partitions=ran.partitions,
            rows=ran.rows,
            control_plane={op: n for op, n in calls.items() if is_control_plane(op)},
            planning=_read_calls(before, ran.planned, self._stream, self._shards),
            reading=_read_calls(ran.planned, after, self._stream, self._shards),
            throttles=throttles_between(before, after),
            plan_s=round(ran.plan_s, 3),
            read_s=None if ran.read_s is None else round(ran.read_s, 3),
        )

    def start(self) -> StepFigures:
        """What Spark asks a new query's source before its first trigger (no checkpoint)."""

        def run() -> _Ran:
            started = time.perf_counter()
            self._start = _through_json(self.reader.initialOffset())
            return _Ran(Counted.now(self._stack), time.perf_counter() - started)

        return self._step("start", run)

    def batch(self, number: int) -> StepFigures:
        """One trigger that finds records: its end, its partitions, its tasks, its commit."""

        def run() -> _Ran:
            started = time.perf_counter()
            end = _through_json(self.reader.latestOffset(self._start, self._limit))
            partitions = self.reader.partitions(self._start, end) if end != self._start else []
            plan_s = time.perf_counter() - started
            planned = Counted.now(self._stack)
            started = time.perf_counter()
            tasks = list(self._executors.map(read_task, repeat(self.reader), partitions))
            read_s = time.perf_counter() - started
            self.reader.commit(end)
            self._start = end
            rows = 0
            for task in tasks:
                self.read.update(task.keys)
                rows += len(task.keys)
            return _Ran(planned, plan_s, len(partitions), rows, read_s)

        return self._step(f"batch {number}", run)

    def idle(self, seconds: float) -> StepFigures:
        """Triggers that find nothing new, ``IDLE_POLL_S`` apart, for ``seconds``: what a
        caught-up query with the default trigger asks, over and over."""
        triggers = 0
        slowest_s = 0.0

        def run() -> _Ran:
            nonlocal triggers, slowest_s
            planning = 0.0
            ends = time.monotonic() + seconds
            while time.monotonic() < ends:
                started = time.perf_counter()
                end = _through_json(self.reader.latestOffset(self._start, self._limit))
                took_s = time.perf_counter() - started
                planning += took_s
                slowest_s = max(slowest_s, took_s)
                triggers += 1
                if end != self._start:
                    raise RuntimeError(f"an idle trigger found records on {self._stream}")
                time.sleep(IDLE_POLL_S)
            return _Ran(Counted.now(self._stack), planning / max(triggers, 1))

        figures = self._step("idle", run)
        figures.triggers = triggers
        figures.slowest_plan_s = round(slowest_s, 3)
        return figures


def measure_variant(
    stack: emulators.Endpoints,
    shape: ReaderShape,
    variant: Variant,
    options: Mapping[str, str],
    *,
    executors: Executor,
    say: Callable[[str], None],
) -> VariantFigures:
    """One query reading ``shape.batches`` batches, then idle for ``shape.idle_s``."""
    direct = {**options, "kinesis_endpoint_url": str(stack.kinesis_emulator)}
    rows = Rows(direct, variant.label, shape.rows_per_shard)
    batches = range(1, shape.batches + 1)
    if variant.backlog:
        for number in batches:
            rows.put_batch(number)
    query = ReadQuery(stack, {**options, **variant.options}, shape.shards, executors)
    steps = [query.start()]
    for number in batches:
        if not variant.backlog:
            rows.put_batch(number)
        steps.append(query.batch(number))
        say(f"scale reader: {variant.name}: {_said(steps[-1])}")
    if shape.idle_s > 0:
        steps.append(query.idle(shape.idle_s))
        say(f"scale reader: {variant.name}: {_said(steps[-1])}")
    audit = audited(rows.written, query.read)
    say(f"scale reader: {variant.name}: {audit.verdict()}")
    return VariantFigures(variant.name, shape, steps, query.read.total(), audit)


def _said(step: StepFigures) -> str:
    return (
        f"{step.step}: triggers={step.triggers} partitions={step.partitions} rows={step.rows} "
        f"control_plane={step.control_plane} planning={_spread(step.planning)} "
        f"reading={_spread(step.reading)} throttles={step.throttles} plan_s={step.plan_s} "
        f"slowest_plan_s={step.slowest_plan_s} read_s={step.read_s}"
    )


def _spread(calls: Mapping[str, ReadCalls]) -> str:
    return " ".join(f"{op}={c.total}({c.max},{c.mean:g})" for op, c in calls.items())


def measure(
    stack: emulators.Endpoints,
    shape: ReaderShape,
    options: Sequence[str] = OPTIONS,
    *,
    say: Callable[[str], None] = lambda _: None,
) -> list[VariantFigures]:
    """Each set of options on a stream of its own on ``stack`` (the quota mode's proxies), one
    after another; the tasks in ``shape.workers`` worker processes kept for every query."""
    require_proxies(stack)
    chosen = variants(shape, options)
    say(f"scale reader: creating {len(chosen)} streams of {shape.shards} shards")
    streams = proxied_streams(
        stack, [v.label for v in chosen], shards=shape.shards, prefix="scale-read"
    )
    with ProcessPoolExecutor(shape.workers, mp_context=forkserver_processes(__name__)) as pool:
        return [
            measure_variant(stack, shape, variant, streams[variant.label], executors=pool, say=say)
            for variant in chosen
        ]


# --- the table ---------------------------------------------------------------------------------


def _calls(counted: Mapping[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in counted.items()) or "none"


def _cell(calls: ReadCalls) -> str:
    return f"{calls.total} ({calls.max}, {calls.mean:g})"


def _plan_cell(step: StepFigures) -> str:
    """A step's planning seconds; the idle triggers': a trigger's mean (the slowest's)."""
    if step.slowest_plan_s is None:
        return f"{step.plan_s:g}"
    return f"{step.plan_s:g} ({step.slowest_plan_s:g})"


def _rows(figures: Sequence[VariantFigures]) -> Iterator[str]:
    for variant in figures:
        verdict = variant.audit.verdict()
        for step in variant.steps:
            name = step.step if step.step != "idle" else f"idle: {step.triggers} triggers"
            yield (
                f"| {variant.variant} | {variant.shape.shards} | {name} | {step.partitions} "
                f"| {step.rows} | {_calls(step.control_plane)} "
                f"| {_cell(step.planning['GetShardIterator'])} "
                f"| {_cell(step.planning['GetRecords'])} "
                f"| {_cell(step.reading['GetShardIterator'])} "
                f"| {_cell(step.reading['GetRecords'])} | {_calls(step.throttles)} "
                f"| {_plan_cell(step)} | {'-' if step.read_s is None else f'{step.read_s:g}'} "
                f"| {verdict} |"
            )


def render(figures: Sequence[VariantFigures]) -> str:
    """The markdown table: one line per step (calls as: in all (most on a shard, mean))."""
    return "\n".join(
        [
            "| options | S | step | partitions | rows | control plane "
            "| plan: GetShardIterator | plan: GetRecords | read: GetShardIterator "
            "| read: GetRecords | throttles | plan s | read s | every row |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *_rows(figures),
        ]
    )


# --- the command line --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m devstack.scale_reader --shards S --batches N``: on a quota-mode stack of its
    own, started in a temporary folder and stopped at the end."""
    parser = argparse.ArgumentParser(
        prog="python -m devstack.scale_reader", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--shards", type=int, default=64, help="S: the stream's shards")
    parser.add_argument("--batches", type=int, default=3, help="N: micro-batches a query")
    parser.add_argument("--workers", type=int, default=4, help="W: worker processes")
    parser.add_argument("--rows-per-shard", type=int, default=20, help="rows a shard a batch")
    parser.add_argument("--idle-s", type=float, default=5.0, help="idle triggers' seconds")
    parser.add_argument("--options", choices=(*OPTIONS, "all"), default="all")
    parser.add_argument("--out", type=Path, help="JSON results (default: bench/results/...)")
    args = parser.parse_args(argv)
    shape = ReaderShape(args.shards, args.batches, args.workers, args.rows_per_shard, args.idle_s)
    chosen = OPTIONS if args.options == "all" else (args.options,)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with ExitStack() as cleanup:
        say("scale reader: starting the local stack in its quota mode")
        stack = quota_stack(cleanup, prefix="keo-scale-read-")
        figures = measure(stack, shape, chosen, say=say)
    out = args.out or Path("bench/results") / (
        f"scale-reader-{time.strftime('%Y-%m-%d')}-S{shape.shards}-N{shape.batches}"
        f"-W{shape.workers}.json"
    )
    write({"variants": [f.as_json() for f in figures]}, out)
    print(render(figures))
    say(f"scale reader: figures written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
