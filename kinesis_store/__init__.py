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
    from kinesis_store.client import kinesis_client_for as kinesis_client_for
    from kinesis_store.entries import (
        DEFAULT_MAX_RECORD_BYTES as DEFAULT_MAX_RECORD_BYTES,
    )
    from kinesis_store.entries import (
        MAX_HASH_KEY as MAX_HASH_KEY,
    )
    from kinesis_store.entries import (
        MAX_PUT_REQUEST_BYTES as MAX_PUT_REQUEST_BYTES,
    )
    from kinesis_store.entries import (
        MAX_RECORDS_PER_PUT as MAX_RECORDS_PER_PUT,
    )
    from kinesis_store.entries import (
        hash_key_of as hash_key_of,
    )
    from kinesis_store.entries import (
        put_entry as put_entry,
    )
    from kinesis_store.entries import (
        record_size as record_size,
    )
    from kinesis_store.errors import (
        AggregationFormatError as AggregationFormatError,
    )
    from kinesis_store.errors import (
        PutFencedError as PutFencedError,
    )
    from kinesis_store.errors import (
        ShardPositionLostError as ShardPositionLostError,
    )
    from kinesis_store.errors import (
        StreamError as StreamError,
    )
    from kinesis_store.errors import (
        StreamNotFoundError as StreamNotFoundError,
    )
    from kinesis_store.errors import (
        StreamThrottledError as StreamThrottledError,
    )
    from kinesis_store.errors import (
        StreamUnavailableError as StreamUnavailableError,
    )
    from kinesis_store.kpl import (
        Aggregate as Aggregate,
    )
    from kinesis_store.kpl import (
        MalformedAggregate as MalformedAggregate,
    )
    from kinesis_store.kpl import (
        UserRecord as UserRecord,
    )
    from kinesis_store.positions import SeenRecord as SeenRecord
    from kinesis_store.positions import ShardStart as ShardStart
    from kinesis_store.provisioning import (
        StreamSpec as StreamSpec,
    )
    from kinesis_store.provisioning import (
        create_stream as create_stream,
    )
    from kinesis_store.provisioning import (
        provision_stream as provision_stream,
    )
    from kinesis_store.provisioning import (
        wait_active as wait_active,
    )
    from kinesis_store.reader import KinesisReader as KinesisReader
    from kinesis_store.results import (
        PutResultKind as PutResultKind,
    )
    from kinesis_store.results import (
        RecordResult as RecordResult,
    )
    from kinesis_store.results import (
        TransportFailure as TransportFailure,
    )
    from kinesis_store.shards import (
        Shard as Shard,
    )
    from kinesis_store.shards import (
        StreamInfo as StreamInfo,
    )
    from kinesis_store.shards import (
        kcl_view as kcl_view,
    )
    from kinesis_store.shards import (
        lineage as lineage,
    )
    from kinesis_store.shards import (
        open_shards as open_shards,
    )
    from kinesis_store.writer import KinesisWriter as KinesisWriter

__getattr__, __all__ = lazy_exports(
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
