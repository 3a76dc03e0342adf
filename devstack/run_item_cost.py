"""What a replay-mode run's ledger item costs as its task count grows, priced by the billing
meter on the local stack.

    python -m devstack.run_item_cost [--tasks 10,50,100,200] [--rows-per-task 500]
                                     [--renewals N]

Each task attempt of a run registers with the run (its execution counted on the run's item)
and with its task's own item, and says it finished on the run's item (three writes); the driver
completes the run (one). A write is billed by the larger of the item's images, 1 KB a unit: the
run item holds its executions' bounds, never their attempts, so each write costs one unit
whatever the task count. This prints each task count's billed write units, requests, and units
per row at the given rows per task: the figure docs/performance.md quotes for replay mode's
scaling. With ``--renewals N`` each attempt also renews its lease N times before it finishes,
a batch's renewals spread as the early renewals spread them (each round over 45% of a lease,
half a lease apart): what renewals cost, and what they write on the run item.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dedupe_store.records import RunAttempt
from devstack import emulators
from devstack.cost_meter import BillingMeter, ledger_table_spec
from producer.settings import ProducerSettings
from producer.wiring import ledger_from

_STREAM = "run-item-cost"
_LEASE_MS = 360_000
_RENEWAL_SPREAD_MS = _LEASE_MS * 45 // 100  # early renewals: half the fence's slack, 27 s of 60


def price_run(
    settings: ProducerSettings, tasks: int, rows_per_task: int, renewals: int = 0
) -> dict[str, Any]:
    """One run of ``tasks`` attempts (register, ``renewals`` renewals each, finish), then its
    completion."""
    ledger = ledger_from(settings)
    unwatched = ledger_from(settings).client  # the meter's own reads, never priced

    def read_item(table: str, key: Mapping[str, Any]) -> Any:
        return unwatched.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")

    meter = BillingMeter({settings.table: ledger_table_spec()}, read_item=read_item)
    meter.attach(ledger.client)
    run, execution, now_ms = f"cost/{uuid.uuid4().hex[:8]}", uuid.uuid4().hex, 1_800_000_000_000
    attempts = [
        RunAttempt(uuid.uuid4().hex, execution, str(task), task, now_ms, now_ms + _LEASE_MS)
        for task in range(tasks)
    ]
    try:
        for attempt in attempts:
            ledger.register_attempt(_STREAM, run, attempt)
        for round_ in range(1, renewals + 1):
            for task, attempt in enumerate(attempts):
                at_ms = now_ms + round_ * _LEASE_MS // 2 + task * _RENEWAL_SPREAD_MS // tasks
                ledger.renew_attempt(
                    _STREAM, run, attempt, now_ms=at_ms, lease_ms=_LEASE_MS, skew_ms=1_000
                )
        for attempt in attempts:
            ledger.finish_attempt(_STREAM, run, attempt)
        ledger.complete_run(_STREAM, run, counts={"sent": tasks * rows_per_task}, now_ms=now_ms)
    finally:
        meter.detach(ledger.client)
    bill = meter.snapshot()
    rows = tasks * rows_per_task
    figures: dict[str, Any] = {
        "tasks": tasks,
        "rows": rows,
        "billed_write_units": bill.total_write_units,
        "dynamodb_requests": bill.requests,
        "billed_write_units_per_row": round(bill.total_write_units / rows, 4),
        "dynamodb_requests_per_row": round(bill.requests / rows, 4),
    }
    if renewals:
        figures |= {
            "renewals": renewals * tasks,
            "billed_read_units": bill.billed_read_units,
            "update_item_requests": bill.requests_by_operation.get("UpdateItem", 0),
            "get_item_requests": bill.requests_by_operation.get("GetItem", 0),
        }
    return figures


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devstack.run_item_cost", description=__doc__)
    parser.add_argument("--tasks", default="10,50,100,200", help="task counts, comma-separated")
    parser.add_argument("--rows-per-task", type=int, default=500)
    parser.add_argument(
        "--renewals", type=int, default=0, help="renewals of each attempt's lease (default none)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="keo-run-cost-") as state:
        endpoints = emulators.up(Path(state))
        try:
            settings = ProducerSettings(
                stream=_STREAM,
                table="run-item-cost",
                kinesis_endpoint_url=endpoints.kinesis,
                dynamodb_endpoint_url=endpoints.dynamodb,
                region=emulators.REGION,
            )
            ledger_from(settings).create_table(wait=True)
            for tasks in (int(n) for n in args.tasks.split(",")):
                figures = price_run(settings, tasks, args.rows_per_task, args.renewals)
                sys.stdout.write(json.dumps(figures) + "\n")
        finally:
            emulators.down(Path(state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
