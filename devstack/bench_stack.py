"""What the benches stand on (:mod:`devstack.spark_bench`, :mod:`devstack.stream_bench`, and
beside the quota mode's proxies :mod:`devstack.quota_bench`, :mod:`devstack.scale_bench`,
:mod:`devstack.scale_reader`): the local stack's endpoints (or one of its own in the quota
mode), a new stream and ledger table for each measure, their options as the ``KEO_*`` values
the producer reads, the quota proxies' counters, a loop on a thread of its own, and the file
the figures go to.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final, Self

import httpx

from devstack import emulators
from devstack.fault_proxy import REPORT_PATH
from kinesis_store.provisioning import create_stream
from producer.clients import kinesis_client
from producer.wiring import ledger_from
from spark_jobs.writer import producer_settings

__all__ = [
    "PARTITIONS",
    "Background",
    "as_env",
    "fresh_streams",
    "local_endpoints",
    "on_stream",
    "proxy_counters",
    "quota_stack",
    "write",
]

# each bench stream's shards, and the Spark partitions spark_bench writes them from
PARTITIONS: Final = 2


def local_endpoints(cleanup: ExitStack) -> dict[str, str]:
    """``format("keo")`` options of the stack the ``KEO_*_ENDPOINT_URL`` variables name, or
    else of an embedded stack started in a temporary folder (stopped by ``cleanup``)."""
    endpoints = {
        "kinesis_endpoint_url": os.environ.get("KEO_KINESIS_ENDPOINT_URL", ""),
        "dynamodb_endpoint_url": os.environ.get("KEO_DYNAMODB_ENDPOINT_URL", ""),
    }
    if not all(endpoints.values()):
        state = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="keo-bench-")))
        started = emulators.up(state)
        cleanup.callback(emulators.down, state)
        endpoints = {
            "kinesis_endpoint_url": started.kinesis,
            "dynamodb_endpoint_url": started.dynamodb,
        }
    # the writers' own cost, as before the pacing: emulators keep no quota, and a paced writer
    # would measure the quota (1,000 records a second a shard), not itself
    return {
        **endpoints,
        "region": os.environ.get("KEO_REGION", emulators.REGION),
        "put_rate_limit_percent": "0",
    }


def quota_stack(cleanup: ExitStack, *, prefix: str) -> emulators.Endpoints:
    """A local stack of its own in the quota mode (AWS's quotas, in memory), started in a
    temporary folder named from ``prefix`` and stopped by ``cleanup``."""
    state = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    stack = emulators.up(state, quotas="aws", in_memory=True)
    cleanup.callback(emulators.down, state)
    return stack


def fresh_streams(
    settings: Mapping[str, str],
    labels: Sequence[str],
    *,
    shards: int = PARTITIONS,
    prefix: str = "bench-spark",
) -> dict[str, dict[str, str]]:
    """``format("keo")`` options per label, each naming a new stream of ``shards`` shards and
    a new table, all ready.

    Created at once: dynalite takes about 2 s to make a table ACTIVE, whatever the load.
    """
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"

    def fresh(label: str) -> dict[str, str]:
        name = f"{prefix}-{label.replace('_', '-')}-{stamp}"
        options = {**settings, "stream": name, "table": name}
        parsed = producer_settings(as_env(options))
        ledger_from(parsed).create_table(wait=True)
        create_stream(kinesis_client(parsed, for_put=False), name, shards, timeout_s=60)
        return options

    with ThreadPoolExecutor(len(labels)) as pool:
        return dict(zip(labels, pool.map(fresh, labels), strict=True))


def as_env(options: Mapping[str, str]) -> dict[str, str]:
    """``format("keo")`` options as the ``KEO_*`` values the producer reads."""
    return {f"KEO_{name.upper()}": value for name, value in options.items()}


def proxy_counters(proxy: str) -> dict[str, Any]:
    """A quota proxy's counters (``GET /__keo/report``: a Kinesis or a DynamoDB one's)."""
    report: dict[str, Any] = httpx.get(proxy + REPORT_PATH, timeout=10).json()["quotas"]
    return report


def on_stream(stream: str, counter: Mapping[str, int]) -> int:
    """A counter by ``stream/shard`` summed over ``stream``'s shards."""
    return sum(n for where, n in counter.items() if where.startswith(f"{stream}/"))


class Background:
    """``with`` it: its ``_run`` on a thread of its own until the block ends (``_stop``)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        raise NotImplementedError


def write(results: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
