"""The writers against the write quota (devstack.quota_bench), tiny: each writer is measured
behind the quota proxies, and the figures say what the table promises. Nothing about speed is
asserted (figures are for ``make bench``): keo send loses and doubles nothing, and plain
put_records' losses are counted."""

from __future__ import annotations

from typing import Any

import pytest

from devstack import emulators as local_stack
from devstack.quota_bench import (
    keo_send,
    measure_readers,
    measure_writers,
    plain_put_records,
    render_readers,
    render_writers,
)
from producer.settings import ProducerSettings

pytestmark = pytest.mark.integration


def test_each_writer_is_measured_against_its_shards_write_quota(
    emulators: local_stack.Endpoints, keo_env: Any
) -> None:
    settings = ProducerSettings(stream="unused", table="unused")
    writers = {"keo send --dedupe replay": keo_send("replay"), "plain": plain_put_records}
    said: list[str] = []
    figures = {
        f.writer: f
        for f in measure_writers(
            settings, seconds=4, writers=writers, max_shards=1, say=said.append
        )
    }
    replay, plain = figures["keo send --dedupe replay"], figures["plain"]
    # keo send resends what the quota refused: every row once, paced to the quota
    assert (replay.lost, replay.doubled) == (0, 0)
    assert replay.rows == int(replay.offered_rows_per_s * 4)
    assert replay.offered_rows_per_s == 1.5 * replay.quota_records_per_s * replay.shards
    # plain put_records offered 1.5 times what its shards take loses what was refused
    assert plain.throttled > 0
    assert plain.lost > 0
    assert plain.doubled == 0
    table = render_writers(list(figures.values()))
    assert table.count("\n") == 3
    assert any("of the quota" in line for line in said)


def test_a_reader_drains_a_backlog_beside_another_consumer_refusing_it_nothing(
    emulators: local_stack.Endpoints, keo_env: Any
) -> None:
    settings = ProducerSettings(stream="unused", table="unused")
    (audit,) = measure_readers(settings, backlog_mib=8, say=lambda _: None)
    assert audit.reader == "keo audit"
    assert audit.read_mib_per_s > 0
    # within the shard's limits together: the consumer at the tip was never refused
    assert audit.other_calls > 0
    assert audit.other_throttled == 0
    assert render_readers([audit]).count("\n") == 2
