"""PutRecords within each shard's write quota: 1,000 records and 1 MiB (data and partition
keys) a second per shard (PutRecords, Amazon Kinesis Data Streams API Reference: "Each shard
can support writes up to 1,000 records per second, up to a maximum data write total of 1 MiB
per second"), as the KPL's ``RateLimit`` keeps its own puts within a share of it.

::

    a request costing c(S) = max(r / records_per_s, b / bytes_per_s) on each shard S it holds
      leaves at   max(now, T(S) + c(S) - burst for each S)
      then        T(S) = max(T(S), leave) + c(S)

Each shard is a token bucket kept as one time T (the generic cell rate algorithm): when it
would have sent all that was reserved on it at the rate; a request leaves once, with it, no
shard it holds is more than ``burst_s`` ahead of the time. A writer
that keeps to it is never throttled by its own load. Other writers of the shard (other
processes, a Spark job's other tasks) take part of its quota: when the shard refuses a record
of ours, this process's share of the shard's pace halves, and each request it takes whole
grows it back a step (:meth:`WritePacer.answered`), so writers that share a shard settle on
their parts of it without knowing of each other; the records refused are resent as before. A
request that holds more than a shard takes at once is split (:func:`split_to_fit`). One pacer
a process and stream: the writers of a process share it. Pure apart from the injected clock
and sleep: no boto3 here.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from kinesis_store.shards import Shard

__all__ = [
    "PUT_BYTES_PER_S",
    "PUT_RECORDS_PER_S",
    "WritePacer",
    "entry_shard",
    "shard_loads",
    "split_to_fit",
]

PUT_RECORDS_PER_S: Final = 1000
PUT_BYTES_PER_S: Final = 1024 * 1024
# a shard that refused records of ours: this process's share of the pace halves, down to this
MIN_SHARE: Final = 1 / 64
# a request a shard took whole: the share grows back by this much, up to all of it
SHARE_STEP: Final = 0.05
# a shard's share halves once in this long at most: Kinesis counts its quota by the second
_QUOTA_WINDOW_S: Final = 1.0
# how far ahead of the time a shard may be, a request on it counted: Kinesis takes a second of
# its quota at once (AWS documents no burst; the quota mode's bucket holds one second); less,
# so that requests the network delays unevenly still find room
DEFAULT_BURST_S: Final = 0.8


class WritePacer:
    """When each shard can take more records from this process; thread-safe.

    ``percent`` of the shard quota (KPL's ``RateLimit``; 100: all of it, for a writer alone
    on its shards). :meth:`before_request` reserves a request's records on each shard they go
    to and sleeps until all of them can take them (outside the lock: another request whose
    shards are free is not held up)."""

    def __init__(
        self,
        *,
        percent: float = 100,
        burst_s: float = DEFAULT_BURST_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if percent <= 0 or burst_s < 0:
            raise ValueError(f"a pace needs a positive share and burst, got {percent}, {burst_s}")
        self._records_per_s = PUT_RECORDS_PER_S * percent / 100
        self._bytes_per_s = PUT_BYTES_PER_S * percent / 100
        self._burst_s = burst_s
        self._clock = clock
        self._sleep = sleep
        self._theoretical_s: dict[str, float] = {}
        # each shard's share of the pace this process keeps: other writers of the shard (other
        # processes, a Spark job's other tasks) take the rest; halved when the shard refused a
        # record of ours, grown back a step a request it took whole
        self._share: dict[str, float] = {}
        self._halved_at_s: dict[str, float] = {}
        self._lock = threading.Lock()
        self.waited_s = 0.0  # in all, for the metrics and the bench

    def before_request(self, loads: Mapping[str, tuple[int, int]]) -> float:
        """Wait until every shard of ``loads`` (shard id -> records, bytes) can take its part
        of the request; the seconds waited."""
        with self._lock:
            now_s = self._clock()
            costs = {
                shard_id: max(records / self._records_per_s, size / self._bytes_per_s)
                / self._share.get(shard_id, 1.0)
                for shard_id, (records, size) in loads.items()
            }
            # it leaves once, with it, no shard of it is more than the burst ahead of the time
            leave_s = max(
                [
                    now_s,
                    *(
                        self._theoretical_s.get(shard_id, now_s) + cost_s - self._burst_s
                        for shard_id, cost_s in costs.items()
                    ),
                ]
            )
            for shard_id, cost_s in costs.items():
                theoretical_s = max(self._theoretical_s.get(shard_id, leave_s), leave_s)
                self._theoretical_s[shard_id] = theoretical_s + cost_s
            wait_s = leave_s - now_s
            self.waited_s += wait_s
        if wait_s > 0:
            self._sleep(wait_s)
        return wait_s

    def answered(self, refused: Iterable[str], taken: Iterable[str]) -> None:
        """What the shards did with a request: ``refused`` some of its records (throttled:
        another writer takes part of their quota), ``taken`` all of theirs. A refusing shard's
        share of the pace is halved (at least ``MIN_SHARE``; once a second at most, as the
        requests in flight together meet one refusal), a taking one's grown back by
        ``SHARE_STEP`` (at most all): writers that share a shard settle on their parts of it
        without knowing of each other, as TCP's congestion window does."""
        with self._lock:
            now_s = self._clock()
            for shard_id in set(refused):
                # once a second at most: the requests in flight together meet one refusal
                if now_s - self._halved_at_s.get(shard_id, -_QUOTA_WINDOW_S) < _QUOTA_WINDOW_S:
                    continue
                self._halved_at_s[shard_id] = now_s
                self._share[shard_id] = max(MIN_SHARE, self._share.get(shard_id, 1.0) / 2)
            for shard_id in set(taken) - set(refused):
                share = self._share.get(shard_id, 1.0)
                if share < 1.0:
                    self._share[shard_id] = min(1.0, share + SHARE_STEP)

    def share(self, shard_id: str) -> float:
        """The part of the pace this process keeps on ``shard_id`` now (1: all of it)."""
        with self._lock:
            return self._share.get(shard_id, 1.0)

    def fits(self, records: int, size: int) -> bool:
        """Whether ``records`` records of ``size`` bytes on one shard fit in one request: no
        more than the burst of the shard's quota. A request holding more is refused in part
        by Kinesis however long it waits (the shard takes a second of its quota at once: 500
        records of 2 KB are a second of bytes), so the writer splits it
        (:func:`split_to_fit`)."""
        return max(records / self._records_per_s, size / self._bytes_per_s) <= self._burst_s


def entry_shard(entry: Mapping[str, Any], shards: list[Shard]) -> str:
    """The open shard an entry goes to (:func:`_entry_load`)."""
    return _entry_load(entry, shards)[0]


def _entry_load(entry: Mapping[str, Any], shards: list[Shard]) -> tuple[str, int]:
    """The open shard an entry goes to, by its hash key (its ``ExplicitHashKey``, else the MD5
    of its partition key; the first shard when none covers it: a map older than a reshard), and
    the bytes it counts there (data and partition key)."""
    key = str(entry["PartitionKey"])
    explicit = entry.get("ExplicitHashKey")
    hash_key = (
        int(explicit)
        if explicit
        else int.from_bytes(hashlib.md5(key.encode(), usedforsecurity=False).digest(), "big")
    )
    shard = next((s for s in shards if s.covers(hash_key)), shards[0])
    return shard.shard_id, len(entry["Data"]) + len(key.encode())


def shard_loads(
    entries: Iterable[Mapping[str, Any]], shards: list[Shard]
) -> dict[str, tuple[int, int]]:
    """The records and bytes (data and partition key) a PutRecords request puts on each open
    shard (:func:`_entry_load`)."""
    records: dict[str, int] = defaultdict(int)
    sizes: dict[str, int] = defaultdict(int)
    for entry in entries:
        shard_id, size = _entry_load(entry, shards)
        records[shard_id] += 1
        sizes[shard_id] += size
    return {shard_id: (records[shard_id], sizes[shard_id]) for shard_id in records}


def split_to_fit(
    entries: list[dict[str, Any]], shards: list[Shard], pacer: WritePacer
) -> list[list[dict[str, Any]]]:
    """``entries`` in order, in as few requests as keep each shard's part of each within
    :meth:`WritePacer.fits` (an entry too large alone goes alone)."""
    requests: list[list[dict[str, Any]]] = [[]]
    loads: dict[str, tuple[int, int]] = {}
    for entry in entries:
        shard_id, size = _entry_load(entry, shards)
        records, total = loads.get(shard_id, (0, 0))
        if requests[-1] and not pacer.fits(records + 1, total + size):
            requests.append([])
            loads = {}
            records, total = 0, 0
        requests[-1].append(entry)
        loads[shard_id] = (records + 1, total + size)
    return requests
