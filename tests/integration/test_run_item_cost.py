"""``python -m devstack.run_item_cost`` prices a replay-mode run's ledger item on dynalite."""

from __future__ import annotations

from typing import TYPE_CHECKING

import stacks

from devstack import emulators as local_stack
from devstack.run_item_cost import price_run

if TYPE_CHECKING:
    from conftest import Names


def test_a_run_costs_two_writes_a_task_and_its_units_grow_with_its_attempts(
    emulators: local_stack.Endpoints, names: Names
) -> None:
    """GIVEN a ledger table WHEN runs of 5 and 40 tasks are priced THEN each costs two writes
    per task and one to complete, and the larger run's units per row are higher: every write
    to the run item is billed by the item, which holds every attempt."""
    settings = stacks.fresh(emulators, names)
    small = price_run(settings, 5, 500)
    large = price_run(settings, 40, 500)
    assert (small["dynamodb_requests"], large["dynamodb_requests"]) == (11, 81)
    assert large["billed_write_units_per_row"] > small["billed_write_units_per_row"] > 0
