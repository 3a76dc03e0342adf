"""Replay mode (``dedupe=replay``) through ``format("keo")`` and ``ExactlyOnceSink`` on a real
local Spark against the real emulators: the stream holds exactly the rows of a run without
failures, as a multiset of ``(key, data)``, read back with plain boto3 (streamcheck).

The faults of a cluster (a driver killed -9, a Python worker killed, a task stopped past its
lease) are in ``test_spark_cluster_replay.py``; here: a replayed micro-batch, a batch write
re-run with another partitioning and more rows, identical rows, and the options replay mode
needs.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spark_support import events, frame, start_event_query, streamcheck, write_event_files

import spark_jobs
from dedupe_store.states import RunState
from devstack.failpoints import Failpoints
from producer.hooks import NO_HOOKS, Step
from producer.wiring import Stack
from spark_jobs.errors import OptionsError
from spark_jobs.options import setting_options
from spark_jobs.sink import ExactlyOnceSink

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 180


def replay_options(settings: dict[str, str], **more: str) -> dict[str, str]:
    return {**setting_options(settings), "dedupe": "replay", **more}


def in_stream(kinesis: Any, stack: Stack) -> Counter[tuple[str, bytes]]:
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    return Counter((r.partition_key, r.data) for r in contents.records)


def as_multiset(rows: list[tuple[str, str]]) -> Counter[tuple[str, bytes]]:
    return Counter((key, data.encode()) for key, data in rows)


def test_a_batch_write_puts_identical_rows_twice_and_its_re_run_only_what_is_missing(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any
) -> None:
    """GIVEN a batch write named run_id whose commit failed after its puts (two identical
    rows among its 40) WHEN it is re-run with 10 more rows, another partitioning and order THEN
    the stream holds exactly the re-run's rows: the identical rows twice, each other row once,
    and the run is COMPLETE."""
    rows = [*events(38), ("k0000", "payload of k0000"), ("k0001", "payload of k0001")]
    options = replay_options(settings, run_id="backfill-2026-11-24")
    spark_jobs.register(keo, hooks=Failpoints(f"{Step.BATCH_BEFORE_COMPLETE}=raise"))
    with pytest.raises(Exception, match="batch_before_complete"):
        frame(keo, rows).write.format("keo").mode("append").options(**options).save()
    assert in_stream(kinesis, stack) == as_multiset(rows)

    spark_jobs.register(keo)
    more = rows + events(10, prefix="m")
    again = keo.createDataFrame(list(reversed(more)), "key string, data string").repartition(5)
    # the re-run through the row writer (the first through the Arrow writer)
    again.write.format("keo").mode("append").options(**options, arrow="false").save()

    assert in_stream(kinesis, stack) == as_multiset(more)
    run = stack.ledger.get_run(stack.settings.stream, "backfill-2026-11-24")
    assert run is not None
    assert run.state is RunState.COMPLETE
    assert run.counts["sent"] == 10
    assert run.counts["duplicates"] == 40


def test_a_streaming_write_killed_after_its_puts_replays_its_batch_and_sends_nothing_twice(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    """GIVEN a streaming write in replay mode whose driver commit dies after batch 0's puts
    WHEN the query is restarted from its checkpoint THEN batch 0 is replayed: its rows are
    found, none is sent again; every batch's run is COMPLETE and the stream holds each event
    once."""
    from pyspark.errors import StreamingQueryException

    keys = write_event_files(tmp_path / "in", files=3, per_file=40)
    options = replay_options(settings, query_name="orders-replay")
    spark_jobs.register(keo, hooks=Failpoints(f"{Step.BATCH_AFTER_PUTS}=raise"))
    first = start_event_query(keo, tmp_path / "in", tmp_path / "checkpoint", options)
    with pytest.raises(StreamingQueryException, match="batch_after_puts"):
        first.awaitTermination(QUERY_TIMEOUT_S)
    assert sum(in_stream(kinesis, stack).values()) == 40

    spark_jobs.register(keo)
    second = start_event_query(keo, tmp_path / "in", tmp_path / "checkpoint", options)
    assert second.awaitTermination(QUERY_TIMEOUT_S)
    assert second.exception() is None

    stream = stack.settings.stream
    replayed = stack.ledger.get_run(stream, "orders-replay/0")
    assert replayed is not None
    assert replayed.state is RunState.COMPLETE
    assert (replayed.counts["duplicates"], replayed.counts["sent"]) == (40, 0)
    for batch in (1, 2):
        run = stack.ledger.get_run(stream, f"orders-replay/{batch}")
        assert run is not None
        assert run.state is RunState.COMPLETE
    found = in_stream(kinesis, stack)
    assert sorted(key for key, _ in found) == sorted(keys)
    assert set(found.values()) == {1}


def test_a_streaming_write_in_replay_mode_needs_a_query_name(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    """GIVEN replay mode WHEN a streaming write has no query_name THEN the query fails as its
    first batch is planned, naming the option, before any row is read or sent."""
    from pyspark.errors import StreamingQueryException

    write_event_files(tmp_path / "in", files=1, per_file=5)
    query = start_event_query(
        keo, tmp_path / "in", tmp_path / "checkpoint", replay_options(settings)
    )
    with pytest.raises(StreamingQueryException, match="query_name") as refused:
        query.awaitTermination(QUERY_TIMEOUT_S)
    assert "dedupe=replay" in str(refused.value)
    assert sum(in_stream(kinesis, stack).values()) == 0


@pytest.mark.spark35
def test_run_id_belongs_to_replay_mode(settings: dict[str, str]) -> None:
    """GIVEN key mode WHEN a write names a run_id THEN the options are refused by name."""
    from spark_jobs.options import WriteOptions

    options = setting_options(settings)
    with pytest.raises(OptionsError, match="run_id") as refused:
        WriteOptions.parse({**options, "run_id": "r"}, streaming=False)
    assert refused.value.options == ["run_id"]


@pytest.mark.spark35
def test_the_foreach_batch_sink_in_replay_mode_sends_a_replayed_batch_once(
    spark: Any, settings: dict[str, str], stack: Stack, kinesis: Any
) -> None:
    """GIVEN ExactlyOnceSink(dedupe="replay") whose batch 3 put its rows and failed before its
    commit WHEN the same sink is called with batch 3 again (a query restarted in the same
    driver), its rows reordered THEN the replay finds every row and sends none; the run is
    COMPLETE; WHEN batch 3 comes a third time THEN it is skipped."""
    rows = events(30)
    sink = ExactlyOnceSink(
        settings,
        query_id="sink-query",
        dedupe="replay",
        hooks=Failpoints(f"{Step.BATCH_BEFORE_COMPLETE}=raise"),
    )
    with pytest.raises(Exception, match="batch_before_complete"):
        sink.write_batch(frame(spark, rows), 3)
    assert in_stream(kinesis, stack) == as_multiset(rows)

    sink.hooks = NO_HOOKS
    again = sink.write_batch(frame(spark, list(reversed(rows))), 3)
    assert (again.counts["sent"], again.counts["duplicates"]) == (0, 30)
    assert sink.write_batch(frame(spark, rows), 3).skipped

    assert in_stream(kinesis, stack) == as_multiset(rows)
    run = stack.ledger.get_run(stack.settings.stream, "sink-query/3")
    assert run is not None
    assert run.state is RunState.COMPLETE
    assert run.counts["duplicates"] == 30
