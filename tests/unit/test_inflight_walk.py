"""The walk over the in-flight index: every bucket in order, page after page, resumable."""

from __future__ import annotations

from fakes.ledger import InMemoryLedger

from dedupe_store.inflight import bucket_of, bucket_share, walk_in_flight
from dedupe_store.records import ClaimRequest

STREAM = "orders"
T0_MS = 1_700_000_000_000
BUCKETS = 4
KEYS = [f"order-{i:02d}" for i in range(20)]


GROUP_OF: dict[str, str] = {}  # key -> the id of the one-key group that claimed it


def ledger_with_claims() -> InMemoryLedger:
    """20 open groups of one key each, opened 1 ms apart (so their leases end 1 ms apart)."""
    ledger = InMemoryLedger(inflight_buckets=BUCKETS)
    for offset, key in enumerate(KEYS):
        group = ledger.open_group(STREAM, [key], owner="o", now_ms=T0_MS + offset, lease_ms=1_000)
        ledger.claim(ClaimRequest(STREAM, key, "digest", "1"), group, now_ms=T0_MS + offset)
        GROUP_OF[key] = group.group_id
    return ledger


def in_bucket_order(keys: list[str], buckets: list[int]) -> list[str]:
    # the index orders a bucket by lease expiry: here, the order the keys were claimed in
    return [
        key for bucket in buckets for key in keys if bucket_of(GROUP_OF[key], BUCKETS) == bucket
    ]


def test_a_walk_reads_every_bucket_in_order_in_pages_no_larger_than_asked() -> None:
    # GIVEN 20 open groups spread over 4 buckets
    ledger = ledger_with_claims()
    # WHEN the index is walked 3 keys a page
    pages = list(walk_in_flight(ledger, STREAM, before_ms=None, page_limit=lambda: 3))
    # THEN every key comes once, bucket after bucket; no page is larger than 3; the last
    # page says the walk is complete, every other one where the next page starts
    assert [key for keys, _ in pages for key in keys] == in_bucket_order(KEYS, [0, 1, 2, 3])
    assert all(len(keys) <= 3 for keys, _ in pages)
    assert [position is None for _, position in pages] == [False] * (len(pages) - 1) + [True]


def test_a_walk_resumes_where_a_position_says() -> None:
    # GIVEN a walk stopped after its first two pages
    ledger = ledger_with_claims()
    walk = walk_in_flight(ledger, STREAM, before_ms=None, page_limit=lambda: 2)
    first = [next(walk), next(walk)]
    position = first[-1][1]
    assert position is not None
    # WHEN another walk starts at the position it returned
    rest = list(
        walk_in_flight(ledger, STREAM, before_ms=None, page_limit=lambda: 5, start=position)
    )
    # THEN together they read every key once, in order
    read = [key for keys, _ in first + rest for key in keys]
    assert read == in_bucket_order(KEYS, [0, 1, 2, 3])


def test_a_walk_over_a_share_reads_only_its_buckets() -> None:
    # GIVEN claims in every bucket, and the share 1/2 (buckets 1 and 3)
    ledger = ledger_with_claims()
    share = bucket_share(1, 2, BUCKETS)
    # WHEN that share is walked
    pages = walk_in_flight(ledger, STREAM, before_ms=None, page_limit=lambda: 100, buckets=share)
    # THEN only the keys of buckets 1 and 3 come back
    assert share == [1, 3]
    assert [key for keys, _ in pages for key in keys] == in_bucket_order(KEYS, [1, 3])


def test_a_walk_with_a_cut_off_reads_only_leases_expired_before_it() -> None:
    # GIVEN 20 claims whose leases end 1 ms apart
    ledger = ledger_with_claims()
    # WHEN the index is walked for leases expired before the 6th one's end
    cut_off_ms = T0_MS + 1_000 + 5
    pages = walk_in_flight(ledger, STREAM, before_ms=cut_off_ms, page_limit=lambda: 100)
    # THEN the first 5 claims come back, and no other
    assert sorted(key for keys, _ in pages for key in keys) == KEYS[:5]
