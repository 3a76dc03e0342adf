"""GetRecords within a shard's read limits: 5 calls a second and 2 MB a second per shard
(shared by every consumer of the shard), and the backoff after Kinesis throttled a read.

::

    call n leaves at t, answered at a, its page B bytes     call n + 1 not before
      ├─ 5 calls/s  ────────────────────────────────────────>  a + 0.2 s
      └─ 2 MB/s     ────────────────────────────────────────>  t + B / 2 MiB   (a 10 MB page: 5 s)

:class:`ReadPacer` keeps, per shard, when its next call may leave, for one process
(:func:`process_read_pacer`): the driver's planner and a Python worker's reads each pace their
own calls; two processes reading one shard at once (the driver counting a bounded batch while a
task reads the one before) may still be throttled, and :func:`throttle_backoff_s` spaces their
retries apart. By default it takes 4 calls and 1.8 MiB a second, leaving room for one other
consumer of the shard (a KCL worker polls once a second), and sizes each page to one call's
share of the bytes (:meth:`ReadPacer.page_limit`), so that no page leaves the shard in debt
for the other consumer's next call.

The calls are spaced from each answer, not from each departure: Kinesis counts a call when it
arrives, and a call held up on its way (a slow network, a starved process or proxy) arrives
late, while the next one, leaving on its schedule, does not; spaced from departures they would
arrive in a burst. A call arrives before its answer comes back, so the next call, leaving a
whole interval after that answer, arrives at least an interval after it, whatever the delays.
The time a call takes is then part of each call's cycle, and pages are sized to the cycle (one
call's share of the bytes for the interval plus the shard's last call's time, at most twice
the share), so that the reader still takes its share of the bytes.
Pure apart from the injected clock and sleep: no boto3 here.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = [
    "GET_RECORDS_BYTES_PER_S",
    "GET_RECORDS_CALLS_PER_S",
    "SHARED_BYTES_PER_S",
    "SHARED_CALLS_PER_S",
    "ReadPacer",
    "process_read_pacer",
    "throttle_backoff_s",
]

GET_RECORDS_CALLS_PER_S: Final = 5
GET_RECORDS_BYTES_PER_S: Final = 2 * 1024 * 1024  # Kinesis's "2 MB", counted in MiB as it does
# What a reader of ours takes by default: a shard's limits are shared by every consumer of it,
# and another one (a KCL worker polls once a second) must find room. One call a second and a
# tenth of the bytes are left to it.
SHARED_CALLS_PER_S: Final = GET_RECORDS_CALLS_PER_S - 1
SHARED_BYTES_PER_S: Final = 0.9 * GET_RECORDS_BYTES_PER_S
# a record's size before a shard's first page says otherwise: pages are sized by it
_FIRST_RECORD_BYTES: Final = 1024


class ReadPacer:
    """When each shard's next GetRecords may leave, in this process; thread-safe.

    ``before_call`` reserves the shard's next slot and sleeps until it (outside the lock, so
    other shards' calls are not held up); ``after_call`` pushes the slot after that to an
    interval after the answer, and by the bytes the page brought back."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        calls_per_s: float = SHARED_CALLS_PER_S,
        bytes_per_s: float = SHARED_BYTES_PER_S,
    ) -> None:
        if calls_per_s <= 0 or bytes_per_s <= 0:
            raise ValueError(f"read limits must be positive, got {calls_per_s}, {bytes_per_s}")
        self._clock = clock
        self._sleep = sleep
        self._call_interval_s = 1.0 / calls_per_s
        self._bytes_per_s = bytes_per_s
        self._next_s: dict[str, float] = {}
        self._record_bytes: dict[str, float] = {}  # a shard's last page's bytes a record
        self._call_s: dict[str, float] = {}  # a shard's last call's time, leaving to answer
        self._lock = threading.Lock()

    def before_call(self, shard_id: str) -> float:
        """Wait for the shard's next slot; the time the call leaves (for ``after_call``). A
        caller that wakes past its slot (a process starved of CPU) leaves when it wakes: the
        shard's next slot moves to a whole interval after that, so that late calls never catch
        up on their schedule in a burst (the shard's other consumer would be refused)."""
        with self._lock:
            now_s = self._clock()
            at_s = max(now_s, self._next_s.get(shard_id, now_s))
            self._next_s[shard_id] = at_s + self._call_interval_s
        if at_s <= now_s:
            return at_s
        self._sleep(at_s - now_s)
        left_s = self._clock()
        if left_s > at_s:
            with self._lock:
                after_s = left_s + self._call_interval_s
                self._next_s[shard_id] = max(self._next_s[shard_id], after_s)
            return left_s
        return at_s

    def after_call(
        self, shard_id: str, left_at_s: float, page_bytes: int, records: int = 0
    ) -> None:
        """A page of ``page_bytes`` (``records`` records) came back, now, for the call that
        left at ``left_at_s``: the next call leaves an interval after now at the earliest, and
        once the page's bytes fit in our share."""
        answered_s = self._clock()
        by_bytes_s = left_at_s + page_bytes / self._bytes_per_s
        not_before_s = max(by_bytes_s, answered_s + self._call_interval_s)
        with self._lock:
            self._next_s[shard_id] = max(self._next_s.get(shard_id, not_before_s), not_before_s)
            self._call_s[shard_id] = max(0.0, answered_s - left_at_s)
            if records:
                self._record_bytes[shard_id] = page_bytes / records

    def page_limit(self, shard_id: str, wanted: int) -> int:
        """How many records to ask of ``shard_id`` at most: no more than ``wanted``, and no
        more than one call's share of the bytes by the size of its last page's records. The
        share is the bytes of one cycle (the interval, and the time the shard's last call
        took), at most twice the interval's. A page of 10 MB owes the shard 5 s of its 2 MB a
        second, and every other consumer's read in those 5 s is refused; pages of a cycle's
        share never leave the shard in debt past the next call."""
        with self._lock:
            record_bytes = self._record_bytes.get(shard_id, _FIRST_RECORD_BYTES)
            call_s = self._call_s.get(shard_id, 0.0)
        cycle_s = self._call_interval_s + min(call_s, self._call_interval_s)
        share = self._bytes_per_s * cycle_s
        return max(1, min(wanted, int(share / max(record_bytes, 1.0))))


_PROCESS_PACER: ReadPacer | None = None
_PROCESS_PACER_LOCK = threading.Lock()


def process_read_pacer() -> ReadPacer:
    """The pacer of every reader of this process: a shard's limits are the stream's, whoever
    reads it."""
    global _PROCESS_PACER  # noqa: PLW0603 - one for the process, made on first use
    with _PROCESS_PACER_LOCK:
        if _PROCESS_PACER is None:
            _PROCESS_PACER = ReadPacer()
        return _PROCESS_PACER


def throttle_backoff_s(
    retry: int,
    *,
    base_s: float = 0.4,
    cap_s: float = 5.0,
    draw: Callable[[], float] = random.random,
) -> float:
    """The wait before retry ``retry`` (1, 2, ...) of a throttled call: the exponential ceiling
    (``base_s`` doubling to ``cap_s``), half of it fixed and half drawn at random ("equal
    jitter"), so readers throttled together do not all come back together. ``draw`` returns
    a number in [0, 1]; 1 always waits the whole ceiling."""
    ceiling = min(cap_s, base_s * 2.0 ** (retry - 1))
    return ceiling / 2 + ceiling / 2 * draw()
