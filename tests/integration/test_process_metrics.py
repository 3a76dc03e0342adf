"""``keo send`` and ``keo reconcile`` export their metrics, as a user runs them (subprocesses on
the emulators): to a file at the end (``--metrics-file``), or on a port while running
(``--metrics-port``)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import planting
import pytest
import stacks
from prometheus_client.parser import text_string_to_metric_families

from dedupe_store.clock import SystemClock
from devstack import emulators as local_stack
from producer.protocol import Message
from producer.retries import poll_until
from producer.settings import ProducerSettings
from producer.wiring import ledger_from

if TYPE_CHECKING:
    from conftest import Names

KEO = str(Path(sys.executable).with_name("keo"))


@pytest.fixture
def settings(emulators: local_stack.Endpoints, names: Names) -> ProducerSettings:
    return stacks.fresh(emulators, names, shards=2)


@pytest.fixture
def cli_env(env: dict[str, str], settings: ProducerSettings) -> dict[str, str]:
    return {**env, "KEO_STREAM": settings.stream, "KEO_TABLE": settings.table}


def run_keo(
    *args: str, env: dict[str, str], stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [KEO, *args], env=env, input=stdin, capture_output=True, timeout=120, check=False
    )


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``{(sample name, labels): value}`` of a Prometheus text exposition."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def test_keo_send_writes_its_counters_to_the_metrics_file_at_the_end(
    settings: ProducerSettings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN five messages, one of them sent twice
    lines = [json.dumps({"key": f"m-{i}", "data": f"data {i}"}) for i in (0, 1, 2, 3, 4, 0)]
    collector = tmp_path / "textfile"
    collector.mkdir()
    prom = collector / "keo_send.prom"
    # WHEN keo send runs with --metrics-file
    result = run_keo(
        "send",
        "--input",
        "-",
        "--no-progress",
        "--metrics-file",
        str(prom),
        env=cli_env,
        stdin="\n".join(lines).encode(),
    )
    assert result.returncode == 0, result.stderr.decode()
    # THEN the file holds the producer's counters, labelled with the command
    found = samples(prom.read_text(encoding="utf-8"))
    stream = settings.stream
    send = {"command": "send", "stream": stream}
    assert value(found, "keo_messages_total", outcome="SENT", **send) == 5
    assert value(found, "keo_messages_total", outcome="DUPLICATE", **send) == 1
    assert value(found, "keo_put_requests_total", **send) >= 1
    assert value(found, "keo_put_request_duration_seconds_count", **send) >= 1
    # AND the ledger's requests and write units (one claim each, then the group's settle)
    claims = value(
        found, "keo_ledger_requests_total", command="send", operation="UpdateItem", result="ok"
    )
    assert claims >= 5
    assert (
        value(found, "keo_ledger_write_units_total", command="send", operation="UpdateItem")
        >= claims
    )
    assert (
        value(found, "keo_ledger_requests_total", command="send", operation="PutItem", result="ok")
        >= 1
    )
    # AND only keo's own metrics, with no temporary file left beside it
    assert {name for name, _ in found} == {name for name, _ in found if name.startswith("keo_")}
    assert [p.name for p in collector.iterdir()] == ["keo_send.prom"]


def test_keo_reconcile_once_writes_what_it_did_with_stale_claims(
    settings: ProducerSettings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a group a crashed producer left OPEN a minute ago, its put never made
    ledger = ledger_from(settings)
    ledger.ensure_ready(stamp_new=True)
    minute_ago = SystemClock().now_ms() - 60_000
    planting.plant_claims(
        ledger,
        settings.stream,
        [Message("lost", b"x")],
        owner="crashed",
        now_ms=minute_ago,
        lease_ms=3_000,
    )
    prom = tmp_path / "keo_reconcile.prom"
    # WHEN keo reconcile --once runs with --metrics-file
    result = run_keo(
        "reconcile", "--once", "--no-progress", "--metrics-file", str(prom), env=cli_env
    )
    assert result.returncode == 0, result.stderr.decode()
    # THEN the file says it took one stale group over and released its key
    found = samples(prom.read_text(encoding="utf-8"))
    labels = {"command": "reconcile", "stream": settings.stream}
    assert value(found, "keo_reconcile_runs_total", **labels) == 1
    assert value(found, "keo_reconcile_stale_groups", **labels) == 1
    assert value(found, "keo_reconcile_claims_total", outcome="released", **labels) == 1
    assert value(found, "keo_reconcile_last_run_timestamp_seconds", **labels) * 1000 > minute_ago


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def reconcile_loop(cli_env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = _free_port()
    process = subprocess.Popen(
        [
            KEO,
            "reconcile",
            "--loop",
            "--interval",
            "0.2",
            "--no-progress",
            "--metrics-port",
            str(port),
        ],
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process, port
    finally:
        process.terminate()  # its default SIGTERM handler: it dies between passes or in one
        process.communicate(timeout=60)


def test_keo_reconcile_loop_serves_its_metrics_on_loopback_while_it_runs(
    settings: ProducerSettings, reconcile_loop: tuple[subprocess.Popen[str], int]
) -> None:
    # GIVEN keo reconcile --loop --metrics-port P running
    process, port = reconcile_loop
    url = f"http://127.0.0.1:{port}/metrics"
    passes: list[float] = []

    def passed_twice() -> bool:
        if process.poll() is not None:
            _, stderr = process.communicate()
            raise AssertionError(f"keo reconcile exited {process.returncode}: {stderr}")
        try:
            response = httpx.get(url, timeout=2)
        except httpx.TransportError:
            return False  # not listening yet
        found = samples(response.text)
        passes.append(value(found, "keo_reconcile_runs_total", stream=settings.stream))
        return passes[-1] >= 2

    # WHEN /metrics is asked until the reconciler has made two passes
    # THEN it answers with the reconciler's counters, growing with each pass
    assert poll_until(passed_twice, timeout_s=60, interval_s=0.1), passes
    response = httpx.get(url, timeout=2)
    assert response.headers["content-type"].startswith("text/plain")
    assert "keo_reconcile_stale_groups" in response.text
    assert "keo_ledger_requests_total" in response.text
