"""The writers against AWS's write quota (issue 37): each one's share of its shards' quota.

Each writer writes into a stream of its own behind the quota mode's proxies (the stack's
emulators behind ``python -m devstack.quota_proxy`` and ``python -m
devstack.dynamodb_quota_proxy``, processes of their own), offered 1.5 times its shards' write
quota, and is measured by what the proxy admitted::

    calibrate   the writer alone on one shard, the quota out of reach: the rows a second it
                can offer on this machine (R): a first look at once, then half as many seconds
                as the measure, offered at that rate; then again on the shards that R asks for
                (each shard costs requests of its own)
    size        shards = R / (2 x 1,000), at least one: the writer sustains twice the quota,
                so the offer (1.5 times it) is three quarters of what this machine's two
                cores let it do, and the shards, not the cores, bind; a writer that cannot
                sustain 2 shards' worth (key mode on two cores) gets one shard whose quota is
                scaled down to R / 2, its pacer set to match (KEO_PUT_RATE_LIMIT_PERCENT)
    measure     rows offered at 1.5 x the quota (keo send: on its stdin, as a live feed), for
                ``seconds``; the proxy's count of records written, sampled; the stream read
                back from the emulator (every key once?)

    share of quota     records written a second, between 10% and 90% of the rows written
                       (and 2 s after the first: a shard's bucket starts a second full), over
                       the shards' quota (records/s binds: rows of ``record_bytes``)
    throttles / 1,000  records the proxy refused per thousand written
    delay p50 / p99    from a row's offer to its acknowledgement (keo send: its outcome line);
                       the offer outruns the quota by half, so a backlog grows: these grow with
                       ``seconds``, and compare writers only at one size
    lost / doubled     keys offered and not in the stream / records of a key beyond its first

The anchor is plain ``put_records`` with botocore's default retries (they retry a throttled
request, not a throttled record of a 200 answer): what it loses.

Readers (:func:`measure_readers`): each drains a one-shard backlog behind the quota proxy
(AWS's 5 calls and 2 MiB a second) while another consumer polls the shard's tip once a second,
as a KCL worker does: the reader's bytes a second (10% to 90%) over the 2 MiB the other left,
and the calls the shard refused, the reader's and the other's. ``keo audit``; with Spark,
``spark.read.format("keo")``, ``read_records`` (Spark 3.5's batch reader) and
``readStream.format("keo")`` (``availableNow``), each into Spark's ``noop`` sink.
"""

from __future__ import annotations

import json
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import IO, Any, Final

from devstack.bench import CLI_COMMAND, settings_env
from devstack.bench_stack import Background, on_stream, proxy_counters
from devstack.quotas import MIB
from kinesis_store.provisioning import create_stream
from kinesis_store.read_pacing import GET_RECORDS_BYTES_PER_S
from kinesis_store.reader import KinesisReader
from producer.clients import kinesis_client
from producer.settings import ProducerSettings
from producer.wiring import ledger_from

__all__ = [
    "ReaderFigures",
    "WriterFigures",
    "measure_readers",
    "measure_writers",
    "render_readers",
    "render_writers",
]

AWS_SHARD_RECORDS_PER_S: Final = 1000
OFFERED_OVER_QUOTA: Final = 1.5
# what a writer sustains (its calibration) over its shards' quota: headroom, so that the writer
# is measured against the quota, not against the machine (its paced requests are smaller, and
# the quota proxy, the emulators and Spark share two cores)
SUSTAINED_OVER_QUOTA: Final = 2.0
_UNREACHABLE: Final = 1e9  # a quota out of any writer's reach: calibration
_CALIBRATION_ROWS: Final = 3000  # the first look: the rows a second, roughly
_CALIBRATION_SHARE: Final = 0.5  # the second: half the measure's seconds' rows, sustained
_MAX_SHARDS: Final = 8
_SAMPLE_EVERY_S: Final = 0.05
_SETTLED_S: Final = 2.0
_FEED_EVERY_S: Final = 0.01
_CHUNK: Final = 500  # keo send --chunk-size: a live feed's rows reach the producer in chunks
_PROXY_UP: Final = re.compile(r"up endpoint=(http://\S+)")
_PROXY_START_S: Final = 30.0
_WRITER_TIMEOUT_S: Final = 600.0


@dataclass(frozen=True)
class WriterFigures:
    """One writer measured against its shards' write quota."""

    writer: str
    shards: int
    quota_records_per_s: float  # per shard
    scaled: bool  # the quota scaled down to what the writer can offer here
    sustained_rows_per_s: float  # its calibration: the quota out of reach
    offered_rows_per_s: float
    rows: int
    written_records_per_s: float
    share_of_quota: float
    throttled: int
    throttles_per_1000: float
    delay_p50_ms: float
    delay_p99_ms: float
    lost: int
    doubled: int


# --- the proxies ---------------------------------------------------------------------------


@contextmanager
def _proxy(module: str, upstream: str, figures: Mapping[str, float]) -> Iterator[str]:
    """``python -m <module> --upstream <upstream>`` with ``figures``; yields its endpoint."""
    flags = [f"--{name.replace('_', '-')}={value:g}" for name, value in figures.items()]
    process = subprocess.Popen(  # noqa: S603 - this interpreter, our module
        [sys.executable, "-m", module, "--upstream", upstream, *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield _endpoint_of(process)
    finally:
        process.terminate()
        process.wait(timeout=10)


def _endpoint_of(process: subprocess.Popen[str]) -> str:
    if process.stderr is None:
        raise RuntimeError("the quota proxy's stderr is not a pipe")
    said: list[str] = []
    deadline = time.monotonic() + _PROXY_START_S
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        found = _PROXY_UP.search(line)
        if found:
            # its log goes on: drained, so that a full pipe never blocks the proxy
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return found.group(1)
        said.append(line)
    tail = "".join(said[-10:])
    raise RuntimeError(f"quota proxy did not start (exit {process.poll()}): {tail}")


def _written(kinesis_proxy: str, stream: str) -> tuple[int, int]:
    """Records written and refused on ``stream``'s shards, as the proxy counted them."""
    quotas = proxy_counters(kinesis_proxy)
    return on_stream(stream, quotas["records_written"]), on_stream(
        stream, quotas["records_refused"]
    )


class _Sampler(Background):
    """Polls a count the proxy keeps (``count()``: records written on a stream, bytes read);
    the times it crossed 10% and 90% of its last value give the rate held."""

    def __init__(self, count: Callable[[], int]) -> None:
        super().__init__()
        self._count = count
        self._samples: list[tuple[float, int]] = []

    def _run(self) -> None:
        while not self._stop.wait(_SAMPLE_EVERY_S):
            self._samples.append((time.monotonic(), self._count()))

    def rate(self, settled_s: float = _SETTLED_S) -> float:
        """Units a second between the samples at 10% and 90% of the last value, from
        ``settled_s`` after the first on: a shard's bucket starts full, a second of quota a
        client may take at once (a short window would count it as rate)."""
        total = self._samples[-1][1] if self._samples else 0
        began = next((t for t, n in self._samples if n > 0), 0.0)
        low = next(
            (s for s in self._samples if s[1] >= 0.1 * total and s[0] >= began + settled_s), None
        )
        high = next((s for s in self._samples if s[1] >= 0.9 * total), None)
        if low is None or high is None or high[0] <= low[0]:
            return 0.0
        return (high[1] - low[1]) / (high[0] - low[0])


def _writing(kinesis_proxy: str, stream: str) -> _Sampler:
    return _Sampler(lambda: _written(kinesis_proxy, stream)[0])


def _reading(kinesis_proxy: str, stream: str) -> _Sampler:
    return _Sampler(lambda: on_stream(stream, proxy_counters(kinesis_proxy)["bytes_read"]))


# --- the writers ---------------------------------------------------------------------------

# a writer: (settings, rows, offered rows a second, pacing percent) -> offer and ack times
Writer = Callable[
    [ProducerSettings, list[tuple[str, str]], float, float],
    tuple[dict[str, float], dict[str, float]],
]


def _feed(
    rows: list[tuple[str, str]], per_s: float, put: Callable[[list[str]], None]
) -> dict[str, float]:
    """Hand ``rows`` to ``put`` at ``per_s`` rows a second (all at once when 0); returns each
    key's arrival: the time it was due, whether or not ``put`` kept up."""
    started = time.monotonic()
    arrival = {key: started + (i / per_s if per_s > 0 else 0.0) for i, (key, _) in enumerate(rows)}
    sent = 0
    while sent < len(rows):
        elapsed = time.monotonic() - started
        due = len(rows) if per_s <= 0 else min(len(rows), int(elapsed * per_s) + 1)
        if due > sent:
            put([key for key, _ in rows[sent:due]])
            sent = due
        if sent < len(rows):
            time.sleep(_FEED_EVERY_S)
    return arrival


def keo_send(mode: str, number: int = 0) -> Writer:
    """``keo send --input - --dedupe <mode>``, its stdin fed at the offered rate (in replay
    mode, a run of its own: two processes of one run would be one execution superseding the
    other)."""

    def write(
        settings: ProducerSettings, rows: list[tuple[str, str]], per_s: float, percent: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        env = {
            **os.environ,
            **settings_env(settings),
            "KEO_PUT_RATE_LIMIT_PERCENT": f"{percent:g}",
        }
        args = ["--dedupe", mode] + (
            ["--run-id", f"{settings.stream}-run-{number}"] if mode == "replay" else []
        )
        process = subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
            [
                *CLI_COMMAND,
                "send",
                "--input",
                "-",
                "--no-progress",
                "--chunk-size",
                str(_CHUNK),
                *args,
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        if process.stdin is None or process.stdout is None:
            raise RuntimeError("keo send's stdin and stdout are not pipes")
        acked: dict[str, float] = {}
        reader = threading.Thread(target=_read_outcomes, args=(process.stdout, acked), daemon=True)
        reader.start()
        lines = {key: json.dumps({"key": key, "data": data}) + "\n" for key, data in rows}
        stdin = process.stdin

        def put(keys: list[str]) -> None:
            stdin.write("".join(lines[key] for key in keys))
            stdin.flush()

        offered = _feed(rows, per_s, put)
        stdin.close()
        process.wait(timeout=_WRITER_TIMEOUT_S)
        reader.join()
        return offered, acked

    return write


def keo_sends(mode: str, processes: int) -> Writer:
    """``processes`` of :func:`keo_send` at once on the same shards, each offered its share
    of the rows (every ``processes``-th) at its share of the rate, paced as one would be: each
    finds the others by the shard's refusals."""

    def write(
        settings: ProducerSettings, rows: list[tuple[str, str]], per_s: float, percent: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        answers: list[tuple[dict[str, float], dict[str, float]]] = []

        def run(part: int) -> None:
            one = keo_send(mode, part)
            answers.append(one(settings, rows[part::processes], per_s / processes, percent))

        threads = [threading.Thread(target=run, args=(part,)) for part in range(processes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        offered: dict[str, float] = {}
        acked: dict[str, float] = {}
        for their_offer, their_acks in answers:
            offered |= their_offer
            acked |= their_acks
        return offered, acked

    return write


def _read_outcomes(stdout: IO[str], acked: dict[str, float]) -> None:
    for line in stdout:
        outcome = json.loads(line)
        if outcome.get("status") in {"SENT", "DUPLICATE"}:
            acked[outcome["key"]] = time.monotonic()


def plain_put_records(
    settings: ProducerSettings, rows: list[tuple[str, str]], per_s: float, _percent: float
) -> tuple[dict[str, float], dict[str, float]]:
    """A loop of ``put_records`` of up to 500 rows, as they arrive, with botocore's default
    retries and nothing resent: a refused record is lost."""
    import boto3

    client = boto3.session.Session().client(
        "kinesis",
        endpoint_url=settings.kinesis_endpoint_url,
        region_name=settings.resolved_region(),
    )
    data = dict(rows)
    arrived: queue.Queue[str | None] = queue.Queue()
    acked: dict[str, float] = {}

    def drain() -> None:
        done = False
        while not done:
            keys = [arrived.get()]
            while len(keys) < 500 and not arrived.empty():
                keys.append(arrived.get())
            done = keys[-1] is None
            batch = [k for k in keys if k is not None]
            if not batch:
                continue
            answer = client.put_records(
                StreamName=settings.stream,
                Records=[{"PartitionKey": k, "Data": data[k].encode()} for k in batch],
            )
            now = time.monotonic()
            acked.update(
                (k, now)
                for k, r in zip(batch, answer["Records"], strict=True)
                if "ErrorCode" not in r
            )

    def arrive(keys: list[str]) -> None:
        for key in keys:
            arrived.put(key)

    worker = threading.Thread(target=drain, daemon=True)
    worker.start()
    offered = _feed(rows, per_s, arrive)
    arrived.put(None)
    worker.join(timeout=_WRITER_TIMEOUT_S)
    return offered, acked


def _spark_options(settings: ProducerSettings, mode: str, percent: float) -> dict[str, str]:
    """``format("keo")`` options (every ``KEO_*`` setting in lower case) writing where
    ``settings`` do, in ``mode``, paced to ``percent`` of a shard's quota."""
    options = _setting_options(settings)
    options |= {"dedupe": mode, "put_rate_limit_percent": f"{percent:g}"}
    if mode == "replay":
        options["run_id"] = f"{settings.stream}-run"
    return options


def _setting_options(settings: ProducerSettings) -> dict[str, str]:
    """``settings`` as ``format("keo")`` options (every ``KEO_*`` setting in lower case)."""
    from spark_jobs.options import setting_options

    return setting_options(settings_env(settings))


def spark_writer(spark: Any, mode: str, *, sink: bool = False) -> Writer:
    """``df.write.format("keo")`` (or ``foreachBatch(ExactlyOnceSink)``, ``sink``) in ``mode``:
    the rows as one DataFrame of two partitions, written at once (a batch offers all its rows
    together: each row's delay is the write's)."""

    def write(
        settings: ProducerSettings, rows: list[tuple[str, str]], _per_s: float, percent: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        from spark_jobs import ExactlyOnceSink, register

        register(spark)
        frame = spark.createDataFrame(rows, "key string, data string").repartition(2)
        options = _spark_options(settings, mode, percent)
        started = time.monotonic()
        if sink:  # a batch of a query: its run is the query's and the batch's, not run_id
            env = {f"KEO_{name.upper()}": v for name, v in options.items() if name != "run_id"}
            ExactlyOnceSink(env, query_id=f"{settings.stream}-query")(frame, 0)
        else:
            frame.write.format("keo").mode("append").options(**options).save()
        ended = time.monotonic()
        return dict.fromkeys((key for key, _ in rows), started), dict.fromkeys(
            (key for key, _ in rows), ended
        )

    return write


WRITERS: Final[Mapping[str, Writer]] = {
    "keo send --dedupe replay": keo_send("replay"),
    "keo send --dedupe key": keo_send("key"),
    "keo send --dedupe key, 2 processes a shard": keo_sends("key", 2),
    "plain put_records (botocore retries)": plain_put_records,
}


def spark_writers(spark: Any) -> dict[str, Writer]:
    """The Spark writers, on ``spark``'s session."""
    return {
        'format("keo") dedupe=replay': spark_writer(spark, "replay"),
        'format("keo") dedupe=key': spark_writer(spark, "key"),
        "foreachBatch(ExactlyOnceSink) dedupe=replay": spark_writer(spark, "replay", sink=True),
    }


# --- the measure ---------------------------------------------------------------------------


def _rows(prefix: str, count: int, size: int) -> list[tuple[str, str]]:
    return [(f"{prefix}-{i:07d}", "x" * size) for i in range(count)]


def _fresh(settings: ProducerSettings, name: str, shards: int) -> ProducerSettings:
    fresh = settings.model_copy(update={"stream": f"{name}-stream", "table": f"{name}-ledger"})
    create_stream(kinesis_client(fresh, for_put=False), fresh.stream, shards, timeout_s=60)
    ledger_from(fresh).create_table()
    return fresh


def _read_back(settings: ProducerSettings) -> Counter[str]:
    """Every key in the stream, read from the emulator itself, and how often."""
    reader = KinesisReader(kinesis_client(settings, for_put=False), settings.stream)
    return Counter(
        record.partition_key
        for shard in reader.shards()
        for record in reader.read_all(shard.shard_id)
    )


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure_writers(
    settings: ProducerSettings,
    *,
    seconds: float = 10.0,
    record_bytes: int = 100,
    writers: Mapping[str, Writer] = WRITERS,
    max_shards: int = _MAX_SHARDS,
    say: Callable[[str], None] = print,
) -> list[WriterFigures]:
    """Each of ``writers`` against its shards' write quota (module docstring), on at most
    ``max_shards`` shards; ``settings`` point at the stack's emulators (not at quota
    proxies)."""
    kinesis, dynamodb = settings.kinesis_endpoint_url, settings.dynamodb_endpoint_url
    if kinesis is None or dynamodb is None:
        raise ValueError("the quota bench runs on the local stack: set both endpoints")
    stamp = time.strftime("%H%M%S")
    figures: list[WriterFigures] = []
    with _proxy("devstack.dynamodb_quota_proxy", dynamodb, {}) as dynamodb_proxy:
        for number, (name, writer) in enumerate(writers.items()):
            label = f"quota-{stamp}-{number}"
            behind = settings.model_copy(update={"dynamodb_endpoint_url": dynamodb_proxy})
            sustained_per_s = _calibrate(
                behind, kinesis, f"{label}-c", writer, record_bytes, seconds=seconds
            )
            shards = _shards_for(sustained_per_s, max_shards)
            if shards > 1:  # what it sustains on that many: each shard costs requests of its own
                sustained_per_s = _calibrate(
                    behind,
                    kinesis,
                    f"{label}-n",
                    writer,
                    record_bytes,
                    seconds=seconds,
                    shards=shards,
                )
                shards = _shards_for(sustained_per_s, max_shards)
            quota = min(
                AWS_SHARD_RECORDS_PER_S, round(sustained_per_s / SUSTAINED_OVER_QUOTA / shards)
            )
            say(
                f"quotas: {name}: sustains {sustained_per_s:.0f} rows/s here: {shards} shard(s) of {quota} records/s"
            )
            figures.append(
                _measure(
                    behind,
                    kinesis,
                    label,
                    name,
                    writer,
                    shards=shards,
                    quota=quota,
                    sustained_per_s=sustained_per_s,
                    seconds=seconds,
                    record_bytes=record_bytes,
                )
            )
            say(f"quotas: {name}: {figures[-1].share_of_quota:.2f} of the quota")
    return figures


def _shards_for(sustained_per_s: float, max_shards: int) -> int:
    """The shards whose quota a writer sustaining ``sustained_per_s`` rows a second sustains
    twice (at least one: below it, a shard scaled down; at most ``max_shards``)."""
    fits = int(sustained_per_s / (SUSTAINED_OVER_QUOTA * AWS_SHARD_RECORDS_PER_S))
    return max(1, min(max_shards, fits))


def _calibrate(
    settings: ProducerSettings,
    kinesis: str,
    label: str,
    writer: Writer,
    record_bytes: int,
    *,
    seconds: float,
    shards: int = 1,
) -> float:
    """The rows a second ``writer`` sustains on ``shards`` shards with the quota out of reach:
    a first look of ``_CALIBRATION_ROWS`` rows at once, then half of ``seconds``' worth of rows
    offered at that rate, as the measure offers them (a short write misjudges: a Spark job's
    fixed start, a process's warm-up; a live feed is not rows at once: a ``keo send`` fills
    its claim groups only as fast as its rows come)."""
    figures = {"shard_write_records_per_s": _UNREACHABLE, "shard_write_bytes_per_s": _UNREACHABLE}
    rate, rows, fed_per_s = 0.0, _CALIBRATION_ROWS, 0.0
    with _proxy("devstack.quota_proxy", kinesis, figures) as kinesis_proxy:
        for look in ("a", "b"):
            target = _fresh(
                settings.model_copy(update={"kinesis_endpoint_url": kinesis_proxy}),
                f"{label}{look}",
                shards,
            )
            with _writing(kinesis_proxy, target.stream) as sampler:
                writer(target, _rows(f"{label}{look}", rows, record_bytes), fed_per_s, 0.0)
            rate = sampler.rate(settled_s=0.0)  # the quota out of reach: no bucket to spend
            if rate <= 0:
                raise RuntimeError(f"the writer wrote too little to be measured on {target.stream}")
            rows = max(_CALIBRATION_ROWS, int(rate * seconds * _CALIBRATION_SHARE))
            fed_per_s = rate
    return rate


def _measure(
    settings: ProducerSettings,
    kinesis: str,
    label: str,
    name: str,
    writer: Writer,
    *,
    shards: int,
    quota: float,
    sustained_per_s: float,
    seconds: float,
    record_bytes: int,
) -> WriterFigures:
    offered_per_s = OFFERED_OVER_QUOTA * quota * shards
    rows = _rows(label, int(offered_per_s * seconds), record_bytes)
    percent = 100 * quota / AWS_SHARD_RECORDS_PER_S
    with _proxy(
        "devstack.quota_proxy", kinesis, {"shard_write_records_per_s": quota}
    ) as kinesis_proxy:
        target = _fresh(
            settings.model_copy(update={"kinesis_endpoint_url": kinesis_proxy}), label, shards
        )
        with _writing(kinesis_proxy, target.stream) as sampler:
            offered, acked = writer(target, rows, offered_per_s, percent)
        written, refused = _written(kinesis_proxy, target.stream)
    found = _read_back(target.model_copy(update={"kinesis_endpoint_url": kinesis}))
    delays = [(acked[k] - offered[k]) * 1000 for k in acked if k in offered]
    rate = sampler.rate()
    return WriterFigures(
        writer=name,
        shards=shards,
        quota_records_per_s=quota,
        scaled=quota < AWS_SHARD_RECORDS_PER_S,
        sustained_rows_per_s=round(sustained_per_s, 1),
        offered_rows_per_s=round(offered_per_s, 1),
        rows=len(rows),
        written_records_per_s=round(rate, 1),
        share_of_quota=round(rate / (quota * shards), 3),
        throttled=refused,
        throttles_per_1000=round(1000 * refused / max(written, 1), 1),
        delay_p50_ms=round(statistics.median(delays), 1) if delays else 0.0,
        delay_p99_ms=round(_percentile(delays, 0.99), 1),
        lost=sum(1 for key, _ in rows if key not in found),
        doubled=sum(n - 1 for n in found.values() if n > 1),
    )


# --- the readers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReaderFigures:
    """One reader draining a shard's backlog beside another consumer of the shard."""

    reader: str
    backlog_mib: float
    seconds: float
    read_mib_per_s: float
    other_mib_per_s: float
    share_of_quota_left: float
    throttled_calls: int  # GetRecords the shard refused, the reader's and the other's
    other_calls: int
    other_throttled: int


class _TipConsumer(Background):
    """Another consumer of the shard, as a KCL worker at the tip is: a GetRecords a second
    (``Limit`` 10,000), one attempt each; what it read and how often it was refused."""

    def __init__(self, endpoint: str, settings: ProducerSettings, shard_id: str) -> None:
        import boto3
        from botocore.config import Config

        self._client = boto3.session.Session().client(
            "kinesis",
            endpoint_url=endpoint,
            region_name=settings.resolved_region(),
            config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
        )
        self._stream, self._shard = settings.stream, shard_id
        self.calls = self.throttled = self.bytes = 0
        super().__init__()

    def _run(self) -> None:
        from botocore.exceptions import ClientError

        iterator = self._client.get_shard_iterator(
            StreamName=self._stream, ShardId=self._shard, ShardIteratorType="LATEST"
        )["ShardIterator"]
        while not self._stop.wait(1.0):
            self.calls += 1
            try:
                page = self._client.get_records(ShardIterator=iterator, Limit=10_000)
            except ClientError:
                self.throttled += 1
                continue
            iterator = page["NextShardIterator"]
            self.bytes += sum(len(r["Data"]) + len(r["PartitionKey"]) for r in page["Records"])


def _keo_audit(settings: ProducerSettings) -> None:
    """``keo audit`` of the stream (it reads every shard to its tip; its findings do not
    matter here)."""
    subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
        [*CLI_COMMAND, "audit", "--no-progress"],
        env={**os.environ, **settings_env(settings)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
        timeout=_WRITER_TIMEOUT_S,
    )


Reader = Callable[[ProducerSettings], None]
READERS: Final[Mapping[str, Reader]] = {"keo audit": _keo_audit}


def spark_readers(spark: Any) -> dict[str, Reader]:
    """The Spark readers, on ``spark``'s session: each reads the whole stream into Spark's
    ``noop`` sink (every row made, none kept)."""

    def batch(settings: ProducerSettings) -> None:
        from spark_jobs import register

        register(spark)
        frame = spark.read.format("keo").options(**_setting_options(settings)).load()
        frame.write.format("noop").mode("overwrite").save()

    def records(settings: ProducerSettings) -> None:
        from spark_jobs import read_records

        frame = read_records(spark, _setting_options(settings))
        frame.write.format("noop").mode("overwrite").save()

    def streaming(settings: ProducerSettings) -> None:
        from spark_jobs import register

        register(spark)
        source = spark.readStream.format("keo").options(**_setting_options(settings)).load()
        with tempfile.TemporaryDirectory(prefix="keo-quota-bench-") as checkpoint:
            query = (
                source.writeStream.format("noop")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"the streaming read failed: {query.exception()}")

    return {
        'spark.read.format("keo")': batch,
        "read_records (Spark 3.5's batch reader)": records,
        'readStream.format("keo") (availableNow)': streaming,
    }


def _fill(settings: ProducerSettings, records: int, record_bytes: int) -> None:
    """``records`` records of ``record_bytes`` on the stream, straight into the emulator."""
    client = kinesis_client(settings, for_put=False)
    data = b"x" * (record_bytes - 8)
    for start in range(0, records, 500):
        entries = [
            {"PartitionKey": f"{i:08d}", "Data": data}
            for i in range(start, min(records, start + 500))
        ]
        client.put_records(StreamName=settings.stream, Records=entries)


def measure_readers(
    settings: ProducerSettings,
    *,
    backlog_mib: float = 24.0,
    readers: Mapping[str, Reader] = READERS,
    say: Callable[[str], None] = print,
) -> list[ReaderFigures]:
    """Each reader drains a one-shard backlog of ``backlog_mib`` MiB (records of 1 KiB) behind
    the quota proxy (AWS's figures), while another consumer polls the shard's tip once a
    second: its share of the read quota the other left, and the throttles of both."""
    kinesis = settings.kinesis_endpoint_url
    if kinesis is None or settings.dynamodb_endpoint_url is None:
        raise ValueError("the quota bench runs on the local stack: set both endpoints")
    stamp = time.strftime("%H%M%S")
    figures: list[ReaderFigures] = []
    for number, (name, read) in enumerate(readers.items()):
        target = _fresh(settings, f"quota-{stamp}-r{number}", 1)
        records = int(backlog_mib * 1024)
        _fill(target, records, 1024)
        say(f"quotas: {name}: draining {backlog_mib:g} MiB beside a consumer at the tip")
        with _proxy("devstack.quota_proxy", kinesis, {}) as kinesis_proxy:
            behind = target.model_copy(update={"kinesis_endpoint_url": kinesis_proxy})
            shard = "shardId-000000000000"
            started = time.monotonic()
            with (
                _TipConsumer(kinesis_proxy, behind, shard) as other,
                _reading(kinesis_proxy, target.stream) as sampler,
            ):
                read(behind)
            seconds = time.monotonic() - started
            throttled = int(proxy_counters(kinesis_proxy)["throttles"].get("GetRecords", 0))
        other_per_s = other.bytes / seconds
        rate = sampler.rate() - other_per_s
        left = GET_RECORDS_BYTES_PER_S - other_per_s
        figures.append(
            ReaderFigures(
                reader=name,
                backlog_mib=backlog_mib,
                seconds=round(seconds, 1),
                read_mib_per_s=round(rate / MIB, 3),
                other_mib_per_s=round(other_per_s / MIB, 3),
                share_of_quota_left=round(rate / left, 3),
                throttled_calls=throttled,
                other_calls=other.calls,
                other_throttled=other.throttled,
            )
        )
        say(f"quotas: {name}: {figures[-1].share_of_quota_left:.2f} of the read quota left")
    return figures


def render_readers(figures: list[ReaderFigures]) -> str:
    """The markdown table of the readers against the read quota."""
    lines = [
        "| reader | backlog MiB | read MiB/s | other consumer MiB/s | share of the quota left "
        "| GetRecords refused | other consumer: calls, refused |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {f.reader} | {f.backlog_mib:g} | {f.read_mib_per_s:g} | {f.other_mib_per_s:g} "
        f"| **{f.share_of_quota_left:.2f}** | {f.throttled_calls} "
        f"| {f.other_calls}, {f.other_throttled} |"
        for f in figures
    ]
    return "\n".join(lines)


def render_writers(figures: list[WriterFigures]) -> str:
    """The markdown table of the writers against the write quota."""
    lines = [
        "| writer | shards x quota (records/s) | offered rows/s | written records/s "
        "| share of quota | throttles / 1,000 | delay p50 / p99 ms | lost | doubled |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        quota = f"{f.shards} x {f.quota_records_per_s:g}" + (" (scaled)" if f.scaled else "")
        lines.append(
            f"| {f.writer} | {quota} | {f.offered_rows_per_s:g} | {f.written_records_per_s:g} "
            f"| **{f.share_of_quota:.2f}** | {f.throttles_per_1000:g} "
            f"| {f.delay_p50_ms:g} / {f.delay_p99_ms:g} | {f.lost} | {f.doubled} |"
        )
    return "\n".join(lines)


def as_json(
    writers: list[WriterFigures], readers: list[ReaderFigures]
) -> dict[str, list[dict[str, Any]]]:
    return {"writers": [asdict(f) for f in writers], "readers": [asdict(f) for f in readers]}


def measure(
    settings: ProducerSettings,
    *,
    seconds: float = 10.0,
    spark: bool = False,
    writers: bool = True,
    readers: bool = True,
    named: str = "",
    say: Callable[[str], None] = print,
) -> tuple[list[WriterFigures], list[ReaderFigures]]:
    """The writers and the readers against the quotas (with ``spark``, the Spark ones too, in a
    local[2] session of their own; with ``named``, only those whose name holds it)."""
    written: list[WriterFigures] = []
    read: list[ReaderFigures] = []
    session = None
    if spark and (writers or readers):
        from spark_jobs.session import local_session

        say("quotas: starting a local[2] Spark session for the Spark writers and readers")
        session = local_session("keo-quota-bench")
    try:
        if writers:
            chosen_writers = dict(WRITERS) | (spark_writers(session) if session else {})
            chosen_writers = {n: w for n, w in chosen_writers.items() if named in n}
            written = measure_writers(settings, seconds=seconds, writers=chosen_writers, say=say)
        if readers:
            chosen_readers = dict(READERS) | (spark_readers(session) if session else {})
            chosen_readers = {n: r for n, r in chosen_readers.items() if named in n}
            read = measure_readers(settings, readers=chosen_readers, say=say)
    finally:
        if session is not None:
            session.stop()
    return written, read


def main(argv: list[str] | None = None) -> int:
    """``python -m devstack.quota_bench [--seconds S]``: on the stack in ``$KEO_*``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m devstack.quota_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="how long rows are offered")
    parser.add_argument("--out", help="JSON results file")
    parser.add_argument(
        "--only", choices=("writers", "readers"), help="measure only the writers or the readers"
    )
    parser.add_argument(
        "--spark",
        action="store_true",
        help="the Spark writers and readers too, in a local[2] session",
    )
    parser.add_argument(
        "--named",
        "--writer",
        dest="named",
        default="",
        metavar="TEXT",
        help="only the writers and readers whose name holds TEXT (e.g. 'dedupe=key', "
        "'keo send', 'format')",
    )
    args = parser.parse_args(argv)
    settings = ProducerSettings(stream="unused", table="unused")

    def say(text: str) -> None:
        print(text, file=sys.stderr)

    writers, readers = measure(
        settings,
        seconds=args.seconds,
        spark=args.spark,
        writers=args.only != "readers",
        readers=args.only != "writers",
        named=args.named,
        say=say,
    )
    print(render_writers(writers))
    print()
    print(render_readers(readers))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            json.dump(as_json(writers, readers), out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
