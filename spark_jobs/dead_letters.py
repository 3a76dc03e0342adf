"""Dead letters: the rows of a batch that no retry delivers as they are (REJECTED input, a key's
CONFLICT), and the one writer that keeps them for both of Spark's doors.

::

    executors   TaskWriter: a row REJECTED or CONFLICT ── DeadLetter (dead_letter_of), in the
                partition's report to the driver
    driver      settle_batch, once every task of the batch has reported
                  └─ DeadLetterWriter.write(report)
                       ├─ no dead_letter_path: dropped, with a warning that counts them
                       ├─ the folder: <dead_letter_path>/batch=<batch id>   a streaming batch
                       │              <dead_letter_path>/write=<UTC time>-<8 hex>   a batch write
                       ├─ JSON lines, one object a row, every field of DEAD_LETTER_SCHEMA
                       └─ <folder>/part-00000.json replaced whole: written aside, renamed in

They are written on the driver, once a batch, after every task succeeded: a task attempt that
failed or lost to a speculative copy leaves none behind. A replayed batch (the same batch id)
replaces its own file, so its dead letters are never there twice. They are written before the
batch is recorded COMPLETE: a batch that died between the two writes them again when it is
replayed, and a replay skipped as COMPLETE finds them where its first run left them.

The two doors differ only in what they reach from the driver: ``format("keo")``'s commit runs in
a Python worker of the driver that has no Spark session, so it writes a local or mounted folder
with plain file calls (:class:`LocalFolders`); ``foreachBatch(ExactlyOnceSink)`` runs in the
driver's own process and writes through its session's Hadoop file system
(:class:`HadoopFolders`): any path Spark can write (``s3://``, ``hdfs://``, ...), with Spark's
configuration and credentials. Nothing here imports pyspark.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from producer.outcomes import Outcome, OutcomeStatus

if TYPE_CHECKING:
    from spark_jobs.writer import BatchReport

log = logging.getLogger(__name__)

DEAD_LETTER_STATUSES: Final = frozenset({OutcomeStatus.REJECTED, OutcomeStatus.CONFLICT})
DEAD_LETTER_SCHEMA: Final = (
    "query_id string, batch_id long, key string, status string, reason string, "
    "data string, data_base64 string, routing_key string"
)
DEAD_LETTER_FIELDS: Final = tuple(column.split()[0] for column in DEAD_LETTER_SCHEMA.split(", "))
# one file a batch, so that a replay of the batch replaces it rather than adds one
PART_FILE: Final = "part-00000.json"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A row that can never be delivered as it is: rejected input or a key conflict."""

    key: str | None
    status: str
    reason: str
    data: str | None  # text data as it was
    data_base64: str | None  # binary data
    routing_key: str | None

    def as_row(self, query_id: str | None, batch_id: int | None) -> tuple[Any, ...]:
        """In the order of :data:`DEAD_LETTER_SCHEMA`."""
        return (
            query_id,
            batch_id,
            self.key,
            self.status,
            self.reason,
            self.data,
            self.data_base64,
            self.routing_key,
        )


def dead_letter_of(row: Any, outcome: Outcome, *, binary: bool) -> DeadLetter:
    """The dead letter of a row ``(key, data, routing_key)`` and its outcome: text data as it
    was, binary data in base64."""
    data = row[1]
    text: str | None = None
    encoded: str | None = None
    if binary and data is not None:
        encoded = base64.b64encode(bytes(data)).decode("ascii")
    elif isinstance(data, str):
        text = data
    return DeadLetter(
        key=row[0] if isinstance(row[0], str) else None,
        status=outcome.status.value,
        reason=outcome.reason or outcome.status.value,
        data=text,
        data_base64=encoded,
        routing_key=row[2],
    )


def json_lines(rows: Sequence[tuple[Any, ...]]) -> str:
    """Rows in the order of :data:`DEAD_LETTER_SCHEMA` as JSON lines, nulls written out."""
    return "".join(
        json.dumps(dict(zip(DEAD_LETTER_FIELDS, row, strict=True)), ensure_ascii=False) + "\n"
        for row in rows
    )


def batch_folder(root: str, batch_id: int | None, *, now: Callable[[], datetime]) -> str:
    """Where a batch's dead letters go: ``batch=<id>`` for a streaming batch (a replay of it
    finds the same folder), ``write=<UTC time>-<8 hex>`` for a batch write (one a write)."""
    parent = root.rstrip("/")
    if batch_id is not None:
        return f"{parent}/batch={batch_id}"
    return f"{parent}/write={now().strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"


class Folders(Protocol):
    """A file system the driver writes dead letters to."""

    def replace(self, folder: str, name: str, text: str) -> None:
        """``folder/name`` holds ``text``, whole, in place of what it held (the folder made if
        need be): a reader sees the old file or the new one, never a part."""
        ...


class LocalFolders:
    """A local or mounted folder, by plain file calls (``format("keo")``'s commit: a Python
    worker of the driver, with no Spark session to write through)."""

    def replace(self, folder: str, name: str, text: str) -> None:
        where = Path(folder)
        where.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=where, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        Path(temporary).replace(where / name)


@dataclass(frozen=True)
class HadoopFolders:
    """Any path the Spark session can write, through its Hadoop file system and configuration
    (``foreachBatch(ExactlyOnceSink)``: the driver's own process, with its session)."""

    spark: Any

    def replace(self, folder: str, name: str, text: str) -> None:
        context = self.spark.sparkContext
        hadoop_path = context._jvm.org.apache.hadoop.fs.Path
        target = hadoop_path(f"{folder}/{name}")
        # hidden (a dot first), so that Spark's readers of the folder skip it
        temporary = hadoop_path(f"{folder}/.{name}.{uuid.uuid4().hex}.tmp")
        files = target.getFileSystem(context._jsc.hadoopConfiguration())
        files.mkdirs(hadoop_path(folder))
        out = files.create(temporary, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        # Hadoop's rename does not replace: the old file goes first (the batch, not yet
        # recorded COMPLETE, writes it again if the driver dies in between)
        files.delete(target, False)
        if not files.rename(temporary, target):
            raise OSError(f"dead letters: could not rename {temporary} to {target}")
        # what the sink's Spark writer left here before (part-*-c000.json, _SUCCESS) was this
        # batch's letters too: a replay across the upgrade holds them once, as its overwrite did
        stale = files.globStatus(hadoop_path(f"{folder}/{{part-*,_SUCCESS}}")) or []
        for status in stale:
            if status.getPath().getName() != name:
                files.delete(status.getPath(), False)


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class DeadLetterWriter:
    """Writes a settled batch's dead letters under ``root`` (none: they are dropped, with a
    warning), ``folders`` being what the driver can reach."""

    root: str | None
    stream: str
    folders: Folders = field(default_factory=LocalFolders)
    now: Callable[[], datetime] = field(default=_utc_now)

    def write(self, report: BatchReport) -> None:
        if self.root is None:
            log_dead_letters_dropped(self.stream, report)
            return
        folder = batch_folder(self.root, report.batch_id, now=self.now)
        self.folders.replace(folder, PART_FILE, json_lines(report.dead_letter_rows()))
        log.info(
            "dead letters written stream=%s batch=%s rows=%d path=%s",
            self.stream,
            report.batch_id,
            len(report.dead_letters),
            folder,
        )


def log_dead_letters_dropped(stream: str, report: BatchReport) -> None:
    log.warning(
        "no dead-letter path: rows dropped stream=%s query=%s batch=%s rejected=%d conflicts=%d",
        stream,
        report.query_id,
        report.batch_id,
        report.counts["rejected"],
        report.counts["conflicts"],
    )
