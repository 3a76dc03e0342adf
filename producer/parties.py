"""Who sends: a :class:`Party` of a write, in either mode, and its execution's id.

Shared by both modes, so it imports neither: a key-mode process names its party without
loading replay mode's modules.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

__all__ = ["Party", "new_execution_id"]


def new_execution_id() -> str:
    """A fresh execution id: one per driver run of a query, or per CLI process."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Party:
    """Who sends: one attempt of one task at a run (replay mode's identity: ``run``, its
    ``execution_id``, ``task`` and ``task_attempt``), and the owner its claim groups name (key
    mode's; None: the settings' owner). A party of a process of its own (``keo send``) is an
    execution of its own."""

    run: str
    execution_id: str = field(default_factory=new_execution_id)
    task: str = "0"
    task_attempt: int = 0
    owner: str | None = None
