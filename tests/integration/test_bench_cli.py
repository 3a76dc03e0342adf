"""``keo bench`` end to end, tiny: every figure the docs and the issue name is in the JSON, and
the docs table is rewritten between its markers. Nothing about speed is asserted (figures are
for ``make bench``); this only proves the benchmark runs and reports what it promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devstack import emulators as local_stack

KEO = str(Path(sys.executable).with_name("keo"))

PER_MESSAGE = (
    "messages_per_second",
    "client_cpu_ms_per_message",
    "dynamodb_requests_per_message",
    "dynamodb_write_requests_per_message",
    "billed_write_units_per_message",
    "billed_read_units_per_message",
    "ceiling_fraction",
    "ratio_to_baseline",
)

REPLAY_BILL = (
    "messages_per_second",
    "dynamodb_requests_per_message",
    "billed_write_units_per_message",
    "billed_read_units_per_message",
)


def test_keo_bench_writes_every_figure_and_the_docs_table(
    emulators: local_stack.Endpoints, tmp_path: Path
) -> None:
    # GIVEN a docs page with the bench markers, and the emulators' endpoints
    docs = tmp_path / "performance.md"
    docs.write_text(
        "# perf\n\n<!-- bench:begin (written by keo bench) -->\nold\n<!-- bench:end -->\ntail\n",
        encoding="utf-8",
    )
    output = tmp_path / "bench.json"
    env = {**os.environ, **emulators.as_env()}
    # WHEN a tiny benchmark runs, two ceiling/producer pairs at one concurrency
    tiny = ["--messages", "100", "--concurrency", "4", "--repeat", "2"]
    tiny += ["--reconcile", "10", "--reconcile-lease-s", "4"]
    # AND replay mode's runs, its batch in tasks and its two recoveries, as small
    tiny += ["--replay-messages", "600", "--rows-per-task", "200", "--replay-tasks", "3"]
    tiny += ["--recovery-rows", "400", "--recovery-lease-s", "4"]
    tiny += ["--resend-messages", "100"]
    tiny.append("--no-spark")  # the Spark part has its own test, on the session's Spark
    tiny.append("--no-quotas")  # so has the quota table: test_quota_bench.py
    done = subprocess.run(
        [KEO, "bench", *tiny, "--output", str(output), "--docs", str(docs)],
        env=env,
        capture_output=True,
        check=False,
        timeout=600,
    )
    # THEN it succeeds, with progress on stderr and the table on stdout
    assert done.returncode == 0, done.stderr.decode()
    assert b"the ledger ceiling before and after (2/2)" in done.stderr
    assert b"| exactly-once | new | 4 |" in done.stdout
    # AND the JSON holds every per-message figure, for new keys and for the resend
    results = json.loads(output.read_text(encoding="utf-8"))
    (run,) = results["exactly_once"]
    for path in (run, run["duplicate_path"]):
        missing = [name for name in PER_MESSAGE if not isinstance(path.get(name), int | float)]
        assert missing == []
    assert len(run["repeats"]) == 2
    assert run["ledger_ceiling"]["messages_per_second_ceiling"] > 0
    assert set(run["cost"]) >= {
        "on_demand_per_million_messages_usd",
        "provisioned_per_million_messages_usd",
        "on_demand_per_day_at_2_billion_usd",
        "provisioned_per_day_at_2_billion_usd",
    }
    assert run["delivered"] == 100
    # AND the resend path through the metering proxy: every key a DUPLICATE, its requests
    resend = results["resend"]
    assert (resend["messages"], resend["delivered"]) == (100, 100)
    assert resend["dynamodb_requests_per_message"] > 0
    (stale,) = results["reconcile"]
    assert (stale["stale_claims"], stale["resolved"], stale["lease_s"]) == (10, 10, 4)
    # AND replay mode's figures next to key mode's: every row delivered, and a bill
    replay = results["replay"]
    assert replay["producer"]["delivered"] == 600
    assert replay["producer"]["duplicate_path"]["kinesis_requests"] == 0  # COMPLETE: nothing sent
    assert len(replay["rounds"]) == 2
    (batch,) = replay["batches"]
    for figures in (replay["producer"], replay["keo_send"], batch):
        missing = [name for name in REPLAY_BILL if not isinstance(figures.get(name), int | float)]
        assert missing == []
        assert figures["billed_write_units_per_message"] > 0
        assert figures["cost"]["on_demand_per_day_at_2_billion_usd"] >= 0
    assert (batch["attempts"], batch["delivered"]) == (3, 600)
    assert set(results["modes"]) == {"key", "replay"}
    # AND the recoveries: all found, nothing sent, no wait; then half found, the rest sent
    landed, halfway = replay["recovery"]
    assert (landed["rows_found"], landed["rows_sent"], landed["wait_s"]) == (400, 0, 0)
    assert (halfway["rows_found"], halfway["rows_sent"]) == (200, 200)
    for recovery in (landed, halfway):
        assert recovery["records_in_stream"] == recovery["delivered"] == 400  # each row once
        assert recovery["get_records_calls"] > 0
    assert b"| replay: recovery of |" in done.stdout
    # AND the docs table was replaced between the markers, the rest of the page kept
    page = docs.read_text(encoding="utf-8")
    assert "old" not in page
    assert page.startswith("# perf\n")
    assert page.endswith("<!-- bench:end -->\ntail\n")


def test_keo_bench_refuses_an_unknown_dynamodb_emulator_before_starting_anything(
    tmp_path: Path,
) -> None:
    # GIVEN no endpoints set, and a DynamoDB emulator the local stack does not have
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"KEO_KINESIS_ENDPOINT_URL", "KEO_DYNAMODB_ENDPOINT_URL"}
    }
    # WHEN keo bench is asked for it
    done = subprocess.run(
        [KEO, "bench", "--dynamodb-emulator", "nope", "--state-dir", str(tmp_path / "stack")],
        env=env,
        capture_output=True,
        check=False,
        timeout=60,
    )
    # THEN it is a usage error naming the ones there are, and no stack was started
    assert done.returncode == 2, done.stderr.decode()
    assert b"dynalite, dynamodb-local" in done.stderr
    assert not (tmp_path / "stack").exists()
