"""``python -m devstack.run_item_cost`` prices a replay-mode run's ledger items on dynalite."""

from __future__ import annotations

from typing import TYPE_CHECKING

import stacks

from devstack import emulators as local_stack
from devstack.run_item_cost import price_run

if TYPE_CHECKING:
    from conftest import Names


def test_a_run_costs_three_small_writes_a_task_whatever_its_task_count(
    emulators: local_stack.Endpoints, names: Names
) -> None:
    """GIVEN a ledger table WHEN runs of 5 and 200 tasks are priced THEN each costs three
    writes per task and one to complete, each billed one unit, and two for the in-flight
    index (the run's entry written once, removed once): the run item holds its executions'
    bounds, never their attempts, so it does not grow with the tasks (it did: 0.068 units a
    row at 200 tasks of 500 rows, ten times the 10-task figure)."""
    settings = stacks.fresh(emulators, names)
    small = price_run(settings, 5, 500)
    large = price_run(settings, 200, 500)
    assert (small["dynamodb_requests"], large["dynamodb_requests"]) == (16, 601)
    assert (small["billed_write_units"], large["billed_write_units"]) == (18, 603)
    assert large["billed_write_units_per_row"] <= 0.01
