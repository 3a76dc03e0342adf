"""``KinesisReader``: reads a stream back: its description, its shard map with lineage, a
shard's records in a time window or whole, deaggregated as a KCL consumer sees them.

Reads are idempotent: a throttled one is tried again in place; every other botocore error is
translated once into :mod:`kinesis_store.errors`, keeping the cause.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from kinesis_store.errors import StreamNotFoundError, StreamThrottledError, StreamUnavailableError
from kinesis_store.kpl import UserRecord, arrival_ms_of, deaggregate
from kinesis_store.shards import Shard, StreamInfo

__all__ = ["KinesisReader"]

log = logging.getLogger(__name__)

_READ_THROTTLED = frozenset(
    {"ProvisionedThroughputExceededException", "LimitExceededException", "KMSThrottlingException"}
)


class KinesisReader:
    """Reads shards: the shard map with lineage, time windows, and whole shards."""

    def __init__(
        self,
        client: Any,
        stream: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        max_throttle_retries: int = 20,
        page_limit: int = 10_000,
    ) -> None:
        self._client = client
        self.stream = stream
        self._sleep = sleep
        self._max_throttle_retries = max_throttle_retries
        self._page_limit = page_limit
        self.get_records_calls = 0

    @property
    def client(self) -> Any:
        """The botocore client, for event hooks (metrics, injected faults)."""
        return self._client

    def describe(self) -> StreamInfo:
        summary = self._call("describe_stream_summary", StreamName=self.stream)[
            "StreamDescriptionSummary"
        ]
        max_kib = summary.get("MaxRecordSizeInKiB")
        return StreamInfo(
            name=self.stream,
            retention_hours=int(summary.get("RetentionPeriodHours", 24)),
            max_record_bytes=int(max_kib) * 1024 if max_kib else DEFAULT_MAX_RECORD_BYTES,
            open_shard_count=int(summary.get("OpenShardCount", 0)),
        )

    def shards(self) -> list[Shard]:
        """Every shard the stream still has, open and closed, with their lineage."""
        found: list[Shard] = []
        kwargs: dict[str, Any] = {"StreamName": self.stream}
        while True:
            page = self._call("list_shards", **kwargs)
            found.extend(_shard_of(raw) for raw in page.get("Shards", []))
            token = page.get("NextToken")
            if not token:
                return found
            kwargs = {"NextToken": token}

    def read_window(
        self, shard_id: str, start_ms: int, end_ms: int, *, now_ms: Callable[[], int]
    ) -> Iterator[UserRecord]:
        """User records that arrived in ``[start_ms, end_ms]``, read once from ``start_ms``.

        Stops at the first record that arrived after ``end_ms``, at a closed shard's end,
        or at the tip once ``end_ms`` has passed. Arrival times are not monotonic, hence
        callers pad the window with the skew margin.
        """
        iterator = self._iterator_at_timestamp(shard_id, start_ms)
        last_sequence: str | None = None
        while iterator is not None:
            page, iterator = self._get_records(shard_id, iterator, last_sequence, start_ms)
            for raw in page["Records"]:
                last_sequence = str(raw["SequenceNumber"])
                arrival = arrival_ms_of(raw.get("ApproximateArrivalTimestamp"))
                if arrival > end_ms:
                    return
                yield from deaggregate(shard_id, raw)
            if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                if now_ms() > end_ms:
                    return
                self._sleep(0.2)  # the window is still open: wait for late arrivals

    def read_all(self, shard_id: str) -> Iterator[UserRecord]:
        """Every user record of a shard from TRIM_HORIZON to its end (closed) or the tip."""
        iterator: str | None = self._call(
            "get_shard_iterator",
            StreamName=self.stream,
            ShardId=shard_id,
            ShardIteratorType="TRIM_HORIZON",
        )["ShardIterator"]
        last_sequence: str | None = None
        while iterator is not None:
            page, iterator = self._get_records(shard_id, iterator, last_sequence, None)
            for raw in page["Records"]:
                last_sequence = str(raw["SequenceNumber"])
                yield from deaggregate(shard_id, raw)
            if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                return

    def _iterator_at_timestamp(self, shard_id: str, start_ms: int) -> str | None:
        return self._call(  # type: ignore[no-any-return]
            "get_shard_iterator",
            StreamName=self.stream,
            ShardId=shard_id,
            ShardIteratorType="AT_TIMESTAMP",
            Timestamp=datetime.fromtimestamp(start_ms / 1000, tz=UTC),
        )["ShardIterator"]

    def _get_records(
        self, shard_id: str, iterator: str, last_sequence: str | None, start_ms: int | None
    ) -> tuple[dict[str, Any], str | None]:
        while True:
            page = self._read_retrying()(self._get_page, shard_id, iterator)
            if page is None:
                # iterators live 5 minutes: resume right after the last record seen
                iterator = self._resume(shard_id, last_sequence, start_ms)
                continue
            return page, page.get("NextShardIterator")

    def _get_page(self, shard_id: str, iterator: str) -> dict[str, Any] | None:
        """One GetRecords call; None when the iterator has expired."""
        self.get_records_calls += 1
        try:
            return self._client.get_records(  # type: ignore[no-any-return]
                ShardIterator=iterator, Limit=self._page_limit
            )
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ExpiredIteratorException":
                return None
            raise self._translate(exc, "get records", shard_id) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StreamUnavailableError(
                f"Kinesis failed to get records: {exc}", stream=self.stream, shard_id=shard_id
            ) from exc

    def _resume(self, shard_id: str, last_sequence: str | None, start_ms: int | None) -> str:
        if last_sequence is not None:
            kwargs: dict[str, Any] = {
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                "StartingSequenceNumber": last_sequence,
            }
        elif start_ms is not None:
            kwargs = {
                "ShardIteratorType": "AT_TIMESTAMP",
                "Timestamp": datetime.fromtimestamp(start_ms / 1000, tz=UTC),
            }
        else:
            kwargs = {"ShardIteratorType": "TRIM_HORIZON"}
        return self._call(  # type: ignore[no-any-return]
            "get_shard_iterator", StreamName=self.stream, ShardId=shard_id, **kwargs
        )["ShardIterator"]

    def _read_retrying(self) -> Retrying:
        """Reads are idempotent: a throttled one is tried again, with backoff (0.4 s doubling
        to 5 s), up to ``max_throttle_retries`` times. Other failures are raised at once: the
        SDK has retried them already."""
        return Retrying(
            retry=retry_if_exception_type(StreamThrottledError),
            wait=wait_exponential(multiplier=0.4, max=5.0),
            stop=stop_after_attempt(self._max_throttle_retries + 1),
            sleep=self._sleep,
            before_sleep=before_sleep_log(log, logging.INFO),
            reraise=True,
        )

    def _call(self, operation: str, **kwargs: Any) -> Any:
        return self._read_retrying()(self._call_once, operation, kwargs)

    def _call_once(self, operation: str, kwargs: dict[str, Any]) -> Any:
        try:
            return getattr(self._client, operation)(**kwargs)
        except botocore.exceptions.ClientError as exc:
            raise self._translate(exc, operation, kwargs.get("ShardId")) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StreamUnavailableError(
                f"Kinesis failed to {operation}: {exc}", stream=self.stream
            ) from exc

    def _translate(
        self, exc: botocore.exceptions.ClientError, doing: str, shard_id: str | None
    ) -> StreamNotFoundError | StreamUnavailableError:
        code = exc.response.get("Error", {}).get("Code")
        if code == "ResourceNotFoundException":
            return StreamNotFoundError(
                f"stream {self.stream!r} does not exist: run 'keo init'",
                stream=self.stream,
                shard_id=shard_id,
            )
        if code in _READ_THROTTLED:
            return StreamThrottledError(
                f"Kinesis failed to {doing}: {code}", stream=self.stream, shard_id=shard_id
            )
        return StreamUnavailableError(
            f"Kinesis failed to {doing}: {code}", stream=self.stream, shard_id=shard_id
        )


def _shard_of(raw: dict[str, Any]) -> Shard:
    hash_range = raw["HashKeyRange"]
    sequences = raw.get("SequenceNumberRange", {})
    return Shard(
        shard_id=raw["ShardId"],
        starting_hash_key=int(hash_range["StartingHashKey"]),
        ending_hash_key=int(hash_range["EndingHashKey"]),
        parent_shard_id=raw.get("ParentShardId"),
        adjacent_parent_shard_id=raw.get("AdjacentParentShardId"),
        starting_sequence_number=str(sequences.get("StartingSequenceNumber", "0")),
        ending_sequence_number=sequences.get("EndingSequenceNumber"),
    )
