"""The Kinesis adapter: what the exactly-once protocol needs from Kinesis, and nothing of the
protocol itself.

:class:`KinesisWriter` puts records and classifies every record's result
(:mod:`kinesis_store.results`: written, not written, ambiguous); :class:`KinesisReader` reads a
stream back (its description, its shards and their lineage, a shard's records in a window or
between two positions (:mod:`kinesis_store.positions`), its tail, deaggregated by
:mod:`kinesis_store.kpl`, the one wrapper of aws-kinesis-agg);
:func:`create_stream`, :func:`wait_active` and :func:`provision_stream` administer a stream.
What Kinesis counts (its limits, routing, a record's size) is :mod:`kinesis_store.entries`.
Its errors are the stream's branch of ``KeoError`` (:mod:`kinesis_store.errors`). It imports
:mod:`dedupe_store` only for that root; the protocol (:mod:`producer`) builds on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dedupe_store.exports import lazy_exports

if TYPE_CHECKING:
    from kinesis_store.client import kinesis_client_for
    from kinesis_store.entries import (
        DEFAULT_MAX_RECORD_BYTES,
        MAX_HASH_KEY,
        MAX_PUT_REQUEST_BYTES,
        MAX_RECORDS_PER_PUT,
        hash_key_of,
        put_entry,
        record_size,
    )
    from kinesis_store.errors import (
        AggregationFormatError,
        PutFencedError,
        ShardPositionLostError,
        StreamError,
        StreamNotFoundError,
        StreamThrottledError,
        StreamUnavailableError,
    )
    from kinesis_store.kpl import Aggregate, MalformedAggregate, UserRecord
    from kinesis_store.positions import SeenRecord, ShardStart
    from kinesis_store.provisioning import StreamSpec, create_stream, provision_stream, wait_active
    from kinesis_store.reader import KinesisReader
    from kinesis_store.results import PutResultKind, RecordResult, TransportFailure
    from kinesis_store.shards import Shard, StreamInfo, kcl_view, lineage, open_shards
    from kinesis_store.writer import KinesisWriter

__getattr__ = lazy_exports(
    __name__,
    {
        "kinesis_store.client": ("kinesis_client_for",),
        "kinesis_store.entries": (
            "DEFAULT_MAX_RECORD_BYTES",
            "MAX_HASH_KEY",
            "MAX_PUT_REQUEST_BYTES",
            "MAX_RECORDS_PER_PUT",
            "hash_key_of",
            "put_entry",
            "record_size",
        ),
        "kinesis_store.errors": (
            "AggregationFormatError",
            "PutFencedError",
            "ShardPositionLostError",
            "StreamError",
            "StreamNotFoundError",
            "StreamThrottledError",
            "StreamUnavailableError",
        ),
        "kinesis_store.kpl": (
            "Aggregate",
            "MalformedAggregate",
            "UserRecord",
        ),
        "kinesis_store.positions": (
            "SeenRecord",
            "ShardStart",
        ),
        "kinesis_store.provisioning": (
            "StreamSpec",
            "create_stream",
            "provision_stream",
            "wait_active",
        ),
        "kinesis_store.reader": ("KinesisReader",),
        "kinesis_store.results": (
            "PutResultKind",
            "RecordResult",
            "TransportFailure",
        ),
        "kinesis_store.shards": (
            "Shard",
            "StreamInfo",
            "kcl_view",
            "lineage",
            "open_shards",
        ),
        "kinesis_store.writer": ("KinesisWriter",),
    },
)

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "MAX_HASH_KEY",
    "MAX_PUT_REQUEST_BYTES",
    "MAX_RECORDS_PER_PUT",
    "Aggregate",
    "AggregationFormatError",
    "KinesisReader",
    "KinesisWriter",
    "MalformedAggregate",
    "PutFencedError",
    "PutResultKind",
    "RecordResult",
    "SeenRecord",
    "Shard",
    "ShardPositionLostError",
    "ShardStart",
    "StreamError",
    "StreamInfo",
    "StreamNotFoundError",
    "StreamSpec",
    "StreamThrottledError",
    "StreamUnavailableError",
    "TransportFailure",
    "UserRecord",
    "create_stream",
    "hash_key_of",
    "kcl_view",
    "kinesis_client_for",
    "lineage",
    "open_shards",
    "provision_stream",
    "put_entry",
    "record_size",
    "wait_active",
]
