"""The audit's verdict key by key (``key_anomalies``), and its sums (``Findings``): the same
report however the keys are split, counts exact, key lists bounded. No sockets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedupe_store.records import LedgerRecord, Position, ReplayRun, RunExecution
from dedupe_store.states import LedgerState, RunState
from producer.audit.stream import (
    Anomaly,
    Findings,
    ReplayWindows,
    StreamTally,
    judge,
    key_anomalies,
)

HERE = Position("shardId-000000000000", "100")
THERE = Position("shardId-000000000001", "200")
AGGREGATED = Position("shardId-000000000000", "100", 0)


def anomalies(
    positions: list[Position],
    state: LedgerState | None = None,
    position: Position | None = None,
    *,
    expected: bool = False,
    ledger_read: bool = True,
) -> set[Anomaly]:
    found = key_anomalies(
        positions,
        ledger_read=ledger_read,
        ledger_state=state,
        ledger_position=position,
        expected=expected,
    )
    return {anomaly for anomaly, _ in found}


@pytest.mark.parametrize(
    ("positions", "state", "position", "expected", "found"),
    [
        # delivered once, where the ledger says: clean
        ([HERE], LedgerState.DELIVERED, HERE, True, set()),
        # sub-sequence number 0 and none are the same record of a plain put
        ([AGGREGATED], LedgerState.DELIVERED, HERE, False, set()),
        ([HERE, THERE], LedgerState.DELIVERED, HERE, False, {Anomaly.DUPLICATE}),
        ([HERE], LedgerState.DELIVERED, THERE, False, {Anomaly.POSITION_MISMATCH}),
        ([], LedgerState.DELIVERED, HERE, True, {
            Anomaly.DELIVERED_MISSING,
            Anomaly.EXPECTED_MISSING,
        }),
        ([HERE], None, None, False, {Anomaly.UNKNOWN}),
        ([], None, None, True, {Anomaly.EXPECTED_MISSING}),
        ([], LedgerState.IN_FLIGHT, None, False, {Anomaly.IN_FLIGHT}),
        ([], LedgerState.UNVERIFIABLE, None, False, {Anomaly.UNVERIFIABLE}),
        # released: the key may be sent again; neither in the stream nor expected is fine
        ([], LedgerState.RELEASED, None, False, set()),
        # a key that nobody mentions (all its records dropped as KCL would): nothing
        ([], None, None, False, set()),
    ],
)  # fmt: skip
def test_each_key_is_judged_by_what_the_stream_the_ledger_and_the_expected_keys_say(
    positions: list[Position],
    state: LedgerState | None,
    position: Position | None,
    expected: bool,
    found: set[Anomaly],
) -> None:
    assert anomalies(positions, state, position, expected=expected) == found


def test_without_the_ledger_only_the_stream_and_the_expected_keys_count() -> None:
    # GIVEN no ledger read: a key in the stream is not "unknown"
    assert anomalies([HERE], ledger_read=False) == set()
    assert anomalies([HERE, THERE], ledger_read=False) == {Anomaly.DUPLICATE}
    assert anomalies([], ledger_read=False, expected=True) == {Anomaly.EXPECTED_MISSING}


def test_a_duplicate_lists_its_positions_in_stream_order() -> None:
    ((anomaly, detail),) = key_anomalies(
        [THERE, HERE],
        ledger_read=False,
        ledger_state=None,
        ledger_position=None,
        expected=False,
    )
    assert anomaly is Anomaly.DUPLICATE
    assert detail == [
        {"shard_id": HERE.shard_id, "sequence_number": "100"},
        {"shard_id": THERE.shard_id, "sequence_number": "200"},
    ]


# --- the sums: any split of the keys gives the same report ---------------------------------------

STATES = st.sampled_from([None, *LedgerState])
KEY_FACTS = st.tuples(
    st.integers(min_value=0, max_value=3),  # records in the stream
    STATES,
    st.booleans(),  # the ledger's position is the first record's
    st.booleans(),  # expected
)


def add(findings: Findings, key: str, facts: tuple[int, LedgerState | None, bool, bool]) -> None:
    records, state, at_first, expected = facts
    positions = [Position("shardId-000000000000", str(100 + i)) for i in range(records)]
    position = None
    if state is LedgerState.DELIVERED:
        position = positions[0] if at_first and positions else Position("shardId-9", "1")
    findings.add_key(
        key,
        positions,
        ledger_read=True,
        ledger_state=state,
        ledger_position=position,
        expected=expected,
    )


@given(
    keys=st.dictionaries(st.text(min_size=1, max_size=4), KEY_FACTS, max_size=40),
    parts=st.integers(min_value=1, max_value=5),
    listed=st.integers(min_value=0, max_value=4),
)
def test_findings_added_in_parts_and_merged_are_the_findings_of_all_keys(
    keys: dict[str, tuple[int, LedgerState | None, bool, bool]], parts: int, listed: int
) -> None:
    # GIVEN every key added to one findings
    whole = Findings(listed=listed, expected=0)
    for key, facts in keys.items():
        add(whole, key, facts)
    # WHEN the keys are split into parts, each added up on its own and sent as JSON
    split = [Findings(listed=listed, expected=0) for _ in range(parts)]
    for index, (key, facts) in enumerate(keys.items()):
        add(split[index % parts], key, facts)
    merged = Findings(listed=listed, expected=0)
    for part in split:
        merged.merge(Findings.from_json(json.loads(json.dumps(part.to_json()))))

    # THEN the report is the same; the counts are exact and each list holds the first keys
    report = merged.report("s", shards=1)
    assert report.as_json() == whole.report("s", shards=1).as_json()
    for anomaly in Anomaly:
        keys_with = sorted(key for key, facts in keys.items() if anomaly in facts_anomalies(facts))
        assert report.count(anomaly) == len(keys_with)
        assert [key for key, _ in merged.listed_keys(anomaly)] == keys_with[:listed]


def facts_anomalies(facts: tuple[int, LedgerState | None, bool, bool]) -> set[Anomaly]:
    probe = Findings(listed=1)
    add(probe, "k", facts)
    return set(probe.counts)


def test_findings_hold_a_bounded_number_of_keys_however_many_are_added() -> None:
    # GIVEN 1000 keys, every one expected and missing
    findings = Findings(listed=5, expected=0)
    for i in range(1000):
        findings.add_key(
            f"k{999 - i:04d}",
            [],
            ledger_read=True,
            ledger_state=None,
            ledger_position=None,
            expected=True,
        )
        # THEN it never keeps more than about twice the keys it lists
        assert len(findings.keys[Anomaly.EXPECTED_MISSING]) <= 2 * 5 + 1
    report = findings.report("s", shards=1)
    assert report.count(Anomaly.EXPECTED_MISSING) == 1000
    assert report.expected_missing == ["k0000", "k0001", "k0002", "k0003", "k0004"]
    assert report.as_json()["missing_count"] == 1000


def test_judge_reports_the_first_keys_and_exact_counts() -> None:
    # GIVEN a stream with 12 keys twice each
    tally = StreamTally("orders", shards=1)
    for i in range(12):
        tally.seen[f"order-{i:02d}"] = [
            Position("shardId-000000000000", str(2 * i + 1)),
            Position("shardId-000000000000", str(2 * i + 2)),
        ]
        tally.user_records += 2
    # WHEN it is judged listing 3 keys, without the ledger
    report = judge(tally, None, listed=3)
    # THEN 12 duplicates are counted and the first 3 listed with their positions
    body: dict[str, Any] = report.as_json()
    assert body["duplicate_count"] == 12
    assert body["counts"]["duplicate"] == 12
    assert body["anomalies"] == 12
    assert body["listed_keys"] == 3
    assert list(body["duplicates"]) == ["order-00", "order-01", "order-02"]
    assert "verdict: 12 ANOMALIES" in report.summary()


# --- a stream written in both modes ---------------------------------------------------------


def _run(name: str, *windows: tuple[int, int]) -> ReplayRun:
    executions = tuple(
        RunExecution(f"{name}-exec-{i}", started_at_ms=start, lease_expires_at_ms=end)
        for i, (start, end) in enumerate(windows)
    )
    return ReplayRun("orders", name, RunState.COMPLETE, executions)


def test_keys_the_ledger_does_not_know_written_while_a_replay_run_wrote_are_replay_modes() -> None:
    # GIVEN a stream with a key the ledger knows, two keys that arrived while replay runs
    # wrote (one inside a second execution's window, one inside the skew), and one after
    tally = StreamTally("orders", shards=1)
    arrivals = {"claimed": 5_000, "r1": 12_000, "r2": 40_500, "stray": 90_000}
    for sequence, (key, arrival_ms) in enumerate(arrivals.items()):
        tally.seen[key] = [Position("shardId-000000000000", str(sequence + 1))]
        tally.arrival_ms[key] = arrival_ms
        tally.user_records += 1
    claimed = LedgerRecord(
        "orders",
        "claimed",
        LedgerState.DELIVERED,
        attempt=1,
        owner="keo-send",
        claimed_at_ms=4_000,
        payload_digest="d",
        routing_hash_key="0",
        position=Position("shardId-000000000000", "1"),
    )
    runs = [_run("q/1", (10_000, 20_000)), _run("q/2", (15_000, 18_000), (30_000, 40_000))]
    # WHEN it is judged against the ledger and its replay runs, 1 s of skew
    report = judge(tally, [claimed], replay=lambda: ReplayWindows(runs, skew_ms=1_000))
    # THEN the keys written while a run wrote are replay mode's, named with the runs; the
    # one written after every run is unknown
    assert report.replay_rows == 2
    assert report.replay_runs == ["q/1", "q/2"]
    assert report.unknown_keys == ["stray"]
    assert report.anomalies == 1
    assert "replay-mode keys:     2" in report.summary()
    assert "keo audit --dedupe replay --expected FILE" in report.summary()
    # AND without the stray key the audit is clean
    del tally.seen["stray"]
    assert judge(tally, [claimed], replay=lambda: ReplayWindows(runs, skew_ms=1_000)).clean


def test_replay_windows_merge_overlapping_executions_and_place_a_time_in_them() -> None:
    windows = ReplayWindows(
        [_run("a", (0, 10)), _run("b", (5, 20)), _run("c", (30, 40))], skew_ms=0
    )
    assert windows.writing_at(7) == {"a", "b"}
    assert windows.writing_at(20) == {"a", "b"}
    assert windows.writing_at(25) == set()
    assert windows.writing_at(30) == {"c"}
    assert windows.writing_at(-1) == set()
    assert ReplayWindows([], skew_ms=5).writing_at(0) == set()


def test_replay_rows_travel_with_findings_between_processes() -> None:
    findings = Findings(listed=2)
    findings.add_key(
        "r1",
        [Position("shardId-000000000000", "1")],
        ledger_read=True,
        ledger_state=None,
        ledger_position=None,
        expected=False,
        replay_row=True,
    )
    merged = Findings(listed=2)
    merged.merge(Findings.from_json(json.loads(json.dumps(findings.to_json()))))
    assert merged.replay_rows == 1
    assert merged.report("orders", shards=1, replay_runs=["q/1"]).clean


def test_the_replay_runs_are_read_only_when_the_stream_holds_a_key_the_ledger_does_not_know() -> (
    None
):
    # GIVEN a stream whose keys the ledger all knows
    tally = StreamTally("orders", shards=1)
    tally.seen["k"] = [Position("shardId-000000000000", "1")]
    tally.arrival_ms["k"] = 1_000
    known = LedgerRecord(
        "orders",
        "k",
        LedgerState.DELIVERED,
        attempt=1,
        owner="keo-send",
        claimed_at_ms=0,
        payload_digest="d",
        routing_hash_key="0",
        position=Position("shardId-000000000000", "1"),
    )

    def unread() -> ReplayWindows:
        raise AssertionError("the replay runs were read (a second table scan) for nothing")

    # WHEN it is judged THEN its replay runs are never asked for
    assert judge(tally, [known], replay=unread).clean
