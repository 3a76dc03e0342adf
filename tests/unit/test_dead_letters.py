"""The one dead-letter writer of both Spark doors (spark_jobs.dead_letters), over local folders:
where a batch's letters go, what a line holds, and that a replayed batch replaces its file
rather than adding one. The sink's Hadoop folders are the same writer, in the e2e Spark tests
(e2e/test_spark_sink.py), as are format("keo")'s commits (e2e/test_spark_datasource.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from producer.outcomes import Outcome, OutcomeStatus
from spark_jobs.dead_letters import (
    DEAD_LETTER_FIELDS,
    PART_FILE,
    DeadLetterWriter,
    LocalFolders,
    dead_letter_of,
)
from spark_jobs.writer import BatchReport, PartitionReport

STREAM = "orders"


def report_of(
    batch_id: int | None, *rows: tuple[Any, Outcome], binary: bool = False
) -> BatchReport:
    """A batch whose one partition dead-lettered ``rows`` ``(key, data, routing_key)``."""
    part = PartitionReport(0, dead_letters=[dead_letter_of(r, o, binary=binary) for r, o in rows])
    report = BatchReport("orders-to-kinesis", batch_id)
    report.add(part)
    return report


def rejected(key: str, reason: str) -> Outcome:
    return Outcome(0, key, OutcomeStatus.REJECTED, reason=reason)


def lines_of(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / PART_FILE).read_text("utf-8").splitlines()]


def test_a_batch_s_dead_letters_are_json_lines_in_its_folder_and_a_replay_replaces_them(
    tmp_path: Path,
) -> None:
    # GIVEN a writer under a dead-letter folder, and batch 7 with a rejected and a conflicting row
    writer = DeadLetterWriter(str(tmp_path / "dlq"), STREAM, LocalFolders())
    first = report_of(
        7,
        (("", "no key", None), rejected("", "key is empty")),
        (("taken", "other", "tenant-1"), Outcome(1, "taken", OutcomeStatus.CONFLICT)),
    )
    # WHEN it is written, then replayed and written again with only one of them
    writer.write(first)
    writer.write(report_of(7, (("", "no key", None), rejected("", "key is empty"))))
    # THEN batch 7's folder holds one file: the replay's letters, not both runs'
    folder = tmp_path / "dlq" / "batch=7"
    assert [p.name for p in folder.iterdir()] == [PART_FILE]
    (letter,) = lines_of(folder)
    # AND each line holds every field, the query and the batch, nulls written out
    assert tuple(letter) == DEAD_LETTER_FIELDS
    assert letter == {
        "query_id": "orders-to-kinesis",
        "batch_id": 7,
        "key": "",
        "status": "REJECTED",
        "reason": "key is empty",
        "data": "no key",
        "data_base64": None,
        "routing_key": None,
    }


def test_a_conflict_keeps_its_status_as_reason_and_binary_data_is_base64(tmp_path: Path) -> None:
    # GIVEN a batch of binary data whose one row conflicts (an outcome without a reason)
    writer = DeadLetterWriter(str(tmp_path), STREAM)
    report = report_of(
        3, (("k", b"\x00\xff", "r"), Outcome(0, "k", OutcomeStatus.CONFLICT)), binary=True
    )
    # WHEN it is written
    writer.write(report)
    # THEN its line says CONFLICT, and its data is base64
    (letter,) = lines_of(tmp_path / "batch=3")
    assert (letter["status"], letter["reason"]) == ("CONFLICT", "CONFLICT")
    assert (letter["data"], letter["data_base64"], letter["routing_key"]) == (None, "AP8=", "r")


def test_each_batch_write_has_a_folder_of_its_own(tmp_path: Path) -> None:
    # GIVEN a writer whose clock says 2024-05-01 12:00:00 UTC, and a batch write (no batch id)
    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    writer = DeadLetterWriter(str(tmp_path) + "/", STREAM, now=lambda: now)
    report = report_of(None, (("", "x", None), rejected("", "key is empty")))
    # WHEN two writes write their dead letters
    writer.write(report)
    writer.write(report)
    # THEN each has its folder, named by its time and a random part, none replacing the other
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) == 2
    assert all(name.startswith("write=20240501T120000Z-") for name in folders)
    assert all(len(lines_of(tmp_path / name)) == 1 for name in folders)


def test_without_a_dead_letter_path_the_rows_are_dropped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a writer without a path, and a batch with a rejected row
    writer = DeadLetterWriter(None, STREAM)
    report = report_of(2, (("", "x", None), rejected("", "key is empty")))
    report.counts["rejected"] = 1
    # WHEN it writes
    with caplog.at_level("WARNING", logger="spark_jobs.dead_letters"):
        writer.write(report)
    # THEN nothing is written, and the log says how many rows were dropped
    assert not any(tmp_path.iterdir())
    assert "no dead-letter path: rows dropped" in caplog.text
    assert "rejected=1" in caplog.text
