"""Clocks are injected: the protocol never reads the time on its own."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...


class SystemClock:
    """Wall-clock time, as the ledger and Kinesis arrival timestamps use it."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to; for tests and simulations."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> None:
        self._now_ms += ms


class SkewedClock:
    """Another clock shifted by a fixed offset: a host whose clock is off by ``offset_ms``."""

    def __init__(self, base: Clock, offset_ms: int) -> None:
        self._base = base
        self._offset_ms = offset_ms

    def now_ms(self) -> int:
        return self._base.now_ms() + self._offset_ms
