"""PutRecords within each shard's write quota: 1,000 records and 1 MiB (data and partition
keys) a second per shard (PutRecords, Amazon Kinesis Data Streams API Reference: "Each shard
can support writes up to 1,000 records per second, up to a maximum data write total of 1 MiB
per second"), as the KPL's ``RateLimit`` keeps its own puts within a share of it.

::

    a request costing c(S) = max(r / records_per_s, b / bytes_per_s) / share on each shard S
      it holds
      leaves at   max(now, T(S) + c(S) - burst for each S)
      then        T(S) = max(T(S), leave) + c(S)

Each shard is a token bucket kept as one time T (the generic cell rate algorithm): when it
would have sent all that was reserved on it at the rate; a request leaves once, with it, no
shard it holds is more than ``burst_s`` ahead of the time, and reserves its part then. A writer
that keeps to it is never throttled by its own load. Other writers of the shard (other
processes, a Spark job's other tasks) take part of its quota: when shards refuse records of
ours, this process's share of the pace shrinks by twice the part of the request refused (at
most by half, once for the requests paced together), and while they take every record, or a
request of ours waits for its turn, it grows by half of itself a second
(:meth:`WritePacer.answered`), so writers that share shards settle on their parts of them
without knowing of each other, however many they are; the records refused are resent. The
share is the stream's, not a shard's: a request holds records for every shard and leaves when
its slowest shard has room, so shares kept a shard each would hold the writer to the smallest
of them, the noisiest (a shard's part of a request is a few dozen records): two Spark tasks
on 8 shards held 0.84 to 0.91 of the quota with a share a shard, 0.99 to 1.05 with one
(``python -m devstack.quota_bench --spark --named 'format("keo") dedupe=replay'``, three runs
each). A request that holds more than a shard takes at once is
split (:func:`split_to_fit`). One pacer a process and stream: the writers of a process share
it. Pure apart from the injected clock and sleep: no boto3 here.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from kinesis_store.shards import Shard

__all__ = [
    "PUT_BYTES_PER_S",
    "PUT_RECORDS_PER_S",
    "REQUEST_PART_OF_BURST",
    "WritePacer",
    "shard_loads",
    "split_to_fit",
]

PUT_RECORDS_PER_S: Final = 1000
PUT_BYTES_PER_S: Final = 1024 * 1024
# shards that refused records of ours: this process's share of the pace shrinks, down to this
# (a stream written by a thousand tasks at once gives each a thousandth)
MIN_SHARE: Final = 1 / 1024
# while the shards take every record of ours, the share grows by this part of itself a
# second, up to all of it: a multiple, so that the writers of a shard together grow by half a
# second however many they are (a step each would grow a thousand writers a thousand steps)
SHARE_GROWTH_PER_S: Final = 0.5
# a refusal shrinks the share by this many times the part of our records refused, at most by
# half: the writers that overshoot together shed the excess and a margin, so that the shard's
# bucket fills again before they reach it
SHRINK_PER_REFUSED: Final = 2.0
# how often a request waiting for its shards looks at them again
_REPLAN_S: Final = 0.1
# the longest growth counted at once: a share grows at most twice as large an answer (a
# request paced at a small share waits seconds for its turn; a shard written after a pause)
_GROWTH_STEP_MAX_S: Final = 2.0
# how far ahead of the time a shard may be, a request on it counted: Kinesis takes a second of
# its quota at once (AWS documents no burst; the quota mode's bucket holds one second); less,
# so that requests the network delays unevenly still find room
DEFAULT_BURST_S: Final = 0.8
# the most of the burst one request holds on a shard: the shard's bucket holds a second, so a
# request that is most of it, from one of several writers, drains it at once and the next
# writer's lands on nothing, refused nearly whole; smaller requests interleave, and each writer
# meets refusals in proportion to its overshoot (two Spark tasks in key mode on a shard: 0.72
# and 0.80 of its quota at the whole burst, 0.94 and 0.99 at a third)
REQUEST_PART_OF_BURST: Final = 1 / 3


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
        # the share of the pace this process keeps: other writers of the shards (other
        # processes, a Spark job's other tasks) take the rest; shrunk when shards refused
        # records of ours, grown by time while they take them all (answered)
        self._share = 1.0
        self._grown_at_s: float | None = None
        self._lock = threading.Lock()
        # the requests with a turn waiting for their shards: token -> (turn, shard ids)
        self._waiting: dict[int, tuple[int, frozenset[str]]] = {}
        self._tokens = itertools.count()
        self.waited_s = 0.0  # in all, for the metrics and the bench

    def before_request(
        self, loads: Mapping[str, tuple[int, int]], *, turn: int | None = None
    ) -> float:
        """Wait until every shard of ``loads`` (shard id -> records, bytes) can take its part
        of the request at the share there is then; the seconds waited. A request reserves its
        shards' time only as it leaves: one that waits looks again every ``_REPLAN_S``. The
        share grows by time while it waits, as while the shards take every record, so a
        writer left alone on shards it shared is not held to its small share until an answer
        comes (two hundred writers that start together kept a shard at 0.75 of its quota so,
        0.98 now: test_write_pacing.py); and a reservation made at a small share would hold
        the shards back after it grew.

        ``turn``: the request's place among the writers of the process (a smaller one is
        older: :mod:`producer.put_loop`'s puts, in the order they began); of the requests
        waiting for a shard, the oldest leaves first. Without it, the claim groups a key-mode
        sender keeps in flight shared the shards request by request, all finished their puts
        together, and the next groups claimed with nothing left to put: two Spark tasks on a
        shard left it idle 2 s in 8 (the groups in flight: :mod:`producer.key.pipeline`);
        oldest first, one group finishes while the next ones wait, and the group after them
        claims while they put."""
        token = next(self._tokens)
        try:
            return self._wait_for_room(loads, turn, token)
        finally:
            with self._lock:
                self._waiting.pop(token, None)

    def _wait_for_room(
        self, loads: Mapping[str, tuple[int, int]], turn: int | None, token: int
    ) -> float:
        waited_s = 0.0
        started_s: float | None = None
        while True:
            with self._lock:
                now_s = self._clock()
                if started_s is None:
                    started_s = now_s  # a shard with nothing reserved is idle from then
                costs = {
                    shard_id: max(records / self._records_per_s, size / self._bytes_per_s)
                    / self._share
                    for shard_id, (records, size) in loads.items()
                }
                # it leaves once, with it, no shard of it is more than the burst ahead of the time
                leave_s = max(
                    [
                        now_s,
                        *(
                            self._theoretical_s.get(shard_id, started_s) + cost_s - self._burst_s
                            for shard_id, cost_s in costs.items()
                        ),
                    ]
                )
                if leave_s <= now_s and not self._older_waiting(loads, turn):
                    for shard_id, cost_s in costs.items():
                        theoretical_s = max(self._theoretical_s.get(shard_id, now_s), now_s)
                        self._theoretical_s[shard_id] = theoretical_s + cost_s
                    self.waited_s += waited_s
                    return waited_s
                if turn is not None:
                    self._waiting[token] = (turn, frozenset(loads))
            pause_s = max(0.0, min(leave_s - now_s, _REPLAN_S)) or _REPLAN_S / 10
            self._sleep(pause_s)
            waited_s += pause_s
            with self._lock:
                self._grow(self._clock())

    def answered(self, sent: int, refused: int, paced_with: float | None = None) -> None:
        """What the shards did with a request: ``sent`` records, of which they ``refused``
        some (throttled: other writers take part of their quota), the request paced with the
        share ``paced_with`` (:meth:`share` as it was reserved; now's when not given). On a
        refusal the share becomes the one the request was paced with, shrunk by
        ``SHRINK_PER_REFUSED`` times the part refused, at most by half (at least
        ``MIN_SHARE``), if that is less than it is now: the requests in flight together, paced
        with one share, meet one refusal and shrink it once. A request taken whole grows it by
        ``SHARE_GROWTH_PER_S`` of itself a second since it last grew (at most all). Writers
        that share shards settle on their parts of them without knowing of each other, as
        TCP's congestion windows do, and together grow by the same part a second however many
        they are."""
        with self._lock:
            now_s = self._clock()
            part_refused = min(1.0, refused / max(sent, 1))
            if not part_refused:
                self._grow(now_s)
                return
            self._grown_at_s = now_s
            paced = self._share if paced_with is None else paced_with
            shrink = max(0.5, 1 - SHRINK_PER_REFUSED * part_refused)
            self._share = max(MIN_SHARE, min(self._share, paced * shrink))

    def _older_waiting(self, loads: Mapping[str, tuple[int, int]], turn: int | None) -> bool:
        """Whether a request older than ``turn`` waits for a shard of ``loads``; under the
        lock."""
        return turn is not None and any(
            their_turn < turn and not shards.isdisjoint(loads)
            for their_turn, shards in self._waiting.values()
        )

    def _grow(self, now_s: float) -> None:
        """The share grown by ``SHARE_GROWTH_PER_S`` of itself a second since it last grew or
        shrank (at most ``_GROWTH_STEP_MAX_S`` at once, at most all); under the lock. A time
        before the last growth grows nothing (a simulation's clock, in which a writer's
        requests in flight each keep their own time, moves back): it never shrinks it."""
        grown_at_s = now_s if self._grown_at_s is None else self._grown_at_s
        self._grown_at_s = max(grown_at_s, now_s)
        grown_s = min(_GROWTH_STEP_MAX_S, max(0.0, now_s - grown_at_s))
        self._share = min(1.0, self._share * (1 + SHARE_GROWTH_PER_S * grown_s))

    def share(self) -> float:
        """The part of the pace this process keeps now (1: all of it)."""
        with self._lock:
            return self._share

    def fits(self, records: int, size: int) -> bool:
        """Whether ``records`` records of ``size`` bytes on one shard fit in one request: no
        more than ``REQUEST_PART_OF_BURST`` of the burst of this process's pace on the shard,
        at its share. A request holding more than the burst is refused in part by Kinesis
        however long it waits (the shard takes a second of its quota at once: 500 records of
        2 KB are a second of bytes); one holding most of it, when other writers take part of
        the shard, lands on a bucket they emptied, or empties it for them; so the writer splits
        it (:func:`split_to_fit`)."""
        cost_s = max(records / self._records_per_s, size / self._bytes_per_s) / self.share()
        return cost_s <= self._burst_s * REQUEST_PART_OF_BURST


def _entry_load(entry: Mapping[str, Any], shards: Sequence[Shard]) -> tuple[str, int]:
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
    entries: Iterable[Mapping[str, Any]], shards: Sequence[Shard]
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
    entries: list[dict[str, Any]], shards: Sequence[Shard], pacer: WritePacer
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
