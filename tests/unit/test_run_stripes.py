"""Which stripe a replay-mode task counts its attempts on, and how a run item's stripes are
read back (``dedupe_store.run_items``; the writes are the ledger contract's,
``tests/ledger_contract/run_stripes.py``)."""

from __future__ import annotations

from dedupe_store import expressions as x
from dedupe_store.records import ReplayRun, RunExecution
from dedupe_store.run_items import (
    TASKS_PER_STRIPE,
    announced_stripes,
    replay_run_pk,
    replay_stripe_pk,
    stripe_of,
    with_stripes,
)
from dedupe_store.states import RunState


def test_spark_tasks_are_striped_256_a_stripe_and_other_tasks_count_on_the_run_item() -> None:
    # GIVEN Spark's tasks (partition indexes), the CLI's and the API's
    # WHEN their stripes are asked
    # THEN a batch's first 256 partitions are in stripe 0 (the run item), then 256 a stripe;
    # a task that is not a decimal number is in stripe 0
    assert TASKS_PER_STRIPE == 256
    assert [stripe_of(t) for t in ("0", "255", "256", "511", "512", "1999")] == [0, 0, 1, 1, 2, 7]
    assert [stripe_of(t) for t in ("cli", "api", "-1", "3.5", "", "٣٠٠")] == [0] * 6


def test_a_stripe_item_is_never_read_as_a_run_of_its_stream() -> None:
    # GIVEN a run's item key and its stripe's, a run name holding "/"
    run_pk = replay_run_pk("orders", "query-a/7")
    stripe_pk = replay_stripe_pk("orders", "query-a/7", "exec-1", 3)
    # THEN a scan of the stream's runs (begins_with the runs' prefix) never reads the stripe
    assert run_pk.startswith(replay_run_pk("orders", ""))
    assert not stripe_pk.startswith(replay_run_pk("orders", ""))
    assert stripe_pk == "__keo__/runpart/orders/exec-1/3/query-a/7"


def test_an_item_written_before_stripes_reads_as_it_did_and_stripes_add_to_its_counts() -> None:
    # GIVEN a run with one execution counted on the run item
    run = ReplayRun(
        "orders", "q/1", RunState.OPEN, (RunExecution("e1", 1, 2, attempts=2, open_tags=5),)
    )
    # WHEN an item with no stripes, and one listing stripes 1 and 3 of e1, are read
    # THEN the first announces none; the second's stripe items add their counts (a stripe a
    # seal created before any attempt wrote it adds nothing)
    assert announced_stripes({"exec:e1:open": x.n(5)}) == {}
    assert announced_stripes({"exec:e1:stripes": {"NS": ["3", "1"]}}) == {"e1": (1, 3)}
    stripes = [
        {"attempts": x.n(2), "open": x.n(7), "late": {"SS": ["r1"]}},
        {"sealed": {"BOOL": True}},
    ]
    [merged] = with_stripes(run, {"e1": stripes}).executions
    assert (merged.attempts, merged.open_tags, merged.late_rows) == (4, 12, {"r1"})
