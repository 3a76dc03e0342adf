"""The sparse in-flight index: the bucket an open claim group or an OPEN replay run is indexed
in, and the walk over buckets.

Two kinds of item are in the index, each in partitions of its own, so that a query for one
never reads the other::

    open claim groups   "<stream>#<bucket>"       by lease expiry
    OPEN replay runs    "<stream>#run#<bucket>"   by the lease its first attempt registered

(a stream name has no "#", and a bucket is a number: the two never meet). Each kind is spread
over ``inflight_buckets`` partitions. A walk reads the buckets in order, each page after page,
where DynamoDB's last evaluated key (lease expiry, item key) says where a bucket's next page
starts. The groups' pages come from
:meth:`dedupe_store.contract.GroupReader.in_flight_page`, so the walk is the same over
DynamoDB, the in-memory fake, and the API's reads::

    bucket 0: page, page ─> bucket 1: page ─> ... ─> bucket n-1: page ─> done
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dedupe_store.contract import LedgerReader


def bucket_of(name: str, buckets: int) -> int:
    """The bucket of an open group (its id) or an OPEN run (its name): stable across processes
    (CRC-32, not Python's ``hash``)."""
    return zlib.crc32(name.encode("utf-8")) % buckets


def bucket_partition(stream: str, bucket: int) -> str:
    """The index partition key of a stream's bucket of open claim groups."""
    return f"{stream}#{bucket}"


def run_bucket_partition(stream: str, bucket: int) -> str:
    """The index partition key of a stream's bucket of OPEN replay runs: never a groups' one."""
    return f"{stream}#run#{bucket}"


def bucket_share(index: int, count: int, buckets: int) -> list[int]:
    """Share ``index`` of ``count``: the buckets ``b`` with ``b % count == index``, so that
    ``count`` reconcilers split the index between them."""
    return [bucket for bucket in range(buckets) if bucket % count == index]


@dataclass(frozen=True, slots=True)
class IndexPosition:
    """Where a walk of the index stands: a bucket, and the last item read in it, if any."""

    bucket: int
    after: tuple[int, str] | None = None  # (lease_expires_at_ms, pk) of the last item read


_T = TypeVar("_T")
Cursor = tuple[int, str]  # (lease_expires_at_ms, pk) of the last item a page read
ReadPage = Callable[[int, int, Cursor | None], tuple[list[_T], Cursor | None]]


def walk_index(
    read_page: ReadPage[_T],
    *,
    buckets: Sequence[int],
    page_limit: Callable[[], int],
    start: IndexPosition | None = None,
) -> Iterator[tuple[list[_T], IndexPosition | None]]:
    """Pages of the index, bucket after bucket, each with the position the next page starts
    at (None once the walk is complete). ``read_page(bucket, limit, after)`` reads one page.

    ``page_limit`` is asked before each page, so a caller filling a page of its own never
    reads more than it has room for. ``start``: a position a previous walk returned.
    """
    order = list(buckets)
    if start is not None:
        order = [bucket for bucket in order if bucket >= start.bucket]
    for index, bucket in enumerate(order):
        after = start.after if start is not None and bucket == start.bucket else None
        while True:
            items, last = read_page(bucket, page_limit(), after)
            if last is not None:
                # the bucket may hold more (DynamoDB also ends a page at 1 MB read)
                after = last
                yield items, IndexPosition(bucket, last)
                continue
            following = order[index + 1] if index + 1 < len(order) else None
            yield items, IndexPosition(following) if following is not None else None
            break


def walk_items(
    read_page: ReadPage[_T],
    *,
    buckets: Sequence[int] | None,
    inflight_buckets: int,
    page_size: int,
) -> Iterator[_T]:
    """Every item the pages of the index hold, bucket after bucket (``buckets``: a share of
    the index; all ``inflight_buckets`` when None), ``page_size`` a page."""
    for items, _ in walk_index(
        read_page,
        buckets=list(buckets) if buckets is not None else range(inflight_buckets),
        page_limit=lambda: page_size,
    ):
        yield from items


def walk_in_flight(
    ledger: LedgerReader,
    stream: str,
    *,
    before_ms: int | None,
    page_limit: Callable[[], int],
    buckets: Sequence[int] | None = None,
    start: IndexPosition | None = None,
) -> Iterator[tuple[list[str], IndexPosition | None]]:
    """Pages of the keys open groups list (``page_limit`` groups a page), bucket after
    bucket, each with the position the next page starts at (None once complete).

    ``before_ms``: only groups whose lease expired before it (None: every open group).
    ``buckets``: a share of the index (all when None).
    """

    def read_page(bucket: int, limit: int, after: Cursor | None) -> tuple[list[str], Cursor | None]:
        return ledger.in_flight_page(
            stream,
            bucket,
            before_ms=before_ms,
            limit=limit,
            after_lease_ms=after[0] if after is not None else None,
            after_pk=after[1] if after is not None else None,
        )

    every = range(ledger.inflight_buckets)
    yield from walk_index(
        read_page,
        buckets=list(buckets) if buckets is not None else every,
        page_limit=page_limit,
        start=start,
    )
