"""A progress line on stderr for long work, shown only on a terminal unless asked.

It never touches stdout (results go there: ``keo send > out.jsonl`` on a terminal must fill
the file), and it shares its console with the log handler (:mod:`cli.logs`), so a log line
printed while it runs goes above it. It shows what is done out of the total (when known), the
rate, the time left and an optional note (``12 put requests``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.progress import Task
    from rich.text import Text


class Progress:
    """``with Progress(enabled, "sending", unit="messages", total=n) as bar: bar.advance(1)``.

    Every method is a no-op when disabled, and safe to call from worker threads.
    """

    def __init__(self, enabled: bool, label: str, *, unit: str, total: int | None = None) -> None:
        self._enabled = enabled
        self._label = label
        self._unit = unit
        self._total = total
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if not self._enabled:
            return self
        from rich.progress import Progress as RichProgress

        from cli.logs import stderr_console

        bar = RichProgress(
            *_columns(self._label, self._unit),
            console=stderr_console(),
            transient=True,
            # stdout carries results: never capture it. stderr writes go above the bar.
            redirect_stdout=False,
        )
        bar.start()
        self._task = bar.add_task(self._label, total=self._total, note="")
        self._bar = bar
        return self

    def advance(self, done: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, done)

    def set_total(self, total: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, total=total)

    def note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, note=text)

    def __exit__(self, *_: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _columns(label: str, unit: str) -> list[Any]:
    """``⠋ sending ━━━━━━━╸━━━━━━━━━ 15000/20000 lines 391/s ETA 0:13 40 put requests``: it
    fits 80 columns."""
    # rich is imported here, not at the top: every 'keo' command would pay for it
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        ProgressColumn,
        SpinnerColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            shown = "" if speed is None else f"{speed:,.0f}/s"
            return Text(shown, style="progress.data.speed")

    return [
        SpinnerColumn(),
        TextColumn(escape(label)),
        BarColumn(bar_width=16),
        MofNCompleteColumn(),
        TextColumn(escape(unit)),
        RateColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(compact=True),
        TextColumn("{task.fields[note]}", markup=False),
    ]
