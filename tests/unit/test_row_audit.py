"""The replay audit's verdict row by row (``row_anomaly``), its counting (``RowTally``) checked
against a naive ``Counter`` of rows, and its sums (``RowFindings``): the same report however
the rows are split. No sockets: ``audit_rows`` reads a fake Kinesis."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from fakes.kinesis import FakeKinesisClient
from hypothesis import given
from hypothesis import strategies as st

from dedupe_store.clock import ManualClock
from dedupe_store.records import Position
from kinesis_store.entries import put_entry
from kinesis_store.reader import KinesisReader
from producer.audit.rows import (
    ExpectedRow,
    RowAnomaly,
    RowFindings,
    RowTally,
    row_anomaly,
    row_digest,
)
from producer.audit.stream import audit_rows
from producer.errors import AuditTooLargeError

Row = tuple[str, bytes]
SHARD = "shardId-000000000000"


def at(sequence: int) -> Position:
    return Position(SHARD, str(sequence))


def tally_of(expected: list[Row], stream: list[Row], *, max_rows: int | None = None) -> RowTally:
    """Rows expected (lines from 1), then the stream's records at sequence numbers 1, 2, ..."""
    tally = RowTally(
        "orders",
        [ExpectedRow(key, data, line) for line, (key, data) in enumerate(expected, 1)],
        max_rows=max_rows,
    )
    for sequence, (key, data) in enumerate(stream, 1):
        tally.add(key, data, at(sequence))
    return tally


@pytest.mark.parametrize(
    ("expected", "found", "anomaly"),
    [
        (1, 1, None),
        (2, 2, None),  # two identical rows, both delivered
        (0, 0, None),
        (2, 1, RowAnomaly.MISSING),
        (1, 0, RowAnomaly.MISSING),
        (1, 2, RowAnomaly.DUPLICATED),
        (2, 5, RowAnomaly.DUPLICATED),
        (0, 1, RowAnomaly.UNEXPECTED),
    ],
)
def test_each_row_is_judged_by_its_copies_expected_and_found(
    expected: int, found: int, anomaly: RowAnomaly | None
) -> None:
    assert row_anomaly(expected, found) is anomaly


def test_a_row_is_its_key_and_data_and_no_other_split_of_the_same_bytes() -> None:
    # GIVEN rows whose key and data run together into the same characters
    # THEN each is its own row; the same key and data are the same row
    assert row_digest("ab", b"c") != row_digest("a", b"bc")
    assert row_digest("a\x00", b"b") != row_digest("a", b"\x00b")
    assert row_digest("k", b"v") == row_digest("k", b"v")
    assert len(row_digest("k", b"v")) == 16


def test_identical_rows_count_as_many_copies_and_another_data_is_another_row() -> None:
    # GIVEN a run that sent two identical rows, and the same key with other data
    twice, other = ("order-1", b"paid"), ("order-1", b"refunded")
    # WHEN the stream holds one copy of the identical row, and the other row twice
    report = tally_of([twice, twice, other], [twice, other, other]).findings().report("s", shards=1)
    # THEN one copy of the identical row is missing, and the other row has one extra copy
    body = report.as_json()
    assert body["counts"] == {"missing": 1, "duplicated": 1, "unexpected": 0}
    assert body["copies"] == {"missing": 1, "duplicated": 1, "unexpected": 0}
    (missing,) = body["missing"]
    assert missing == {
        "digest": row_digest(*twice).hex(),
        "key": "order-1",
        "expected": 2,
        "found": 1,
        "line": 1,
        "missing": 1,
    }
    (duplicated,) = body["duplicated"]
    # AND the extra copy named is the later one in stream order
    assert (duplicated["line"], duplicated["extra"]) == (3, 1)
    assert duplicated["positions"] == [{"shard_id": SHARD, "sequence_number": "3"}]
    assert not report.clean
    assert (body["expected_records"], body["expected_rows"], body["matched_rows"]) == (3, 2, 0)
    # AND the summary names each row by its key, line and digest, and its copies
    summary = report.summary()
    assert f"missing: 'order-1' (line 1, {missing['digest'][:8]}): found 1 of 2" in summary
    assert f"duplicated: 'order-1' (line 3, {duplicated['digest'][:8]}): found 2 of 1" in summary
    assert "verdict: 2 ANOMALIES" in summary


def test_unexpected_rows_are_reported_and_fail_the_audit_only_when_it_is_strict() -> None:
    # GIVEN every expected row delivered once, and another writer's row in the stream
    mine, theirs = ("order-1", b"paid"), ("invoice-9", b"{}")
    tally = tally_of([mine], [theirs, mine])
    # WHEN judged, and judged strictly
    lenient = tally.findings().report("s", shards=1)
    strict = tally.findings().report("s", shards=1, strict=True)
    # THEN both report the unexpected row; only the strict audit fails on it
    assert lenient.count(RowAnomaly.UNEXPECTED) == strict.count(RowAnomaly.UNEXPECTED) == 1
    assert lenient.clean
    assert "not a failure without --strict" in lenient.summary()
    assert "verdict: CLEAN" in lenient.summary()
    assert not strict.clean
    assert "verdict: 1 ANOMALIES" in strict.summary()
    (row,) = strict.as_json()["unexpected"]
    assert (row["key"], row["expected"], row["extra"], "line" in row) == ("invoice-9", 0, 1, False)


def test_a_clean_stream_says_so() -> None:
    rows = [("a", b"1"), ("a", b"1"), ("b", b"")]
    report = tally_of(rows, list(reversed(rows))).findings().report("orders", shards=2)
    assert report.clean
    assert report.as_json()["matched_rows"] == 2
    assert report.summary().splitlines()[0] == (
        "keo audit: stream orders (replay: rows counted): 2 shards, 3 records, 2 distinct rows"
    )
    assert report.summary().endswith("verdict: CLEAN")


def test_past_max_rows_the_tally_stops_rather_than_run_out_of_memory() -> None:
    # GIVEN 3 rows expected, the same 3 in the stream: 3 rows held
    rows = [("a", b"1"), ("b", b"1"), ("c", b"1")]
    tally_of(rows, rows, max_rows=3)
    # WHEN a fourth row is expected, or found
    # THEN it stops, naming what holds too many rows
    with pytest.raises(AuditTooLargeError, match="the expected rows holds more than 3 rows"):
        tally_of([*rows, ("d", b"1")], [], max_rows=3)
    with pytest.raises(AuditTooLargeError, match="stream orders with the expected rows"):
        tally_of(rows, [("d", b"1")], max_rows=3)


# --- against a naive Counter ---------------------------------------------------------------

# few keys and payloads, so that rows repeat and collide on their key
ROWS = st.tuples(st.sampled_from(["a", "b", "a\x00"]), st.sampled_from([b"", b"1", b"\x00"]))


def naive(expected: list[Row], stream: list[Row]) -> dict[RowAnomaly, dict[Row, int]]:
    """Each anomaly's rows and their copies concerned, with Counters: what the audit must say."""
    want, got = Counter(expected), Counter(stream)
    return {
        RowAnomaly.MISSING: dict(want - got),
        RowAnomaly.DUPLICATED: {row: n for row, n in (got - want).items() if row in want},
        RowAnomaly.UNEXPECTED: {row: n for row, n in got.items() if row not in want},
    }


@given(
    expected=st.lists(ROWS, max_size=12),
    stream=st.lists(ROWS, max_size=12),
    strict=st.booleans(),
)
def test_the_tally_says_what_a_naive_counter_of_rows_says(
    expected: list[Row], stream: list[Row], strict: bool
) -> None:
    # GIVEN any expected rows and any stream, rows repeating
    # WHEN the tally judges them
    report = tally_of(expected, stream).findings().report("s", shards=1, strict=strict)
    body = report.as_json()
    # THEN each anomaly names exactly the rows and copies a Counter finds
    truth = naive(expected, stream)
    for anomaly, rows in truth.items():
        listed = {(r["key"], r["digest"]): r for r in body[anomaly.value]}
        assert set(listed) == {(key, row_digest(key, data).hex()) for key, data in rows}
        assert body["counts"][anomaly.value] == len(rows)
        assert body["copies"][anomaly.value] == sum(rows.values())
        for (key, data), copies in rows.items():
            row = listed[key, row_digest(key, data).hex()]
            assert row["missing" if anomaly is RowAnomaly.MISSING else "extra"] == copies
    # AND the extra copies named are the later ones: a row's occurrences past its expected count
    want = Counter(expected)
    for row in body["duplicated"] + body["unexpected"]:
        (key, data) = next(r for r in set(stream) if row_digest(*r).hex() == row["digest"])
        occurrences = [str(i) for i, r in enumerate(stream, 1) if r == (key, data)]
        extra = [p["sequence_number"] for p in row["positions"]]
        assert extra == occurrences[want[key, data] :]
    # AND the totals, and the verdict: missing or duplicated fail, unexpected only if strict
    assert (body["user_records"], body["expected_records"]) == (len(stream), len(expected))
    assert body["found_rows"] == len(set(stream))
    assert body["expected_rows"] == len(set(expected))
    assert body["matched_rows"] == sum(1 for r, n in want.items() if Counter(stream)[r] == n)
    failing = truth[RowAnomaly.MISSING] or truth[RowAnomaly.DUPLICATED]
    assert report.clean is not bool(failing or (strict and truth[RowAnomaly.UNEXPECTED]))


# --- the sums: any split of the rows gives the same report -------------------------------------

ROW_FACTS = st.tuples(
    st.text(min_size=1, max_size=3),  # key
    st.integers(min_value=0, max_value=3),  # copies expected
    st.integers(min_value=0, max_value=3),  # copies found
)


def add(findings: RowFindings, digest: bytes, facts: tuple[str, int, int]) -> None:
    key, expected, found = facts
    extra = [at(i) for i in range(expected, found)]
    findings.add_row(digest, key, expected=expected, found=found, extra=extra, line=None)


@given(
    rows=st.dictionaries(st.binary(min_size=16, max_size=16), ROW_FACTS, max_size=30),
    parts=st.integers(min_value=1, max_value=5),
    listed=st.integers(min_value=0, max_value=4),
)
def test_row_findings_added_in_parts_and_merged_are_the_findings_of_all_rows(
    rows: dict[bytes, tuple[str, int, int]], parts: int, listed: int
) -> None:
    # GIVEN every row added to one findings
    whole = RowFindings(listed=listed)
    for digest, facts in rows.items():
        add(whole, digest, facts)
    # WHEN the rows are split into parts, each added up on its own and sent as JSON
    split = [RowFindings(listed=listed) for _ in range(parts)]
    for index, (digest, facts) in enumerate(rows.items()):
        add(split[index % parts], digest, facts)
    merged = RowFindings(listed=listed)
    for part in split:
        merged.merge(RowFindings.from_json(json.loads(json.dumps(part.to_json()))))
    # THEN the report is the same; each list holds the first rows in (key, digest) order
    report: dict[str, Any] = merged.report("s", shards=1).as_json()
    assert report == whole.report("s", shards=1).as_json()
    for anomaly in RowAnomaly:
        with_it = sorted(
            (key, digest.hex())
            for digest, (key, expected, found) in rows.items()
            if row_anomaly(expected, found) is anomaly
        )
        assert report["counts"][anomaly.value] == len(with_it)
        assert [(r["key"], r["digest"]) for r in report[anomaly.value]] == with_it[:listed]


# --- reading the stream ----------------------------------------------------------------------


def test_audit_rows_reads_every_shard_as_a_consumer_does() -> None:
    # GIVEN a fake stream of 2 shards holding rows routed to both, one of them twice
    client = FakeKinesisClient(stream="orders", clock=ManualClock(), shard_count=2)
    rows = [(f"order-{i}", f"payload {i}".encode()) for i in range(10)]
    client.put_records(StreamName="orders", Records=[put_entry(k, d) for k, d in rows])
    client.put_records(StreamName="orders", Records=[put_entry(*rows[4])])
    reader = KinesisReader(client, "orders", sleep=client.sleep)
    expected = [ExpectedRow(key, data, line) for line, (key, data) in enumerate(rows, 1)]
    # WHEN the replay audit reads it against the rows
    shards_read: list[int] = []
    report = audit_rows(
        reader, [*expected, ExpectedRow("lost", b"x", 11)], progress=shards_read.append
    )
    # THEN it read both shards and found the second copy and the row never written
    body = report.as_json()
    assert (body["shards"], body["user_records"], shards_read) == (2, 11, [1, 1])
    assert [(r["key"], r["extra"]) for r in body["duplicated"]] == [("order-4", 1)]
    assert [(r["key"], r["line"]) for r in body["missing"]] == [("lost", 11)]
    assert body["clean"] is False
