"""The one test seam of the product: named steps where an injected ``Hooks`` object is called.

Product code never reads ``KEO_FAILPOINTS`` nor imports the dev toolbox. An entry point (the
CLI, a test, the demo) builds a hooks object (``devstack.failpoints`` parses the spec) and
passes it in; everything defaults to :data:`NO_HOOKS`, which does nothing.

The steps, in the order a send reaches them::

    after_claim ─ before_put ─ after_put ─ before_mark ─ after_mark      (producer)
    reconcile_before_mark                                                (reconciler)
    batch_after_puts ─ batch_before_complete                             (Spark, driver)

The Spark steps run on the driver once a batch's partitions have all reported (in
``foreachBatch(ExactlyOnceSink)`` and in ``format("keo")``'s commit) and say which batch:
``batch_id`` is the micro-batch's id, None for a batch write. The producer's steps pass none.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

__all__ = ["NO_HOOKS", "Hooks", "NoHooks", "Step"]


class Step(StrEnum):
    AFTER_CLAIM = "after_claim"
    BEFORE_PUT = "before_put"
    AFTER_PUT = "after_put"
    BEFORE_MARK = "before_mark"
    AFTER_MARK = "after_mark"
    RECONCILE_BEFORE_MARK = "reconcile_before_mark"
    BATCH_AFTER_PUTS = "batch_after_puts"
    BATCH_BEFORE_COMPLETE = "batch_before_complete"
    REPLAY_BEFORE_REGISTER = "replay_before_register"  # a task attempt, before its registration
    REPLAY_AFTER_REGISTER = "replay_after_register"  # an attempt registered, before any read


class Hooks(Protocol):
    """Called at each :class:`Step`; may sleep, raise or end the process (fault tests)."""

    def at(self, step: Step, *, batch_id: int | None = None) -> None: ...


class NoHooks:
    """The production default: every step is a no-op."""

    def at(self, step: Step, *, batch_id: int | None = None) -> None:
        """Nothing happens at any step."""

    def __reduce__(self) -> str:
        return "NO_HOOKS"  # unpickles to the module's singleton (Spark ships it to executors)


NO_HOOKS = NoHooks()
