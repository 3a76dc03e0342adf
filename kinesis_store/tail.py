"""``TailSearch``: the last record a shard holds after a position, found without reading the
shard whole: a read goes on from the position first, then reads windows back from now, each
wider than the last, and narrows a window holding more than a page before it reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinesis_store.errors import StreamUnavailableError
from kinesis_store.positions import SeenRecord, ShardStart, StartKind
from kinesis_store.shard_pages import Page, ShardPages, cause_code_of, seen

__all__ = ["TailSearch"]

# The tail of a shard is looked for in the last 10 s first, then in windows 10 times wider.
_TAIL_WINDOW_MS = 10_000
_TAIL_WIDENING = 10
# A window holding more records than this is halved, down to a second, before it is read.
_TAIL_PAGE = 1_000
_TAIL_NARROWEST_MS = 1_000


@dataclass(frozen=True, slots=True)
class _Reading:
    """What a read of a few records found: its first and last records (None: none), and where
    to go on when it stopped short of the tip (None: it reached the tip)."""

    first: SeenRecord | None
    last: SeenRecord | None
    resume: _Resume | None


@dataclass(frozen=True, slots=True)
class _Resume:
    """Where a tail search can go on reading with no new iterator: the iterator a page
    returned, right after ``record``, its last record (a new AT_TIMESTAMP iterator would make
    kinesalite scan the shard again, and costs a call on AWS)."""

    record: SeenRecord
    iterator: str | None  # None: the shard is closed and ends at ``record``

    @classmethod
    def after(cls, page: Page) -> _Resume:
        return cls(seen(page.records[-1]), page.next_iterator)


class TailSearch:
    """Finds a shard's tail with the calls of :class:`kinesis_store.shard_pages.ShardPages`."""

    def __init__(self, shard_pages: ShardPages) -> None:
        self._shard_pages = shard_pages

    def tail(
        self, shard_id: str, start: ShardStart, *, now_ms: int, margin_ms: int
    ) -> SeenRecord | None:
        """The last record the shard holds after ``start``; None when it holds nothing after it.

        A start after a record (a running query's last end) is read on from first, a page of
        ``_TAIL_PAGE`` records: a query's next tail is near its last, and a page that reaches
        the tip ends the search with one call. Otherwise, or when more than a page follows it,
        read from a little before now (the last 10 s, then windows 10 times wider), so that
        finding the tip of a busy shard reads seconds of it, not all of it. A window that finds
        nothing is widened only while records after ``start`` may lie before it: one record read
        from ``start`` says whether there are any, and the window stops widening once it reaches
        back to the first of them (``margin_ms`` covers arrival times out of order). A window
        holding more than ``_TAIL_PAGE`` records is narrowed before it is read
        (:meth:`_last_since`): a shard quiet since a burst is not read whole for its last record.
        """
        window_ms = _TAIL_WINDOW_MS
        first: SeenRecord | None = None
        if start.kind is StartKind.AFTER_SEQUENCE_NUMBER:
            ahead = self._ahead(shard_id, start)
            if ahead is not None and ahead.resume is None:
                return ahead.last  # read to the tip: None when nothing follows the start
            if ahead is not None:
                first = ahead.first
        empty_since_ms = now_ms  # no record arrived from here on, as far as is known
        while True:
            since_ms = now_ms - window_ms
            if start.kind is StartKind.AT_TIMESTAMP and start.timestamp_ms is not None:
                since_ms = max(since_ms, start.timestamp_ms)  # nothing before the start counts
            # the first record after start arrived at first.arrival_ms: a start there finds one
            lowest_ms = since_ms if first is None else max(since_ms, first.arrival_ms - margin_ms)
            last = self._last_since(shard_id, since_ms, lowest_ms, empty_since_ms)
            if last is not None:
                return last if start.is_before(last.sequence_number) else None
            empty_since_ms = since_ms
            if first is None:
                found = self._first(shard_id, start)
                if found is None:
                    return None
                first = found.record
            if since_ms <= first.arrival_ms - margin_ms:
                # arrival times out of order beyond the margin: read everything after start
                return self._last_after(shard_id, start)
            window_ms *= _TAIL_WIDENING

    def _last_since(
        self, shard_id: str, since_ms: int, lowest_ms: int, empty_since_ms: int
    ) -> SeenRecord | None:
        """The shard's last record, read from ``since_ms`` (None: nothing arrived since).

        A window holding more than a page is halved first, keeping its later half while a
        record arrived in it (one GetRecords of one record a step), down to a second, which is
        read to the tip from the last record found. Whatever the order of arrival times, a
        read that starts at a record and goes on to the tip ends at the shard's last record;
        each step keeps a start where a record was found, and the iterator after it, which
        the last read goes on with. The halving starts between ``lowest_ms`` (a start known to
        find a record, at or after ``since_ms``) and ``empty_since_ms`` (where a narrower
        window found none): where the tail is, as far as is known. Those bounds only spare
        steps: the last read goes on to the tip whatever they say.
        """
        reading = self._reading(shard_id, ShardStart.at_timestamp(max(since_ms, 0)), _TAIL_PAGE)
        last, resume = reading.last, reading.resume
        if resume is None:
            return last  # read to the tip (or nothing arrived since)
        # a start at the last record read finds it (or one after it): the halving starts there
        low = max(lowest_ms, resume.record.arrival_ms)
        high = max(empty_since_ms, low)
        while high - low > _TAIL_NARROWEST_MS:
            middle = (low + high) // 2
            found = self._first(shard_id, ShardStart.at_timestamp(max(middle, 0)))
            if found is None:
                high = middle
            else:  # a start at the record found finds it: past a quiet stretch at once
                low = min(max(middle, found.record.arrival_ms), high)
                resume = found
        return self._last_resumed(shard_id, resume)

    def _reading(self, shard_id: str, start: ShardStart, at_most: int) -> _Reading:
        """Records read from ``start`` to the tip; or, once ``at_most`` records were read short
        of the tip, what was read so far and where to go on (a window of exactly ``at_most``
        records is then searched as a larger one would be: one call fewer for every larger
        one)."""
        first: SeenRecord | None = None
        last: SeenRecord | None = None
        read = 0

        def size() -> int:
            return at_most - read

        for page in self._shard_pages.pages(shard_id, start, check=False, limit=size):
            if page.records:
                first = first or seen(page.records[0])
                last = seen(page.records[-1])
                read += len(page.records)
            if page.caught_up:
                break  # a tail: whatever arrives next is for the next batch
            if not page.tip and read >= at_most:
                return _Reading(first, last, _Resume.after(page))
        return _Reading(first, last, None)

    def _ahead(self, shard_id: str, start: ShardStart) -> _Reading | None:
        """A page read on after the record ``start`` names; None when Kinesis refuses that
        record (past the trim horizon: the read of the batch says what was lost)."""
        try:
            return self._reading(shard_id, start, _TAIL_PAGE)
        except StreamUnavailableError as exc:
            if cause_code_of(exc.__cause__) != "InvalidArgumentException":
                raise
            return None

    def _last_resumed(self, shard_id: str, resume: _Resume) -> SeenRecord:
        """The last record from ``resume`` on to the tip (its record, when none came after)."""
        last = resume.record
        if resume.iterator is None:
            return last
        start = ShardStart.after(last.sequence_number, last.arrival_ms)
        for page in self._shard_pages.pages(shard_id, start, check=False, iterator=resume.iterator):
            if page.records:
                last = seen(page.records[-1])
            if page.caught_up:
                break
        return last

    def _first(self, shard_id: str, start: ShardStart) -> _Resume | None:
        """The first record from ``start`` on, read one record a call, and where to go on."""
        for page in self._shard_pages.pages(shard_id, start, check=False, limit=lambda: 1):
            if page.records:
                return _Resume.after(page)  # one record a page: the first
        return None

    def _last_after(self, shard_id: str, start: ShardStart) -> SeenRecord | None:
        last: SeenRecord | None = None
        for page in self._shard_pages.pages(shard_id, start, check=False):
            if page.records:
                last = seen(page.records[-1])
        return last
