"""A progress bar on stderr for long work, shown only on a terminal unless asked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Progress:
    """``with Progress(enabled, "label", total) as advance: advance(n)``."""

    def __init__(self, enabled: bool, label: str, total: int | None = None) -> None:
        self._enabled = enabled
        self._label = label
        self._total = total
        self._bar: Any = None

    def __enter__(self) -> Callable[[int], None]:
        if not self._enabled:
            return lambda _n: None
        from rich.console import Console
        from rich.progress import MofNCompleteColumn, SpinnerColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        bar = RichProgress(
            SpinnerColumn(),
            self._label,
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        bar.start()
        task = bar.add_task(self._label, total=self._total)
        self._bar = bar
        return lambda n: bar.advance(task, n)

    def __exit__(self, *_: object) -> None:
        if self._bar is not None:
            self._bar.stop()
