"""How ``keo send`` stops on Ctrl-C or SIGTERM without leaving the user guessing.

The first signal stops reading input and interrupts the producer: the requests in flight
finish, nothing more is sent, claims not yet sent are released (their outcome is FAILED:
send them again), waits on other producers' claims end (those keys are IN_FLIGHT), what was
written is settled; the outcomes are printed with the summary, and the command exits 130.
If the signal comes while the next chunk is being read (a blocking read of stdin, say), that
read is abandoned: those lines were never sent. A second signal exits at once: claims of the
chunk in flight are then left for ``keo reconcile``, like after a crash.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from cli.exit_codes import ExitCode

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopReadingError(Exception):
    """Raised by the first signal out of a read of the input, to abandon it."""


class GracefulStop:
    """``with GracefulStop(say) as stop:`` read inside ``stop.reading()``; stop when
    ``stop.requested``. Handlers are installed only in the main thread (the only one that
    receives signals), and the previous ones are put back on exit."""

    def __init__(
        self, say: Callable[[str], None], on_stop: Callable[[], None] | None = None
    ) -> None:
        self._say = say
        self._on_stop = on_stop
        self.requested = False
        self._reading = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *_: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Input is read inside: the first signal abandons the read (StopReadingError)."""
        self._reading = True
        try:
            yield
        finally:
            self._reading = False

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            self._say(
                f"keo send: {name} again: exiting now; claims of the chunk in flight are left "
                "for 'keo reconcile'"
            )
            if sys.stderr.isatty():
                sys.stderr.write("\x1b[?25h")  # the progress line hid the cursor
            sys.stderr.flush()
            os._exit(ExitCode.INTERRUPTED)
        self.requested = True
        if self._on_stop is not None:
            self._on_stop()
        if self._reading:
            self._say(f"keo send: {name}: stopped reading input")
            raise StopReadingError
        self._say(
            f"keo send: {name}: stopped reading input; finishing the requests in flight, "
            "releasing claims not sent yet (again to exit at once)"
        )
