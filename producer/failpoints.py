"""Failpoints: named steps where a test makes the process die, pause or raise.

Set ``KEO_FAILPOINTS`` to ``step=action[,step=action...]`` before the process starts, with
action ``kill`` (SIGKILL itself: no cleanup, like a crash), ``raise``, or ``sleep:<seconds>``.
Steps: after_claim, before_put, after_put, before_mark, after_mark, reconcile_before_mark.
When the variable is unset, :func:`hit` is a dictionary lookup on an empty dict.
"""

from __future__ import annotations

import math
import os
import signal
import time

STEPS = frozenset(
    {"after_claim", "before_put", "after_put", "before_mark", "after_mark", "reconcile_before_mark"}
)


class FailpointError(RuntimeError):
    """Raised at a failpoint whose action is ``raise``."""

    def __init__(self, step: str) -> None:
        super().__init__(f"failpoint {step} raised")
        self.step = step


def _is_sleep(action: str) -> bool:
    prefix, _, seconds = action.partition(":")
    try:
        return prefix == "sleep" and math.isfinite(float(seconds)) and float(seconds) >= 0
    except ValueError:
        return False


def _parse(spec: str) -> dict[str, str]:
    actions: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        step, _, action = part.partition("=")
        if step not in STEPS:
            raise ValueError(f"KEO_FAILPOINTS: unknown step {step!r}; known: {sorted(STEPS)}")
        if action not in {"kill", "raise"} and not _is_sleep(action):
            raise ValueError(f"KEO_FAILPOINTS: unknown action {action!r} for {step}")
        actions[step] = action
    return actions


_ACTIVE: dict[str, str] = _parse(os.environ.get("KEO_FAILPOINTS", ""))


def hit(step: str) -> None:
    action = _ACTIVE.get(step)
    if action is None:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        raise FailpointError(step)
    else:
        time.sleep(float(action.split(":", 1)[1]))


def configure(spec: str) -> None:
    """Replace the active failpoints (in-process tests)."""
    parsed = _parse(spec)  # a bad spec leaves the armed failpoints as they were
    _ACTIVE.clear()
    _ACTIVE.update(parsed)
