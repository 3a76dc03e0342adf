"""The driver program of the ``local-cluster`` tests (cluster_job.py) as a process: started in
a folder of its own, its processes found in ``/proc``, waited on while a failpoint freezes
some of them, and killed with SIGKILL.

Every process a driver starts (its JVM, which holds the standalone master and workers, the
executor JVMs, their Python workers) is a descendant of the driver and works under the
driver's folder (an executor and its Python workers in ``<SPARK_HOME>/work/<app>/<executor>``),
which tells one scenario's processes from any other's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_support import SHARDS, streamcheck

from devstack.fault_proxy import FaultRule, FaultSchedule
from kinesis_store.provisioning import create_stream
from producer.clients import kinesis_client
from spark_jobs.options import setting_options
from spark_jobs.session import worker_python_path
from spark_jobs.writer import producer_settings

JOB = Path(__file__).with_name("cluster_job.py")
DRIVER_TIMEOUT_S = 360
EXIT_TIMEOUT_S = 120
POLL_S = 0.2
EXECUTOR = "CoarseGrainedExecutorBackend"


# --- processes, as /proc shows them ----------------------------------------------------------


def stat(pid: int) -> tuple[int, str] | None:
    """``(parent pid, state)`` of a live process; None once it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, parent = text[text.rindex(")") + 2 :].split()[:2]  # the name may hold spaces
    return (int(parent), state) if state not in {"Z", "X"} else None


def live() -> dict[int, tuple[int, str]]:
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := stat(int(entry.name))) is not None:
            table[int(entry.name)] = found
    return table


def tree(root: int) -> dict[int, str]:
    """``root`` and its live descendants, each with its state (``T`` when stopped)."""
    table = live()
    found = {root: table[root][1]} if root in table else {}
    grew = True
    while grew:
        more = {pid: st for pid, (parent, st) in table.items() if parent in found}
        grew = bool(more.keys() - found.keys())
        found.update(more)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def under(folder: Path) -> set[int]:
    """Live processes working in ``folder``."""
    inside = set()
    for pid in live():
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if cwd.is_relative_to(folder.resolve()):
            inside.add(pid)
    return inside


def executors(folder: Path) -> set[int]:
    """The executor JVMs working in ``folder``."""
    return {pid for pid in under(folder) if EXECUTOR in cmdline(pid)}


def wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    """The ``pids`` still alive after waiting up to ``timeout_s`` for them to end."""
    deadline = time.monotonic() + timeout_s
    alive = {pid for pid in pids if stat(pid) is not None}
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)
        alive = {pid for pid in alive if stat(pid) is not None}
    return alive


def kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- the driver program ----------------------------------------------------------------------


def new_stream(
    emulators: Any, table: str, name: str, timing: Mapping[str, str], *, shards: int = SHARDS
) -> dict[str, str]:
    """The ``KEO_*`` settings of a new stream of ``shards`` shards on the emulators (``name``
    and this process's id), created, with the ledger ``table`` and ``timing``."""
    settings = {
        "KEO_KINESIS_ENDPOINT_URL": emulators.kinesis,
        "KEO_DYNAMODB_ENDPOINT_URL": emulators.dynamodb,
        "KEO_REGION": "us-east-1",
        "KEO_STREAM": f"{name}-{os.getpid()}-stream",
        "KEO_TABLE": table,
        **timing,
    }
    parsed = producer_settings(settings)
    create_stream(kinesis_client(parsed, for_put=False), parsed.stream, shards, timeout_s=30)
    return settings


def stream_job(
    work_dir: Path,
    settings: Mapping[str, str],
    query: str,
    *,
    sink: str = "format",
    partitions: int = 2,
) -> dict[str, Any]:
    """A job for cluster_job.py: the streaming query ``query`` over the event files in
    ``work_dir/in`` (its checkpoint in ``work_dir``) into ``sink`` (``format``: format("keo");
    ``foreach_batch``: ExactlyOnceSink), ``partitions`` tasks a micro-batch, then nothing: no
    batch write, no read, no streaming read."""
    return {
        "run": "first",
        "work_dir": str(work_dir),
        "partitions": partitions,
        "options": setting_options(dict(settings)),
        "stream": {
            "source": str(work_dir / "in"),
            "checkpoint": str(work_dir / "checkpoint"),
            "query_name": query,
        },
        "sink": sink,
        "batch_rows": None,
        "read": None,
        "stream_read": None,
    }


Rows = Counter[tuple[str, bytes]]  # (key, data), as a multiset


def rows_of(events: Path) -> Rows:
    """The rows of a JSON event file, as a multiset."""
    lines = events.read_text(encoding="utf-8").splitlines()
    return Counter((event["key"], event["data"].encode()) for event in map(json.loads, lines))


def in_stream(kinesis: Any, stream: str) -> Rows:
    """The stream's rows as a KCL consumer reads them, read with plain boto3."""
    contents = streamcheck.read_stream(kinesis, stream)
    return Counter((r.partition_key, r.data) for r in contents.records)


def assert_each_row_once(found: Rows, expected: Rows) -> None:
    extra, missing = found - expected, expected - found
    assert found == expected, (
        f"{extra.total()} rows too many, e.g. {list(extra)[:3]}; "
        f"{missing.total()} missing, e.g. {list(missing)[:3]}"
    )


def throttled_ledger_writes(seed: int) -> FaultSchedule:
    """The first two UpdateItems are throttled, then one in six."""
    return FaultSchedule(
        [
            FaultRule("UpdateItem", "throttle", probability=1.0, limit=2),
            FaultRule("UpdateItem", "throttle", probability=1 / 6),
        ],
        seed=seed,
    )


def steps(stdout: Path) -> dict[str, Any]:
    """The steps the driver finished, by name (one JSON line each on its stdout; a line not
    ended yet is left for later)."""
    lines = stdout.read_text(encoding="utf-8").split("\n")[:-1]
    return {line["step"]: line for line in map(json.loads, lines)}


def wait_step(driver: subprocess.Popen[bytes], logs: Path, step: str) -> dict[str, Any]:
    """Waits until the driver has finished ``step``; fails with its stderr if it ends first or
    never gets there."""
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while driver.poll() is None and time.monotonic() < deadline:
        done = steps(logs.with_suffix(".out")).get(step)
        if done is not None:
            return done
        time.sleep(POLL_S)
    raise AssertionError(
        f"the driver never finished step {step!r} (exit {driver.returncode}): "
        + tail(logs.with_suffix(".err"))
    )


def tail(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-4000:]


def start_driver(
    job: dict[str, Any], logs: Path, *, script: Path = JOB, **env: str
) -> subprocess.Popen[bytes]:
    """``script`` (cluster_job.py) running ``job``, working in ``job["work_dir"]``; its output
    goes to ``logs`` + ``.out`` / ``.err``."""
    environment = {**os.environ, "PYTHONPATH": worker_python_path()}
    for inherited in ("SPARK_HOME", "KEO_FAILPOINTS"):
        environment.pop(inherited, None)
    environment.update(env)
    with logs.with_suffix(".out").open("wb") as out, logs.with_suffix(".err").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, str(script), json.dumps(job)],
            env=environment,
            stdout=out,
            stderr=err,
            cwd=job["work_dir"],
        )


@contextlib.contextmanager
def running(
    job: dict[str, Any], logs: Path, *, script: Path = JOB, **env: str
) -> Iterator[subprocess.Popen[bytes]]:
    """:func:`start_driver`, killed on the way out if it still runs, and waited for."""
    driver = start_driver(job, logs, script=script, **env)
    try:
        yield driver
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait()


@dataclass(frozen=True)
class Frozen:
    """A driver's processes when its failpoints had frozen ``count`` of them."""

    processes: dict[int, str]  # pid -> state, the driver and every descendant
    frozen: list[int]

    def commands(self, pids: list[int] | None = None) -> list[str]:
        return [cmdline(pid) for pid in (self.processes if pids is None else pids)]


def wait_frozen(driver: subprocess.Popen[bytes], logs: Path, count: int = 1) -> Frozen:
    """Waits until ``count`` of the driver's processes are stopped (failpoint action
    ``stop``); fails with the driver's stderr if it ends first or never gets there."""
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while driver.poll() is None and time.monotonic() < deadline:
        processes = tree(driver.pid)
        frozen = sorted(pid for pid, state in processes.items() if state == "T")
        if len(frozen) >= count:
            return Frozen(processes, frozen)
        time.sleep(POLL_S)
    raise AssertionError(
        f"the driver never reached its failpoints (exit {driver.returncode}): "
        + tail(logs.with_suffix(".err"))
    )


def kill_driver(driver: subprocess.Popen[bytes], frozen: Frozen) -> None:
    """SIGKILLs the driver's Python process, its JVM (which holds the standalone master and
    workers) and the frozen processes: the executors are left to notice on their own."""
    processes = frozen.processes
    jvm = {pid for pid in processes if Path(cmdline(pid).split(" ")[0]).name == "java"}
    executors = {pid for pid in processes if EXECUTOR in cmdline(pid)}
    kill({driver.pid, *(jvm - executors), *frozen.frozen})
    driver.wait()
