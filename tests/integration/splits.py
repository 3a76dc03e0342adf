"""Splits a stream under a running producer: its widest open shard at its middle, every so
often in a thread of its own, and on demand right before a put leaves (the producer's
``before_put`` hook), so that puts meet a stale shard map. Used by the aggregation tests and
the soak. Imported by path, like ``streamcheck``."""

from __future__ import annotations

import threading
from typing import Any

from devstack.spark_demo import split_a_shard
from producer.hooks import Step


class Splitter:
    """Splits the stream's widest open shard at its middle, waiting for ACTIVE after each: the
    first ``forced`` puts each wait at ``before_put`` (:meth:`at`, the producer's hooks) for a
    split asked for then, and from the first put on, one every ``every_s`` seconds, up to
    ``live`` of those."""

    def __init__(self, client: Any, stream: str, *, live: int, forced: int, every_s: float):
        self._client = client
        self._stream = stream
        self._live = live
        self._forced = forced
        self._every_s = every_s
        self._putting = threading.Event()
        self._asked = threading.Event()
        self._stop = threading.Event()
        self._done = threading.Condition()
        self.splits = 0
        self.stale_puts = 0
        self._thread = threading.Thread(target=self._run, name="splitter", daemon=True)

    def __enter__(self) -> Splitter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._putting.set()
        self._asked.set()
        self._thread.join(timeout=30)

    def at(self, step: Step, *, batch_id: int | None = None) -> None:  # noqa: ARG002
        if step is not Step.BEFORE_PUT:
            return
        self._putting.set()
        with self._done:
            if self.stale_puts >= self._forced:
                return
            self.stale_puts += 1
            wanted = self.splits + 1
            self._asked.set()
            assert self._done.wait_for(lambda: self.splits >= wanted, timeout=30)

    def _run(self) -> None:
        self._putting.wait()  # live splits while the send runs, not while it starts
        live = 0
        while not self._stop.is_set():
            asked = self._asked.wait(timeout=self._every_s)
            self._asked.clear()
            if self._stop.is_set():
                return
            if not asked:
                if live >= self._live:
                    continue
                live += 1
            split_a_shard(self._client, self._stream)
            with self._done:
                self.splits += 1
                self._done.notify_all()
