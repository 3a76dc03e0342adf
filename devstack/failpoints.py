"""Failpoints: named steps where a test makes the process die, pause or raise.

The spec is ``step=action[,step=action...]``, read from ``KEO_FAILPOINTS`` by the entry
points (:func:`from_env`) and parsed here, once. Actions: ``kill`` (SIGKILL itself: no
cleanup, like a crash), ``raise`` (:class:`FailpointError`), ``stop`` (SIGSTOP itself: frozen,
as by a debugger or a starved VM, until someone sends SIGCONT), ``pause`` (the thread that
reaches the step waits while the process runs on, as in a long GC pause of that thread, until
the process receives SIGCONT: armed on the main thread, which takes the signal; reached where
nothing hears SIGCONT, it raises :class:`FailpointError` rather than wait forever), or
``sleep:<seconds>``.
Steps are :class:`producer.hooks.Step`: after_claim, before_put, after_put, before_mark,
after_mark, reconcile_before_mark, batch_after_puts, batch_before_complete,
replay_before_register, replay_after_register.

A :class:`Failpoints` is the product's :class:`producer.hooks.Hooks`: entry points pass it to
the producer, the reconciler and the Spark sink. It pickles, so Spark ships it to executors.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Mapping

from producer.errors import ConfigurationError
from producer.hooks import NO_HOOKS, Hooks, Step

__all__ = ["ENV", "STEPS", "FailpointError", "Failpoints", "from_env", "parse"]

log = logging.getLogger(__name__)

ENV = "KEO_FAILPOINTS"
STEPS = frozenset(step.value for step in Step)


class FailpointError(RuntimeError):
    """Raised at a failpoint whose action is ``raise``, or a ``pause`` nothing can resume."""

    def __init__(self, step: str, why: str = "raised") -> None:
        super().__init__(f"failpoint {step} {why}")
        self.step = step


def _is_sleep(action: str) -> bool:
    prefix, _, seconds = action.partition(":")
    try:
        return prefix == "sleep" and math.isfinite(float(seconds)) and float(seconds) >= 0
    except ValueError:
        return False


def parse(spec: str) -> dict[str, str]:
    """``{step: action}`` of a spec; refuses unknown steps and actions by name."""
    actions: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        step, _, action = part.partition("=")
        if step not in STEPS:
            raise ConfigurationError(
                f"{ENV}: unknown step {step!r}; known: {sorted(STEPS)}", setting=ENV
            )
        if action not in {"kill", "raise", "stop", "pause"} and not _is_sleep(action):
            raise ConfigurationError(f"{ENV}: unknown action {action!r} for {step}", setting=ENV)
        actions[step] = action
    return actions


# One entry a SIGCONT received since a ``pause`` was armed: a paused thread waits for another.
# The handler only appends (no lock: it runs between two bytecodes of the main thread, which may
# hold any lock), and the paused thread looks every PAUSE_POLL_S.
_RESUMES: list[int] = []
PAUSE_POLL_S = 0.05


def _count_resume(*_: object) -> None:
    _RESUMES.append(1)


def _listen_for_resumes(actions: Mapping[str, str]) -> None:
    if "pause" in actions.values() and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCONT, _count_resume)


def _resumes_heard() -> bool:
    return signal.getsignal(signal.SIGCONT) is _count_resume


class Failpoints:
    """Hooks that act at the armed steps; a step that is not armed costs a dict lookup."""

    def __init__(self, spec: str = "") -> None:
        self._actions: dict[str, str] = parse(spec)
        _listen_for_resumes(self._actions)

    def __setstate__(self, state: dict[str, dict[str, str]]) -> None:
        # unpickled where it runs (a Spark executor's worker): listen there too
        self._actions = state["_actions"]
        _listen_for_resumes(self._actions)

    @property
    def armed(self) -> Mapping[str, str]:
        return dict(self._actions)

    def arm(self, spec: str) -> None:
        """Replace the armed steps; a bad spec leaves them as they were."""
        parsed = parse(spec)
        _listen_for_resumes(parsed)
        self._actions = parsed

    def disarm(self) -> None:
        self._actions = {}

    def at(self, step: Step, *, batch_id: int | None = None) -> None:  # noqa: ARG002
        # a failpoint acts at its step in every batch
        action = self._actions.get(step)
        if action is None:
            return
        # counted before the line a test waits for: a SIGCONT sent once it is read resumes
        resumes_seen = len(_RESUMES)
        log.warning("failpoint hit step=%s action=%s pid=%d", step, action, os.getpid())
        # Sent to this thread, not to the process: a signal sent to the process may be taken
        # by another thread (the main one, asleep), and this one would run on, even send its
        # put, until the kernel gets round to stopping it. Either signal ends or stops them all.
        if action == "kill":
            signal.pthread_kill(threading.get_ident(), signal.SIGKILL)
        elif action == "stop":
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)  # returns after SIGCONT
        elif action == "raise":
            raise FailpointError(step)
        elif action == "pause":
            if not _resumes_heard():
                raise FailpointError(
                    step,
                    "could not pause: nothing in this process counts the SIGCONT that would "
                    "resume it (it was armed off the main thread, or SIGCONT's handler was "
                    f"replaced since); set {ENV} before the process starts",
                )
            while len(_RESUMES) == resumes_seen:
                time.sleep(PAUSE_POLL_S)
        else:
            time.sleep(float(action.split(":", 1)[1]))


def from_env(environ: Mapping[str, str] | None = None) -> Hooks:
    """The hooks an entry point installs: :data:`NO_HOOKS` unless ``KEO_FAILPOINTS`` is set."""
    spec = (os.environ if environ is None else environ).get(ENV, "")
    return Failpoints(spec) if spec.strip() else NO_HOOKS
