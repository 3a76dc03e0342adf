"""Aggregating sends, in key mode and in replay mode, while the stream is split under them on
kinesalite: every second in a thread, and right before the first puts leave (after their
aggregates were packed on the shard map the producer held, so those puts surely meet a stale
map). An aggregate that lands on a shard not covering all its members is dropped whole by
the KCL; the producer sends all its members again. Audited by ``tests/kcl_rule.py``, a port of
the KCL's rule: every key once (key mode), every row once as a multiset (replay mode).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import kcl_rule
import pytest
import stacks
import streamcheck
from splits import Splitter

from devstack import emulators as local_stack
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import Message
from producer.settings import ProducerSettings
from producer.wiring import build_stack

if TYPE_CHECKING:
    from conftest import Names

MESSAGES = [Message(f"order-{i:05d}", f"payload {i}".encode()) for i in range(2_000)]
FORCED = 2  # the first puts wait for a split right before they leave
LIVE = 2  # and a split every second while the send runs: 2 shards become up to 6 open ones
EVERY_S = 1.0


@pytest.fixture
def settings(emulators: local_stack.Endpoints, names: Names) -> ProducerSettings:
    # a longer read timeout than FAST's (and the lease it needs): a put the loaded emulator
    # answers late is ambiguous and read back, which these tests are not about
    timing = {**stacks.FAST, "put_read_timeout_s": 3.0, "lease_s": 6.0}
    return stacks.fresh(emulators, names, **timing, aggregate=True)


@pytest.fixture
def kinesis(emulators: local_stack.Endpoints) -> Any:
    return streamcheck.kinesis_client(emulators.kinesis)


@pytest.fixture
def splitter(settings: ProducerSettings, emulators: local_stack.Endpoints) -> Iterator[Splitter]:
    # its own client: it runs in its own thread
    client = streamcheck.kinesis_client(emulators.kinesis)
    with Splitter(client, settings.stream, live=LIVE, forced=FORCED, every_s=EVERY_S) as splitter:
        yield splitter


def assert_positions_seen_by_kcl(outcomes: list[Outcome], seen: kcl_rule.StreamAsSeen) -> None:
    """Every SENT outcome points at a user record a KCL consumer reads (none at a stray)."""
    kcl = {(r.shard_id, r.sequence_number, r.sub_sequence_number) for r in seen.kcl}
    off = [
        o
        for o in outcomes
        if o.position is None
        or (o.position.shard_id, o.position.sequence_number, o.position.sub_sequence_number)
        not in kcl
    ]
    assert not off, f"{len(off)} outcomes at positions no KCL consumer reads, e.g. {off[:3]}"


def test_key_mode_aggregating_across_live_splits_delivers_each_key_once_to_a_kcl_consumer(
    settings: ProducerSettings, kinesis: Any, splitter: Splitter
) -> None:
    # GIVEN an aggregating key-mode producer on a stream split every second and before its
    # first puts leave
    stack = build_stack(settings, hooks=splitter)
    # WHEN 2,000 keys are sent
    with stack.producer(owner="aggregator") as producer:
        outcomes = producer.send(MESSAGES)
    # THEN each is SENT, and puts met a stale shard map (aggregates the KCL drops whole)
    assert Counter(o.status for o in outcomes) == {OutcomeStatus.SENT: len(MESSAGES)}
    assert splitter.stale_puts == FORCED
    assert splitter.splits >= 1  # puts asking at once are all stale after the same split
    seen = kcl_rule.read_stream(kinesis, settings.stream)
    assert seen.dropped_aggregates > 0
    # AND a KCL consumer sees every key exactly once, where its outcome says
    missing = [m.key for m in MESSAGES if seen.kcl_keys[m.key] == 0]
    twice = {k: n for k, n in seen.kcl_keys.items() if n > 1}
    assert not missing, f"{len(missing)} keys a KCL consumer never sees, e.g. {missing[:5]}"
    assert not twice, f"{len(twice)} keys a KCL consumer sees more than once"
    assert seen.kcl_keys == Counter(m.key for m in MESSAGES)
    assert_positions_seen_by_kcl(outcomes, seen)
    # AND a resend is DUPLICATE for every key, nothing more written
    with stack.producer(owner="again") as producer:
        again = producer.send(MESSAGES)
    assert Counter(o.status for o in again) == {OutcomeStatus.DUPLICATE: len(MESSAGES)}
    assert kcl_rule.read_stream(kinesis, settings.stream).kcl_keys == seen.kcl_keys


def test_replay_mode_aggregating_across_live_splits_delivers_each_row_once_to_a_kcl_consumer(
    settings: ProducerSettings, kinesis: Any, splitter: Splitter
) -> None:
    # GIVEN an aggregating replay-mode producer on a stream split every second and before its
    # first puts leave; some rows twice (two records each)
    stack = build_stack(settings, hooks=splitter)
    rows = [*MESSAGES, *MESSAGES[:20]]
    # WHEN the run's rows are sent
    outcomes = stack.replay_producer().send_run("split-run", rows)
    # THEN each is SENT, and puts met a stale shard map (aggregates the KCL drops whole)
    assert Counter(o.status for o in outcomes) == {OutcomeStatus.SENT: len(rows)}
    assert splitter.stale_puts == FORCED
    seen = kcl_rule.read_stream(kinesis, settings.stream)
    assert seen.dropped_aggregates > 0
    # AND a KCL consumer sees every row exactly once, as a multiset, where its outcome says
    expected = Counter((m.key, m.data) for m in rows)
    missing = expected - seen.kcl_rows
    extra = seen.kcl_rows - expected
    assert not missing, f"{sum(missing.values())} rows a KCL consumer never sees"
    assert not extra, f"{sum(extra.values())} rows a KCL consumer sees too often"
    assert_positions_seen_by_kcl(outcomes, seen)
    # AND a re-run of the complete run sends nothing
    again = stack.replay_producer().send_run("split-run", rows)
    assert Counter(o.status for o in again) == {OutcomeStatus.DUPLICATE: len(rows)}
    assert kcl_rule.read_stream(kinesis, settings.stream).kcl_rows == seen.kcl_rows
